"""The incremental engine: many profiles at once, one event (or clock step) at a time.

* Events arrive in any order within each source's allowed lateness; the engine orders them by
  (time, arrival) and processes an instant once every source's watermark has passed it. Late
  and malformed events go to the dead-letter record with the reason; nothing stops.
* Within an instant: primitive events in arrival order, then ticks of time classes, then the
  clock steps of negations (passive events) and of end-of-interval results — the total order of
  DESIGN §3, the same as the reference evaluator's.
* Each event is matched once against the distinct class predicates that can match its
  ``type`` — through a predicate index (:class:`~eva.classes.ClassIndex`: equality and range
  tests by look-up, not one by one) — then handed to the profiles that use those classes only.
* Stored state is bounded by the retention horizons of :mod:`eva.retention`; a
  profile whose state cannot be bounded is held under ``state_cap`` and an overflow is reported
  as a dead letter with reason ``state_cap``.
* Each operator reports at most ``composite_limit`` composites per step (the number can grow
  exponentially with nesting under EVA's own semantics): a step that reaches it is reported as
  a dead letter with reason ``composite_limit``.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass
from typing import Any

from eva import ast
from eva import semantics as sem
from eva.admission import Stream
from eva.classes import ClassIndex, TypePlan, label, next_tick
from eva.compiler import ProfileSpec, compile_profile, external_id
from eva.events import (
    PRIMITIVE,
    DeadLetter,
    Event,
    EventError,
    brief_repr,
    field_path,
    format_time,
)
from eva.interrupt import STOP, Interrupted
from eva.retention import longest, retention
from eva.semantics import Key, Notification, Occ, partition_key
from eva.state import Budget, SnapshotError
from eva.units import format_span

NEVER = 2**62
_CANONICAL = frozenset((str, int, bool))
"""Types of ``per`` values equal to every other value of their partition key."""
COMPOSITE_LIMIT = 10_000
"""The default limit on composites an operator reports per step (docs/semantics.md, "The limit
on composites": 10 s of a client's stream at the default ``limits.rate``)."""
COMPACT_OPENED = 4096
"""Entries of a profile's list of partitions not kept (``_Profile.opened``) at which it is
first compacted."""
REMEMBERED = 100_000
"""Ids per generation of the duplicate memory (two generations): what bounds it when its time
window holds more events, or is unbounded."""


@dataclass
class EngineConfig:
    tick: int = 1_000_000
    """Granularity (µs) of the default clock at which free-standing negations are evaluated."""
    allowed_lateness: int = 0
    """How far (µs) behind its source's newest event an event may arrive and still count."""
    gc: bool = True
    """Drop stored occurrences past their retention horizon (off only to test it changes nothing)."""
    state_cap: int = 1_000_000
    """Stored occurrences per profile: beyond it the oldest are evicted (to 90 % of the cap)
    and the overflow is reported as a dead letter — answers that needed them are lost."""
    sources: tuple[str, ...] = ()
    """Sources known in advance: no instant is processed before each of them has reported,
    so a source that starts late is not mistaken for a late one."""
    sweep: int = 4096
    """Events between sweeps that collect every partition up to the clock (at least as many
    as there are partitions, so a sweep costs O(1) per event); 0: never. Without them a
    partition is collected only when it gets an event, so partitions that stop getting events
    (a delivered parcel, a closed session) would keep their state for good."""
    horizon: int | None = None
    """How far (µs) ahead of the newest admitted event time an event may lie and be admitted
    at once. One beyond it is held until the next event decides: admitted (before it) if that
    event lies at most the horizon before it or later — the stream really moved — else a dead
    letter with reason ``future``, as it is if the input ends first (``close`` before its
    time). A typo'd year would otherwise move the clock there, and every later event would be
    late. None: no limit (``evamed replay``: 1d)."""
    remember: int | None = 0
    """At least how long (µs of event time: until every instant up to its time plus this is
    processed) an admitted event's (source, id) is remembered, so that another event with both
    is a dead letter with reason ``duplicate``; None: as long as the count allows. The engine
    remembers at least the allowed lateness and the longest retention horizon of its profiles
    anyway: an engine that only admits events for evaluation elsewhere (``replay --via``) is
    told the profiles' here."""
    composite_limit: int | None = COMPOSITE_LIMIT
    """Composites each operator of a profile reports per step (an event, a tick, a clock step)
    of a partition at most: the first ones in report order; the rest are never made, and the
    step is reported as a dead letter with reason ``composite_limit``. None: no limit."""

    def to_json(self) -> dict[str, Any]:
        """The configuration as a JSON object (field name → value; ``sources`` a list): what a
        checkpoint keeps, and compares, to resume with the same configuration."""
        return {"tick": self.tick, "allowed_lateness": self.allowed_lateness, "gc": self.gc,
                "state_cap": self.state_cap, "sources": list(self.sources),
                "sweep": self.sweep, "horizon": self.horizon, "remember": self.remember,
                "composite_limit": self.composite_limit}

    @classmethod
    def from_json(cls, data: Any) -> EngineConfig:
        """The configuration ``to_json`` wrote; ValueError naming the field that is missing,
        unknown or of the wrong type."""
        if not isinstance(data, dict):
            raise ValueError(f"engine configuration: expected a JSON object, found "
                             f"{type(data).__name__}")
        expected = set(cls().to_json())
        given = sorted(data)
        if "composite_limit" not in data:  # written before the limit existed: the default
            data = {**data, "composite_limit": COMPOSITE_LIMIT}
        if set(data) != expected:  # (the fields as given, not with the default added)
            raise ValueError(f"engine configuration: fields {given}, expected "
                             f"{sorted(expected)}")
        counts = ("tick", "allowed_lateness", "state_cap", "sweep")
        for name in (*counts, "horizon", "remember", "composite_limit"):
            value = data[name]
            if not (type(value) is int or (value is None and name not in counts)):
                raise ValueError(f"engine configuration: {name} is {brief_repr(value)}, "
                                 "expected an integer" + ("" if name in counts else " or null"))
        if type(data["gc"]) is not bool:
            raise ValueError(f"engine configuration: gc is {brief_repr(data['gc'])}, "
                             "expected true or false")
        sources = data["sources"]
        if not isinstance(sources, list) or not all(type(s) is str for s in sources):
            raise ValueError(f"engine configuration: sources is {brief_repr(sources)}, "
                             "expected a list of strings")
        return cls(data["tick"], data["allowed_lateness"], data["gc"], data["state_cap"],
                   tuple(sources), data["sweep"], data["horizon"], data["remember"],
                   data["composite_limit"])


EXTERNAL_SOURCE = "eva.external"
"""The source whose watermark the occurrences given to ``Engine.feed`` share."""


@dataclass(frozen=True, slots=True)
class Fed:
    """An occurrence given to ``Engine.feed``, buffered until its instant."""

    profile: str
    leaf: Hashable
    occ: Occ
    partition: Any
    at: Key | None = None
    """Its step key when the operand reported it at a tick or a clock step of its instant
    (phase > 0); None: a step of phase 0, in arrival order with the instant's events."""


class _Partition:
    # A plain class, not a dataclass: mypyc compiles its constructor, while a dataclass's
    # generated __init__ runs interpreted — and the engine builds one per new ``per`` value.
    __slots__ = ("created", "key", "order", "state", "value")

    def __init__(self, value: Any, key: Hashable, state: Any, created: Key | None,
                 order: int) -> None:
        self.value = value
        self.key = key  # partition_key(value); None without ``per``
        self.state = state  # the root's state record (eva.state)
        self.created = created
        # Its number in order of creation within its profile (_Profile.next_order): same-key
        # clock steps run in it, and state cap overflows evict in it.
        self.order = order


class _Profile:
    __slots__ = ("budget", "compact_at", "doc_id", "droppable", "evicted", "index",
                 "next_order", "opened", "partitions", "path", "preds", "profile", "single",
                 "spec", "start", "tick_ids", "timed", "touched", "unloaded", "unsorted")

    def __init__(self, index: int, profile: ast.Profile, doc_id: int, start: int | None,
                 spec: ProfileSpec, tick_ids: frozenset[Hashable], budget: Budget,
                 gc: bool) -> None:
        self.index = index
        self.profile = profile
        self.doc_id = doc_id
        self.start = start
        self.spec = spec  # compiled once; each partition holds only its state
        self.preds: frozenset[int] = spec.preds
        self.tick_ids = tick_ids
        self.timed = spec.timed
        self.budget = budget
        self.partitions: dict[Hashable, _Partition] = {}
        # Partitions are numbered in order of creation (_Partition.order), kept or not: a new
        # partition left at rest is not kept (_step_value), but until the next sweep it holds
        # the place it would have had in ``partitions`` had it been kept, since ``_check_cap``
        # evicts in that order. ``opened``: (key, number) of each one since the last sweep
        # (an append, no look-up: the first of a key counts), compacted to the first of each
        # key when it reaches ``compact_at`` entries (sweeps may be rare, or off).
        self.next_order = 0
        self.opened: list[tuple[Hashable, int]] = []
        self.compact_at = COMPACT_OPENED
        self.single: _Partition | None = None  # the partition of a profile without ``per``
        self.evicted = 0
        # The ``per`` path, split once (events.field_path); None without ``per``.
        self.path = None if profile.per is None else field_path(profile.per)
        # A partition at rest answers as the one a new event of its key would create, so it
        # need not be kept (unless clock-driven: it acts without events, from its creation).
        self.droppable = gc and profile.per is not None and not spec.timed and not tick_ids
        # Keys of the partitions changed (stepped, created, collected, evicted, dropped) since
        # the engine's changes were last taken (``Engine.changed_partitions``); None until
        # then, so an engine nobody asks keeps no such set.
        self.touched: set[Hashable] | None = None
        # Keys of partitions a core restored (eva.snapshot.restore_core) lists whose records
        # are not read yet (``Engine._load``); ``unsorted``: some were read out of creation
        # order, so ``partitions`` is sorted again before it is walked (``_load_all``).
        self.unloaded: set[Hashable] = set()
        self.unsorted = False


class Engine:
    """Evaluate registered profiles incrementally over an event stream."""

    def __init__(self, config: EngineConfig | None = None,
                 dead_letter: Callable[[DeadLetter], None] | None = None) -> None:
        self.config = config or EngineConfig()
        self.dead_letter = dead_letter or (lambda _: None)
        self.index = ClassIndex()
        self._docs: list[ast.Document] = []
        self._class_maps: list[dict[str, ast.ClassDef]] = []
        self._profiles: dict[int, _Profile] = {}
        self._next_index = 0
        self._by_pred: dict[int, list[_Profile]] = {}
        # type → (its plan in the index, the predicate ids the type alone implies, the profiles
        # those step): what an event steps unless the plan finds more (``TypePlan.extra``).
        self._dispatch: dict[str, tuple[TypePlan, frozenset[int], list[_Profile]]] = {}
        self._named: dict[str, list[_Profile]] = {}  # by profile name, in registration order
        self._clocked = False  # any profile with negation, end-of-interval or time classes
        self._time_classes: dict[Hashable, tuple[ast.Every, int, list[_Profile]]] = {}
        self._buffer: list[tuple[int, int, Event | Fed]] = []
        # The current instant's fed occurrences of a later phase (Fed.at), sorted by (step key,
        # arrival) from last to first: stepped among the instant's ticks and clock steps.
        self._staged: list[tuple[Key, int, Fed]] = []
        self._arrivals = 0
        # A declared source that has not reported yet holds the frontier back.
        self._source_max: dict[str, int] = {s: -(2**62) for s in self.config.sources}
        self._done_until: int | None = None  # every instant ≤ this has been processed
        self._progress: int | None = None  # the latest time any event was processed at
        self._max_time: int | None = None
        # (due key, profile index, partition number, partition key): the number before the
        # key, unique within a clock-driven profile, so keys of different kinds (a JSON
        # object's text, a number's tuple) are never compared.
        self._timers: list[tuple[Key, int, int, Hashable]] = []
        self._out: list[Notification] = []
        self._next_sweep = self.config.sweep  # arrivals at which the next sweep is due
        # (source, id) of admitted events, in two generations: the older is dropped when the
        # instants processed pass ``_rotate_at`` (the newest event time when it stopped being
        # the newer, plus the window: so an id is kept until every instant up to its event's
        # time plus the window is processed, at most about twice the window) or the newer
        # holds REMEMBERED ids: two set look-ups per event.
        self._ids: set[tuple[str, str]] = set()
        self._old_ids: set[tuple[str, str]] = set()
        self._id_window: int | None = 0
        self._rotate_at = -(2**62)
        # The instants processed as of the end of the last push: the duplicate memory rotates
        # by these, not by an advance made since — a base service steps the clock to just
        # before each event (a gap's clock-driven work) and the memory then rotated one push
        # earlier than the same events pushed alone (issue 26).
        self._pushed_done: int | None = None
        self._held: Event | None = None  # beyond the horizon: the next event decides
        self.admitted: list[Event] | None = None
        """When a list, every admitted event is appended to it, in arrival order (the order
        of its ``seq`` in keys): for a caller that only admits events here and evaluates them
        elsewhere (``replay --via``, ``--engine spark``)."""
        self.instants = 0
        """Instants processed so far (introspection: clock-driven work is proportional to it)."""
        self.origin: int | None = None
        """Where the clock started (see ``begin``); None before the first event."""
        # Reads a partition's record the first time it is needed (profile index, key, budget
        # → [value, state, created, order]): set by ``import_state`` from a core.
        self._loader: Callable[[int, Hashable, Budget], list[Any]] | None = None
        # (profile index, partition keys) of profiles removed since the changes were taken.
        self._gone: list[tuple[int, list[Hashable]]] = []
        self._changed()

    # ---------------------------------------------------------------- registration

    def add_document(self, doc: ast.Document, profiles: Iterable[str] | None = None, *,
                     start: int | None = None) -> list[str]:
        """Register a document's profiles (all, or those named), seeing events after ``start``
        (default: the engine's current progress, or just before the first event)."""
        doc_id = self._add_doc(doc)
        wanted = set(profiles) if profiles is not None else None
        names = []
        if start is None and self._done_until is not None:
            # Registration is at the engine's progress: what it has processed is in the past.
            start = max(self._done_until, self._progress or self._done_until)
        for profile in doc.profiles:
            if wanted is not None and profile.name not in wanted:
                continue
            entry = self._register(doc_id, profile, self._next_index, start)
            self._next_index += 1
            if start is not None:
                self._started(entry)
            names.append(profile.name)
        self._changed()
        return names

    def _add_doc(self, doc: ast.Document) -> int:
        self._docs.append(doc)
        self._class_maps.append(doc.class_map())
        return len(self._docs) - 1

    def _register(self, doc_id: int, profile: ast.Profile, index: int,
                  start: int | None) -> _Profile:
        """Compile a profile of a registered document, once, and index it for dispatch."""
        doc = self._docs[doc_id]
        spec = compile_profile(profile, self._class_maps[doc_id], self.index, doc_id=doc_id,
                               tick=self.config.tick, gc=self.config.gc,
                               limit=self.config.composite_limit)
        ticks = frozenset(self._add_time_class(doc_id, doc, name) for name in spec.ticks)
        entry = _Profile(index, profile, doc_id, start, spec, ticks, Budget(self.config.state_cap),
                         self.config.gc)
        self._profiles[index] = entry
        for pred in spec.preds:
            self._by_pred.setdefault(pred, []).append(entry)
        for tick_id in ticks:
            self._time_classes[tick_id][2].append(entry)
        return entry

    def _changed(self) -> None:
        self._dispatch.clear()
        self._named = {}
        for p in self._profiles.values():
            self._named.setdefault(p.profile.name, []).append(p)
        # (External operands too: a fed occurrence may be due after the instant's events.)
        self._clocked = any(p.timed or p.tick_ids or p.spec.externals
                            for p in self._profiles.values())
        # An id is remembered while a copy could still be admitted at its time (the allowed
        # lateness) or could pair with what its original left in state (retention).
        # (A new window applies from the next rotation.)
        self._id_window = longest([self.config.allowed_lateness, self.config.remember,
                                   *(retention(p.profile.expr).horizon
                                     for p in self._profiles.values())])

    def _add_time_class(self, doc_id: int, doc: ast.Document, name: str) -> Hashable:
        tick_id = (doc_id, name)
        if tick_id not in self._time_classes:
            index = [c.name for c in doc.classes].index(name)
            every = self._class_maps[doc_id][name].body
            assert isinstance(every, ast.Every)
            self._time_classes[tick_id] = (every, index, [])
        return tick_id

    def remove_profile(self, name: str) -> bool:
        """Unregister every profile of that name; its state is released."""
        found = list(self._named.get(name, ()))
        for p in found:
            del self._profiles[p.index]
            if p.touched is not None:  # its partitions' records are kept somewhere: dropped
                # ... with those swept since the last take (in touched, no longer held)
                self._gone.append((p.index, list({*p.partitions, *p.unloaded, *p.touched})))
            for pred in p.preds:
                users = self._by_pred[pred]
                users.remove(p)
                if not users:  # no profile needs it matched any more
                    self.index.release(pred)
            for tick_id in p.tick_ids:
                self._time_classes[tick_id][2].remove(p)
        self._changed()
        return bool(found)

    # ---------------------------------------------------------------- input

    def push(self, event: Event) -> list[Notification]:
        """Accept one event (its arrival order becomes its ``seq``); returns whatever the
        watermark now lets the engine report."""
        out = self._push(event)
        self._pushed_done = self._done_until
        return out

    def _push(self, event: Event) -> list[Notification]:
        if self._held is not None:
            return self._after_held(event)
        wm = self._source_max.get(event.source)
        done = self._done_until
        if self._is_late(event.time, wm, done):
            self._late(event, wm, done)
            return []
        if self._beyond_horizon(event.time):
            # A typo'd year or a real gap: only what comes next can tell.
            self._held = event
            return []
        return self._admit(event, wm, done)

    def would_admit(self, event: Event) -> bool:
        """Whether ``push`` would admit ``event`` now and process it at once — asked without
        side effects, so a caller that steps the clock before a push (a base service over a
        quiet gap) steps nothing for an event that is then refused. The same tests as ``push``
        and ``_admit``, in their order."""
        if self._held is not None:
            return False  # the push decides the held event first: it steps nothing before
        done = self._done_until
        if self._is_late(event.time, self._source_max.get(event.source), done) or (
                self._beyond_horizon(event.time)):
            return False
        ident: Any = (event.source, event.id)  # (Any: compiled, one tuple for both look-ups)
        return ident not in self._ids and (self._rotates(done) or ident not in self._old_ids)

    def _is_late(self, t: int, wm: int | None, done: int | None) -> bool:
        """Behind its source's watermark (``wm``) less the lateness, or within the instants
        already processed (``done``)."""
        return (wm is not None and t < wm - self.config.allowed_lateness) or (
            done is not None and t <= done)

    def _beyond_horizon(self, t: int) -> bool:
        newest = self._max_time
        horizon = self.config.horizon
        return horizon is not None and newest is not None and t > newest + horizon

    def _rotates(self, done: int | None) -> bool:
        """Whether the duplicate memory drops its older generation before the next admission:
        by the instants processed as of the last push (``_pushed_done``, at most ``done``)."""
        pushed = self._pushed_done
        if done is not None and pushed is not None and min(done, pushed) > self._rotate_at:
            return True
        return len(self._ids) >= REMEMBERED

    def _admit(self, event: Event, wm: int | None, done: int | None) -> list[Notification]:
        """An event on time (``wm``: its source's newest time, ``done``: the instants
        processed) is admitted unless a duplicate, and processed as far as the watermark
        allows."""
        t = event.time
        ids = self._ids
        if self._rotates(done):
            # Every id in the older generation is of an event at most ``_rotate_at`` minus the
            # window: a copy at its original's time is now late, and one at a new time meets
            # nothing its original left (retention counts from the same instants). The newer
            # generation's are at most the newest time so far.
            window = self._id_window
            top = self._max_time
            self._old_ids = ids
            ids = self._ids = set()
            self._rotate_at = NEVER if window is None else (t if top is None else top) + window
        # Any, not the inferred tuple[str, str]: compiled, a typed tuple is a C struct, and
        # each of its three uses below as an object made a new tuple of it.
        ident: Any = (event.source, event.id)
        if ident in ids or ident in self._old_ids:
            self._duplicate(event, "was already admitted")
            return []
        ids.add(ident)
        if self.admitted is not None:
            self.admitted.append(event)
        late = self.config.allowed_lateness
        source_max = self._source_max
        seq = self._start(t, event.source, done)
        if not late and not self._clocked and not self._buffer and (
                not source_max or (wm is not None and len(source_max) == 1)):
            # In order, one source, no lateness and no clock-driven work: nothing happens at
            # the end of an instant, so the event can be processed on arrival.
            if wm is None or t > wm:
                source_max[event.source] = t
                self._max_time = t
            out = self._out = []
            self._primitive(event, (t, 0, seq))
            self._done_until = t - 1
            self._progress = t
            return out
        return self._enqueue(t, seq, event, event.source, wm)

    def _start(self, t: int, source: str, done: int | None) -> int:
        """Start the clock at the first input (once every declared source has reported) and
        number the input in arrival order: its ``seq``."""
        if done is None and (not self.config.sources or all(
                self._source_max[s] > -(2**62) for s in self.config.sources if s != source)):
            # The clock starts just before the earliest time still acceptable once every
            # declared source has reported: profiles registered before any input see the whole
            # trace (replay), and time classes tick from there.
            self.begin(min([t, *(e[0] for e in self._buffer)]) - self.config.allowed_lateness - 1)
        seq = self._arrivals
        self._arrivals = seq + 1
        return seq

    def _enqueue(self, t: int, seq: int, item: Event | Fed, source: str,
                 wm: int | None) -> list[Notification]:
        """Buffer an admitted input; process the instants every source has now passed."""
        heapq.heappush(self._buffer, (t, seq, item))
        if wm is not None and t <= wm:
            return []  # its source's watermark did not move, so no instant completed
        source_max = self._source_max
        source_max[source] = t
        if self._max_time is None or t > self._max_time:
            self._max_time = t
        late = self.config.allowed_lateness
        # Instants up to the bound are complete: no source can still add to them.
        return self._run_until((t if len(source_max) == 1 else min(source_max.values())) - late - 1)

    def feed(self, profile: str, leaf: str, occ: Occ, partition: Any = None,
             emitted: Key | None = None) -> list[Notification]:
        """Deliver one occurrence of the external operand ``<leaf>`` of the profiles named
        ``profile`` (in partition ``partition`` of a ``per`` profile), stepped where the
        operand reported it — ``emitted``, its report key in this engine's key space (default
        ``occ.time``, phase 0), as the reference's trace view places it:

        * phase 0: a step of that instant after the inputs already given for it, in time
          order with pushed events (its report key is the step's, numbered in arrival order);
        * a later phase (reported at a tick, a passive event, an end-of-interval close): a step
          at that key's place among the instant's ticks (by class position) and clock steps
          (by key) — at a key equal to one of the engine's own steps, first if the operand
          stands left of what makes that step in the profile (Def. 4.1: left side first).

        Feeds share one watermark (:data:`EXTERNAL_SOURCE`): one behind it, or at an instant
        already processed, is a ``late`` dead letter. A profile or leaf that is not registered,
        or a partition that does not fit the profile, is a ValueError (a caller's mistake)."""
        targets = self._named.get(profile)
        if not targets:
            raise ValueError(f"feed: no profile {profile!r} is registered")
        for p in targets:
            if leaf not in p.spec.externals:
                leaves = sorted(p.spec.externals)
                raise ValueError(f"feed: profile {profile!r} has no external operand <{leaf}> "
                                 f"(it has {', '.join(f'<{n}>' for n in leaves) or 'none'})")
            if (partition is None) != (p.profile.per is None):
                raise ValueError(f"feed: profile {profile!r} is " + (
                    f"partitioned (per {p.profile.per}): name the partition" if partition is None
                    else f"not partitioned: got partition {brief_repr(partition)}"))
        t = occ.time if emitted is None else emitted[0]
        at = emitted if emitted is not None and emitted[1] != PRIMITIVE else None
        wm = self._source_max.get(EXTERNAL_SOURCE)
        done = self._done_until
        if self._is_late(t, wm, done):
            self.dead_letter(DeadLetter("late", f"occurrence {brief_repr(occ.events)} of <{leaf}> "
                                        f"for profile {profile!r} at {label(t)} is behind the "
                                        f"watermark: {self._behind(t, wm, done)}"))
            return []
        seq = self._start(t, EXTERNAL_SOURCE, done)
        return self._enqueue(t, seq, Fed(profile, external_id(leaf), occ, partition, at),
                             EXTERNAL_SOURCE, wm)

    def _after_held(self, event: Event) -> list[Notification]:
        """The event after one held beyond the horizon decides it: at most the horizon before
        it or later, the stream moved there and the held event is admitted (first: it arrived
        first); else it was a typo, a ``future`` dead letter. Then the event is taken as any
        other (it may be held in turn). A copy of the held event (same source and id) decides
        the same way — a corrected resend of a typo must refuse it, not be refused by it —
        except a copy at the held one's very time, a redelivery, which decides nothing."""
        held = self._held
        assert held is not None
        horizon = self.config.horizon or 0
        confirms = event.time >= held.time - horizon
        copy = event.source == held.source and event.id == held.id
        if copy and event.time == held.time:
            # A redelivery (at-least-once transports repeat an event as it was) is no evidence
            # of where the stream is: else a typo delivered twice would confirm itself.
            self._duplicate(event, "is held (beyond the horizon) already")
            return []
        self._held = None
        if confirms:
            out = self._admit(held, self._source_max.get(held.source), self._done_until)
            if copy:
                # The copy of an event now admitted: a duplicate, whatever its time (taken as
                # any other it could be called late, or held in turn and refused later).
                self._duplicate(event, "was already admitted")
                return out
        else:
            self._future(held, f"and the next event ({brief_repr(event.id)} at "
                         f"{label(event.time)}{', a copy of it' if copy else ''}) is not "
                         f"within {format_span(horizon)} before it or later: a jump nothing "
                         "confirms (the horizon; raise it if the gap is real)")
            out = []
        return out + self.push(event)

    def _release_held(self, until: int | None, final: bool) -> list[Notification]:
        """The held event when no next event decides it: admitted if ``until`` (a clock that
        moved, or the end of the trace) reaches the horizon before it; else, at the end
        (``final``), a ``future`` dead letter."""
        held = self._held
        if held is None:
            return []
        if until is not None and until >= held.time - (self.config.horizon or 0):
            self._held = None
            return self._admit(held, self._source_max.get(held.source), self._done_until)
        if final:
            self._held = None
            self._future(held, "and no event came after it to confirm the jump before the end "
                         "of the input (raise the horizon, or end the trace at or after its "
                         "time, if the gap is real)")
        return []

    def _future(self, event: Event, why: str) -> None:
        self.dead_letter(DeadLetter(
            "future", f"event time {label(event.time)} is more than "
            f"{format_span(self.config.horizon or 0)} ahead of the newest event time "
            f"{label(self._max_time or 0)}, {why}", event))

    def _duplicate(self, event: Event, what: str) -> None:
        self.dead_letter(DeadLetter(
            "duplicate", f"an event with source {brief_repr(event.source)} and id "
            f"{brief_repr(event.id)} {what} (CloudEvents: source and id identify an event)",
            event))

    def _late(self, event: Event, wm: int | None, done: int | None) -> None:
        self.dead_letter(DeadLetter("late", f"event time {label(event.time)} is behind the "
                                    f"watermark: {self._behind(event.time, wm, done)}", event))

    def _behind(self, t: int, wm: int | None, done: int | None) -> str:
        late = self.config.allowed_lateness
        if wm is not None and t < wm - late:
            return (f"its source's newest event time {label(wm)}"
                    + (f" minus the allowed lateness {format_span(late)}" if late else ""))
        return f"the instants already processed (up to {label(done or 0)})"

    def begin(self, origin: int) -> None:
        """Start the clock just after ``origin``: profiles registered without a start see events
        after it, time classes tick from it. Normally the first event decides; an engine that
        evaluates part of a trace (one partition on Spark) is told the whole trace's origin."""
        if self._done_until is not None:
            return
        self.origin = origin
        self._done_until = origin
        for p in self._profiles.values():
            if p.start is None:
                p.start = origin
                self._started(p)

    def _started(self, p: _Profile) -> None:
        if p.profile.per is None and None not in p.partitions:
            p.single = p.partitions[None] = self._new_partition(p, None, None, None)
            self._touch(p, None)

    def malformed(self, detail: str, raw: str | None = None) -> None:
        self.dead_letter(DeadLetter("malformed", detail, None, raw))

    def advance(self, time: int) -> list[Notification]:
        """Declare that no event at or before ``time`` will come (e.g. from a wall clock); a
        clock within the horizon before an event held beyond it confirms that event."""
        out = self._release_held(time, False)
        return out + self._run_until(time)

    def close(self, until: int | None = None) -> list[Notification]:
        """End of input: process everything up to ``until`` (default: the newest event time).
        An event held beyond the horizon is admitted if ``until`` confirms it, else refused."""
        out = self._release_held(until, True)
        end = until if until is not None else self._max_time
        if end is None:
            return out
        return out + self._run_until(end)

    # ---------------------------------------------------------------- the instant loop

    def _run_until(self, bound: int) -> list[Notification]:
        out = self._out = []
        if not self._clocked:
            # No clock-driven work: the instants are exactly the events' times.
            buffer = self._buffer
            step = self._input
            while buffer and buffer[0][0] <= bound:
                t, seq, item = heapq.heappop(buffer)
                step(item, (t, 0, seq))
            if self._done_until is not None and bound > self._done_until:
                self._done_until = bound
            return out
        stop = STOP
        while True:
            instant = self._next_instant()
            if instant is None or instant > bound:
                break
            if stop[0]:  # a signal asked for a stop: here, between two instants
                raise Interrupted(f"interrupted before {instant} µs")
            self._instant(instant)
            self._done_until = instant
        if self._done_until is not None and bound > self._done_until:
            self._done_until = bound
        return out

    def next_instant(self) -> int | None:
        """The earliest instant with work pending (a buffered event, a timer, a tick), if any:
        a caller that drives the clock (``advance``) need not come back before it."""
        return self._next_instant() if self._clocked or self._buffer else None

    def _next_instant(self) -> int | None:
        candidates = []
        if self._buffer:
            candidates.append(self._buffer[0][0])
        while self._timers and not self._timer_valid(self._timers[0]):
            heapq.heappop(self._timers)
        if self._timers:
            candidates.append(self._timers[0][0][0])
        best = min(candidates) if candidates else None
        after = self._done_until
        if after is None:
            return best
        for tick_id, (every, _, subscribers) in self._time_classes.items():
            if subscribers:
                t = next_tick(every, after)
                # A class whose tick would change nothing skips to after the next other
                # instant: a quiet gap costs what its ticks report, not their number.
                if (best is None or t < best) and not self._inert(tick_id, subscribers, t):
                    best = t
        return best

    def _inert(self, tick_id: Hashable, subscribers: list[_Profile], t: int) -> bool:
        """Whether a tick of that class at ``t`` and every later one would change nothing for
        its subscribers while no other instant comes (``Node.inert``)."""
        for p in subscribers:
            if p.start is None or t <= p.start or (p.profile.per is None and p.single is None):
                return False
            self._load_all(p)
            for partition in p.partitions.values():
                if not p.spec.root.inert(partition.state, tick_id, t):
                    return False
        return True

    def _instant(self, t: int) -> None:
        self.instants += 1
        while self._buffer and self._buffer[0][0] == t:
            _, seq, item = heapq.heappop(self._buffer)
            self._input(item, (t, 0, seq))
        staged = self._staged
        if staged:
            staged.sort(key=_staged_order, reverse=True)
        self._ticks(t)
        while True:
            due_key = self._due_at(t)
            if staged and (due_key is None or self._fed_first(staged[-1], due_key,
                                                             due_key[1])):
                at, _, fed = staged.pop()
                self._fed(fed, at)
                continue
            if due_key is None:
                break
            due = [heapq.heappop(self._timers)]
            while self._timers and self._timers[0][0] == due_key:
                due.append(heapq.heappop(self._timers))
            # Popped in order: by profile, then partition in order of creation.
            due = [d for d in due if self._timer_valid(d)]
            seen: set[tuple[int, Hashable]] = set()
            for key, pidx, _, part in due:
                if (pidx, part) in seen:
                    continue
                seen.add((pidx, part))
                profile = self._profile_by_index(pidx)
                if profile is None:
                    continue
                partition = self._partition(profile, part)
                if partition is None:
                    continue
                self._emit(profile, partition, key, profile.spec.root.clock(partition.state, key))
                self._touch(profile, part)
                self._schedule(profile, partition)

    def _due_at(self, t: int) -> Key | None:
        """The key of the next valid timer if it is due at ``t``."""
        timers = self._timers
        while timers and not self._timer_valid(timers[0]):
            heapq.heappop(timers)
        if timers and timers[0][0][0] == t:
            return timers[0][0]
        return None

    def _fed_first(self, staged: tuple[Key, int, Fed], key: Key, other: Hashable) -> bool:
        """Whether a staged fed occurrence comes before the engine's own step at ``key``
        (``other``: what makes that step — a time class's name, or a clock step's phase)."""
        at = staged[0]
        return at < key or (at == key and self._leads(staged[2], other))

    def _leads(self, fed: Fed, other: Hashable) -> bool:
        """Whether the fed operand comes first at a key equal to the step of ``other`` (a time
        class's name, or a clock step's phase): whether it stands before the end, in
        pre-order, of every node making that step — the time class, a negation (which sees
        its operand's elements at keys up to its own), the root (an end-of-interval close sees
        the whole view). The trace view takes the left side first (Def. 4.1)."""
        for p in self._profiles.values():
            if p.profile.name != fed.profile:
                continue
            walk = ast.walk(p.profile.expr)
            mine = len(walk)
            theirs = len(walk)
            for i, node in enumerate(walk):
                if isinstance(node, ast.External) and external_id(node.name) == fed.leaf:
                    mine = min(mine, i)
                elif (isinstance(node, ast.Prim) and node.name == other) or (
                        isinstance(node, ast.Negation) and other == sem.PASSIVE):
                    theirs = min(theirs, i + len(ast.walk(node)))
            return mine < theirs
        return True

    def _profile_by_index(self, index: int) -> _Profile | None:
        return self._profiles.get(index)

    def _timer_valid(self, timer: tuple[Key, int, int, Hashable]) -> bool:
        profile = self._profile_by_index(timer[1])
        if profile is None:
            return False
        partition = self._partition(profile, timer[3])
        return partition is not None and profile.spec.root.due(partition.state) == timer[0]

    def _plan(self, type_: str) -> tuple[TypePlan, frozenset[int], list[_Profile]]:
        plan = self.index.plan(type_)
        implied = plan.implied()
        return plan, implied, self._users(implied)

    def _users(self, hits: Iterable[int]) -> list[_Profile]:
        """The profiles using those predicates, in registration order."""
        stepped = {p.index: p for pred in hits for p in self._by_pred.get(pred, ())}
        return [stepped[i] for i in sorted(stepped)]

    def _primitive(self, event: Event, key: Key) -> None:
        if self._arrivals >= self._next_sweep > 0:
            self._sweep()
        type_ = event.type
        found = self._dispatch.get(type_)
        if found is None:
            found = self._dispatch[type_] = self._plan(type_)
        plan, hits, stepped = found
        self.index.tests += plan.decided
        if plan.dynamic:
            extra = plan.extra(event)
            if extra:
                hits = hits | extra
                stepped = self._users(hits)
        if not stepped:
            return
        t = event.time
        occ = sem.primitive(event.id, event.source, t, key)
        for p in stepped:
            if t <= p.start:  # type: ignore[operator]
                continue
            partition = p.single
            if partition is not None:
                self._step(p, partition, key, occ, hits, None)
                continue
            path = p.path
            assert path is not None
            value = event.field_at(path[0], path[1])
            if value is not None:
                self._step_value(p, value, key, occ, hits, None)

    def _input(self, item: Event | Fed, key: Key) -> None:
        if type(item) is Event:
            self._primitive(item, key)
            return
        assert isinstance(item, Fed)
        if item.at is not None:
            self._staged.append((item.at, key[2], item))  # stepped at its key (_instant)
            return
        self._fed(item, key)

    def _fed(self, item: Fed, key: Key) -> None:
        """A fed occurrence, stepped at ``key`` in its profiles."""
        for p in self._named.get(item.profile, ()):
            if p.start is None or key[0] <= p.start:
                continue
            partition = p.single
            if partition is None:
                self._step_value(p, item.partition, key, item.occ, frozenset(), item.leaf)
            else:
                self._step(p, partition, key, item.occ, frozenset(), item.leaf)

    def _step_value(self, p: _Profile, value: Any, key: Key, occ: Occ, hits: Any,
                    tick: Hashable) -> None:
        """One input through the partition of a ``per`` value, created at ``key`` if new. A
        new partition the step leaves at rest, having reported nothing, is not kept: the sweep
        would drop it (``_sweep``), and the next input of its key makes the same one again —
        for a value its key gives back (a float's key is -0.0's too, a JSON object's is that
        of its keys in any order: kept until a sweep finds it at rest, it reports the value
        that opened it, as a partition kept from the start would). Half the partitions of a
        sequence are opened by a posterior event that finds nothing. Until the next sweep, a
        partition not kept is listed with its creation number (``_Profile.opened``: an append,
        no look-up): kept later, it takes the first such place in the eviction order."""
        part_key = partition_key(value)
        partition = p.partitions.get(part_key)
        if partition is None and p.unloaded:
            partition = self._load(p, part_key)
        if partition is not None:
            self._step(p, partition, key, occ, hits, tick)
            return
        partition = self._new_partition(p, value, part_key, key)
        root = p.spec.root
        occs = root.step(partition.state, key, occ, hits, tick)
        if occs or p.budget.limited or not p.droppable or type(value) not in _CANONICAL or (
                not root.at_rest(partition.state)):
            p.partitions[part_key] = partition
            self._stepped(p, partition, key, occs)
        else:
            opened = p.opened
            opened.append((part_key, partition.order))
            if len(opened) >= p.compact_at:
                _compact_opened(p)

    def _step(self, p: _Profile, partition: _Partition, key: Key, occ: Occ, hits: Any,
              tick: Hashable) -> None:
        """One input through one partition."""
        self._stepped(p, partition, key, p.spec.root.step(partition.state, key, occ, hits, tick))

    def _stepped(self, p: _Profile, partition: _Partition, key: Key, occs: list[Occ]) -> None:
        """What follows a step of a partition: its reports, its timer, its state cap."""
        touched = p.touched
        if touched is not None:
            touched.add(partition.key)
        if occs or p.budget.limited:
            self._emit(p, partition, key, occs)
        if p.timed:
            self._schedule(p, partition)
        if p.budget.stored > p.budget.cap:
            self._check_cap(p)

    def _sweep(self) -> None:
        """Collect every partition as a step at the clock would (``Node.sweep``) and drop the
        partitions left at rest: called before an event is processed, when every instant up
        to ``_done_until`` has been."""
        now = self._done_until
        partitions = 0
        for p in self._profiles.values():
            if now is not None and self.config.gc:
                self._load_all(p)
                self._touch_all(p)  # collected: their records may change
                droppable = p.droppable
                resting = []
                root = p.spec.root
                for part_key, partition in p.partitions.items():
                    root.sweep(partition.state, now)
                    if droppable and root.at_rest(partition.state):
                        resting.append(part_key)
                for part_key in resting:
                    del p.partitions[part_key]
                if p.opened:
                    # A partition kept at a later input than the one that opened it keeps the
                    # place it was opened at; the rest of the list were at rest and would go now.
                    for part_key, order in _first_opened(p).items():
                        kept = p.partitions.get(part_key)
                        if kept is not None and order < kept.order:
                            kept.order = order
                    p.opened.clear()
            partitions += len(p.partitions) + len(p.unloaded)
        self._next_sweep = self._arrivals + max(self.config.sweep, partitions)

    def _ticks(self, t: int) -> None:
        fired = []
        for tick_id, (every, index, subscribers) in self._time_classes.items():
            # On its grid at t (the ticks before it since the last instant, if any, were
            # inert and skipped: see _next_instant).
            if subscribers and self._done_until is not None and next_tick(every, t - 1) == t:
                fired.append((index, tick_id, subscribers))
        fired.sort(key=lambda f: (f[0], f[1]))
        staged = self._staged
        for index, tick_id, subscribers in fired:
            name = tick_id[1]  # type: ignore[index]
            occ = sem.time_event(name, index, t, label(t))
            while staged and self._fed_first(staged[-1], occ.key, name):
                at, _, fed = staged.pop()
                self._fed(fed, at)
            for p in sorted(subscribers, key=lambda p: p.index):
                if p.start is None or t <= p.start:
                    continue
                self._started(p)
                self._load_all(p)
                for partition in list(p.partitions.values()):
                    if partition.created is not None and occ.key < partition.created:
                        continue
                    self._emit(p, partition, occ.key,
                               p.spec.root.step(partition.state, occ.key, occ, frozenset(), tick_id))
                    self._touch(p, partition.key)
                    if p.timed:
                        self._schedule(p, partition)

    def _new_partition(self, p: _Profile, value: Any, part_key: Hashable,
                       created: Key | None) -> _Partition:
        """A partition of ``value`` (key ``part_key``), created at ``created``, numbered next
        in its profile; the caller keeps it."""
        assert p.start is not None
        first = created[0] if created is not None else p.start + 1
        order = p.next_order
        p.next_order = order + 1
        partition = _Partition(value, part_key, p.spec.new_state(p.budget, first), created,
                               order)
        if p.timed:
            self._schedule(p, partition)
        return partition

    def _schedule(self, p: _Profile, partition: _Partition) -> None:
        due = p.spec.root.due(partition.state)
        if due[0] < NEVER:
            heapq.heappush(self._timers, (due, p.index, partition.order, partition.key))

    def _emit(self, p: _Profile, partition: _Partition, key: Key, occs: list[Occ]) -> None:
        """A step's reports (every step of a partition ends here, or in ``_stepped``)."""
        for occ in occs:
            self._out.append(Notification(p.profile.name, partition.value, occ, key))
        if p.budget.limited:
            self._limited(p, partition, key)

    def _limited(self, p: _Profile, partition: _Partition, key: Key) -> None:
        """A step at which operators reached the composite limit: one dead letter."""
        operators = p.budget.limited
        p.budget.limited = 0
        where = "" if p.profile.per is None else f" of partition {brief_repr(partition.value)}"
        self.dead_letter(DeadLetter(
            "composite_limit", f"profile {p.profile.name!r} reached its limit of "
            f"{self.config.composite_limit:,} composites per step (composite_limit) at "
            f"{format_time(key[0])}{where}: {operators} operator"
            f"{'' if operators == 1 else 's'} made no more; its composites can grow "
            "exponentially (see evamed check): bound its spans or duplicates, or raise the "
            "limit"))

    def _check_cap(self, p: _Profile) -> None:
        budget = p.budget
        excess = budget.stored - budget.cap * 9 // 10
        evicted = 0
        self._load_all(p)
        for partition in _oldest_first(p):
            if evicted >= excess:
                break
            self._touch(p, partition.key)
            evicted += p.spec.root.evict(partition.state, excess - evicted)
        budget.overflowed += 1
        p.evicted += evicted
        self.dead_letter(DeadLetter(
            "state_cap", f"profile {p.profile.name!r} exceeded its cap of {budget.cap} stored "
            f"occurrences (overflow {budget.overflowed}); evicted the {evicted} oldest, "
            f"{p.evicted} in all — answers that needed them are lost; bound the profile's "
            "span (see evamed check) or raise the cap"))

    # ---------------------------------------------------------------- state as data

    def export_state(self, records: bool = True) -> dict[str, Any]:
        """The engine's state as data (for :mod:`eva.snapshot`): documents, class predicates
        in id order, profiles with their partitions' state records, clock and buffers —
        nothing compiled (the specs are compiled again from the documents). Without
        ``records`` (a core: ``eva.snapshot.snapshot_core``) a profile's partitions are their
        keys only, and none is read through the loader."""
        profiles = []
        for p in self._profiles.values():
            if records:
                self._load_all(p)
                partitions: list[Any] = [_record(q) for q in p.partitions.values()]
            else:
                partitions = [*p.partitions, *p.unloaded]
            profiles.append([p.index, p.doc_id, p.profile, p.start, p.evicted, p.budget,
                             partitions, p.next_order, p.opened])
        return {"config": self.config.to_json(), "docs": self._docs,
                "predicates": self.index.predicates(), "tests": self.index.tests,
                "next_index": self._next_index, "profiles": profiles,
                "clock": [self._buffer, self._arrivals, self._source_max, self._done_until,
                          self._progress, self._max_time, self._timers, self._next_sweep,
                          self._ids, self._old_ids, self._rotate_at, self._held, self.admitted,
                          self.instants, self.origin]}

    @classmethod
    def import_state(cls, state: dict[str, Any],
                     dead_letter: Callable[[DeadLetter], None] | None = None,
                     loader: Callable[[int, Hashable, Budget], list[Any]] | None = None
                     ) -> Engine:
        """The engine ``export_state`` described (its profiles compiled again); SnapshotError
        when a profile's records do not fit the profile compiled again (``Node.check``). With
        a ``loader``, the state is a core (``export_state(records=False)``): a partition's
        record is read through it the first time the engine needs the partition (a profile
        without ``per``'s one partition at once), and only changes from here on are taken."""
        engine = cls(EngineConfig.from_json(state["config"]), dead_letter)
        engine._loader = loader
        for pred in state["predicates"]:
            engine.index.add(pred, {})  # the same ids, in the same order
        engine.index.tests = state["tests"]
        for doc in state["docs"]:
            engine._add_doc(doc)
        for record in state["profiles"]:
            engine._import_profile(record)
        for pred in range(len(state["predicates"])):
            if not engine._by_pred.get(pred):  # released before the export: not matched again
                engine.index.release(pred)
        engine._next_index = state["next_index"]
        (engine._buffer, engine._arrivals, engine._source_max, engine._done_until,
         engine._progress, engine._max_time, engine._timers, engine._next_sweep, engine._ids,
         engine._old_ids, engine._rotate_at, engine._held, engine.admitted, engine.instants,
         engine.origin) = state["clock"]
        engine._pushed_done = engine._done_until  # (not in the snapshot: as if just pushed)
        engine._changed()
        return engine

    def _import_profile(self, record: list[Any]) -> None:
        """Register a profile ``export_state`` described, with its partitions, once every
        record is checked against the profile compiled again: a record of the wrong kind or
        budget (another profile's state, records swapped) is refused here. The check is of
        shape, not of every field's value: a crafted snapshot with a well-shaped record holding
        a wrong value can still fail at its next input (a snapshot is trusted data, written by
        this program into a checkpoint only it writes)."""
        index, doc_id, profile, start, evicted, budget, partitions, next_order, opened = record
        if profile not in self._docs[doc_id].profiles:
            raise SnapshotError(f"profile {profile.name!r} is not one of document {doc_id}'s")
        p = self._register(doc_id, profile, index, start)
        where = f"snapshot of profile {profile.name!r}"
        if type(budget) is not Budget:
            raise SnapshotError(f"{where}: its budget is {brief_repr(budget)}, expected a Budget")
        if type(next_order) is not int or not _numbered_keys(opened):
            raise SnapshotError(f"{where}: partition numbers {brief_repr(next_order)} and "
                                f"{brief_repr(opened)}, expected an integer and a list of "
                                "(partition key, integer) pairs")
        p.evicted, p.budget, p.next_order, p.opened = evicted, budget, next_order, opened
        p.compact_at = max(COMPACT_OPENED, 2 * len(opened))
        if self._loader is None:
            for value, root, created, order in partitions:
                key = partition_key(value) if profile.per is not None else None
                self._add_partition(p, key, [value, root, created, order])
        else:
            if type(partitions) is not list or not all(
                    _hashable(key) and (key is None) == (profile.per is None)
                    for key in partitions):
                raise SnapshotError(f"{where}: partition keys {brief_repr(partitions)}, "
                                    "expected " + ("a list of keys" if profile.per is not None
                                                   else "none or [null]"))
            p.unloaded.update(partitions)
            p.touched = set()  # the records read are those kept: nothing changed yet
            self._load(p, None)  # a profile without ``per``: its one partition, at once
        p.single = p.partitions.get(None) if profile.per is None else None

    def _add_partition(self, p: _Profile, key: Hashable, record: list[Any]) -> _Partition:
        """Keep the partition of ``key`` that a record (``_record``) describes, once checked."""
        value, root, created, order = record
        problem = p.spec.root.check(root, p.budget) or (
            "" if type(order) is int else f"its number is {brief_repr(order)}, expected "
            "an integer")
        if problem:
            raise SnapshotError(f"snapshot of profile {p.profile.name!r}, partition "
                                f"{brief_repr(value)}: {problem} (the state does not fit the "
                                "profile compiled from its document)")
        partition = p.partitions[key] = _Partition(value, key, root, created, order)
        return partition

    def _partition(self, p: _Profile, key: Hashable) -> _Partition | None:
        """The partition of ``key``, read through the loader if it is not read yet."""
        partition = p.partitions.get(key)
        if partition is None and p.unloaded:
            partition = self._load(p, key)
        return partition

    def _load(self, p: _Profile, key: Hashable) -> _Partition | None:
        """The partition of ``key`` if its record is one not read yet: read and kept (after
        the others read: ``unsorted``)."""
        if key not in p.unloaded:
            return None
        loader = self._loader
        assert loader is not None
        partition = self._add_partition(p, key, loader(p.index, key, p.budget))
        p.unloaded.discard(key)
        p.unsorted = True
        return partition

    def _load_all(self, p: _Profile) -> None:
        """Every partition of the profile read, in order of creation — ``partitions``' order
        everywhere it matters: a profile whose partitions are walked in it (time classes:
        ``_ticks``) keeps each partition from its creation, so the order of creation is that
        of insertion (the profiles that drop and keep again partitions walk them for nothing
        order-dependent)."""
        if p.unloaded:
            for key in list(p.unloaded):
                self._load(p, key)
        if p.unsorted:
            p.partitions = dict(sorted(p.partitions.items(), key=_creation))
            p.unsorted = False

    def _touch(self, p: _Profile, key: Hashable) -> None:
        """Note that the partition of ``key`` changed (see ``changed_partitions``)."""
        touched = p.touched
        if touched is not None:
            touched.add(key)

    def _touch_all(self, p: _Profile) -> None:
        touched = p.touched
        if touched is not None:
            touched.update(p.partitions)

    def changed_partitions(self) -> list[tuple[int, Hashable, Budget | None, list[Any] | None]]:
        """(profile index, partition key, the profile's budget, the partition's record) of
        each partition changed since the changes were last taken (``forget_changes``) — its
        record None when it is gone (collected at rest, or its profile removed). A profile
        whose changes were never taken gives every partition it holds (its changes since it
        held none), except one restored from a core: its records are kept already."""
        out: list[tuple[int, Hashable, Budget | None, list[Any] | None]] = [
            (index, key, None, None) for index, keys in self._gone for key in keys]
        for p in self._profiles.values():
            keys = p.partitions if p.touched is None else p.touched
            for key in keys:
                q = p.partitions.get(key)
                out.append((p.index, key, p.budget, None if q is None else _record(q)))
        return out

    def forget_changes(self) -> None:
        """Start the next ``changed_partitions`` from here: tracked from now on."""
        self._gone = []
        for p in self._profiles.values():
            p.touched = set()

    # ---------------------------------------------------------------- introspection

    def at_rest(self) -> bool:
        """Whether the engine answers every future input as a freshly started one would, as
        ``_sweep`` decides it for a ``per`` partition: nothing buffered, staged or held, no
        clock-driven profile, and every partition at rest once collected up to the instants
        processed (collecting changes no answer). An engine over one partition of a trace
        (the plan runner's) can then be dropped."""
        if self._buffer or self._staged or self._held is not None:
            return False
        now = self._done_until
        collect = now is not None and self.config.gc
        for p in self._profiles.values():
            if p.timed or p.tick_ids:
                return False
            self._load_all(p)
            if collect:
                self._touch_all(p)
            root = p.spec.root
            for partition in p.partitions.values():
                if now is not None and collect:
                    root.sweep(partition.state, now)
                if not root.at_rest(partition.state):
                    return False
        return True

    def stored(self) -> int:
        """Occurrences held in operator state, over all profiles and partitions."""
        return sum(p.budget.stored for p in self._profiles.values())

    def peak_stored(self) -> int:
        return sum(p.budget.peak for p in self._profiles.values())


def push_admitted(engine: Engine, stream: Stream, events: list[Event | EventError],
                  out: list[Notification],
                  malformed: Callable[[int, EventError], None] | None = None) -> None:
    """Each of ``events`` through the admission ``stream``, and what it gives out — in time
    order — pushed to ``engine``, whose clock starts at the admission's origin (set by the
    first event it takes); the composites appended to ``out``; a line that was not an event
    (an :class:`EventError`) given to ``malformed`` with its index, in its place in the
    trace. `evamed replay`'s loop over a batch of decoded lines (``events.read_lines``),
    compiled with the engine: interpreted, its calls per event cost about as much as the
    engine's push."""
    push = engine.push
    admit = stream.push
    for i, event in enumerate(events):
        if isinstance(event, EventError):
            if malformed is not None:
                malformed(i, event)
            continue
        due = admit(event)
        if due:
            if engine.origin is None and stream.origin is not None:
                engine.begin(stream.origin)
            for one in due:
                found = push(one)
                if found:
                    out.extend(found)


def _staged_order(staged: tuple[Key, int, Fed]) -> tuple[Key, int]:
    return (staged[0], staged[1])


def _numbered_keys(value: Any) -> bool:
    """Whether ``value`` is a list of (hashable key, integer) pairs, as ``_Profile.opened``."""
    if type(value) is not list:
        return False
    for item in value:
        if type(item) is not tuple or len(item) != 2 or type(item[1]) is not int or (
                not _hashable(item[0])):
            return False
    return True


def _hashable(value: Any) -> bool:
    try:
        hash(value)
    except TypeError:
        return False
    return True


def _record(q: _Partition) -> list[Any]:
    """A partition as data: what ``Engine._add_partition`` takes back."""
    return [q.value, q.state, q.created, q.order]


def _creation(item: tuple[Hashable, _Partition]) -> int:
    return item[1].order


def _first_opened(p: _Profile) -> dict[Hashable, int]:
    """Each key of ``_Profile.opened`` with the number it was first listed with."""
    first: dict[Hashable, int] = {}
    for part_key, order in p.opened:
        if part_key not in first:
            first[part_key] = order
    return first


def _compact_opened(p: _Profile) -> None:
    p.opened = list(_first_opened(p).items())
    p.compact_at = max(COMPACT_OPENED, 2 * len(p.opened))


def _oldest_first(p: _Profile) -> list[_Partition]:
    """A profile's partitions in order of creation, kept or not: a partition kept only at a
    later input than the one that created it (``_Profile.opened``) sits after partitions
    created in between in ``partitions``, and takes the first place it had since the sweep."""
    first = _first_opened(p)
    ranked = [(first.get(q.key, q.order), q) for q in p.partitions.values()]
    ranked.sort(key=_rank)  # numbers are unique: no two partitions tie
    return [q for _, q in ranked]


def _rank(item: tuple[int, _Partition]) -> int:
    return item[0]


def replay(doc: ast.Document, events: Iterable[Event], *, profiles: Iterable[str] | None = None,
           config: EngineConfig | None = None, until: int | None = None,
           dead_letter: Callable[[DeadLetter], None] | None = None) -> list[Notification]:
    """Run a finite trace through a fresh engine: the incremental counterpart of
    :func:`eva.reference.evaluate`."""
    engine = Engine(config, dead_letter)
    engine.add_document(doc, profiles)
    out: list[Notification] = []
    for event in events:
        out.extend(engine.push(event))
    out.extend(engine.close(until))
    return out


__all__ = ["EXTERNAL_SOURCE", "DeadLetter", "Engine", "EngineConfig", "replay"]
