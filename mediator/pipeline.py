"""The pipeline: every subscription evaluated over the mediator's event log, live.

A thread tails the store's event log (the trace, in arrival order: the log order is the trace
order) and, for each batch, runs every live subscription's :class:`~adapters.federation.Federation`
over the shared :class:`~adapters.links.Link` s (docs/architecture.md, "The live path"):

1. every federation takes the batch (``begin``) and says which ticks its queries need per link;
2. every link is published, once, the batch events its service observes (its coverage) merged
   with the ticks all federations ask of it, deduplicated by (type, time), in key order;
3. every federation takes its handles' detections (``finish``) and decides its composites;
4. each subscription's composites are appended to its notification log (the store skips an id
   already there) and ``on_append`` wakes the streams that deliver it.

Profiles added and removed take effect between batches (one lock: the thread holds it for a
batch). A restart is fresh everything and a replay: :meth:`Pipeline.start` re-plans every stored
subscription and replays the log once, all federations fed together, each subscribed at the
services just when the replay reaches its start, so each sees exactly what it saw before;
composites already logged are skipped by their deterministic ids.

The composer: ``"inprocess"`` composes every plan's mediator-side part in its federation's
runner in this process. ``"spark"`` (the service's default) hands the profiles whose leaves are
all memoryless — the mediator's own feed and clock, or a service's filter of one class
(:func:`composed_by_spark`) — to live Spark jobs (``spark_jobs.composer``, local mode unless
given a session) that read the event log themselves, continuously, and append their composites
to the subscriptions' logs from their own thread (:class:`_Sparks`): the pipeline does not wait
for them. It keeps the plans where a service evaluates more than a filter in the runners.
Each job may read the log only as far as the pipeline has evaluated (the cap file): a profile
registered at a position sees exactly the events after it, as its runner would.
"""

from __future__ import annotations

import contextlib
import heapq
import io
import json
import logging
import os
import shutil
import threading
import time as clock
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from adapters.federation import Federation, publish
from adapters.links import Handle, Link
from eva import ast
from eva.classes import required_types
from eva.events import TICK_SOURCE, TICK_TYPE, Event, EventError, clock_id, from_json_line
from eva.notify import composite_line
from eva.parser import parse
from eva.printer import to_text
from eva.semantics import Notification
from mediator.composer import LiveComposer
from mediator.config import COMPOSERS
from mediator.config import RESERVED_SERVICE as OWN_FEED  # a constituent no service reported
from mediator.metrics import Metrics
from mediator.store.base import LoggedEvent, Store, SubscriptionRecord
from transforms.dialects.base import Detection
from transforms.explanation import as_json, explain, service_renderer
from transforms.federated import ServiceInfo, plan_federated
from transforms.plans import Plan, Remote, nodes
from transforms.runner import RunnerStats, lag

log = logging.getLogger(__name__)

NEWEST_KEY = "pipeline.newest"
"""Store meta: the newest event time evaluated, kept across trims of the event log."""
POLL = 1.0
"""Seconds the thread sleeps without a wake before it looks at the log again."""
LOCK_SLICE = 0.1
"""Seconds between looks, while waiting for the lock, whether the pipeline stops."""
CUT = 1.0
"""Seconds :meth:`Pipeline.stop` waits for what it cut short (the links closed) to end."""


class Stopping(ConnectionError):
    """The pipeline is stopping: a batch cut short decides nothing, a profile is not added."""


def close_links(links: Iterable[Link], seconds: float) -> None:
    """Close every link, each in a thread of its own, waiting ``seconds`` at most for them all.
    Closing a link cuts short what waits on its service (a :class:`~adapters.remote_link.
    RemoteLink` call raises ConnectionError), but its ``close`` may itself wait for that call
    to notice, or for the service to answer its unsubscriptions: one still closing then is left
    to finish alone (its threads are daemons), said in the log."""
    closing = [threading.Thread(target=_close, args=(link,), daemon=True,
                                name=f"evamed-close-{link.info.name}") for link in links]
    for thread in closing:
        thread.start()
    deadline = clock.monotonic() + seconds
    for thread in closing:
        thread.join(max(0.0, deadline - clock.monotonic()))
    late = [t.name.removeprefix("evamed-close-") for t in closing if t.is_alive()]
    if late:
        log.warning("links still closing after %.1f s, left to finish alone: %s", seconds,
                    ", ".join(late))


def _close(link: Link) -> None:
    try:
        link.close()
    except Exception as exc:  # a service gone already: nothing to close there
        log.debug("closing the link to %s: %s", link.info.name, exc)

Key = tuple[str, str]
"""A subscription: (owner, name)."""


@dataclass(frozen=True)
class ServiceStatus:
    """A connected service as ListServices shows it."""

    info: ServiceInfo
    status: str   # the link's: SERVING, CONNECTING
    handles: int  # native queries subscribed there


@dataclass
class _Subscription:
    record: SubscriptionRecord
    doc: ast.Document
    plans: list[Plan]
    federations: list[Federation]  # one per profile composed in a runner: a profile whose
    # answers wait long (a wide frame) holds back none of the others'
    types: frozenset[str] | None  # the event types its classes can match (None: any)
    horizon: int | None  # how long a composite may name an event after it (None: unbounded)
    composed: list[str] = field(default_factory=list)  # profiles a live Spark job composes
    slot: int = -1  # the Spark composer (slot) holding them

    @property
    def key(self) -> Key:
        return (self.record.owner, self.record.name)

    def handles(self) -> set[tuple[str, Handle]]:
        return {(link, h) for f in self.federations for link, hs in f.handles.items() for h in hs}


def composed_by_spark(p: Plan, doc: ast.Document) -> bool:
    """Whether the Spark composer composes the plan (docs/spark.md, "What runs where"): every
    leaf is the mediator's own feed or clock, or a service's filter of one event class — a
    memoryless leaf whose events are all in the event log (a service is published what its
    coverage observes of the log, and is assigned a class only if it observes every event of
    it), so the job's engine over the log decides exactly what the runner decides over the
    service's answers. A subtree a service evaluates whole (an operator, a time class with the
    service's clock) stays with the runner."""
    classes = doc.class_map()
    return all(isinstance(n.original, ast.Prim)
               and not isinstance(classes[n.original.name].body, ast.Every)
               for n in nodes(p.root) if isinstance(n, Remote))


def payload(cloudevent: str, ident: str, profile: str, subscription: str,
            described: Described) -> bytes:
    """A notification log entry: the Notification message's fields but its resume token."""
    return json.dumps({"cloudevent": cloudevent, "id": ident, "profile": profile,
                       "subscription": subscription, "sources": described.sources,
                       "services": described.services, "types": described.types,
                       "times": described.times}).encode()


@dataclass(frozen=True)
class Described:
    """What a notification says of a composite's constituents besides their ids (in their
    order): source, type and time of each (a tick's type and time from its id; "" and 0 for
    one no longer known), and the services they came through."""

    sources: list[str]
    types: list[str]
    times: list[int]
    services: list[str]


NOT_KEPT = -1
"""An ``_Origins`` horizon: no live document can match the event."""


def _longer(a: int | None, b: int | None) -> int | None:
    """The longer of two horizons (None: unbounded; NOT_KEPT: none)."""
    if a == NOT_KEPT or b == NOT_KEPT:
        return b if a == NOT_KEPT else a
    return None if a is None or b is None else max(a, b)


class _Origins:
    """Where the events a composite may still name came from: each one's source, and the
    (link, handle) pairs whose detections named it (the plan leaves that made it visible).
    A composite names only ids; this keeps each event a live document can match (by its type)
    as long as a composite of that document may still name it."""

    def __init__(self) -> None:
        self._source: dict[str, str] = {}
        self._kind: dict[str, tuple[str, int]] = {}  # id → (type, time), as _source
        self._via: dict[tuple[str, str], set[tuple[str, Handle]]] = {}  # by (source, id)
        self._expiry: list[tuple[int, str]] = []  # a heap: (time to forget, id)
        self.clear()

    def clear(self) -> None:
        """No live document: nothing more is kept (what is kept expires as before)."""
        self._by_type: dict[str, int | None] = {}  # type → the longest horizon matching it
        self._any: int | None = NOT_KEPT  # of the documents with a class of any type
        self._longest: int | None = NOT_KEPT  # of every document (ticks)

    def widen(self, types: frozenset[str] | None, horizon: int | None) -> None:
        """Keep what one more document may name too (``types`` None: any type)."""
        if types is None:
            self._any = _longer(self._any, horizon)
        for t in types or ():
            self._by_type[t] = _longer(self._by_type.get(t, NOT_KEPT), horizon)
        self._longest = _longer(self._longest, horizon)

    def __len__(self) -> int:
        """The events it keeps."""
        return len(self._source)

    def note(self, events: Iterable[Event]) -> None:
        for e in events:
            if e.id in self._source:
                continue
            horizon = (self._longest if e.type.startswith(TICK_TYPE)
                       else _longer(self._by_type.get(e.type, NOT_KEPT), self._any))
            if horizon == NOT_KEPT:
                continue
            self._source[e.id] = e.source
            self._kind[e.id] = (e.type, e.time)
            if horizon is not None:
                heapq.heappush(self._expiry, (e.time + horizon, e.id))

    def reported(self, link: str, handle: Handle, detections: Iterable[Detection]) -> None:
        for d in detections:
            self.note(d.constituents)  # the ticks the mediator published
            for e in d.constituents:
                if e.id in self._source:
                    self._via.setdefault((e.source, e.id), set()).add((link, handle))

    def forget(self, newest: int) -> None:
        """Drop what no composite reported after ``newest`` can name."""
        while self._expiry and self._expiry[0][0] < newest:
            _, ident = heapq.heappop(self._expiry)
            source = self._source.pop(ident, None)
            self._kind.pop(ident, None)
            if source is not None:
                self._via.pop((source, ident), None)

    def describe(self, constituents: Sequence[str], handles: set[tuple[str, Handle]],
                 occurrence: Hashable = None) -> Described:
        """The sources, types and times, one per constituent, and the services they came
        through (each once, in constituent order; a constituent no service reported: the
        mediator's own). The
        occurrence's identity names each primitive constituent's (source, id) — CloudEvents
        make only the pair unique — and is read where it does; else by id, as kept."""
        pairs = _pairs(occurrence, constituents)
        sources: list[str] = []
        services: dict[str, None] = {}
        for at, ident in enumerate(constituents):
            pair = pairs[at] if pairs is not None else None
            source = pair[0] if pair is not None else self._source.get(
                ident, TICK_SOURCE if ident.startswith("tick:") else "")
            sources.append(source)
            named = self._via.get((source, ident), set())
            via = sorted({link for link, h in handles if (link, h) in named})
            for link in via or [OWN_FEED]:
                services[link] = None
        kinds = [self._kind.get(ident) or clock_id(ident) or ('', 0) for ident in constituents]
        return Described(sources, [k[0] for k in kinds], [k[1] for k in kinds], list(services))


def _pairs(occurrence: Hashable, constituents: Sequence[str]
           ) -> list[tuple[str, str] | None] | None:
    """Each constituent's (source, id) as the occurrence's identity names it (None for a tick
    or an absence), in constituent order (eva.semantics: a primitive's identity is the pair, a
    binary composite's (tag, left, right)); None when the identity is not of those shapes or
    does not name exactly these constituents."""
    out: list[tuple[str, str] | None] = []

    def walk(ident: Any) -> bool:
        if not isinstance(ident, tuple) or not ident:
            return False
        if len(ident) == 2 and isinstance(ident[0], str) and isinstance(ident[1], str):
            out.append((ident[0], ident[1]))
            return True
        if ident[0] in ("tick", "not"):
            out.append(None)
            return True
        return (len(ident) == 3 and isinstance(ident[0], str)
                and walk(ident[1]) and walk(ident[2]))

    if not walk(occurrence) or len(out) != len(constituents):
        return None
    if any(p is not None and p[1] != c for p, c in zip(out, constituents, strict=True)):
        return None
    return out


def _horizon(doc: ast.Document, tick: int) -> int | None:
    """How long after an event a composite of the document may still name it: the profiles'
    reach, once for the composite's own span and once for the runner's wait on the services'
    answers (a leaf's delay is at most its profile's reach), plus the clock's granularity."""
    found = 0
    for p in doc.profiles:
        reach = lag(p.expr, p.evaluation is ast.Evaluation.END_OF_INTERVAL, tick)
        if reach is None:
            return None
        found = max(found, 2 * reach + 2 * tick)
    return found


def _types(doc: ast.Document) -> frozenset[str] | None:
    """The event types the document's profiles can match (None: any)."""
    classes = doc.class_map()
    out: set[str] = set()
    for name in {n.name for p in doc.profiles for n in ast.walk(p.expr) if isinstance(n, ast.Prim)}:
        body = classes[name].body
        if isinstance(body, ast.Every):
            continue
        found = required_types(body, classes)
        if found is None:
            return None
        out |= found
    return frozenset(out)


SLOTS = "slots.json"
"""In the Spark directory: which subscription's profiles each composer slot holds."""
EVALUATED = "evaluated"
"""In the Spark directory: the event-log position the pipeline has evaluated — the live jobs'
cap (spark_jobs/log_source.py): a job reads no further before the profiles registered there
are in its table."""
MAX_ROWS = 50_000
"""Event-log positions per micro-batch at most (a restart after a long stop catches up in
bounded batches)."""

Claim = tuple[str, str, int]
"""A slot's profile holder: (owner, subscription, created_us) — a subscription removed and
registered again under its name is another holder."""


def spark_dir(store: Store) -> str:
    """Where the Spark composer keeps its jobs by default: beside a SQLite store's file
    (``<file>.spark``), ``./evamed-spark`` for a Redis store (docs/operations.md, Stores)."""
    from mediator.store.sqlite import SqliteStore

    if isinstance(store, SqliteStore):
        if store.path == ":memory:" or store.path.startswith("file:"):
            raise ValueError(f"the Spark composer reads the event log from the store's file; "
                             f"the SQLite store {store.path!r} has none: use a file")
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


def log_lines(store: Store, evaluated: str, start: int) -> Callable[[Any], Any]:
    """The store's event log as a live job's input (after position ``start`` when the job
    is new), capped at the pipeline's evaluated position."""
    from mediator.store.redis import RedisStore
    from mediator.store.sqlite import SqliteStore

    if isinstance(store, SqliteStore):
        from spark_jobs.log_source import sqlite_log_lines

        path = os.path.realpath(store.path)  # read by Spark's workers, wherever they run
        return lambda spark: sqlite_log_lines(spark, path, cap=evaluated, start=start,
                                              max_rows=MAX_ROWS)
    if isinstance(store, RedisStore):
        from spark_jobs.redis_io import redis_lines

        url, stream = store.url, store.prefix + "events"
        return lambda spark: redis_lines(spark, url, stream, cap=evaluated,
                                         start=f"{start}-0", max_rows=MAX_ROWS)
    raise ValueError(f"the Spark composer reads the event log of a SQLite or Redis store, "
                     f"not of {type(store).__name__}")


class _Sparks:
    """The Spark composers (slots) holding the profiles Spark composes, each a live job over
    the store's event log in its own directory under ``root``. A profile name is one entry of
    a composer's profile table, and a composite's id is made from its profile's name: two
    subscriptions defining the same name go to two slots, so every composite keeps the id the
    in-process runner gives it. Which subscription holds which slot's names is kept
    (``slots.json``), so a restart puts every profile back on the job — and the checkpoint —
    that composed it; a slot left without profiles is stopped and its directory removed."""

    def __init__(self, spark: Any, store: Store, root: str | None,
                 deliver: Callable[[Key, str, dict[str, Any]], None], trigger: str | None,
                 tick: int) -> None:
        self.spark = spark
        self.tick = tick  # the runners' clock: the jobs' engines tick alike
        self.store = store
        # Resolved: Spark reads "//tmp/x" (a store URL sqlite:////tmp/x) as host tmp.
        self.root = os.path.realpath(root if root is not None else spark_dir(store))
        self.deliver = deliver
        self.trigger = trigger
        self.evaluated = os.path.join(self.root, EVALUATED)
        os.makedirs(self.root, exist_ok=True)
        self.slots: list[LiveComposer | None] = []
        self.names: list[dict[str, Claim]] = self._load()  # per slot: profile → its holder
        self.live: set[int] = set()  # slots whose names are registered since this start
        # Per slot, names removed there since this start: a micro-batch still in flight runs
        # the old table, and its composites must not reach a new holder of the name.
        self.retired: dict[int, set[str]] = {}
        self._marked: int | None = None  # the position in the cap file (read at first use)
        self._failed: BaseException | None = None  # a job that did not start
        self._looked = 0.0  # when failure() last asked the jobs

    def _load(self) -> list[dict[str, Claim]]:
        path = os.path.join(self.root, SLOTS)
        if not os.path.exists(path):
            return []
        try:
            with open(path, encoding="utf-8") as handle:
                found = json.load(handle)
            return [{name: (str(c[0]), str(c[1]), int(c[2])) for name, c in slot.items()}
                    for slot in found]
        except (OSError, ValueError, TypeError, IndexError, AttributeError) as exc:
            raise ValueError(f"the Spark composer's {path} cannot be read ({exc}); expected "
                             "the slots it wrote: remove the directory to start its jobs "
                             "afresh (they then replay from the subscriptions' starts)"
                             ) from None

    def _save(self) -> None:
        from spark_jobs.spool import write_whole

        write_whole(os.path.join(self.root, SLOTS),
                    json.dumps([{n: list(c) for n, c in slot.items()} for slot in self.names]))

    def mark(self, position: int) -> None:
        """The pipeline evaluated the log up to ``position``: the jobs may read that far. Never
        moved back: a restart's replay of positions evaluated before registers nothing there
        (a new subscription starts at the log's head)."""
        from spark_jobs.log_source import read_cap
        from spark_jobs.spool import write_whole

        if self._marked is None:
            self._marked = read_cap(self.evaluated) or 0
        if position > self._marked:
            write_whole(self.evaluated, str(position))
            self._marked = position

    def register(self, record: SubscriptionRecord, doc: ast.Document, names: list[str]) -> int:
        """Register the subscription's profiles ``names`` (its start as the record says) with
        the slot that held them before a restart, else one where none of them is taken."""
        holder = (record.owner, record.name, record.created_us)
        slot = next((i for i, held in enumerate(self.names)
                     if names and all(held.get(n) == holder for n in names)), -1)
        if slot < 0:
            slot = next((i for i, held in enumerate(self.names)
                         if not set(names) & (set(held) | self.retired.get(i, set()))), -1)
        if slot < 0:
            self.names.append({})
            slot = len(self.names) - 1
        # Named after its holder (a comment): a profile removed and registered again gets a
        # new registration in the job's table, never the old one's state.
        text = (f"# subscription {record.owner}/{record.name} created {record.created_us}\n"
                + to_text(ast.Document(doc.classes,
                                       tuple(p for p in doc.profiles if p.name in names))))
        self._composer(slot, record.start_position).register(text, record.start_time)
        self.names[slot].update(dict.fromkeys(names, holder))
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
                lines=log_lines(self.store, self.evaluated, start),
                deliver=lambda rows: self._delivered(slot, rows),
                trigger=self.trigger or TRIGGER)
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
        self.live.discard(slot)
        self.retired.pop(slot, None)  # its job is stopped: nothing of it is in flight
        self._save()

    def remove(self, slot: int, names: list[str]) -> None:
        for name in names:
            composer = self.slots[slot]
            if composer is not None:
                composer.remove(name)
            self.names[slot].pop(name, None)
            self.retired.setdefault(slot, set()).add(name)
        if not self.names[slot]:
            self._drop(slot)
        else:
            self._save()

    def _delivered(self, slot: int, rows: list[tuple[str, str, dict[str, Any]]]) -> None:
        """A live job's micro-batch (in its query's thread): each composite to the log of the
        subscription holding its profile."""
        held = self.names[slot]
        for kind, profile, body in rows:
            holder = held.get(profile)
            if kind != "composite":
                log.warning("the Spark composer refused an event for profile %s: %s: %s",
                            profile, body.get("reason"), body.get("detail"))
            elif holder is not None:  # else removed meanwhile
                self.deliver(holder[:2], profile, body)

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


class Pipeline:
    """Every live subscription over the event log (see the module docstring). ``spark``: the
    SparkSession of the ``"spark"`` composer (default: local mode, started by :meth:`start`);
    ``spark_dir``: where its jobs keep their tables and checkpoints (default: :func:`spark_dir`);
    ``trigger``: their processing-time trigger (default: spark_jobs.composer.TRIGGER);
    ``batch``: events per batch; ``trim_every``: batches between event-log trims."""

    def __init__(self, store: Store, links: Mapping[str, Link], *, tick: int = 1_000_000,
                 composer: str = "inprocess", metrics: Metrics | None = None,
                 on_append: Callable[[str, str, int], None] = lambda owner, name, head: None,
                 spark: Any = None, spark_dir: str | None = None, trigger: str | None = None,
                 batch: int = 500, trim_every: int = 100) -> None:
        if composer not in COMPOSERS:
            raise ValueError(f"composer {composer!r}: expected one of {', '.join(COMPOSERS)}")
        if batch < 1 or trim_every < 1:
            raise ValueError(f"batch {batch} and trim_every {trim_every}: expected 1 or more")
        for name, link in links.items():
            if name != link.info.name:
                raise ValueError(f"link {name!r} serves {link.info.name!r}: expected each link "
                                 "under its service's name")
        self.store = store
        self.links = dict(links)
        self.tick = tick
        self.composer = composer
        self.metrics = metrics
        self.on_append = on_append
        self.batch = batch
        self.trim_every = trim_every
        self._sparks = (_Sparks(spark, store, spark_dir, self._append_composed, trigger, tick)
                        if composer == "spark" else None)
        self._subs: dict[Key, _Subscription] = {}
        self._handles: dict[str, int] = dict.fromkeys(self.links, 0)  # per link, all federations'
        self._origins = _Origins()
        self._lock = threading.RLock()  # held for a batch, and to add or remove
        self._wakeup = threading.Event()
        self._thread: threading.Thread | None = None
        self._draining = False  # stop: evaluate what the log holds, then end
        self._halt = False      # stop now, after the batch in progress
        self._cut_short = False  # the links were closed under a batch: it appends nothing
        self._position = 0      # the last event-log position evaluated
        self._newest: int | None = None  # the newest event time evaluated
        self._sealed = False  # the newest time is a watermark's: its instant is complete
        self._logged: int | None = None  # the newest event time in the log at start
        self._watermarks: list[tuple[int, int]] = []  # (log head when given, time)
        self._marks = threading.Lock()  # for the watermarks: advance() never waits on a batch
        self._batches = 0
        self.error: BaseException | None = None
        """What stopped the thread, if it failed (the service reports NOT_SERVING)."""

    # ---------------------------------------------------------------- lifecycle

    def start(self) -> None:
        """Restore every stored subscription, then start the thread: each is re-planned and
        subscribed again at the services when the replay of the log reaches its start position;
        the thread replays the rest of the log with every federation, then follows it."""
        if self._sparks is not None:
            # The JVM starts now, before the service answers (and forks before its gRPC
            # threads): not in the first AddProfile that needs it, seconds past its deadline.
            self._sparks.session()
        records = sorted(self.store.subscriptions(), key=lambda r: r.start_position)
        head = self.store.event_head()
        self._position = records[0].start_position if records else head
        self._logged = self._newest_logged(head)
        for record in records:
            try:
                self._add(record, None, restoring=True)
            except Exception as exc:  # one subscription that cannot be restored: the rest can
                log.error("subscription %s/%s not restored: %s", record.owner, record.name, exc)
        if self._sparks is not None:  # every stored profile is back in the jobs' tables
            self._sparks.begin()
        self._thread = threading.Thread(target=self._run, name="evamed-pipeline", daemon=True)
        self._thread.start()

    def _newest_logged(self, head: int) -> int | None:
        """The newest event time the log holds (or held before a trim)."""
        found = [int(v)] if (v := self.store.get_meta(NEWEST_KEY)) is not None else []
        for logged in self.store.read_events(after=max(head - 1, 0), limit=1):
            with contextlib.suppress(EventError):
                found.append(from_json_line(logged.line).time)
        return max(found, default=None)

    def stop(self, timeout: float = 5.0) -> None:
        """Evaluate what the log holds, then unsubscribe every federation at its services —
        within ``timeout`` whatever the services do. A batch still waiting on a service then
        (one out of reach: its link reconnects without end) is cut short: the links are closed
        (their calls raise ConnectionError, which the thread takes as the stop), nothing that
        batch decided is appended, and it stays in the event log for the next start to
        evaluate. The same for unsubscribing. Returns within about ``timeout + 3 * CUT``."""
        deadline = clock.monotonic() + timeout
        thread, self._thread = self._thread, None
        self._draining = True
        self._wakeup.set()
        if thread is not None:
            thread.join(timeout)
            if thread.is_alive():
                log.warning("the pipeline did not evaluate the event log within %.1f s (a "
                            "service out of reach?); closing the links: the next start "
                            "evaluates it from position %d", timeout, self._position)
                self._cut()
                thread.join(CUT)
        self._halt = True
        self._wakeup.set()
        if not self._lock.acquire(timeout=max(deadline - clock.monotonic(), CUT)):
            log.error("the pipeline thread did not stop; leaving it (the next start evaluates "
                      "the event log from position %d)", self._position)
            return
        try:
            unsubscribing = threading.Thread(target=self._unsubscribe_all, daemon=True,
                                             name="evamed-pipeline-stop")
            unsubscribing.start()
            unsubscribing.join(max(deadline - clock.monotonic(), CUT))
            if unsubscribing.is_alive():
                log.warning("unsubscribing at the services did not end within %.1f s (a "
                            "service out of reach?); closing the links", timeout)
                self._cut()
                unsubscribing.join(CUT)
            self._subs.clear()
            self._handles = dict.fromkeys(self.links, 0)
            if self._sparks is not None:
                self._sparks.close()
            if self._newest is not None:
                self.store.set_meta(NEWEST_KEY, str(self._newest))
        finally:
            self._lock.release()

    def _cut(self) -> None:
        """Cut short whatever waits on a service: the links closed, the thread halted, and
        nothing more appended (a batch whose answers a closed link cut may be incomplete)."""
        self._cut_short = True
        self._halt = True
        close_links(self.links.values(), CUT)

    def _unsubscribe_all(self) -> None:
        for sub in list(self._subs.values()):
            for federation in sub.federations:
                try:
                    federation.unsubscribe()
                except Exception as exc:  # gone, or closed meanwhile: its service forgets it
                    log.warning("unsubscribing %s/%s: %s", *sub.key, exc)

    @property
    def position(self) -> int:
        """The last event-log position evaluated."""
        return self._position

    def wake(self) -> None:
        """The event log grew."""
        self._wakeup.set()

    def newest(self) -> int | None:
        """The newest event time in the log as far as the pipeline knows (evaluated, or there
        at start)."""
        times = [t for t in (self._newest, self._logged) if t is not None]
        return max(times, default=None)

    def advance(self, time: int) -> None:
        """A watermark: no event at or before ``time`` will come any more. Applied once the
        events logged before it are evaluated."""
        with self._marks:
            self._watermarks.append((self.store.event_head(), time))
        self._wakeup.set()

    # ---------------------------------------------------------------- subscriptions

    def add(self, record: SubscriptionRecord, doc: ast.Document | None = None) -> list[Plan]:
        """Plan every profile of the record's document over the connected services, subscribe
        the federation, and evaluate it on the events after the record's start position (the
        log's head when it was registered): the pipeline first evaluates the log up to there.
        The record's start is then set to where the pipeline is — the position, and the newest
        event time evaluated, which the profiles see events after — and stored, if the record
        is (a restart replays it from there): store it before ``add``. ``ProfileError`` for a
        document that does not parse, ``ValueError`` (``PushRefused``) for one a service
        refuses. ``doc``: the record's text parsed already (parsing is most of the cost)."""
        return self._add(record, doc, restoring=False)

    def _add(self, record: SubscriptionRecord, doc: ast.Document | None,
             restoring: bool) -> list[Plan]:
        doc = doc if doc is not None else parse(record.text)
        infos = [link.info for link in self.links.values()]
        with self._locked():
            key = (record.owner, record.name)
            if key in self._subs:
                raise ValueError(f"subscription {record.owner}/{record.name} is already live")
            while self._position < record.start_position and self._step(record.start_position):
                pass
            stamped = replace(record, start_position=self._position, start_time=self._newest)
            if not restoring and stamped != record:
                # Registered while events were on their way, or evaluated past its start
                # already (the services have seen those events): it starts here.
                record = stamped
                if self.store.subscription(record.owner, record.name) is not None:
                    self.store.put_subscription(record)
            plans = [plan_federated(p, doc, infos, live=True) for p in doc.profiles]
            sparked = [p for p in plans if self._composer(p, doc) == "spark"]
            ran = [p for p in plans if p not in sparked]
            federations: list[Federation] = []
            try:
                for p in ran:
                    federations.append(Federation(doc, [p], self.links, tick=self.tick,
                                                  start=record.start_time))
                sub = _Subscription(record, doc, plans, federations, _types(doc),
                                    _horizon(doc, self.tick), [p.profile.name for p in sparked])
                if sparked and self._sparks is not None:
                    sub.slot = self._sparks.register(record, doc, sub.composed)
                    if not restoring:  # (restored ones start together: Pipeline.start)
                        self._sparks.begin(wait=False)
                        self._sparks.mark(self._position)
            except BaseException:  # nothing half-subscribed stays at the services
                for federation in federations:
                    federation.unsubscribe()
                raise
            self._subs[key] = sub
            self._count(sub, 1)
            self._origins.widen(sub.types, sub.horizon)
            return plans

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        """The lock, for adding and removing: waited for in slices, and given up (Stopping)
        once the pipeline stops — a batch waiting on a service holds it until stop() cuts it
        short, and what waits behind it must then end too."""
        while not self._lock.acquire(timeout=LOCK_SLICE):
            if self._halt:
                raise Stopping("the mediator is stopping: try again once it is back")
        try:
            if self._halt:
                raise Stopping("the mediator is stopping: try again once it is back")
            yield
        finally:
            self._lock.release()

    def _count(self, sub: _Subscription, sign: int) -> None:
        """Count a subscription's handles in (1) or out (-1) of their links'."""
        for federation in sub.federations:
            for name, handles in federation.handles.items():
                self._handles[name] += sign * len(handles)

    def remove(self, owner: str, name: str) -> bool:
        """Unsubscribe a live subscription at its services and drop it."""
        with self._locked():
            sub = self._subs.pop((owner, name), None)
            if sub is None:
                return False
            self._count(sub, -1)
            for federation in sub.federations:
                federation.unsubscribe()
            if sub.composed and self._sparks is not None:
                self._sparks.remove(sub.slot, sub.composed)
            self._retarget()
            return True

    def _retarget(self) -> None:
        """What the origins index keeps: the types and horizons of the live documents."""
        self._origins.clear()
        for sub in self._subs.values():
            self._origins.widen(sub.types, sub.horizon)

    def _composer(self, p: Plan, doc: ast.Document) -> str:
        """Where a plan's mediator-side part is composed (the module docstring)."""
        return ("spark" if self._sparks is not None and composed_by_spark(p, doc)
                else "inprocess")

    def placement(self, owner: str, name: str) -> dict[str, str]:
        """Where each profile of a live subscription is composed: ``"inprocess"`` (its
        federation's runner, in this process) or ``"spark"`` (the Spark composer)."""
        sub = self._subs.get((owner, name))
        if sub is None:
            return {}
        return {p.profile.name: "spark" if p.profile.name in sub.composed else "inprocess"
                for p in sub.plans}

    def explain(self, doc: ast.Document) -> tuple[str, str]:
        """The document's plans over the connected services, as text and as JSON."""
        from rich.console import Console

        infos = [link.info for link in self.links.values()]
        plans = [plan_federated(p, doc, infos, live=True) for p in doc.profiles]
        render = service_renderer(((i.name, i.group) for i in infos), doc)
        console = Console(record=True, width=120, file=io.StringIO())
        out = []
        for p in plans:
            composer = self._composer(p, doc)
            console.print(explain(p, render))
            console.print(f"  composed by: {composer}")
            out.append({**as_json(p, render), "composer": composer})
        return console.export_text(), json.dumps(out, indent=2, ensure_ascii=False)

    def services(self) -> list[ServiceStatus]:
        return [ServiceStatus(link.info, link.status(), self._handles[name])
                for name, link in self.links.items()]

    # ---------------------------------------------------------------- the thread

    def _run(self) -> None:
        try:
            while True:
                self._wakeup.clear()
                with self._lock:
                    if self._halt:
                        return
                    evaluated = self._step()
                    self._watermark()
                    failed = self._sparks.failure() if self._sparks is not None else None
                    if failed is not None:  # a live job stopped: composites would stop too
                        raise failed
                if evaluated:
                    continue
                if self._draining:
                    return
                self._wakeup.wait(POLL)
        except Exception as exc:  # a bug, or a service gone for good: say so, keep the log
            if self._cut_short:  # stop() closed the links under the batch: the stop, said
                log.info("the pipeline stopped at event-log position %d, its batch cut short "
                         "(%s)", self._position, exc)
                return
            self.error = exc
            log.exception("the pipeline stopped at event-log position %d", self._position)

    def _step(self, upto: int | None = None) -> int:
        """Evaluate the next batch of the log (up to position ``upto``); how many entries it
        held."""
        limit = self.batch if upto is None else min(self.batch, upto - self._position)
        logged = self.store.read_events(after=self._position, limit=limit) if limit > 0 else []
        if not logged:
            return 0
        events = self._decode(logged)
        if events:
            began = clock.perf_counter()
            self._evaluate(events)
            if self.metrics:
                self.metrics.composer_latency.observe(clock.perf_counter() - began)
                self._measure(self.metrics)
        self._position = logged[-1].position
        if self._sparks is not None:
            self._sparks.mark(self._position)
        self._batches += 1
        if self._batches % self.trim_every == 0:
            self._trim()
        return len(logged)

    def _decode(self, logged: list[LoggedEvent]) -> list[Event]:
        """The batch's events, numbered by their log positions (the trace's arrival order).
        Publish logs only well-formed events in time order; anything else is skipped, said."""
        out: list[Event] = []
        for item in logged:
            try:
                event = from_json_line(item.line, item.position)
            except EventError as exc:
                log.error("event-log position %d skipped: %s", item.position, exc)
                self._dead_letter("malformed")
                continue
            if self._newest is not None and (event.time < self._newest or (
                    event.time == self._newest and self._sealed)):
                log.error("event-log position %d (id %r) skipped: its time lies before the "
                          "newest evaluated (or at a watermark); expected the log in time "
                          "order", item.position, event.id)
                self._dead_letter("late")
                continue
            self._newest, self._sealed = event.time, False
            out.append(event)
        return out

    def _dead_letter(self, reason: str) -> None:
        if self.metrics:
            self.metrics.dead_letters.labels(reason).inc()

    def _evaluate(self, events: list[Event]) -> None:
        """Steps 1–4 of the module docstring for one batch."""
        self._origins.note(events)
        self._round(events, None, events[-1].time)
        self._origins.forget(events[-1].time)

    def _round(self, events: list[Event], until: int | None, newest: int) -> None:
        """Every federation over the shared links: the batch (or, with ``until`` and no
        events, a watermark) published to each link with subscriptions once, with the ticks
        every federation asks of it; then each decides up to ``newest - 1``."""
        feds = [(s, f) for s in self._subs.values() for f in s.federations]
        ticks: dict[str, list[Event]] = {}
        for _, fed in feds:
            for name, asked in fed.begin(events, until).items():
                ticks.setdefault(name, []).extend(asked)
        used = {name: link for name, link in self.links.items() if self._handles[name]}
        detections = publish(used, events, ticks, until)
        for name, found in detections.items():
            for handle, reported in found.items():
                self._origins.reported(name, handle, reported)
            count = sum(len(v) for v in found.values())
            if self.metrics and count:
                self.metrics.notifications_in.labels(name).inc(count)
        decided: dict[Key, list[Notification]] = {}
        for sub, fed in feds:
            decided.setdefault(sub.key, []).extend(fed.finish(detections, newest))
        for key, notes in decided.items():
            # One runner per profile: merged in detection order, as one runner would report.
            notes.sort(key=lambda n: n.emitted)
            self._append(self._subs[key], notes)

    def _measure(self, metrics: Metrics) -> None:
        """After a batch: what the runners hold, summed over every subscription per part (a
        fixed label set however many subscriptions there are), with the pipeline's own index
        of origins; and the services' answers the post-filters dropped, per service (those of
        watermark rounds too)."""
        held = RunnerStats()
        for federation in (f for sub in self._subs.values() for f in sub.federations):
            held += federation.stats()
            for service, count in federation.take_drops().items():
                metrics.post_filter_drops.labels(service).inc(count)
        for part, value in [*asdict(held).items(), ("origins", len(self._origins))]:
            metrics.state_size.labels(part).set(value)

    def _watermark(self) -> None:
        """Apply the watermarks whose events are all evaluated: a round without events."""
        with self._marks:
            due = [t for head, t in self._watermarks if head <= self._position]
            self._watermarks = [(h, t) for h, t in self._watermarks if h > self._position]
        if not due:
            return
        time = max(due)
        if self._newest is None or time >= self._newest:
            self._newest, self._sealed = time, True  # an event at or before it is late
            self._round([], time, time + 1)

    def _append(self, sub: _Subscription, notes: list[Notification]) -> None:
        if not notes:
            return
        handles = sub.handles()
        items = []
        for n in notes:
            ident, line = composite_line(n)
            described = self._origins.describe(n.occ.events, handles, n.occ.ident)
            items.append((ident, payload(line, ident, n.profile, sub.record.name, described)))
        self._store_items(sub.key, items)

    def _append_composed(self, key: Key, profile: str, body: dict[str, Any]) -> None:
        """A composite of the Spark composer (its CloudEvent as the runner writes it), in its
        job's thread: the store dedupes by id, so a micro-batch re-run after a restart
        appends nothing twice. Its services: the mediator's own feed (no service took part).
        Its sources as the origins index still knows them (it keeps an event as long as a
        composite may name it after the pipeline evaluated it; a job far behind the pipeline
        — catching up after a restart — may find "" for one)."""
        constituents = [str(c) for c in body["data"]["constituents"]]
        described = self._origins.describe(constituents, set())
        ident = str(body["id"])
        self._store_items(key, [(ident, payload(json.dumps(body), ident, profile, key[1],
                                                described))])

    def _store_items(self, key: Key, items: list[tuple[str, bytes]]) -> None:
        if self._cut_short:  # decided from answers a closed link may have cut: not kept
            raise Stopping("the pipeline is stopping: the batch in progress was cut short")
        appended = self.store.append_notifications(key[0], key[1], items)
        if not appended:
            return
        if self.metrics:
            self.metrics.composites_out.inc(len(appended))
        try:
            self.on_append(key[0], key[1], appended[-1].position)
        except Exception:  # the streams re-read the log anyway; the pipeline goes on
            log.exception("waking the streams of %s/%s failed", *key)

    def _trim(self) -> None:
        """Drop the event-log positions no live subscription needs (each needs those after its
        start position) and the pipeline has evaluated."""
        starts = [s.record.start_position for s in self._subs.values()]
        before = min([*starts, self._position + 1])
        if self._newest is not None:
            self.store.set_meta(NEWEST_KEY, str(self._newest))
        dropped = self.store.trim_events(before)
        if dropped:
            log.debug("event log trimmed: %d entries before position %d", dropped, before)

