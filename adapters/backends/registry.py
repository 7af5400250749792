"""The language of each group's reference base service (``cg0`` … ``cg5``). Each language's
module is imported when its group is first asked for (SQL's brings sqlglot)."""

from __future__ import annotations

from adapters.backends.native import Language
from transforms.dialects import GROUPS

__all__ = ["GROUPS", "language"]


def language(group: str, tick: int = 1_000_000) -> Language:
    """The native language of a group's base service; ``tick`` is a peer mediator's clock."""
    if group in ("cg0", "cg1"):
        from adapters.backends.boolean import BooleanLanguage, FilterLanguage
        return FilterLanguage() if group == "cg0" else BooleanLanguage()
    if group == "cg2":
        from adapters.backends.snoop import SnoopLanguage
        return SnoopLanguage()
    if group == "cg3":
        from adapters.backends.sql import SqlLanguage
        return SqlLanguage()
    if group == "cg4":
        from adapters.backends.xchange import XChangeLanguage
        return XChangeLanguage()
    if group == "cg5":
        from adapters.backends.peer import PeerLanguage
        return PeerLanguage(tick)
    raise KeyError(f"unknown group {group!r}; groups are {', '.join(GROUPS)}")
