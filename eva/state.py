"""Per-partition engine state: plain records, nothing compiled (docs/semantics.md, "Compile once").

A profile is compiled once, at registration, into an immutable tree of node specs
(:mod:`eva.nodes`, built by :mod:`eva.compiler`); each ``per`` partition holds one tree of the
records below, made by the spec's ``new_state`` — a new partition costs a few small objects,
never a compile. The spec holds the rules, the state holds the lists: a snapshot
(:mod:`eva.snapshot`) writes these records and nothing else.

Every record's constructor takes all of its fields, in the order of ``FIELDS``, so a snapshot
rebuilds one by calling it with the values it wrote. A leaf keeps no state (``None``).
"""

from __future__ import annotations

from collections import deque
from typing import Any

from eva.semantics import Element, Key, Occ


class SnapshotError(ValueError):
    """Bytes that are not an engine snapshot (or core, or partition record) this version can
    read, or records that do not fit the profiles compiled again from its documents (or, from
    ``eva.snapshot.snapshot`` and its kin, an engine state too large to be read back). Defined
    here, below the engine, because ``Engine.import_state`` checks the records it is given —
    and an engine restored from a core checks a partition's record when it first reads it."""


class Budget:
    """Counts stored occurrences of one profile against its cap (DESIGN §3: bounded state);
    shared by all partitions of the profile. ``limited``: operators that reached the limit on
    composites per step (docs/semantics.md, "The limit on composites") in the step now
    running — the engine reads and clears it after each step, so it is 0 between steps and
    no snapshot writes it."""

    __slots__ = ("cap", "limited", "overflowed", "peak", "stored")

    def __init__(self, cap: int, stored: int = 0, peak: int = 0, overflowed: int = 0) -> None:
        self.cap = cap
        self.stored = stored
        self.peak = peak
        self.overflowed = overflowed
        self.limited = 0

    def add(self, n: int = 1) -> None:
        self.stored += n
        if self.stored > self.peak:
            self.peak = self.stored


class DList:
    """A duplicate list's metadata and the elements of it that are still kept.

    ``kept`` maps the element's index within the list to (view position, occurrence).
    """

    __slots__ = ("count", "first_pos", "kept", "number", "role")

    def __init__(self, number: int, role: int, first_pos: int, count: int = 0,
                 kept: dict[int, tuple[int, Occ]] | None = None) -> None:
        self.number = number
        self.role = role
        self.first_pos = first_pos
        self.count = count
        self.kept: dict[int, tuple[int, Occ]] = {} if kept is None else kept


class Candidate:
    """A provisional end-of-interval result waiting for its lists or frame to close."""

    __slots__ = ("frame", "occ", "p1", "p2", "wait_x", "wait_y", "x", "y")

    def __init__(self, occ: Occ, p1: int, p2: int, x: DList, y: DList, wait_x: bool = False,
                 wait_y: bool = False, frame: int | None = None) -> None:
        self.occ = occ
        self.p1 = p1
        self.p2 = p2
        self.x = x
        self.y = y
        self.wait_x = wait_x
        self.wait_y = wait_y
        self.frame = frame

    def ready(self) -> bool:
        return not self.wait_x and not self.wait_y


class SelectionState:
    __slots__ = ("child", "count")

    def __init__(self, child: Any, count: int = 0) -> None:
        self.child = child
        self.count = count


class NegationState:
    """The next tick that can report, the latest negated time, the passive events so far."""

    __slots__ = ("child", "count", "latest", "next_tick")

    def __init__(self, child: Any, next_tick: int, latest: int | None = None,
                 count: int = 0) -> None:
        self.child = child
        self.next_tick = next_tick
        self.latest = latest
        self.count = count


class AnchoredState:
    """Anchors waiting for their deadline (a heap), the negated times still in some window."""

    __slots__ = ("child", "count", "order", "pending", "times")

    def __init__(self, child: Any, pending: list[tuple[Key, int, Occ]] | None = None,
                 times: list[int] | None = None, count: int = 0, order: int = 0) -> None:
        self.child = child
        self.pending: list[tuple[Key, int, Occ]] = [] if pending is None else pending
        self.times: list[int] = [] if times is None else times
        self.count = count
        self.order = order


class BinaryState:
    """A binary node's trace view (duplicate lists), expiry queue and end-of-interval results."""

    __slots__ = ("budget", "closing", "expiry", "left", "lists", "now", "pending", "position",
                 "right")

    def __init__(self, left: Any, right: Any, budget: Budget,
                 lists: deque[DList] | None = None, position: int = 0,
                 expiry: deque[tuple[int, DList, int]] | None = None, now: int = -(2**62),
                 pending: list[Candidate] | None = None,
                 closing: list[tuple[Key, int, int, Occ]] | None = None) -> None:
        self.left = left
        self.right = right
        self.budget = budget
        self.lists: deque[DList] = deque() if lists is None else lists
        self.position = position
        self.expiry: deque[tuple[int, DList, int]] = deque() if expiry is None else expiry
        self.now = now
        self.pending: list[Candidate] = [] if pending is None else pending
        self.closing: list[tuple[Key, int, int, Occ]] = [] if closing is None else closing


class RepeatedState:
    """A repeated_pairs node's unconsumed view."""

    __slots__ = ("budget", "left", "remaining", "right")

    def __init__(self, left: Any, right: Any, budget: Budget,
                 remaining: list[Element] | None = None) -> None:
        self.left = left
        self.right = right
        self.budget = budget
        self.remaining: list[Element] = [] if remaining is None else remaining


FIELDS: dict[type, tuple[str, ...]] = {
    Budget: ("cap", "stored", "peak", "overflowed"),
    DList: ("number", "role", "first_pos", "count", "kept"),
    Candidate: ("occ", "p1", "p2", "x", "y", "wait_x", "wait_y", "frame"),
    SelectionState: ("child", "count"),
    NegationState: ("child", "next_tick", "latest", "count"),
    AnchoredState: ("child", "pending", "times", "count", "order"),
    BinaryState: ("left", "right", "budget", "lists", "position", "expiry", "now", "pending",
                  "closing"),
    RepeatedState: ("left", "right", "budget", "remaining"),
}
"""Each record class's fields in constructor order: what a snapshot writes and passes back (the
flat layouts of eva.snapshot write and read them in this order too)."""
