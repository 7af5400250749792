"""Node specs of the incremental engine: the rules of each operator, compiled once per profile.

A spec is immutable (no method assigns to it); each ``per`` partition keeps a tree of plain
state records (:mod:`eva.state`) made by ``new_state``, and every spec method takes its node's
record. Each step feeds one view element; a node reports the occurrences that element adds to
its stream, in the same order as the reference evaluator. Binary nodes keep their trace view as
duplicate-list *metadata* (role, element count) plus only the elements that can still be
selected, so garbage collection never changes which element counts as first, last or i-th
(research/bry_eckert.md R10). ``gc=False`` keeps everything; tests check it changes nothing.
"""

from __future__ import annotations

import heapq
from bisect import bisect_right, insort
from collections.abc import Hashable, Iterable
from typing import Any

from eva import ast
from eva import semantics as sem
from eva.classes import label
from eva.semantics import LR, Key, L, Occ, R
from eva.state import (
    AnchoredState,
    BinaryState,
    Budget,
    Candidate,
    DList,
    NegationState,
    RepeatedState,
    SelectionState,
)

NO_DUE: Key = (2**62, 9, 0)
NO_LIMIT = 2**62
"""The limit on composites per step of an operator when none is set."""


class Node:
    """Interface of a node spec; ``st`` is the node's state record (None for a leaf)."""

    __slots__ = ()

    def new_state(self, budget: Budget, first: int) -> Any:
        """A fresh state record for one partition created at time ``first`` (children's
        included); ``budget`` counts the profile's stored occurrences."""
        return None

    def check(self, st: Any, budget: Budget) -> str:
        """'' when ``st`` fits this node — of the record class ``new_state`` makes, its
        children's records fitting theirs, sharing the profile's ``budget`` — else what does
        not fit. A restored snapshot's records are handed to specs compiled again from the
        documents: one that does not fit would fail at the partition's next input."""
        return _fits(self, st, None)

    def step(self, st: Any, key: Key, current: Occ, hits: Any, tick: Hashable) -> list[Occ]:
        raise NotImplementedError

    def clock(self, st: Any, key: Key) -> list[Occ]:
        return []

    def due(self, st: Any) -> Key:
        return NO_DUE

    def evict(self, st: Any, count: int) -> int:
        """Drop up to ``count`` of the oldest stored occurrences (state cap overflow); returns
        how many were dropped. Answers that needed them are lost, so the engine reports it."""
        return 0

    def sweep(self, st: Any, now: int) -> None:
        """Collect as a step at ``now`` would, without one: every instant up to ``now`` has
        been processed, so no element this node sees from here on is older. A partition's
        collection otherwise runs only when the partition gets an event, and a partition that
        never gets another (a finished delivery, a closed session) would keep its state."""

    def inert(self, st: Any, tick: Hashable, now: int) -> bool:
        """Whether a tick of time class ``tick`` at ``now`` would report nothing and change no
        state that matters — and so would every later one while nothing else reaches the node
        (the engine then skips that class's ticks across a quiet gap). False whenever unsure."""
        return False

    def at_rest(self, st: Any) -> bool:
        """Whether the node would answer every future input as a freshly built one does: no
        stored occurrence, no count, no duplicate list whose position still matters. False
        whenever unsure — the engine drops a partition only when its root is at rest."""
        return False

    def floor(self, st: Any, now: int) -> int:
        """A lower bound on the time of any occurrence this node may still report at or after
        ``now`` (the lower bounds of Bry & Eckert's suppressing joins). Garbage collection
        measures horizons from it, not from ``now``: a repeated_pairs node can report a
        composite of stored, older occurrences."""
        return now


def _fits(node: Node, st: Any, record: type | None) -> str:
    """'' when ``st`` is of class ``record`` (None: no record, a leaf's), else what was found."""
    if (st is None) if record is None else type(st) is record:
        return ""
    found = "none" if st is None else f"a {type(st).__name__}"
    expected = "none" if record is None else f"a {record.__name__}"
    return f"the state of a {type(node).__name__} is {found}, expected {expected}"


def _shares(node: Node, held: Any, budget: Budget) -> str:
    """'' when a node's record counts against its profile's budget, else what it holds."""
    if held is budget:
        return ""
    found = "another budget" if type(held) is Budget else f"a {type(held).__name__}"
    return (f"the state of a {type(node).__name__} holds {found} where its profile's budget "
            "was expected")


class AttributeLeaf(Node):
    __slots__ = ("pred",)

    def __init__(self, pred: Any) -> None:
        self.pred = pred

    def step(self, st: Any, key: Key, current: Occ, hits: Any, tick: Hashable) -> list[Occ]:
        return [current] if tick is None and self.pred in hits else []

    def inert(self, st: Any, tick: Hashable, now: int) -> bool:
        return True

    def at_rest(self, st: Any) -> bool:
        return True


class TimeLeaf(Node):
    """A time class's ticks, or an external operand's fed occurrences: steps named by id."""

    __slots__ = ("tick_id",)

    def __init__(self, tick_id: Hashable) -> None:
        self.tick_id = tick_id  # a time class's (document, name), or external_id(name)

    def step(self, st: Any, key: Key, current: Occ, hits: Any, tick: Hashable) -> list[Occ]:
        return [current] if tick == self.tick_id else []

    def inert(self, st: Any, tick: Hashable, now: int) -> bool:
        return tick != self.tick_id

    def at_rest(self, st: Any) -> bool:
        return True


class SelectionNode(Node):
    __slots__ = ("child", "index", "pairs")

    def __init__(self, child: Node, expr: ast.Selection) -> None:
        self.child = child
        self.index = expr.index
        self.pairs = expr.pairs

    def new_state(self, budget: Budget, first: int) -> SelectionState:
        return SelectionState(self.child.new_state(budget, first))

    def check(self, st: Any, budget: Budget) -> str:
        return _fits(self, st, SelectionState) or self.child.check(st.child, budget)

    def _pick(self, st: SelectionState, occs: list[Occ]) -> list[Occ]:
        out = []
        for occ in occs:
            st.count += 1
            if sem.selection_picks(self.index, st.count, self.pairs):
                out.append(occ)
        return out

    def step(self, st: SelectionState, key: Key, current: Occ, hits: Any, tick: Hashable) -> list[Occ]:
        return self._pick(st, self.child.step(st.child, key, current, hits, tick))

    def clock(self, st: SelectionState, key: Key) -> list[Occ]:
        return self._pick(st, self.child.clock(st.child, key))

    def due(self, st: SelectionState) -> Key:
        return self.child.due(st.child)

    def floor(self, st: SelectionState, now: int) -> int:
        return self.child.floor(st.child, now)

    def sweep(self, st: SelectionState, now: int) -> None:
        self.child.sweep(st.child, now)

    def inert(self, st: SelectionState, tick: Hashable, now: int) -> bool:
        return self.child.inert(st.child, tick, now)

    def at_rest(self, st: SelectionState) -> bool:
        return st.count == 0 and self.child.at_rest(st.child)  # the i-th counts from the first

    def evict(self, st: SelectionState, count: int) -> int:
        return self.child.evict(st.child, count)


class NegationNode(Node):
    """(not E)_T at the default clock's ticks: passive iff no E in [t − T, t] (Def. 4.8).

    Every E the node has seen was reported at or before the tick, so "some E in [t − T, t]"
    is "the latest E time ≥ t − T": one number of state.
    """

    __slots__ = ("child", "pairs", "span", "tag", "tick")

    def __init__(self, child: Node, expr: ast.Negation, tag: str, tick: int) -> None:
        self.child = child
        self.span = expr.span
        self.pairs = expr.pairs
        self.tag = tag
        self.tick = tick

    def new_state(self, budget: Budget, first: int) -> NegationState:
        # Its ticks start at the default clock's first tick at or after the partition's start.
        g = self.tick
        return NegationState(self.child.new_state(budget, first), (first + g - 1) // g * g)

    def check(self, st: Any, budget: Budget) -> str:
        return _fits(self, st, NegationState) or self.child.check(st.child, budget)

    def _see(self, st: NegationState, occs: list[Occ]) -> None:
        for occ in occs:
            if st.latest is None or occ.time > st.latest:
                st.latest = occ.time

    def step(self, st: NegationState, key: Key, current: Occ, hits: Any, tick: Hashable) -> list[Occ]:
        self._see(st, self.child.step(st.child, key, current, hits, tick))
        return []

    def clock(self, st: NegationState, key: Key) -> list[Occ]:
        self._see(st, self.child.clock(st.child, key))
        t = st.next_tick
        if key != (t, sem.PASSIVE, ()):
            return []
        # The next tick that can report: none after unique_pairs' first report; none while
        # the latest E is within the span (it only moves later). A quiet gap costs the
        # passive events it reports, not its ticks.
        g = self.tick
        latest = st.latest
        blocked = latest is not None and latest >= t - self.span
        if not blocked:
            st.count += 1
        if self.pairs is ast.Pairs.UNIQUE and st.count:
            st.next_tick = NO_DUE[0]
        elif latest is not None and latest + self.span >= t + g:
            st.next_tick = (latest + self.span) // g * g + g
        else:
            st.next_tick = t + g
        if blocked or not sem.negation_picks(st.count, self.pairs):
            return []
        return [sem.passive(self.tag, t, label(t), None)]

    def due(self, st: NegationState) -> Key:
        return min(self.child.due(st.child), (st.next_tick, sem.PASSIVE, ()))

    def sweep(self, st: NegationState, now: int) -> None:
        self.child.sweep(st.child, now)

    def inert(self, st: NegationState, tick: Hashable, now: int) -> bool:
        return self.child.inert(st.child, tick, now)  # an E would move ``latest``

    def evict(self, st: NegationState, count: int) -> int:
        return self.child.evict(st.child, count)


class AnchoredNegationNode(Node):
    """(A ; (not E)_T): a passive event at t(a) + T when no E lies in (t(a), t(a) + T]."""

    __slots__ = ("child", "gc", "pairs", "span", "tag")

    def __init__(self, child: Node, expr: ast.Negation, tag: str, gc: bool) -> None:
        self.child = child
        self.span = expr.span
        self.pairs = expr.pairs
        self.tag = tag
        self.gc = gc

    def new_state(self, budget: Budget, first: int) -> AnchoredState:
        return AnchoredState(self.child.new_state(budget, first))

    def check(self, st: Any, budget: Budget) -> str:
        return _fits(self, st, AnchoredState) or self.child.check(st.child, budget)

    def anchor(self, st: AnchoredState, emitted: Key, occs: list[Occ]) -> None:
        for a in occs:
            deadline = (a.time + self.span, sem.PASSIVE, a.key)
            if deadline > emitted:
                st.order += 1
                heapq.heappush(st.pending, (deadline, st.order, a))

    def _see(self, st: AnchoredState, occs: list[Occ]) -> None:
        for occ in occs:
            insort(st.times, occ.time)

    def step(self, st: AnchoredState, key: Key, current: Occ, hits: Any, tick: Hashable) -> list[Occ]:
        self._see(st, self.child.step(st.child, key, current, hits, tick))
        return []

    def clock(self, st: AnchoredState, key: Key) -> list[Occ]:
        self._see(st, self.child.clock(st.child, key))
        out = []
        while st.pending and st.pending[0][0] == key:
            _, _, a = heapq.heappop(st.pending)
            deadline = a.time + self.span
            i = bisect_right(st.times, a.time)
            if i < len(st.times) and st.times[i] <= deadline:
                continue
            st.count += 1
            if sem.negation_picks(st.count, self.pairs):
                out.append(sem.passive(self.tag, deadline, label(deadline), a))
        self._trim(st, key[0])
        return out

    def _trim(self, st: AnchoredState, now: int) -> None:
        if self.gc and st.times:
            # A window (t(a), t(a) + T] of a pending or future anchor lies after this floor:
            # a future anchor is reported now or later, so its deadline is after now.
            floor = min((a.time for _, _, a in st.pending), default=now - self.span)
            floor = min(floor, now - self.span)
            cut = bisect_right(st.times, floor)
            if cut:
                del st.times[:cut]

    def sweep(self, st: AnchoredState, now: int) -> None:
        self.child.sweep(st.child, now)
        self._trim(st, now)

    def inert(self, st: AnchoredState, tick: Hashable, now: int) -> bool:
        return self.child.inert(st.child, tick, now)

    def due(self, st: AnchoredState) -> Key:
        head = st.pending[0][0] if st.pending else NO_DUE
        return min(head, self.child.due(st.child))

    def evict(self, st: AnchoredState, count: int) -> int:
        return self.child.evict(st.child, count)


class BinaryNode(Node):
    """Disjunction, conjunction or sequence with all_pairs / unique_pairs.

    The results a new view element adds all involve that element (it is the newest), so each
    step pairs it only with the kept elements of earlier lists. When both operands are
    primitive classes the step is fused (no child calls), and since their times never
    decrease, expiry is a queue in arrival order.
    """

    __slots__ = ("all_dups", "anchor", "any_last", "eoi", "gc", "is_disj", "is_seq", "ldup",
                 "leafy", "left", "limit", "lkind", "ln", "lpred", "pairs", "rdup", "right",
                 "rkind", "rn", "rpred", "span", "tag", "unique")

    def __init__(self, left: Node, right: Node, expr: ast.Binary, tag: str, gc: bool,
                 eoi: bool, limit: int = NO_LIMIT) -> None:
        self.left = left
        # Composites reported per step at most: the first ``limit`` in report order; the rest
        # are never made, so one event cannot make exponentially many (docs/semantics.md,
        # "The limit on composites").
        self.limit = limit
        self.right = right
        self.is_disj = isinstance(expr, ast.Disjunction)
        self.is_seq = isinstance(expr, ast.Sequence)
        self.ldup = expr.left.dup
        self.rdup = expr.right.dup
        # The selections as plain text and numbers: read on every element, and the compiled
        # engine reads a native attribute where an ast.Dup's would be a dictionary look-up.
        self.lkind: str = self.ldup.kind.value
        self.ln: int = self.ldup.n
        self.rkind: str = self.rdup.kind.value
        self.rn: int = self.rdup.n
        self.all_dups = self.lkind == "all" and self.rkind == "all"
        self.any_last = self.lkind == "last" or self.rkind == "last"
        self.span = None if isinstance(expr, ast.Disjunction) else expr.span
        self.pairs = expr.pairs
        self.unique = expr.pairs is ast.Pairs.UNIQUE
        self.tag = tag
        # The right operand when it is an anchored negation: it hears of each left occurrence.
        self.anchor = right if isinstance(right, AnchoredNegationNode) else None
        self.lpred = left.pred if isinstance(left, AttributeLeaf) else None
        self.rpred = right.pred if isinstance(right, AttributeLeaf) else None
        self.leafy = self.lpred is not None and self.rpred is not None
        self.gc = gc
        self.eoi = eoi

    def new_state(self, budget: Budget, first: int) -> BinaryState:
        if self.leafy:
            return BinaryState(None, None, budget)
        return BinaryState(self.left.new_state(budget, first), self.right.new_state(budget, first), budget)

    def check(self, st: Any, budget: Budget) -> str:
        # A fused node's operands are leaves: they expect no record (new_state makes none).
        return (_fits(self, st, BinaryState) or _shares(self, st.budget, budget)
                or self.left.check(st.left, budget) or self.right.check(st.right, budget))

    # ---- feeding

    def step(self, st: BinaryState, key: Key, current: Occ, hits: Any, tick: Hashable) -> list[Occ]:
        if self.leafy:
            if tick is not None:
                return []
            inl = self.lpred in hits
            inr = self.rpred in hits
            if not (inl or inr):
                return []
            st.now = key[0]
            found = self._element(st, key, current, LR if inl and inr else (L if inl else R),
                                  self.limit)
            if self.eoi:
                self._stage(st, found, key)
                return self._limited(st, self._finish_eoi(st, key))
            return [f[0] for f in found]
        lo = self.left.step(st.left, key, current, hits, tick)
        if self.anchor is not None:
            self.anchor.anchor(st.right, key, lo)
        ro = self.right.step(st.right, key, current, hits, tick)
        return self._feed(st, key, lo, ro)

    def clock(self, st: BinaryState, key: Key) -> list[Occ]:
        if self.leafy:
            return self._close_frames(st, key) if self.eoi and key[1] == sem.CLOSE else []
        lo = self.left.clock(st.left, key)
        if self.anchor is not None:
            self.anchor.anchor(st.right, key, lo)
        ro = self.right.clock(st.right, key)
        out = self._feed(st, key, lo, ro) if lo or ro else []
        if self.eoi and key[1] == sem.CLOSE:
            out.extend(self._close_frames(st, key))
            out = self._limited(st, out)  # what one close releases, with the step's own
        return out

    def due(self, st: BinaryState) -> Key:
        own = NO_DUE
        if self.eoi:
            for cand in st.pending:
                if cand.frame is not None and cand.wait_y:
                    own = min(own, (cand.frame, sem.CLOSE, 0))
        if self.leafy:
            return own
        return min(own, self.left.due(st.left), self.right.due(st.right))

    def floor(self, st: BinaryState, now: int) -> int:
        if self.leafy:
            return now
        return min(self.left.floor(st.left, now), self.right.floor(st.right, now))

    def inert(self, st: BinaryState, tick: Hashable, now: int) -> bool:
        if self.leafy:
            return True  # ticks never reach a fused node
        left = self.left.inert(st.left, tick, now)
        right = self.right.inert(st.right, tick, now)
        if left and right:
            return True
        if left == right or self.eoi or not self.gc:
            return False
        if self.anchor is not None and not left:
            # Each left occurrence is an anchor: the negation hears of it and may report its
            # absence (a tick that merely extends the left list still opens a window).
            return False
        # One operand is the time class itself: each tick is one element of that role. It
        # matters unless it extends the open list of its role (no new list: the next
        # element's rank is unchanged) and can never be selected (first or i-th beyond its
        # rank; nor kept) — or it is a sequence's posterior element with no anterior one kept
        # inside its frame (posterior elements are never kept).
        if type(self.right if left else self.left) is not TimeLeaf:
            return False
        role = R if left else L
        lists = st.lists
        if not lists or lists[-1].role != role:
            return False
        kind, n = (self.rkind, self.rn) if left else (self.lkind, self.ln)
        index = lists[-1].count
        if (kind == "first" and index >= 1) or (kind == "nth" and index >= n):
            return True
        if not self.is_seq or role != R:
            return False
        span = self.span
        for dl in lists:
            if dl.role & L:
                for _, occ in dl.kept.values():
                    if span is None or occ.time >= now - span:
                        return False
        return True

    def at_rest(self, st: BinaryState) -> bool:
        # Only with all_dup on both sides: otherwise the last duplicate list's length decides
        # whether the next element is first, last or i-th, however long ago the list began.
        return (self.all_dups and not self.eoi
                and not st.pending and not st.closing
                and not any(dl.kept for dl in st.lists)
                and (self.leafy or (self.left.at_rest(st.left) and self.right.at_rest(st.right))))

    def sweep(self, st: BinaryState, now: int) -> None:
        if not self.leafy:
            self.left.sweep(st.left, now)
            self.right.sweep(st.right, now)
        if self.span is not None and self.gc and now > st.now:
            self._gc(st, now, self.span)  # else a step at ``now`` already collected it

    def evict(self, st: BinaryState, count: int) -> int:
        done = 0
        for dl in st.lists:  # oldest list first, oldest element first
            while dl.kept and done < count:
                del dl.kept[next(iter(dl.kept))]
                done += 1
            if done >= count:
                break
        st.budget.stored -= done
        self._prune(st)
        if done < count and not self.leafy:
            done += self.left.evict(st.left, count - done)
            done += self.right.evict(st.right, count - done)
        return done

    def _feed(self, st: BinaryState, key: Key, lo: list[Occ], ro: list[Occ]) -> list[Occ]:
        if not lo and not ro:
            return []
        st.now = key[0]
        found: list[_Found] = []
        room = self.limit  # composites this step may still make (every element is taken)
        if ro and lo:
            # An occurrence both operands report in one step is one element with both roles.
            rids = {o.ident for o in ro}
            both = [o for o in lo if o.ident in rids]
            bids = {o.ident for o in both}
            for occ in lo:
                room = self._take(st, key, occ, LR if occ.ident in bids else L, room, found)
            for occ in ro:
                if occ.ident not in bids:
                    room = self._take(st, key, occ, R, room, found)
        else:
            for occ in lo:
                room = self._take(st, key, occ, L, room, found)
            for occ in ro:
                room = self._take(st, key, occ, R, room, found)
        if self.eoi:
            return self._limited(st, self._finish_eoi(st, key))
        return [f[0] for f in found]

    def _take(self, st: BinaryState, key: Key, occ: Occ, role: int, room: int,
              found: list[_Found]) -> int:
        """One element of a step: its results added to ``found`` (staged, at the end of the
        interval, before the next element can overwrite them); the room left."""
        made = self._element(st, key, occ, role, room)
        if self.eoi:
            self._stage(st, made, key)
        else:
            found.extend(made)
        return room - len(made)

    def _limited(self, st: BinaryState, out: list[Occ]) -> list[Occ]:
        """``out`` cut to the limit; a cut is counted in the profile's budget (the engine
        reports it)."""
        if len(out) > self.limit:
            st.budget.limited += 1
            del out[self.limit:]
        return out

    def _element(self, st: BinaryState, key: Key, occ: Occ, role: int,
                 room: int) -> list[_Found]:
        """Take one view element; the results it adds, at most ``room`` of them (the first in
        report order: a step that would make more counts in ``st.budget.limited``)."""
        pos = st.position
        st.position = pos + 1
        lists = st.lists
        last = lists[-1] if lists else None
        if last is not None and role != LR and last.role == role:
            dl = last
            if self.eoi:
                self._list_grew(st, dl)
        else:
            if last is not None and self.eoi:
                self._list_closed(st, last, key)
            dl = DList(last.number + 1 if last is not None else 0, role, pos)
            lists.append(dl)
            if self.gc:
                if self.unique:
                    if len(lists) > 2:
                        # Unique pairs only ever pair a list with its neighbour.
                        dropped = lists.popleft()
                        st.budget.stored -= len(dropped.kept)
                        dropped.kept.clear()
                else:
                    while len(lists) > 1 and not lists[0].kept:
                        lists.popleft()  # nothing left in it can be selected
        index = dl.count
        dl.count = index + 1
        if self.is_disj:
            found = self._disjunction(st, dl, index, occ, pos)
        elif self.is_seq:
            found = self._sequence(st, dl, index, occ, pos, room) if role & R else []
        else:
            found = self._conjunction(st, dl, index, occ, pos, role, room)
        if len(found) > room:
            # Made one beyond the room to know the limit was reached: the rest never are.
            st.budget.limited += 1
            del found[max(room, 0):]
        self._keep(st, dl, index, pos, occ)
        span = self.span
        if span is not None and self.gc:
            self._gc(st, st.now, span)
        return found

    # ---- the operators (same rules as semantics.binary_results)

    def _disjunction(self, st: BinaryState, dl: DList, index: int, occ: Occ, pos: int) -> list[_Found]:
        dups = ([self.ldup] if dl.role & L else []) + ([self.rdup] if dl.role & R else [])
        if any(sem.selected_single(d, index, dl.count) for d in dups):
            return [(occ, pos, pos, dl, dl)]
        return []

    def _sequence(self, st: BinaryState, dl: DList, index: int, e2: Occ, pos: int,
                  room: int) -> list[_Found]:
        rkind = self.rkind
        # Fig. 6 for the newest posterior element: first and <i> are positions; all and last
        # select it exactly when it lies inside the frame, which the time test checks.
        if (rkind == "first" and index != 0) or (rkind == "nth" and index != self.rn - 1):
            return []
        lists = st.lists
        if self.unique:
            if len(lists) < 2:
                return []
            prev = lists[-2]
            if prev.number != dl.number - 1 or not prev.role & L:
                return []
            anterior: Iterable[DList] = (prev,)
        else:
            anterior = [x for x in lists if x is not dl and x.role & L]
        span = self.span
        t2 = e2.time
        key2 = e2.key
        tag = self.tag
        anchored = self.anchor is not None
        out: list[_Found] = []
        for x in anterior:
            for p1, e1 in _selected(x, self.lkind, self.ln):
                t1 = e1.time
                if t1 >= t2 or (span is not None and t2 - t1 > span):
                    continue
                if anchored and e2.anchor != e1.ident:
                    continue
                if len(out) > room:
                    return out  # (made in report order: the rest lie beyond the limit)
                out.append((sem.composite(tag, e1, e2, key2), p1, pos, x, dl))
        return out

    def _conjunction(self, st: BinaryState, dl: DList, index: int, occ: Occ, pos: int,
                     role: int, room: int) -> list[_Found]:
        span = self.span
        lists = st.lists
        if self.unique:
            partners: Iterable[DList] = ()
            if dl.number % 2 == 1 and len(lists) >= 2 and lists[-2].number == dl.number - 1:
                partners = (lists[-2],)
        else:
            partners = [x for x in lists if x is not dl]
        rkind = self.rkind
        newest_selected_as_post = not (
            (rkind == "first" and index != 0) or (rkind == "nth" and index != self.rn - 1))
        selected_as_ante = index in sem.select_anterior(self.ldup, dl.count)
        t = occ.time
        found: list[_Found] = []
        # In report order, (anterior position, posterior position): first the results with the
        # new element posterior (an earlier anterior), by partner; then those with it anterior
        # (its position is the newest), by partner — so the making can stop at the limit.
        for other in partners:
            if not (role & R and other.role & L and newest_selected_as_post):
                continue
            for p1, e1 in _selected(other, self.lkind, self.ln):
                if span is not None and abs(t - e1.time) > span:
                    continue
                if len(found) > room:
                    return found
                found.append((sem.composite(self.tag, e1, occ, max(e1.key, occ.key)),
                              p1, pos, other, dl))
        if role & L and selected_as_ante:
            for other in partners:
                if not other.role & R or (role == LR and other.role == LR):
                    continue
                if self.unique and other.role & L and role & R:
                    continue  # in a block the earlier list is anterior when it can be
                # The other (earlier, closed) list is posterior: all of it lies before the
                # frame's upper bound, so m is its whole length.
                for p2, e2 in _selected(other, rkind, self.rn):
                    if span is not None and abs(e2.time - t) > span:
                        continue
                    if len(found) > room:
                        return found
                    found.append((sem.composite(self.tag, occ, e2, max(occ.key, e2.key)),
                                  pos, p2, dl, other))
        if len(found) > 1:
            found.sort(key=lambda f: (f[1], f[2]))
        return found

    # ---- what to keep

    def _keep(self, st: BinaryState, dl: DList, index: int, pos: int, occ: Occ) -> None:
        if not self.gc:
            dl.kept[index] = (pos, occ)
            st.budget.add()
            return
        if self.is_disj:
            return  # a disjunction pairs nothing with earlier elements
        if self.is_seq and not dl.role & L:
            return  # posterior elements of a sequence are never looked up later
        wanted = False
        if dl.role & L:
            wanted = _may_select(self.lkind, self.ln, index)
        if not wanted and dl.role & R and not self.is_seq:
            wanted = _may_select(self.rkind, self.rn, index)
        if not wanted:
            return
        if index and self.any_last:
            # Only the newest element of a list can be its last one from now on.
            prev = dl.kept.pop(index - 1, None)
            if prev is not None:
                if self._still_wanted(st, dl, index - 1):
                    dl.kept[index - 1] = prev
                else:
                    st.budget.stored -= 1
        dl.kept[index] = (pos, occ)
        budget = st.budget
        budget.stored += 1
        if budget.stored > budget.peak:
            budget.peak = budget.stored
        if self.leafy:
            st.expiry.append((occ.time, dl, index))

    def _still_wanted(self, st: BinaryState, dl: DList, index: int) -> bool:
        for kind, n, role in ((self.lkind, self.ln, L), (self.rkind, self.rn, R)):
            if not (dl.role & role and (role == L or not self.is_seq)):
                continue
            if kind == "all" or (kind == "first" and index == 0):
                return True
            if kind == "nth" and index == n - 1:
                return True
        return False

    def _gc(self, st: BinaryState, now: int, span: int) -> None:
        if not self.leafy:
            self._collect(st, now)
        elif st.expiry and st.expiry[0][0] < now - span:
            self._expire(st, now - span)

    def _expire(self, st: BinaryState, horizon: int) -> None:
        """Leaf operands' times never decrease: expire kept elements in arrival order."""
        expiry = st.expiry
        budget = st.budget
        while expiry and expiry[0][0] < horizon:
            _, dl, index = expiry.popleft()
            if dl.kept.pop(index, None) is not None:
                budget.stored -= 1
        self._prune(st)

    def _collect(self, st: BinaryState, now: int) -> None:
        # Every result from now on involves a new element, whose time is at least the
        # operands' floor (a repeated_pairs operand can report older composites).
        assert self.span is not None
        horizon = self.floor(st, now) - self.span
        for dl in st.lists:
            stale = [i for i, (_, o) in dl.kept.items() if o.time < horizon]
            for i in stale:
                del dl.kept[i]
            st.budget.stored -= len(stale)
        self._prune(st)

    def _prune(self, st: BinaryState) -> None:
        lists = st.lists
        while len(lists) > 1 and not lists[0].kept and (not self.unique or len(lists) > 2):
            lists.popleft()

    # ---- end-of-interval evaluation (root only)

    def _stage(self, st: BinaryState, found: list[_Found], key: Key) -> None:
        for occ, p1, p2, x, y in found:
            cand = Candidate(occ, p1, p2, x, y)
            if self.is_disj:
                dups = ([self.ldup] if x.role & L else []) + ([self.rdup] if x.role & R else [])
                index = x.count - 1
                cand.wait_x = all(d.kind == "last" for d in dups
                                  if sem.selected_single(d, index, x.count))
            else:
                cand.wait_x = self.lkind == "last" and x is st.lists[-1]
                if self.rkind == "last" and y is st.lists[-1]:
                    cand.wait_y = True
                    if self.span is not None:
                        cand.frame = occ_time(x, p1) + self.span
                        if (cand.frame, sem.CLOSE, 0) <= key:
                            cand.wait_y = False  # reported after its frame already ended
            if cand.ready():
                st.closing.append((key, p1, p2, occ))
            else:
                st.pending.append(cand)

    def _list_grew(self, st: BinaryState, dl: DList) -> None:
        # A newer element overwrites a provisional result that selected the previous last.
        keep = []
        for cand in st.pending:
            if cand.wait_x and cand.x is dl and (self.is_disj or self.lkind == "last"):
                continue
            if cand.wait_y and cand.y is dl:
                continue
            keep.append(cand)
        st.pending = keep

    def _list_closed(self, st: BinaryState, dl: DList, key: Key) -> None:
        for cand in st.pending:
            if cand.x is dl:
                cand.wait_x = False
            if cand.y is dl:
                cand.wait_y = False
        self._release(st, key)

    def _close_frames(self, st: BinaryState, key: Key) -> list[Occ]:
        for cand in st.pending:
            if cand.frame is not None and (cand.frame, sem.CLOSE, 0) <= key:
                cand.wait_y = False
        self._release(st, key)
        return self._finish_eoi(st, key)

    def _release(self, st: BinaryState, key: Key) -> None:
        """Move the candidates nothing can overwrite any more to this step's reports."""
        keep = []
        for cand in st.pending:
            if cand.ready():
                st.closing.append((key, cand.p1, cand.p2, cand.occ))
            else:
                keep.append(cand)
        st.pending = keep

    def _finish_eoi(self, st: BinaryState, key: Key) -> list[Occ]:
        if not st.closing:
            return []
        ready = sorted(c for c in st.closing if c[0] == key)
        st.closing = [c for c in st.closing if c[0] != key]
        return [c[3] for c in ready]


def _selected(dl: DList, kind: str, n: int) -> Iterable[tuple[int, Occ]]:
    """The kept elements of a (closed or growing) list that a selection (``kind``, ``n``:
    an ast.Dup's) selects, in list order; ``last`` is the list's newest element."""
    kept = dl.kept
    if kind == "all":
        return kept.values()
    index = 0 if kind == "first" else dl.count - 1 if kind == "last" else n - 1
    found = kept.get(index)
    return (found,) if found is not None else ()


_Found = tuple[Occ, int, int, DList, DList]


def occ_time(dl: DList, pos: int) -> int:
    for p, occ in dl.kept.values():
        if p == pos:
            return occ.time
    raise AssertionError("an anterior element of a pending result is always kept")


def _may_select(kind: str, n: int, index: int) -> bool:
    """Whether element ``index`` of a growing list can ever be selected by a selection
    (``kind``, ``n``: an ast.Dup's)."""
    if kind == "first":
        return index == 0
    if kind == "nth":
        return index == n - 1
    return True  # all, and last (the newest is the last until a newer one comes)


class RepeatedNode(Node):
    """Conjunction or sequence with repeated_pairs: after each element, match unique pairs on
    the unconsumed view, remove what matched, match again (DESIGN §3) — the definition itself,
    run on a view that garbage collection keeps small.

    Collection drops whole lists from the front of the unconsumed view only when every element
    in them is past its time frame, an even number of lists at a time, and keeps two such
    lists as a boundary: expired elements are never consumed, so lists never merge across the
    boundary, and the pairing of conjunction blocks keeps its parity.
    """

    __slots__ = ("anchor", "expr", "gc", "left", "limit", "right", "tag")

    def __init__(self, left: Node, right: Node, expr: ast.Conjunction | ast.Sequence, tag: str,
                 gc: bool, limit: int = NO_LIMIT) -> None:
        self.left = left
        # Composites reported per step at most (BinaryNode.limit). What is matched beyond it
        # is still consumed: the limit cuts the report, not the definition's consumption.
        self.limit = limit
        self.right = right
        self.expr = expr
        self.tag = tag
        self.anchor = right if isinstance(right, AnchoredNegationNode) else None
        self.gc = gc

    def new_state(self, budget: Budget, first: int) -> RepeatedState:
        return RepeatedState(self.left.new_state(budget, first), self.right.new_state(budget, first), budget)

    def check(self, st: Any, budget: Budget) -> str:
        return (_fits(self, st, RepeatedState) or _shares(self, st.budget, budget)
                or self.left.check(st.left, budget) or self.right.check(st.right, budget))

    def step(self, st: RepeatedState, key: Key, current: Occ, hits: Any, tick: Hashable) -> list[Occ]:
        lo = self.left.step(st.left, key, current, hits, tick)
        if self.anchor is not None:
            self.anchor.anchor(st.right, key, lo)
        return self._feed(st, key, lo, self.right.step(st.right, key, current, hits, tick))

    def clock(self, st: RepeatedState, key: Key) -> list[Occ]:
        lo = self.left.clock(st.left, key)
        if self.anchor is not None:
            self.anchor.anchor(st.right, key, lo)
        return self._feed(st, key, lo, self.right.clock(st.right, key))

    def due(self, st: RepeatedState) -> Key:
        return min(self.left.due(st.left), self.right.due(st.right))

    def floor(self, st: RepeatedState, now: int) -> int:
        own = min((e.occ.time for e in st.remaining), default=now)
        return min(own, self.left.floor(st.left, now), self.right.floor(st.right, now))

    def inert(self, st: RepeatedState, tick: Hashable, now: int) -> bool:
        return self.left.inert(st.left, tick, now) and self.right.inert(st.right, tick, now)

    def at_rest(self, st: RepeatedState) -> bool:
        # The unconsumed view is the whole state: empty, it is a fresh node's.
        return not st.remaining and self.left.at_rest(st.left) and self.right.at_rest(st.right)

    def sweep(self, st: RepeatedState, now: int) -> None:
        self.left.sweep(st.left, now)
        self.right.sweep(st.right, now)
        if self.gc and self.expr.span is not None and st.remaining:
            self._collect(st, now, self.expr.span)

    def evict(self, st: RepeatedState, count: int) -> int:
        done = min(count, len(st.remaining))
        del st.remaining[:done]
        st.budget.stored -= done
        if done < count:
            done += self.left.evict(st.left, count - done)
            done += self.right.evict(st.right, count - done)
        return done

    def _feed(self, st: RepeatedState, key: Key, lo: list[Occ], ro: list[Occ]) -> list[Occ]:
        if not lo and not ro:
            return []
        out: list[Occ] = []
        for element in sem.merge([(key, o) for o in lo], [(key, o) for o in ro]):
            st.remaining.append(element)
            st.budget.add()
            while True:
                found = sorted(sem.binary_results(self.expr, st.remaining, self.tag),
                               key=sem.result_order)
                if not found:
                    break
                used = {i for r in found for i in (r[1], r[2])}
                room = self.limit - len(out)
                if len(found) > room:
                    st.budget.limited += 1
                    del found[room:]
                out.extend(r[0] for r in found)
                st.remaining = [e for i, e in enumerate(st.remaining) if i not in used]
                st.budget.stored -= len(used)
        if self.gc and self.expr.span is not None:
            self._collect(st, key[0], self.expr.span)
        return out

    def _collect(self, st: RepeatedState, now: int, span: int) -> None:
        """Drop a dead prefix: lists whose every element is more than the span older than any
        element after them and any element still to come, so nothing can ever pair with it."""
        remaining = st.remaining
        lists = sem.cut(remaining)
        future = min(self.left.floor(st.left, now), self.right.floor(st.right, now))
        suffix_min = [future] * (len(lists) + 1)
        for i in range(len(lists) - 1, -1, -1):
            a, b = lists[i]
            suffix_min[i] = min(suffix_min[i + 1], min(remaining[j].occ.time for j in range(a, b)))
        dead = 0
        prefix_max = -(2**62)
        for k, (a, b) in enumerate(lists):
            prefix_max = max(prefix_max, max(remaining[j].occ.time for j in range(a, b)))
            if prefix_max < suffix_min[k + 1] - span:
                dead = k + 1
        drop = max(0, dead - 2) // 2 * 2
        if drop:
            cut_at = lists[drop][0]
            del st.remaining[:cut_at]
            st.budget.stored -= cut_at
