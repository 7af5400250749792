"""Placement: where each plan's mediator-side part is composed.

The ``composer`` setting names the class that composes: ``"inprocess"`` — every plan in its
federation's runner, in this process (:class:`adapters.federation.Federation`) — or
``"spark"``: :class:`SparkFeed` gives the Spark jobs (:class:`SparkSlots`,
spark_jobs/composer.py) the plans they compose exactly (:func:`spark_composes`) and leaves the
others to the runners. Whichever composes, every service is subscribed what its plan assigns
it.

**The Spark composer composes notifications** (docs/spark.md, "What runs where"). A plan the
job composes has filters of one class for leaves (a service's, the own feed's, or the union of
both over autonomous services) and the mediator's clock. :class:`SparkFeed` subscribes those
filters at their services — fed and autonomous, sharing memoryless handles with the
federations (:func:`adapters.federation.subscribe_query`), under durable names — and the
pipeline hands it what it hands a federation: each own-feed batch (``begin``) and the fed
links' detections of it (``take``), each autonomous notification (``learn``), and the bound up
to which the inputs its plans use have reported everything (``release``). It keeps the events
the filters' notifications name, and the own feed's events of the classes the plans take from
the own feed, each once (by source and id), and releases them in merged-trace order (time, then
``merged_seq``: the own feed first, then each service in the configured order) up to that
bound into the store's **composer log**, each release closed by a **watermark line** (every
instant up to the bound is complete). The live jobs read the composer log, nothing else: a
service's filter is never re-evaluated over raw events, and the clock of an instant decided
at the mediator reaches the jobs with the watermark line, not with a later event.

Each event's line in the composer log carries what a notification says of it — its source,
type and time, and the (service, handle) pairs whose filters named it — so a composite the job
delivers, however late, names its constituents' provenance by looking them up there
(:meth:`SparkFeed.trim` keeps every line a composite still to come may name). A micro-batch's
composites are appended in report-key order (each profile's in replay order: docs/spark.md,
"Order").
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import threading
import time as clock
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from adapters.client import cloudevent_json
from adapters.federation import Detections, Late, subscribe_query, unsubscribe_query
from adapters.links import Handle, Link
from eva import ast
from eva.classes import Matcher, compile_predicate
from eva.events import TICK_SOURCE, TICK_TYPE, Event, clock_id
from eva.printer import to_text
from mediator.composer import LiveComposer
from mediator.config import RESERVED_SERVICE as OWN_FEED
from mediator.notification_log import Entry, encode
from mediator.provenance import horizon
from mediator.store.base import ComposerLine, Store, SubscriptionRecord
from transforms.dialects import dialect
from transforms.dialects.base import Detection
from transforms.federated import MEDIATOR
from transforms.plans import Plan, Remote, Subscribe, nodes

log = logging.getLogger("mediator.pipeline")

Key = tuple[str, str]
"""A subscription: (owner, name)."""


def spark_composes(p: Plan, doc: ast.Document) -> bool:
    """Whether the Spark composer composes the plan (docs/spark.md, "What runs where"): every
    leaf is a filter of one event class — a service's (``Remote`` of a ``Prim``, not a time
    class on the service's clock), the own feed's, or the union of both over autonomous
    services (``Subscribe``) — or the mediator's clock. A filter keeps no state: the events
    its notifications name are the class's events of the merged trace (a service is assigned
    a class only if it observes every event of it; a union covers the class together with the
    own feed), so the job's engine over the composer log — those events in trace order —
    decides exactly what the runner decides over the notifications. A subtree a service
    evaluates whole (an operator, a time class with the service's clock) stays with the
    runner."""
    classes = doc.class_map()
    if any(isinstance(n, Subscribe) and n.clock for n in nodes(p.root)):
        # A time class on the mediator's clock: the live job missed composites of such plans
        # across a restart (P6 once issue 26's planner composes it at the mediator; found by
        # tests/test_pipeline.py's Spark test, not yet understood): the runner composes them.
        return False
    return all(isinstance(n.original, ast.Prim)
               and not isinstance(classes[n.original.name].body, ast.Every)
               for n in nodes(p.root) if isinstance(n, Remote))


SLOTS = "slots.json"
"""In the Spark directory: which subscription's profiles each composer slot holds, and where
each was registered."""
RELEASED = "released"
"""In the Spark directory: the composer log's head as the pipeline released it — the live
jobs' cap (spark_jobs/log_source.py): a job reads no further before the profiles registered
there are in its table."""
MAX_ROWS = 50_000
"""Composer-log positions per micro-batch at most (a restart after a long stop catches up in
bounded batches): a micro-batch ends at the last watermark line within them."""

WARM_UP = -(2**62)
"""The time of the watermark line that warms the jobs up before anything was released: before
every event's (a restart reads no released bound from it)."""

MARKS = 4096
"""Watermark lines the composer feed remembers (position, time) to trim by, at most."""

Claim = tuple[str, str, int]
"""A slot's profile holder: (owner, subscription, created_us) — a subscription removed and
registered again under its name is another holder."""
Start = tuple[int, int]
"""Where a profile was registered in its job's table: (the time its profiles see events
after, the composer-log position they see the lines after)."""


def spark_dir(store: Store) -> str:
    """Where the Spark composer keeps its jobs by default: beside a SQLite store's file
    (``<file>.spark``), ``./evamed-spark`` for a Redis store (docs/operations.md, Stores)."""
    from mediator.store.base import unwrapped
    from mediator.store.sqlite import SqliteStore

    store = unwrapped(store)
    if isinstance(store, SqliteStore):
        if store.path == ":memory:" or store.path.startswith("file:"):
            raise ValueError(f"the Spark composer reads the composer log from the store's "
                             f"file; the SQLite store {store.path!r} has none: use a file")
        return store.path + ".spark"
    return "evamed-spark"


def spark_session(root: str) -> Any:
    """The Spark composer's session (local mode), its JVM's output to ``spark.log`` in the
    composer's directory ``root``. Start it before any gRPC channel exists in this process
    (mediator.server does): gRPC's fork handlers in the forked launcher can crash it (seen:
    "Spark did not start" when the links to remote services connected first)."""
    from spark_jobs.session import build_session

    os.makedirs(root, exist_ok=True)
    return build_session(log=os.path.join(root, "spark.log"))


def composer_lines(store: Store, cap: str, start: int) -> Callable[[Any], Any]:
    """The store's composer log as a live job's input (after position ``start`` when the job
    is new; each row's ``seq`` its position), capped at what the pipeline has released."""
    from mediator.store.base import unwrapped
    from mediator.store.redis import RedisStore
    from mediator.store.sqlite import SqliteStore

    store = unwrapped(store)
    if isinstance(store, SqliteStore):
        from spark_jobs.log_source import sqlite_log_lines

        path = os.path.realpath(store.path)  # read by Spark's workers, wherever they run
        return lambda spark: sqlite_log_lines(spark, path, table="composer_log", cap=cap,
                                              start=start, max_rows=MAX_ROWS, releases=True)
    if isinstance(store, RedisStore):
        from spark_jobs.redis_io import redis_lines

        url, stream = store.url, store.prefix + "composer"
        return lambda spark: redis_lines(spark, url, stream, cap=cap, start=f"{start}-0",
                                         max_rows=MAX_ROWS, positions=True, releases=True)
    raise ValueError(f"the Spark composer reads the composer log of a SQLite or Redis store, "
                     f"not of {type(store).__name__}")


Rows = list[tuple[str, str, dict[str, Any], str, list[str]]]
"""A live job's micro-batch (spark_jobs.composer.Delivered): kind, profile, payload, report
key, constituents' sources."""


class SparkSlots:
    """The Spark composers (slots) holding the profiles Spark composes, each a live job over
    the store's composer log in its own directory under ``root``. A profile name is one entry
    of a composer's profile table, and a composite's id is made from its profile's name: two
    subscriptions defining the same name go to two slots, so every composite keeps the id the
    in-process runner gives it. Which subscription holds which slot's names is kept
    (``slots.json``), with where each was registered, so a restart puts every profile back on
    the job — and the checkpoint — that composed it, registered as before; a slot left without
    profiles is stopped and its directory removed. ``deliver(slot, rows)``: a micro-batch of a
    slot's job (in its query's thread)."""

    def __init__(self, spark: Any, store: Store, root: str | None,
                 deliver: Callable[[int, Rows], None], trigger: str | None, tick: int) -> None:
        self.spark = spark
        self.tick = tick  # the runners' clock: the jobs' engines tick alike
        self.store = store
        # Resolved: Spark reads "//tmp/x" (a store URL sqlite:////tmp/x) as host tmp.
        self.root = os.path.realpath(root if root is not None else spark_dir(store))
        self.deliver = deliver
        self.trigger = trigger
        self.released = os.path.join(self.root, RELEASED)
        os.makedirs(self.root, exist_ok=True)
        self.slots: list[LiveComposer | None] = []
        self.names: list[dict[str, Claim]] = []  # per slot: profile → its holder
        self.starts: list[dict[str, Start]] = []  # per slot: profile → where registered
        self._load()
        self.live: set[int] = set()  # slots whose names are registered since this start
        # Per slot, names removed there since this start: a micro-batch still in flight runs
        # the old table, and its composites must not reach a new holder of the name.
        self.retired: dict[int, set[str]] = {}
        self._marked: int | None = None  # the position in the cap file (read at first use)
        self._failed: BaseException | None = None  # a job that did not start
        self._looked = 0.0  # when failure() last asked the jobs

    def _load(self) -> None:
        path = os.path.join(self.root, SLOTS)
        if not os.path.exists(path):
            return
        try:
            with open(path, encoding="utf-8") as handle:
                found = json.load(handle)
            for slot in found:
                self.names.append({n: (str(c[0]), str(c[1]), int(c[2])) for n, c in slot.items()})
                self.starts.append({n: (int(c[3]), int(c[4])) for n, c in slot.items()
                                    if len(c) >= 5})  # (written before the composer log: none)
        except (OSError, ValueError, TypeError, IndexError, AttributeError) as exc:
            raise ValueError(f"the Spark composer's {path} cannot be read ({exc}); expected "
                             "the slots it wrote: remove the directory to start its jobs "
                             "afresh (they then replay from the subscriptions' starts)"
                             ) from None

    def _save(self) -> None:
        from spark_jobs.spool import write_whole

        write_whole(os.path.join(self.root, SLOTS), json.dumps([
            {n: [*c, *starts.get(n, ())] for n, c in slot.items()}
            for slot, starts in zip(self.names, self.starts, strict=True)]))

    def mark(self, position: int) -> None:
        """The pipeline released the composer log up to ``position``: the jobs may read that
        far. Never moved back."""
        from spark_jobs.log_source import read_cap
        from spark_jobs.spool import write_whole

        if self._marked is None:
            self._marked = read_cap(self.released) or 0
        if position > self._marked:
            write_whole(self.released, str(position))
            self._marked = position

    def register(self, record: SubscriptionRecord, doc: ast.Document, names: list[str],
                 at: int, after: int) -> int:
        """Register the subscription's profiles ``names`` — seeing the events after time
        ``at`` among the composer-log lines after ``after`` — with the slot that held them
        before a restart (registered where they were then), else with one where none of them
        is taken."""
        holder = (record.owner, record.name, record.created_us)
        slot = next((i for i, held in enumerate(self.names)
                     if names and all(held.get(n) == holder for n in names)), -1)
        if slot >= 0 and all(n in self.starts[slot] for n in names):
            at, after = self.starts[slot][names[0]]
        if slot < 0:
            slot = next((i for i, held in enumerate(self.names)
                         if not set(names) & (set(held) | self.retired.get(i, set()))), -1)
        if slot < 0:
            self.names.append({})
            self.starts.append({})
            slot = len(self.names) - 1
        # Named after its holder (a comment): a profile removed and registered again gets a
        # new registration in the job's table, never the old one's state.
        text = (f"# subscription {record.owner}/{record.name} created {record.created_us}\n"
                + to_text(ast.Document(doc.classes,
                                       tuple(p for p in doc.profiles if p.name in names))))
        self._composer(slot, after).register_at(text, at, after)
        self.names[slot].update(dict.fromkeys(names, holder))
        self.starts[slot].update(dict.fromkeys(names, (at, after)))
        self.live.add(slot)
        self._save()
        return slot

    def session(self) -> Any:
        """The SparkSession, started (local mode) if none was given (or the one
        :func:`spark_session` started: getOrCreate returns it)."""
        if self.spark is None:
            self.spark = spark_session(self.root)
        return self.spark

    def _composer(self, slot: int, start: int) -> LiveComposer:
        from spark_jobs.composer import TRIGGER, SparkComposer

        while len(self.slots) <= slot:
            self.slots.append(None)
        found = self.slots[slot]
        if found is None:
            from eva.engine import EngineConfig

            found = SparkComposer(
                self.session(), os.path.join(self.root, f"composer-{slot}"),
                EngineConfig(tick=self.tick),
                lines=composer_lines(self.store, self.released, start),
                deliver=lambda rows: self.deliver(slot, rows),
                trigger=self.trigger or TRIGGER, ordered=True)
            self.slots[slot] = found
        return found

    def begin(self, wait: bool = True) -> None:
        """Start the jobs of the slots registered (after a restart: once every stored
        subscription is back); a slot nothing was registered with again is dropped.
        ``wait`` False: in a thread — building a query takes Spark seconds, longer than an
        AddProfile may wait; the table is written already, and the cap holds the job back."""
        for slot, held in enumerate(self.names):
            if slot in self.live:
                composer = self.slots[slot]
                assert composer is not None
                if wait:
                    composer.begin()
                else:
                    threading.Thread(target=self._begin, args=(composer,), daemon=True,
                                     name="evamed-spark-start").start()
            elif held:
                self._drop(slot)

    def standby(self) -> None:
        """When no job is live (a first start, or every profile removed): a job with no
        profile, started now, that the next registration takes (``register`` takes a slot
        whose names it does not collide with) — so that the JVM's seconds of planning a
        job's query, and of its first micro-batch, come before a subscriber waits."""
        if self.live:
            return
        slot = next((i for i, held in enumerate(self.names)
                     if not held and not self.retired.get(i)), len(self.names))
        if slot == len(self.names):
            self.names.append({})
            self.starts.append({})
        # No profile held there: nothing to resume (a slot left by an earlier standby).
        shutil.rmtree(os.path.join(self.root, f"composer-{slot}"), ignore_errors=True)
        self._composer(slot, self.store.composer_head())
        self.live.add(slot)
        self._save()

    def ran(self, position: int) -> bool:
        """Whether every live job has run a micro-batch that read up to ``position``."""
        for slot in self.live:
            composer = self.slots[slot] if slot < len(self.slots) else None
            found = composer.read_to() if composer is not None else None
            if found is None or found < position:
                return False
        return True

    def _begin(self, composer: LiveComposer) -> None:
        try:
            composer.begin()
        except Exception as exc:  # the pipeline's next look at failure() stops it, said
            self._failed = exc

    def _drop(self, slot: int) -> None:
        """Stop a slot's job and remove its directory (its checkpoint: no profile left)."""
        composer = self.slots[slot] if slot < len(self.slots) else None
        if composer is not None:
            composer.close()
            self.slots[slot] = None
        shutil.rmtree(os.path.join(self.root, f"composer-{slot}"), ignore_errors=True)
        self.names[slot] = {}
        self.starts[slot] = {}
        self.live.discard(slot)
        self.retired.pop(slot, None)  # its job is stopped: nothing of it is in flight
        self._save()

    def remove(self, slot: int, names: list[str]) -> None:
        for name in names:
            composer = self.slots[slot]
            if composer is not None:
                composer.remove(name)
            self.names[slot].pop(name, None)
            self.starts[slot].pop(name, None)
            self.retired.setdefault(slot, set()).add(name)
        if not self.names[slot]:
            self._drop(slot)
        else:
            self._save()

    def committed(self) -> int | None:
        """The composer-log position every live job has evaluated up to (and checkpointed),
        with its clock past the newest watermark line there; None while a job has not said."""
        found = []
        for slot in self.live:
            composer = self.slots[slot] if slot < len(self.slots) else None
            position = composer.committed() if composer is not None else None
            if position is None:
                return None
            found.append(position)
        return min(found, default=None)

    def failure(self) -> BaseException | None:
        """What stopped a live job, if one stopped by itself (or did not start). Asked after
        every batch; the jobs are asked (a call into the JVM each) once a second at most."""
        if self._failed is not None:
            return self._failed
        now = clock.monotonic()
        if now < self._looked + 1.0:
            return None
        self._looked = now
        for composer in self.slots:
            found = composer.failure() if composer is not None else None
            if found is not None:
                return found
        return None

    def close(self) -> None:
        """Stop the jobs; their directories stay for the next start."""
        for composer in self.slots:
            if composer is not None:
                composer.close()
        self.slots = []
        self.live = set()


@dataclass(frozen=True)
class _Filter:
    """A Spark plan's leaf subscribed at a service: its native query and handle there."""

    service: str
    text: str
    handle: Handle


@dataclass
class _Sparked:
    """A subscription's profiles the Spark jobs compose, and what feeds them."""

    record: SubscriptionRecord
    doc: ast.Document
    names: list[str]
    filters: list[_Filter]
    own: list[Matcher]  # the classes its plans take from the own feed
    inputs: frozenset[str]  # the autonomous services its filters are at
    own_inputs: bool  # the own feed is an input (its classes, or a filter at a fed service)
    horizon: int | None  # how long after an event a composite may still name it
    slot: int = -1  # the slot it is registered with (-1: not yet, its start unknown)
    handles: frozenset[tuple[str, Handle]] = frozenset()


@dataclass
class _Pending:
    """An event the Spark plans need, not released yet, and who named it."""

    event: Event
    via: set[tuple[str, Handle]] = field(default_factory=set)


def _at_root(p: Plan, node: object) -> bool:
    return node is p.root


class SparkFeed:
    """The ``"spark"`` composer (see the module docstring): the Spark plans' filters
    subscribed at their services, the composer log they feed, and the live jobs reading it
    (:class:`SparkSlots`). ``links``: every service (the pipeline's); ``autonomous``: the
    autonomous ones' names; ``append(key, items)``: the pipeline's, a subscription's
    notification-log items (in a job's thread)."""

    def __init__(self, store: Store, links: Mapping[str, Link], autonomous: Iterable[str], *,
                 spark: Any, root: str | None, trigger: str | None, tick: int,
                 append: Callable[[Key, list[tuple[str, bytes]]], None]) -> None:
        self.store = store
        self.links = links
        self.tick = tick
        self.append = append
        self.slots = SparkSlots(spark, store, root, self._delivered, trigger, tick)
        self.subs: dict[Key, _Sparked] = {}
        self._users: dict[tuple[str, Handle], int] = {}  # the filters using each handle
        self._pending: dict[tuple[str, str], _Pending] = {}  # by (source, id)
        self._batch: dict[tuple[str, str], Event] = {}  # the own feed's batch, by (source, id)
        head = store.composer_head()
        last = store.read_composer(head - 1, 1) if head else []
        self.released: int | None = last[0].time if last and last[0].time != WARM_UP else None
        """The newest watermark line's time: every instant up to it is in the composer log."""
        self.warming = False  # warm() was asked for: a job stands by whenever none is live
        self._marks: deque[tuple[int, int]] = deque()  # (position, time) of watermark lines
        # The inputs' heads at start: what a restart reads again up to them is a replay of
        # what was released (or refused as late) before, never late again.
        self._replayed = {MEDIATOR: store.event_head(),
                          **{name: store.link_bounds(name)[0] for name in autonomous}}
        self._autonomous = frozenset(autonomous)

    # ---------------------------------------------------------------- subscriptions

    @property
    def own_inputs(self) -> bool:
        """Whether a plan the jobs compose takes the own feed (its decisions wait on it)."""
        return any(sub.own_inputs for sub in self.subs.values())

    @property
    def inputs(self) -> set[str]:
        """The autonomous services the jobs' plans take filters from."""
        return {name for sub in self.subs.values() for name in sub.inputs}

    def holds(self, service: str, handle: Handle) -> bool:
        return (service, handle) in self._users

    def handles(self, key: Key) -> list[tuple[str, Handle]]:
        """A subscription's filters' handles, one per filter (ListServices counts them)."""
        sub = self.subs.get(key)
        return [(f.service, f.handle) for f in sub.filters] if sub is not None else []

    def add(self, record: SubscriptionRecord, doc: ast.Document, plans: list[Plan],
            restoring: bool) -> None:
        """Subscribe the plans' filters at their services and register the profiles with a
        job — now, if the subscription's start is known (else at the first release that knows
        the merged trace's origin). ``PushRefused`` if a service refuses a filter (nothing of
        the subscription stays subscribed)."""
        key = (record.owner, record.name)
        owner = f"{record.owner}/{record.name}@{record.created_us}/spark"
        classes = doc.class_map()
        filters: dict[tuple[str, str], _Filter] = {}  # by (service, native text): once each
        own: dict[str, Matcher] = {}
        eoi = {p.profile.name: p.profile.evaluation is ast.Evaluation.END_OF_INTERVAL
               for p in plans}
        try:
            for p in plans:
                leaves: list[tuple[str, ast.Expr, bool]] = []
                for n in [*nodes(p.root), *p.observed]:
                    if isinstance(n, Remote):
                        leaves.append((n.service, n.target, _at_root(p, n)))
                    elif isinstance(n, Subscribe) and not n.clock:
                        for source in n.sources:
                            body = classes[n.name].body
                            if source == MEDIATOR or source not in self.links:
                                assert not isinstance(body, ast.Every)  # (n.clock: not here)
                                own[n.name] = compile_predicate(body, classes)
                            else:
                                leaves.append((source, ast.Prim(n.name), _at_root(p, n)))
                for service, expr, at_root in leaves:
                    link = self.links[service]
                    text = dialect(link.info.group).render(
                        expr, doc, p.profile, at_root and eoi[p.profile.name])
                    if (service, text) in filters:
                        continue
                    # A peer mediator's profile may be partitioned or drop an id it has seen:
                    # one per subscription (adapters.federation.memoryless).
                    shared = (isinstance(expr, ast.Prim) and link.info.group != "cg5"
                              and not isinstance(classes[expr.name].body, ast.Every))
                    handle = subscribe_query(link, text, shared, owner, len(filters),
                                             p.profile.name)
                    filters[(service, text)] = _Filter(service, text, handle)
        except BaseException:  # nothing half-subscribed stays at the services
            for f in filters.values():
                unsubscribe_query(self.links[f.service], f.text, f.handle)
            raise
        names = [p.profile.name for p in plans]
        held = list(filters.values())
        sub = _Sparked(record, doc, names, held, list(own.values()),
                       frozenset(f.service for f in held if f.service in self._autonomous),
                       bool(own) or any(f.service not in self._autonomous for f in held),
                       horizon(doc, self.tick),
                       handles=frozenset((f.service, f.handle) for f in held))
        self.subs[key] = sub
        for f in held:
            self._users[(f.service, f.handle)] = self._users.get((f.service, f.handle), 0) + 1
        if record.start_time is not None:
            self._register(sub, record.start_time, begin=not restoring)

    def _register(self, sub: _Sparked, at: int, begin: bool) -> None:
        head = self.store.composer_head()
        sub.slot = self.slots.register(sub.record, sub.doc, sub.names, at, head)
        if begin:
            self.slots.begin(wait=False)
            self.slots.mark(head)

    def remove(self, key: Key) -> None:
        """Unsubscribe a subscription's filters (at autonomous services too) and remove its
        profiles from their job."""
        sub = self.subs.pop(key, None)
        if sub is None:
            return
        self._let_go(sub.filters)
        if sub.slot >= 0:
            self.slots.remove(sub.slot, sub.names)
            if self.warming and not self.slots.live:
                self.warm()
        if not self.subs:
            self._pending.clear()  # no plan needs them any more

    def _let_go(self, filters: list[_Filter],
                keep: Callable[[Link], bool] = lambda link: False) -> None:
        for f in filters:
            users = self._users.get((f.service, f.handle), 0)
            if users > 1:
                self._users[(f.service, f.handle)] = users - 1
            else:
                self._users.pop((f.service, f.handle), None)
            unsubscribe_query(self.links[f.service], f.text, f.handle, keep)

    def unsubscribe(self) -> None:
        """The mediator stops: every filter let go of, unsubscribed at the fed services (an
        autonomous service's registrations are durable: the next start takes them up)."""
        for sub in self.subs.values():  # (kept: a micro-batch in flight names their handles)
            self._let_go(sub.filters, keep=lambda link: link.info.autonomous)
            sub.filters = []

    # ---------------------------------------------------------------- the inputs

    def begin(self, events: list[Event]) -> list[Late]:
        """A batch of the own feed: its events of the classes a plan takes from the own feed
        are needed; the batch is kept for the fed links' detections (``take``)."""
        self._batch = {(e.source, e.id): e for e in events}
        matchers = [m for sub in self.subs.values() for m in sub.own]
        late: list[Late] = []
        if matchers:
            for event in events:
                if any(match(event) for match in matchers):
                    late += self._note(event, None, MEDIATOR, event.seq)
        return late

    def take(self, detections: Detections) -> list[Late]:
        """The fed links' detections of the batch: the events the jobs' filters named."""
        late: list[Late] = []
        for service, found in detections.items():
            for handle, reported in found.items():
                if (service, handle) not in self._users:
                    continue
                for d in reported:
                    for c in d.constituents:
                        event = self._batch.get((c.source, c.id), c)
                        late += self._note(event, (service, handle), MEDIATOR, event.seq)
        return late

    def learn(self, service: str, handle: Handle, detection: Detection,
              position: int) -> list[Late]:
        """An autonomous service's notification for a filter of the jobs (its link-log entry
        at ``position``): the events it names, in full, are needed."""
        late: list[Late] = []
        for event in detection.constituents:
            late += self._note(event, (service, handle), service, position)
        return late

    def _note(self, event: Event, via: tuple[str, Handle] | None, input_: str,
              position: int) -> list[Late]:
        if event.type.startswith(TICK_TYPE):
            return []  # a tick: the jobs' engines keep the clock themselves
        if self.released is not None and event.time <= self.released:
            if position <= self._replayed.get(input_, 0):
                return []  # read again after a restart: released (or refused) before
            service, handle = via if via is not None else (OWN_FEED, "")
            return [Late(service, handle, f"event {event.id!r} of {event.source!r} at "
                                          f"{event.time} µs, for the Spark composer")]
        found = self._pending.get((event.source, event.id))
        if found is None:
            found = self._pending[(event.source, event.id)] = _Pending(event)
        if via is not None:
            found.via.add(via)
        return []

    def release(self, bound: int | None, origin: int | None) -> None:
        """Every input the jobs' plans use has reported every instant up to ``bound``: the
        needed events up to it are appended to the composer log in merged-trace order, with a
        watermark line. Subscriptions waiting for their start register first (``origin``: the
        time before the merged trace's first event, once known)."""
        for sub in self.subs.values():
            at = sub.record.start_time if sub.record.start_time is not None else origin
            if sub.slot < 0 and at is not None:
                self._register(sub, at, begin=True)
        if not self.subs or bound is None or (self.released is not None
                                              and bound <= self.released):
            return
        due = sorted((p for p in self._pending.values() if p.event.time <= bound),
                     key=lambda p: p.event.key)
        lines = [ComposerLine(cloudevent_json(p.event), p.event.time, p.event.source,
                              p.event.id, p.event.type, tuple(sorted(p.via))) for p in due]
        from spark_jobs.processor import watermark_line

        lines.append(ComposerLine(watermark_line(bound), bound))
        head = self.store.append_composer(lines)
        for p in due:
            del self._pending[(p.event.source, p.event.id)]
        self.released = bound
        marks = self._marks
        marks.append((head, bound))
        if len(marks) > MARKS:  # every other one: a coarser trim, never a wrong one
            kept = list(marks)[-1::-2][::-1]
            marks.clear()
            marks.extend(kept)
        self.slots.mark(head)

    def trim(self) -> int:
        """Drop the composer-log lines no job still reads and no composite still to come may
        name: before what every job has evaluated (``SparkSlots.committed``), and older than
        the longest a composite of a live document may name an event (the horizon) before the
        instants the jobs have decided there. Never the newest line (its watermark is where
        a restart goes on). Returns how many lines were dropped."""
        committed = self.slots.committed()
        horizons = [sub.horizon for sub in self.subs.values()]
        if committed is None or not self._marks or None in horizons:
            return 0
        marks = self._marks
        decided = max((t for position, t in marks if position <= committed), default=None)
        if decided is None:
            return 0
        reach = max((h for h in horizons if h is not None), default=0)
        cut = 0
        while marks and marks[0][0] <= committed and marks[0][1] < decided - reach:
            cut = marks.popleft()[0]
        if not cut:
            return 0
        return self.store.trim_composer(min(cut + 1, self.store.composer_head()))

    # ---------------------------------------------------------------- the jobs

    def session(self) -> Any:
        return self.slots.session()

    def begin_jobs(self, wait: bool = True) -> None:
        self.slots.begin(wait)

    def warm(self) -> int:
        """Start the jobs — one with no profile too when none is live
        (:meth:`SparkSlots.standby`), and again whenever the last profile is removed — in
        threads, and release them a watermark line that repeats the newest one (nothing
        released yet: one at :data:`WARM_UP`): each job's first micro-batch, where the JVM
        plans and compiles its query (seconds, tens of seconds on a loaded machine), runs on
        that line, not on a subscriber's first event. Returns the line's position
        (:meth:`warmed`)."""
        from spark_jobs.processor import watermark_line

        self.warming = True
        self.slots.standby()
        self.slots.begin(wait=False)
        time = self.released if self.released is not None else WARM_UP
        head = self.store.append_composer([ComposerLine(watermark_line(time), time)])
        self.slots.mark(head)
        return head

    def warmed(self, position: int) -> bool:
        """Every live job has run a micro-batch past the composer-log ``position``."""
        return self.slots.ran(position)

    def failure(self) -> BaseException | None:
        return self.slots.failure()

    def close(self) -> None:
        self.slots.close()

    def _delivered(self, slot: int, rows: Rows) -> None:
        """A live job's micro-batch (in its query's thread): its composites in report-key
        order, each to the log of the subscription holding its profile, with its
        constituents' provenance from the composer log."""
        from spark_jobs.processor import report_key

        held = self.slots.names[slot]
        composites = []
        for kind, profile, body, key, sources in rows:
            if kind != "composite":
                log.warning("the Spark composer refused an event for profile %s: %s: %s",
                            profile, body.get("reason"), body.get("detail"))
            elif profile in held:  # else removed meanwhile
                composites.append((report_key(key), held[profile][:2], profile, body, sources))
        composites.sort(key=lambda c: c[0])  # stable: a key's own order at equal keys
        wanted = [(s, str(c)) for *_, body, sources in composites
                  for c, s in zip(body["data"]["constituents"],
                                  sources or [""] * len(body["data"]["constituents"]),
                                  strict=True)]
        found = self.store.composer_events(wanted)
        items: dict[Key, list[tuple[str, bytes]]] = {}
        for _, holder, profile, body, sources in composites:
            sub = self.subs.get(holder)
            handles = sub.handles if sub is not None else frozenset()
            ident = str(body["id"])
            items.setdefault(holder, []).append((ident, encode(
                _entry(body, profile, holder[1], sources, found, handles), ident)))
        for holder, entries in items.items():
            self.append(holder, entries)


def _entry(body: dict[str, Any], profile: str, subscription: str, sources: list[str],
           found: Mapping[tuple[str, str], ComposerLine],
           handles: frozenset[tuple[str, Handle]]) -> Entry:
    """A Spark composite's notification-log entry: each constituent's source, type and time
    as its composer-log line says (a tick's and an absence's from its id), and the services
    whose filters of the subscription named them, each once, in constituent order (one no
    filter named — an event of the own feed — the mediator's own)."""
    constituents = [str(c) for c in body["data"]["constituents"]]
    out_sources, kinds, times = [], [], []
    services: dict[str, None] = {}
    for ident, source in zip(constituents, sources or [""] * len(constituents), strict=True):
        line = found.get((source, ident))
        named = clock_id(ident)
        if line is not None:
            out_sources.append(line.source)
            kinds.append(line.type)
            times.append(line.time)
        else:
            out_sources.append(source or (TICK_SOURCE if ident.startswith("tick:") else ""))
            kinds.append(named[0] if named else "")
            times.append(named[1] if named else 0)
        via = sorted({s for s, h in (line.via if line is not None else ()) if (s, h) in handles})
        for service in via or [OWN_FEED]:
            services[service] = None
    return Entry(json.dumps(body), profile, subscription, out_sources, kinds, times,
                 list(services))


__all__ = ["SparkFeed", "SparkSlots", "spark_composes", "spark_dir", "spark_session"]
