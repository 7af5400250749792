"""One :class:`~transforms.dialects.base.Dialect` per language group: what the mediator speaks
to that group's base service, and how it reads the service's notifications back.

Each group's module is imported when the group is first asked for (SQL's brings sqlglot).
"""

from __future__ import annotations

from functools import cache

from transforms.dialects.base import Dialect

GROUPS = ("cg0", "cg1", "cg2", "cg3", "cg4", "cg5")


@cache
def dialect(group: str) -> Dialect:
    """The dialect of a group (``cg0`` … ``cg5``); KeyError naming the groups for another."""
    if group in ("cg0", "cg1"):
        from transforms.dialects.filter import BOOLEAN, FILTER
        return FILTER if group == "cg0" else BOOLEAN
    if group == "cg2":
        from transforms.dialects.snoop import SNOOP
        return SNOOP
    if group == "cg3":
        from transforms.dialects.sql import SQL
        return SQL
    if group == "cg4":
        from transforms.dialects.xchange import XCHANGE
        return XCHANGE
    if group == "cg5":
        from transforms.dialects.peer import PEER
        return PEER
    raise KeyError(f"unknown group {group!r}; groups are {', '.join(GROUPS)}")
