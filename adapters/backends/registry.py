"""The language of each group's reference base service (``cg0`` … ``cg5``). Each language's
module is imported when its group is first asked for (SQL's brings sqlglot)."""

from __future__ import annotations

import functools
import threading
from collections import OrderedDict

from adapters.backends.native import Language, Query
from transforms.capability import Capability
from transforms.dialects import GROUPS

__all__ = ["GROUPS", "Recalled", "language", "shared_language"]

RECALLED = 1024
"""Parsed queries a :func:`shared_language` keeps (the most recently used)."""


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


class Recalled:
    """A language that keeps its most recent parses. A parsed query is immutable (each
    evaluator holds its own state), so the mediator's planner — which parses a query to learn
    whether the service's language takes it — and the embedded service that then subscribes it
    share one parse (an SQL one costs ≈ 0.4 ms at each registration). Refusals are not kept."""

    def __init__(self, inner: Language, size: int = RECALLED) -> None:
        self.inner = inner
        self.size = size
        self._kept: OrderedDict[str, Query] = OrderedDict()
        self._lock = threading.Lock()  # the planner and the links run in different threads

    @property
    def name(self) -> str:
        return self.inner.name

    @property
    def group(self) -> str:
        return self.inner.group

    @property
    def capability(self) -> Capability:
        return self.inner.capability

    def parse(self, text: str) -> Query:
        with self._lock:
            query = self._kept.get(text)
            if query is not None:
                self._kept.move_to_end(text)
                return query
        query = self.inner.parse(text)  # outside the lock: parses of different texts overlap
        with self._lock:
            self._kept[text] = query
            if len(self._kept) > self.size:
                self._kept.popitem(last=False)
        return query


def shared_language(group: str, tick: int = 1_000_000) -> Language:
    """One :class:`Recalled` language per group and clock for the whole process (parsers are
    stateless): what the mediator plans with and its embedded services evaluate."""
    # One cache key however the clock is passed, and the clock only where the language has
    # one (a peer mediator's): the planner asks with the default, the links with the
    # configured clock, and both must meet on one instance.
    return _shared(group, tick if group == "cg5" else 1_000_000)


@functools.cache
def _shared(group: str, tick: int) -> Language:
    return Recalled(language(group, tick))
