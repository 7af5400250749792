"""Admission: which events enter the trace, and in which order — one set of rules for every
path that takes events in (``evamed replay``, ``Publish``, the brokers' sources, the own feed's
reader). Pure: no I/O and no clock of its own (a caller that has one passes it).

The rules (docs/semantics.md §1 and §17 pin each with its test):

* **size** — a line (or a broker's payload) longer than ``max_bytes`` is ``too_large``;
* **duplicate** — an event whose ``(source, id)`` was admitted already (:class:`Ids`: two
  generations, rotated when the watermark passes the window, or when one is full);
* **late** — behind the watermark: older than the newest admitted time minus the lateness of
  its lane (a configured ingestion source; one lane in replay), at or before an explicit
  advance, or before an event already given out in time order;
* **future** — more than the horizon ahead of the reference: the newest admitted time, or the
  caller's clock when it has one (whichever is later). With a clock nothing later can be
  confirmed, so it is refused at once; without one (replay), it is held and the next event
  decides (:class:`Stream`);
* **admitted** events are handed on in time order (arrival order within an instant) once the
  watermark passes them: :class:`Reorder`, a bounded buffer.

Every refusal is a :class:`Refused` with one of :class:`Reason`.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Generic, TypeVar

from eva.events import DeadLetter, Event, EventError, brief_repr, format_time
from eva.units import format_span


class Reason(StrEnum):
    """Why an input was refused: every dead letter of the project carries one of these."""

    MALFORMED = "malformed"
    """Not a CloudEvent (what was wrong, with the decoder's position)."""
    TOO_LARGE = "too_large"
    """Longer than the size limit (the limit is named)."""
    DUPLICATE = "duplicate"
    """Its source and id were admitted already."""
    LATE = "late"
    """Behind the watermark (or, from a service, behind an instant decided already)."""
    FUTURE = "future"
    """More than the horizon ahead of the newest event time (or the clock)."""
    MISROUTED = "misrouted"
    """Produced at an autonomous service's coverage: publish it there."""
    FORBIDDEN = "forbidden"
    """Its source is not one the publishing client was granted (``clients add --sources``)."""
    STATE_CAP = "state_cap"
    """The engine's state cap evicted stored occurrences (answers that needed them are lost)."""
    COMPOSITE_LIMIT = "composite_limit"
    """An operator of a profile reached the limit on composites per event (those beyond it are
    never made; the mediator suspends the subscription)."""
    SERVICE_LIMIT = "service_limit"
    """A base service ended a query of a subscription at its work or store limit (the mediator
    suspends the subscription)."""
    PAYLOAD = "payload"
    """A broker's payload the mapping cannot take (not JSON where JSON is required, …)."""
    TIME = "time"
    """A broker message's time field is missing or unreadable."""
    ID = "id"
    """A broker message's id field is missing or unreadable."""
    TOPIC = "topic"
    """A broker's topic (or stream) no rule can map, or one that is not UTF-8."""
    ATTRIBUTE = "attribute"
    """A mapped attribute rendered empty."""
    DELETED = "deleted"
    """A Redis stream entry deleted before it was taken in."""


NEVER = 2**62
REMEMBERED = 100_000
"""Ids per generation of the duplicate memory (two generations)."""
CAPACITY = 50_000
"""Events the reorder buffer holds at most; beyond, the oldest is given out early (and an event
older than it is then late)."""
DEFAULT_LATENESS = 2_000_000
"""The mediator's allowed lateness when the configuration names none: 2 s."""
DEFAULT_HORIZON = 86_400_000_000
"""How far ahead of the newest event time (or the clock) an event may lie: 1 day."""
DEFAULT_MAX_BYTES = 1 << 20
"""The longest event (a CloudEvents line, or a broker's payload) the mediator takes: 1 MiB."""


@dataclass(frozen=True, slots=True)
class Refused:
    """A refusal: the reason and what the sender needs to fix it."""

    reason: Reason
    detail: str

    def letter(self, event: Event | None = None, raw: str | None = None) -> DeadLetter:
        return DeadLetter(str(self.reason), self.detail, event, raw)


HOLD = Refused(Reason.FUTURE, "held")
""":meth:`Admission.judge`'s answer for an event beyond the horizon with no clock to refute it:
held until the next event decides (:class:`Stream`)."""


@dataclass(frozen=True)
class Rules:
    """The admission settings. ``lateness``: µs an event may be behind the newest (the default
    lane's); ``lanes``: per lane (a configured source) where it differs; ``horizon``: µs ahead
    (None: no limit); ``remember``: µs of event time an id is remembered at least (None: as
    long as the count allows); ``capacity``: the reorder buffer's size; ``max_bytes``: the
    longest event (None: no limit), ``sizes`` per lane where it differs."""

    lateness: int = 0
    lanes: Mapping[str, int] = field(default_factory=dict)
    horizon: int | None = None
    remember: int | None = 0
    capacity: int = CAPACITY
    max_bytes: int | None = None
    sizes: Mapping[str, int] = field(default_factory=dict)
    remembered: int = REMEMBERED

    def lateness_of(self, lane: str) -> int:
        return self.lanes.get(lane, self.lateness)

    def max_bytes_of(self, lane: str) -> int | None:
        return self.sizes.get(lane, self.max_bytes)

    @property
    def longest(self) -> int:
        """The longest lateness of any lane: how long the reorder buffer holds an event."""
        return max([self.lateness, *self.lanes.values()])

    @property
    def window(self) -> int | None:
        """How long (event time) an id is remembered at least."""
        return None if self.remember is None else max(self.longest, self.remember)


def too_large(size: int, limit: int | None, what: str = "the event") -> Refused | None:
    """The size rule: ``what`` of ``size`` bytes against the limit."""
    if limit is None or size <= limit:
        return None
    return Refused(Reason.TOO_LARGE, f"{what} is {size:,} bytes, the limit is {limit:,} "
                   "(max_event_bytes)")


class Ids:
    """The (source, id) pairs of admitted events, in two generations: the older is dropped when
    the watermark passes the newest event time at which it stopped being the newer, plus the
    window (so an id is kept at least the window and at most about twice), or when the newer
    holds ``size`` ids. Two look-ups per event.

    Each pair keeps its event time, so a dropped generation leaves :attr:`forgotten`, the newest
    time it held: an event at or before it whose pair is not remembered may be a copy the
    memory no longer knows, and is refused (``late``) rather than taken — taken, a copy at its
    original time would repeat its composites' identities, and they would be lost without a
    trace (docs/semantics.md §17). A window rotation drops only times already behind the
    watermark, so this refuses something only after a count rotation: more than ``size`` ids
    within the lateness."""

    __slots__ = ("_new", "_old", "_rotate_at", "forgotten", "size", "window")

    def __init__(self, window: int | None, size: int = REMEMBERED) -> None:
        self.window = window
        self.size = size
        self._new: dict[tuple[str, str], int] = {}
        self._old: dict[tuple[str, str], int] = {}
        self._rotate_at = NEVER if window is None else -NEVER
        self.forgotten = -NEVER
        """The newest event time of an id dropped from the memory."""

    def __contains__(self, pair: object) -> bool:
        # (object, not tuple[str, str]: compiled, a typed pair is unboxed on the way in and a
        # new tuple is made for each look-up)
        return pair in self._new or pair in self._old

    def __len__(self) -> int:
        return len(self._new) + len(self._old)

    def rotate(self, done: int | None, newest: int | None, t: int) -> None:
        """Before an admission at ``t``: drop the older generation if the watermark ``done``
        passed its bound or the newer one is full."""
        if (done is not None and done > self._rotate_at) or len(self._new) >= self.size:
            if self._old:
                top = max(self._old.values())
                if top > self.forgotten:
                    self.forgotten = top
            self._old, self._new = self._new, {}
            window = self.window
            self._rotate_at = NEVER if window is None else (
                t if newest is None else newest) + window

    def add(self, pair: tuple[str, str], t: int) -> None:
        self._new[pair] = t

    def forget_until(self, t: int) -> None:
        """Ids of events at or before ``t`` may have been admitted without being remembered
        (a restart seeds the memory from the event log's tail only)."""
        if t > self.forgotten:
            self.forgotten = t


T = TypeVar("T")

HeldKey = tuple[int, ...]
"""A held item's order: its time first (then what breaks ties: an arrival number)."""


class Held(Generic[T]):
    """Items given out in key order, where nearly all come in that order: those that do are
    queued, the rest go to a heap, and the two are merged as items are taken — a heap push
    and pop per item was most of a reorder buffer's cost. Keys are unique (an arrival number
    breaks ties). Used by :class:`Reorder` and by the plan runner's held events."""

    def __init__(self) -> None:
        self._heap: list[tuple[HeldKey, T]] = []
        self._queue: deque[tuple[HeldKey, T]] = deque()

    def __len__(self) -> int:
        return len(self._heap) + len(self._queue)

    def push(self, key: HeldKey, item: T) -> None:
        queue = self._queue
        if not queue or queue[-1][0] < key:
            queue.append((key, item))
        else:
            heapq.heappush(self._heap, (key, item))

    def take(self, until: int, most: int = -1) -> list[tuple[HeldKey, T]]:
        """The entries whose time (``key[0]``) is at or before ``until``, in key order (at
        most ``most``; -1: all), taken out."""
        heap, queue = self._heap, self._queue
        out: list[tuple[HeldKey, T]] = []
        while most != 0:
            # (A flag, not an identity test: compiled, a tuple is copied by value.)
            if queue:
                first, queued = queue[0], True
                if heap and heap[0][0] < first[0]:
                    first, queued = heap[0], False
            elif heap:
                first, queued = heap[0], False
            else:
                break
            if first[0][0] > until:
                break
            if queued:
                queue.popleft()
            else:
                heapq.heappop(heap)
            out.append(first)
            most -= 1
        return out

    def first(self) -> tuple[HeldKey, T] | None:
        """The entry taken next (None: none held)."""
        heads = [held[0] for held in (self._heap, self._queue) if held]
        return min(heads, key=lambda entry: entry[0]) if heads else None

    def entries(self) -> list[tuple[HeldKey, T]]:
        """Every entry held, in key order (a state to save: pushed back, it is all queued)."""
        return sorted([*self._heap, *self._queue], key=lambda entry: entry[0])


class Reorder(Generic[T]):
    """Admitted items given out in time order (arrival order within an instant) once the
    watermark passes them: the newest time taken minus ``lateness``, or an advance, whichever
    is later. At most ``capacity`` are held; beyond, the oldest is given out early.

    With a ``clock`` (the mediator's) the newest time counts no later than now: an event ahead
    of the clock is held until its time comes rather than moving the watermark there — one
    producer's far-ahead event would otherwise make every other producer's events late."""

    def __init__(self, lateness: int = 0, capacity: int = CAPACITY,
                 clock: Callable[[], int] | None = None) -> None:
        if lateness < 0 or capacity < 1:
            raise ValueError(f"lateness {lateness} and capacity {capacity}: expected ≥ 0 and ≥ 1")
        self.lateness = lateness
        self.capacity = capacity
        self.clock = clock
        self.newest: int | None = None
        """The newest time taken."""
        self.released: int | None = None
        """The newest time given out."""
        self.advanced: int | None = None
        """Nothing at or before it comes any more (an advance)."""
        self.forced = 0
        """Items given out early because the buffer was full."""
        self._held: Held[T] = Held()  # keyed (time, arrival)
        self._arrivals = 0
        self._now: int | None = None  # the clock's reading while frozen (freeze)

    def __len__(self) -> int:
        return len(self._held)

    def behind(self, t: int) -> str:
        """Why an item at ``t`` can no longer be taken in order ("": it can)."""
        if self.advanced is not None and t <= self.advanced:
            return f"at or before the advance to {format_time(self.advanced)}"
        if self.released is not None and t < self.released:
            return (f"before {format_time(self.released)}, the newest event given out in time "
                    "order" + (f" (the reorder buffer was full: {self.capacity:,} events)"
                               if self.forced else ""))
        return ""

    def put(self, t: int, item: T) -> list[T]:
        """Take an item (the caller checked :meth:`behind`); what is now due, in order."""
        if self.newest is None or t > self.newest:
            self.newest = t
        if len(self._held) == 0 and t <= self._bound():
            self._arrivals += 1
            if self.released is None or t > self.released:
                self.released = t
            return [item]
        self._held.push((t, self._arrivals), item)
        self._arrivals += 1
        return self._due()

    def advance(self, t: int) -> list[T]:
        """Nothing at or before ``t`` comes any more: what is due, in order."""
        if self.advanced is None or t > self.advanced:
            self.advanced = t
        return self._due()

    def drain(self) -> list[T]:
        """Everything held, in order (the end of the input)."""
        out = self._pop(NEVER)
        return out

    def freeze(self) -> None:
        """Read the clock once for the calls that follow (a batch's items), until
        :meth:`thaw` — reading it per item cost more than the rest of ``put``. An item then
        ahead of that reading is held until a later batch's (the clock only caps)."""
        self._now = self.clock() if self.clock is not None else None

    def thaw(self) -> None:
        """The clock is read at each call again."""
        self._now = None

    def _top(self) -> int | None:
        """The newest time taken, no later than the clock."""
        newest = self.newest
        if newest is None or self.clock is None:
            return newest
        now = self._now
        if now is None:
            now = self.clock()
        return now if now < newest else newest

    def _bound(self) -> int:
        top = self._top()
        bound = -NEVER if top is None else top - self.lateness
        return bound if self.advanced is None or self.advanced < bound else self.advanced

    def _due(self) -> list[T]:
        out = self._pop(self._bound())
        if len(self._held) > self.capacity:
            forced = self._pop(NEVER, len(self._held) - self.capacity)
            self.forced += len(forced)
            out += forced
        return out

    def _pop(self, bound: int, most: int = -1) -> list[T]:
        """The held items at or before ``bound`` in order (at most ``most``; -1: all)."""
        out: list[T] = []
        for key, item in self._held.take(bound, most):
            if self.released is None or key[0] > self.released:
                self.released = key[0]
            out.append(item)
        return out

    @property
    def watermark(self) -> int | None:
        """Every instant at or before it is complete: given out whole (None: nothing yet)."""
        newest = self._top()
        mark = None if newest is None else newest - self.lateness - 1
        advanced = self.advanced
        if advanced is not None and (mark is None or advanced > mark):
            mark = advanced
        released = self.released
        if released is not None and (mark is None or released - 1 > mark):
            mark = released - 1
        return mark

    def held(self) -> Iterator[T]:
        """The items held, in no particular order."""
        return (item for _, item in self._held.entries())

    def oldest(self) -> tuple[int, T] | None:
        """(time, item) of the first item due (None: none held)."""
        first = self._held.first()
        return (first[0][0], first[1]) if first is not None else None


def put_events(reorder: Reorder[Event], events: list[Event | EventError], positions: list[int],
               start: int, out: list[Event]) -> int:
    """From index ``start``, each event renumbered by its position into ``reorder`` and what
    is due appended to ``out`` — the own feed's batch (mediator/ingestion.py) in one compiled
    loop — until an entry that is not an event or is behind what was given out: its index, for
    the caller to refuse with its reason (``len(events)``: none)."""
    n = len(events)
    i = start
    while i < n:
        entry = events[i]
        if isinstance(entry, EventError) or reorder.behind(entry.time):
            return i
        out.extend(reorder.put(entry.time, entry.renumbered(positions[i])))
        i += 1
    return n


class Admission:
    """The decision for one event at a time (dup, late, future) and the state it needs: the
    ids admitted, the newest admitted time per the rules, an advance. ``clock``: now, in µs
    (the mediator's wall clock; None in replay: an event beyond the horizon is then held)."""

    def __init__(self, rules: Rules, clock: Callable[[], int] | None = None) -> None:
        self.rules = rules
        self.clock = clock
        self.ids = Ids(rules.window, rules.remembered)
        self.newest: int | None = None
        """The newest admitted event time."""
        self.advanced: int | None = None
        """The newest advance: nothing at or before it is taken any more."""
        self.released: int | None = None
        """The newest time a reorder buffer gave out, when one follows (:class:`Stream`)."""

    def reference(self) -> int | None:
        """What the horizon is measured from: the newest time, or the clock if later."""
        now = self.clock() if self.clock is not None else None
        if now is None:
            return self.newest
        return now if self.newest is None or now > self.newest else self.newest

    def judge(self, event: Event, lane: str = "", done: int | None = None,
              newest: int | None = None, seen: set[tuple[str, str]] | None = None,
              at: int | None = None) -> Refused | None:
        """Why ``event`` is refused (:data:`HOLD`: held until the next event decides), or None.
        ``done``: the watermark (for the duplicate memory's rotation); ``newest`` and ``seen``:
        a :class:`Trial`'s view of what it took so far; ``at``: the clock's reading, when the
        caller read it (a Trial, once for its batch), else the clock is read here."""
        t = event.time
        if newest is None:
            newest = self.newest
        self.ids.rotate(done, self.newest, t)
        pair = (event.source, event.id)
        if pair in self.ids or (seen is not None and pair in seen):
            return Refused(Reason.DUPLICATE, f"an event with source {brief_repr(event.source)} "
                           f"and id {brief_repr(event.id)} was already admitted (CloudEvents: "
                           "source and id identify an event)")
        why = self.behind(t, lane, newest, at)
        if why:
            return Refused(Reason.LATE, f"event time {format_time(t)} is behind the watermark: "
                           f"{why}")
        if t <= self.ids.forgotten:
            return Refused(Reason.LATE, f"event time {format_time(t)} is at or before "
                           f"{format_time(self.ids.forgotten)}, the newest time the duplicate "
                           f"memory had to forget (more than {self.ids.size:,} events within "
                           "the allowed lateness): a copy of an event taken then could not be "
                           "told apart, and taken it would repeat that event's composites")
        horizon = self.rules.horizon
        if horizon is not None:
            now = at if at is not None or self.clock is None else self.clock()
            ref = newest if now is None else now if newest is None or now > newest else newest
            if ref is not None and t > ref + horizon:
                if now is None:
                    return HOLD
                return Refused(Reason.FUTURE, f"event time {format_time(t)} is more than "
                               f"{format_span(horizon)} ahead of the mediator's clock "
                               f"({format_time(ref)}): taken, it would make every later event "
                               "late (raise `future` if such times are real)")
        return None

    def behind(self, t: int, lane: str = "", newest: int | None = None,
               at: int | None = None) -> str:
        """Why a time is behind the watermark ("": it is not). ``at``: the clock's reading,
        when the caller read it (a Trial, once for its batch), else the clock is read here."""
        if self.advanced is not None and t <= self.advanced:
            return f"at or before the advance to {format_time(self.advanced)}"
        if newest is None:
            newest = self.newest
        if newest is not None and self.clock is not None:
            # Measured from now at the latest: an event another producer sent ahead of the
            # clock (within the horizon) must not make this one late (issue 29).
            now = at if at is not None else self.clock()
            newest = now if now < newest else newest
        late = self.rules.lateness_of(lane)
        if newest is not None and t < newest - late:
            return (f"the newest event time {format_time(newest)}"
                    + (f" minus the allowed lateness {format_span(late)}" if late else
                       " (no lateness allowed: events are taken in time order, those of one "
                       "instant in any order)"))
        if self.released is not None and t < self.released:
            return f"before {format_time(self.released)}, an event already given out in order"
        return ""

    def take(self, event: Event) -> None:
        """Record an admitted event."""
        self.ids.add((event.source, event.id), event.time)
        if self.newest is None or event.time > self.newest:
            self.newest = event.time

    def check_advance(self, t: int) -> str:
        """Why an advance to ``t`` is refused ("": it is taken): beyond the horizon."""
        horizon = self.rules.horizon
        ref = self.reference()
        if horizon is not None and self.clock is not None and ref is not None and (
                t > ref + horizon):
            return (f"advance_to_us {format_time(t)} is more than {format_span(horizon)} ahead "
                    f"of the mediator's clock (config `future`): no later event could be taken")
        return ""

    def advance(self, t: int) -> None:
        if self.advanced is None or t > self.advanced:
            self.advanced = t


class Trial:
    """One batch judged against an :class:`Admission` without changing it until
    :meth:`commit` (the door: a message is decided, appended durably, then committed — a batch
    that could not be appended leaves no trace)."""

    def __init__(self, admission: Admission) -> None:
        self.admission = admission
        self.seen: set[tuple[str, str]] = set()
        self.taken: list[Event] = []
        self.newest = admission.newest
        # The mediator's clock (the ``future`` rule), read once for the batch: a batch is
        # judged within milliseconds, and reading the wall clock per event cost a tenth of
        # the door's time.
        self.at = admission.clock() if admission.clock is not None else None

    def judge(self, event: Event, lane: str = "") -> Refused | None:
        refused = self.admission.judge(event, lane, None, self.newest, self.seen, self.at)
        if refused is None:
            self.seen.add((event.source, event.id))
            self.taken.append(event)
            if self.newest is None or event.time > self.newest:
                self.newest = event.time
        return refused

    def run(self, lines: list[str], decoded: list[Event | EventError | None], start: int,
            lane: str, allowed: dict[str, bool] | None, may: Callable[[str], bool],
            accepted: list[str], events: list[Event]) -> tuple[int, Refused | None]:
        """The door's batch (mediator/door.py) from index ``start``, in one compiled loop: each
        line whose event was decoded (``decoded``; None or an error: it was not), is of a
        source the client may publish under (``allowed``: the answers of ``may`` per source,
        filled here; None: any source) and is admitted, appended to ``accepted`` (its line)
        and ``events`` — up to the first line that is not: its index, with its refusal if the
        rules refused it (the caller says why otherwise); ``(len(lines), None)`` at the end."""
        n = len(lines)
        i = start
        while i < n:
            event = decoded[i]
            if not isinstance(event, Event):
                return i, None
            if allowed is not None:
                source = event.source
                ok = allowed.get(source)
                if ok is None:
                    ok = allowed[source] = may(source)
                if not ok:
                    return i, None
            refused = self.judge(event, lane)
            if refused is not None:
                return i, refused
            accepted.append(lines[i].rstrip("\r\n"))
            events.append(event)
            i += 1
        return n, None

    def commit(self) -> None:
        for event in self.taken:
            self.admission.take(event)
        self.taken = []


class Stream:
    """The whole admission of a trace (``evamed replay``): each event judged, an event beyond
    the horizon held until the next event decides, the admitted given out in time order as
    the watermark passes them. Dead letters go to ``dead_letter``."""

    def __init__(self, rules: Rules, dead_letter: Callable[[DeadLetter], None]) -> None:
        self.rules = rules
        self.admission = Admission(rules)
        self.reorder: Reorder[Event] = Reorder(rules.longest, rules.capacity)
        self.dead_letter = dead_letter
        self._lateness = rules.lateness  # the fast path's settings, read once
        self._horizon = NEVER if rules.horizon is None else rules.horizon
        self.origin: int | None = None
        """Just before the earliest time an admitted event can have: the first admitted time
        minus the longest lateness, less one (None before the first)."""
        self._held: Event | None = None

    @property
    def watermark(self) -> int | None:
        return self.reorder.watermark

    def push(self, event: Event) -> list[Event]:
        """One event; what is now due, in time order."""
        if self._held is not None:
            return self._after_held(event)
        # The common case first, inline (a replay takes millions): no advance, a copy or a
        # late or far-ahead event is left to the general path below.
        admission = self.admission
        newest = admission.newest
        t = event.time
        if (newest is not None and newest - self._lateness <= t <= newest + self._horizon
                and admission.advanced is None):
            ids = admission.ids
            done = newest - self._lateness - 1  # the watermark, as nothing was forced out
            if (done > ids._rotate_at or len(ids._new) >= ids.size) and not self.reorder.forced:
                ids.rotate(done, newest, t)
            fresh = ids._new
            pair: Any = (event.source, event.id)  # (Any: one tuple for its three uses)
            if (pair not in fresh and pair not in ids._old and len(fresh) < ids.size
                    and done <= ids._rotate_at and t > ids.forgotten):
                reorder = self.reorder
                released = reorder.released
                if released is None or t >= released:
                    fresh[pair] = t
                    top = t if t > newest else newest
                    admission.newest = reorder.newest = top
                    if len(reorder._held) == 0 and t <= top - reorder.lateness:
                        reorder._arrivals += 1
                        if released is None or t > released:
                            reorder.released = admission.released = t
                        return [event]
                    out = reorder.put(t, event)
                    admission.released = reorder.released
                    return out
        refused = admission.judge(event, "", self.reorder.watermark)
        if refused is HOLD:
            self._held = event  # a typo'd year or a real gap: only what comes next can tell
            return []
        if refused is not None:
            self.dead_letter(refused.letter(event))
            return []
        return self._admit(event)

    def _admit(self, event: Event) -> list[Event]:
        if self.origin is None:
            self.origin = event.time - self.rules.longest - 1
        self.admission.take(event)
        out = self.reorder.put(event.time, event)
        self.admission.released = self.reorder.released
        return out

    def _after_held(self, event: Event) -> list[Event]:
        """The event after one held beyond the horizon decides it: at most the horizon before
        it or later, the stream moved there and the held event is admitted (first: it arrived
        first); else it was a typo, a ``future`` dead letter. Then the event is taken as any
        other. A copy of the held event decides the same way, except a copy at the held one's
        very time — a redelivery — which decides nothing."""
        held = self._held
        assert held is not None
        horizon = self.rules.horizon or 0
        copy = event.source == held.source and event.id == held.id
        if copy and event.time == held.time:
            self.dead_letter(DeadLetter(
                str(Reason.DUPLICATE), f"an event with source {brief_repr(event.source)} and id "
                f"{brief_repr(event.id)} is held (beyond the horizon) already", event))
            return []
        self._held = None
        if event.time >= held.time - horizon:
            out = self._admit(held)
            if copy:
                self.dead_letter(DeadLetter(
                    str(Reason.DUPLICATE), f"an event with source {brief_repr(event.source)} and "
                    f"id {brief_repr(event.id)} was already admitted", event))
                return out
        else:
            self._future(held, f"and the next event ({brief_repr(event.id)} at "
                         f"{format_time(event.time)}{', a copy of it' if copy else ''}) is not "
                         f"within {format_span(horizon)} before it or later: a jump nothing "
                         "confirms (the horizon; raise it if the gap is real)")
            out = []
        return out + self.push(event)

    def _future(self, event: Event, why: str) -> None:
        self.dead_letter(DeadLetter(
            str(Reason.FUTURE), f"event time {format_time(event.time)} is more than "
            f"{format_span(self.rules.horizon or 0)} ahead of the newest event time "
            f"{format_time(self.admission.newest or 0)}, {why}", event))

    def advance(self, t: int) -> list[Event]:
        """No event at or before ``t`` will come; a clock within the horizon before a held
        event confirms it."""
        out = self._release_held(t, False)
        self.admission.advance(t)
        out += self.reorder.advance(t)
        self.admission.released = self.reorder.released
        return out

    def close(self, until: int | None = None) -> list[Event]:
        """The end of the input: a held event admitted if ``until`` confirms it (else
        ``future``), then everything held, in order."""
        out = self._release_held(until, True)
        return out + self.reorder.drain()

    def _release_held(self, until: int | None, final: bool) -> list[Event]:
        held = self._held
        if held is None:
            return []
        if until is not None and until >= held.time - (self.rules.horizon or 0):
            self._held = None
            return self._admit(held)
        if final:
            self._held = None
            self._future(held, "and no event came after it to confirm the jump before the end "
                         "of the input (raise the horizon, or end the trace at or after its "
                         "time, if the gap is real)")
        return []


__all__ = ["CAPACITY", "DEFAULT_HORIZON", "DEFAULT_LATENESS", "DEFAULT_MAX_BYTES", "HOLD",
           "REMEMBERED", "Admission", "Ids", "Reason", "Refused", "Reorder", "Rules", "Stream",
           "Trial", "too_large"]
