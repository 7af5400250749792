"""The language of each group's reference base service (``cg0`` … ``cg5``), with the capability
record that describes it."""

from __future__ import annotations

from adapters.backends.boolean import BooleanLanguage, FilterLanguage
from adapters.backends.native import Language
from adapters.backends.peer import PeerLanguage
from adapters.backends.snoop import SnoopLanguage
from adapters.backends.sql import SqlLanguage
from adapters.backends.xchange import XChangeLanguage

GROUPS = ("cg0", "cg1", "cg2", "cg3", "cg4", "cg5")


def language(group: str, tick: int = 1_000_000) -> Language:
    """The native language of a group's base service; ``tick`` is a peer mediator's clock."""
    languages: dict[str, Language] = {
        "cg0": FilterLanguage(), "cg1": BooleanLanguage(), "cg2": SnoopLanguage(),
        "cg3": SqlLanguage(), "cg4": XChangeLanguage(), "cg5": PeerLanguage(tick),
    }
    if group not in languages:
        raise KeyError(f"unknown group {group!r}; groups are {', '.join(GROUPS)}")
    return languages[group]
