"""The pipeline: every subscription evaluated over the mediator's inputs, live.

The inputs are the mediator's **own feed** — the store's event log (Publish and the brokers'
sources; :mod:`mediator.ingestion`) — and the **autonomous services** — each one's link log,
the messages of the mediator's durable session there (:mod:`mediator.inputs`). A thread reads
them and runs every live subscription's :class:`~adapters.federation.Federation`
(docs/architecture.md, "The live path"):

1. a batch of the own feed: every federation that takes it begins it (``begin``: the ticks its
   queries need per fed link); every **fed** link (a service the mediator publishes to, whose
   coverage observes part of the own feed) is published, once, the batch events its service
   observes merged with the ticks all federations ask of it; every federation takes its
   handles' detections (``take``);
2. the entries of each link log: each detection to the federations holding its handle (those
   registered before the entry; ``learn``: the events it names are learnt);
3. every federation decides up to the smallest watermark of the inputs it uses
   (:func:`mediator.inputs.bound`: an idle input stops holding the others back), and each
   subscription's composites are appended to its notification log (the store skips an id
   already there); ``on_append`` wakes the streams that deliver them.

Profiles added and removed take effect between rounds (one lock: the thread holds it for a
round). A restart is fresh everything and a replay: :meth:`Pipeline.start` re-plans every stored
subscription and replays the logs — the event log from the oldest subscription's start, each
federation subscribed at the fed services just when the replay reaches its start, so each sees
exactly what it saw before, and each link log from the oldest start there (the autonomous
services kept evaluating: their registrations are durable). Composites already logged are
skipped by their deterministic ids.

With autonomous services, every profile starts its clock where the merged trace starts: once
every input has said where its first event lies (or is idle), the **origin** is the earliest of
them (kept in the store); a subscription registered later starts at the instant every input
had reported by then.

Placement (:mod:`mediator.placement`): ``composer = "inprocess"`` composes every plan's
mediator-side part in its federation's runner in this process; ``"spark"`` hands the plans the
Spark job composes exactly (:func:`~mediator.placement.spark_composes`) to the
:class:`~mediator.placement.SparkFeed`, which the thread feeds where it feeds the federations
(1–3: ``begin``/``take``, ``learn``, ``release``): it subscribes their filters at the
services, writes the composer log the live Spark jobs read, and appends their composites from
the jobs' threads.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import threading
import time as clock
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass, field, replace
from operator import attrgetter
from typing import Any

from adapters.backends.registry import shared_language
from adapters.federation import Federation, Late, language_refuses, publish
from adapters.links import Handle, Link, SubscriptionLink
from adapters.remote_link import RemoteLink
from adapters.service_link import AutonomousLink
from eva import ast
from eva.admission import CAPACITY, Reason
from eva.engine import COMPOSITE_LIMIT
from eva.events import DeadLetter, Event
from eva.notify import composite_line
from eva.parser import parse
from eva.semantics import Notification
from mediator import checkpoints
from mediator.config import COMPOSERS, RESERVED_SERVICE
from mediator.dead_letters import DeadLetterLog, Letter
from mediator.door import wall_clock
from mediator.ingestion import OwnFeed
from mediator.inputs import ServiceFeed, State, Takers, bound
from mediator.metrics import Metrics
from mediator.notification_log import Entry, encode
from mediator.placement import SparkFeed, spark_composes
from mediator.provenance import Origins, horizon, types
from mediator.store.base import Store, SubscriptionRecord
from transforms.explanation import as_json, explain, service_renderer
from transforms.federated import Refuses, ServiceInfo, plan_federated
from transforms.plans import Plan
from transforms.runner import RunnerStats

_SEQ = attrgetter("seq")
log = logging.getLogger(__name__)

POLL = 1.0
"""Seconds the thread sleeps without a wake before it looks at the log again."""
MEASURED = 1.0
"""Seconds the state gauge may lag behind subscriptions added while no input moved."""
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

ORIGIN_KEY = "pipeline.origin"
"""Store meta: the origin of the merged trace (with autonomous services): the time before its
first event."""
TRIM_SECONDS = 5.0
"""Seconds between trims of the logs at most, whatever flows."""
CHECKPOINTS_KEPT = 2
"""Checkpoints kept: the newest, and one to fall back on if it does not read."""
FED_GRACE = 3.0
"""Seconds a start waits for the fed services to connect before planning the stored
subscriptions (one out of reach then is planned around)."""
WARM_WAIT = 300.0
"""Seconds a start waits at most for the Spark composer's first micro-batch (``warm``): a
first start on a loaded machine takes tens of seconds; longer, the mediator serves anyway and
says so."""
LINK_READ = 500
"""Link-log entries read per round and service."""
LATE_SHOWN = 3
"""Late reports of a round named in the log (all are counted)."""

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
    links: dict[str, int] = field(default_factory=dict)  # its start in each link log
    own_after: int = 0  # restored from a checkpoint: the event-log position it had read to,
    own_held: frozenset[int] = frozenset()  # but for these (the own feed's reorder buffer's)
    sparked: list[tuple[str, Handle]] = field(default_factory=list)  # its Spark filters

    @property
    def key(self) -> Key:
        return (self.record.owner, self.record.name)

    def handles(self) -> set[tuple[str, Handle]]:
        return {(link, h) for f in self.federations for link, hs in f.handles.items() for h in hs}


class Pipeline:
    """Every live subscription over the inputs (see the module docstring). ``links``: the
    services, fed (:mod:`adapters.links`, :mod:`adapters.remote_link`) and autonomous
    (:class:`~adapters.service_link.AutonomousLink`), in the configured order; ``idle``: each
    autonomous service's idle timeout in seconds (default ``idle_default``, also the own
    feed's). ``spark``: the SparkSession of the ``"spark"`` composer (default: local mode,
    started by :meth:`start`); ``spark_dir``: where its jobs keep their tables and checkpoints;
    ``trigger``: their processing-time trigger; ``batch``: events per batch; ``trim_every``:
    batches between trims of the logs; ``composites``: the composite limit of each profile's
    engines (``limits.composites``; None: none) — a subscription that reaches it, or the
    engines' state cap, is suspended (:meth:`suspended`)."""

    def __init__(self, store: Store, links: Mapping[str, Link], *, tick: int = 1_000_000,
                 composer: str = "inprocess", metrics: Metrics | None = None,
                 on_append: Callable[[str, str, int], None] = lambda owner, name, head: None,
                 spark: Any = None, spark_dir: str | None = None, trigger: str | None = None,
                 batch: int = 2000, trim_every: int = 100, idle: Mapping[str, float] | None = None,
                 idle_default: float = 5.0, checkpoint_interval: float = 30.0,
                 checkpoint_events: int = 100_000, lateness: int = 0, reorder: int = CAPACITY,
                 letters: DeadLetterLog | None = None,
                 composites: int | None = COMPOSITE_LIMIT) -> None:
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
        self.checkpoint_interval = checkpoint_interval
        self.checkpoint_events = checkpoint_events
        self.composites = composites
        self._subs: dict[Key, _Subscription] = {}
        self._handles: dict[str, int] = dict.fromkeys(self.links, 0)  # per link, all federations'
        self._origins = Origins()
        self._lock = threading.RLock()  # held for a round, and to add or remove
        self._wakeup = threading.Event()
        self._thread: threading.Thread | None = None
        self._draining = False  # stop: evaluate what the logs hold, then end
        self._halt = False      # stop now, after the round in progress
        self._cut_short = False  # the links were closed under a batch: it appends nothing
        self.letters = letters  # the dead-letter log (services' late reports)
        self._own = OwnFeed(store, metrics, idle_default, lateness, reorder, letters,
                            now=wall_clock)
        self._feeds: dict[str, ServiceFeed] = {}
        autonomous = [link for link in self.links.values() if isinstance(link, AutonomousLink)]
        for rank, link in enumerate(autonomous, start=1):
            self._feeds[link.info.name] = ServiceFeed(
                link, store, rank, (idle or {}).get(link.info.name, idle_default), self.wake)
        self._sparks = (SparkFeed(store, self.links, self._feeds, spark=spark, root=spark_dir,
                                  trigger=trigger, tick=tick, append=self._store_items)
                        if composer == "spark" else None)
        # Who takes each autonomous handle's detections: (subscription, federation).
        self._users: dict[tuple[str, Handle], Takers] = {}
        for name, link in self.links.items():
            if isinstance(link, (AutonomousLink, SubscriptionLink, RemoteLink)):
                link.on_refused = self._refusals(name)
        self._failed: dict[Key, str] = {}  # subscriptions not evaluated, and why
        # Suspended at a limit (a subset of _failed): the letter's reason (composite_limit,
        # state_cap) — its owner is answered RESOURCE_EXHAUSTED.
        self._suspended: dict[Key, str] = {}
        # Handles a service ended at its limit (a link's thread adds): their holders are
        # suspended at the next round, and so is a later holder (_ended_seen: all checked).
        self._ended_handles: dict[tuple[str, Handle], str] = {}
        self._ended_seen = True
        # A round decides every subscription only when an input moved (the states differ from
        # _settled, or a round evaluated something: None); otherwise only those added since
        # (_fresh) — a registration costs its own decision, not one of every subscription.
        self._settled: list[State] | None = None
        self._fresh: dict[Key, _Subscription] = {}  # (a dropped one leaves it: _drop)
        self._held = RunnerStats()  # the state gauge's sum, kept up as subscriptions come
        self._remeasure = False  # one was dropped: the sum is walked again (once per MEASURED)
        self._measured = clock.monotonic()
        known = store.get_meta(ORIGIN_KEY) if self._feeds else None
        self._origin: int | None = int(known) if known is not None else None
        self._batches = 0
        self._trimmed = clock.monotonic()
        self._checkpointed = clock.monotonic()
        self._since = 0  # entries read since the last checkpoint
        self._kept: list[dict[str, Any]] = []  # the kept checkpoints' positions (oldest first)
        self.error: BaseException | None = None
        """What stopped the thread, if it failed (the service reports NOT_SERVING)."""

    # ---------------------------------------------------------------- lifecycle

    def start(self) -> None:
        """Restore every stored subscription, then start the thread: each is re-planned and
        subscribed again at the services (at the fed ones when the replay of the event log
        reaches its start position); the thread replays the rest of the logs with every
        federation, then follows them."""
        if self._sparks is not None:
            # The JVM starts now, before the service answers (and forks before its gRPC
            # threads): not in the first AddProfile that needs it, seconds past its deadline.
            self._sparks.session()
        records = sorted(self.store.subscriptions(), key=lambda r: r.start_position)
        checkpoint = self._newest_checkpoint()
        saved: dict[str, Any] = checkpoint["subs"] if checkpoint is not None else {}
        covered = [r for r in records if saved.get(_sub_id(r)) is not None]
        rest = [r for r in records if saved.get(_sub_id(r)) is None]
        if checkpoint is not None:
            log.info("restarting from checkpoint: %d of %d subscriptions restored, %d replayed "
                     "from their starts", len(covered), len(records), len(rest))
        own_at = min([*(r.start_position for r in rest),
                      *([checkpoint["own"]["position"]] if covered and checkpoint else [])],
                     default=self.store.event_head())
        self._own.start(own_at)
        if checkpoint is not None and covered and own_at == checkpoint["own"]["position"]:
            lost = self._own.restore(checkpoint["own"])
            if lost:
                log.error("%d events the checkpoint's reorder buffer held are no longer in the "
                          "event log", lost)
        for name, feed in self._feeds.items():
            starts = [_link_starts(r).get(name) for r in rest]
            if checkpoint is not None and covered and name in checkpoint["feeds"]:
                starts.append(checkpoint["feeds"][name]["position"])
            head, _ = self.store.link_bounds(name)
            feed.position = min((s for s in starts if s is not None), default=head)
            if checkpoint is not None and name in checkpoint["feeds"] and (
                    feed.position == checkpoint["feeds"][name]["position"]):
                feed.restore(checkpoint["feeds"][name]["watermark"])
            feed.start()
        if checkpoint is not None and checkpoint.get("origins") is not None and covered:
            self._origins.import_state(checkpoint["origins"])
        self._await_fed_links()
        for record in records:
            try:
                self._add(record, None, restoring=True, saved=saved.get(_sub_id(record)),
                          checkpoint=checkpoint)
            except Exception as exc:  # one subscription that cannot be restored: the rest can
                log.error("subscription %s/%s not restored: %s", record.owner, record.name, exc)
                self._failed[(record.owner, record.name)] = f"not restored: {exc}"
        if self._sparks is not None:  # every stored profile is back in the jobs' tables
            self._sparks.begin_jobs()
        self._thread = threading.Thread(target=self._run, name="evamed-pipeline", daemon=True)
        self._thread.start()

    def warm(self, seconds: float = WARM_WAIT) -> str | None:
        """The Spark composer's jobs (a job with no profile too, when none is live: the first
        registration takes it) each run a first micro-batch now — where Spark plans and
        compiles its query — rather than on a subscriber's first event: waits for them, at
        most ``seconds``. Returns why it stopped waiting early (None: warm, or no Spark)."""
        if self._sparks is None:
            return None
        with self._locked():
            position = self._sparks.warm()
        deadline = clock.monotonic() + seconds
        while not self._sparks.warmed(position):
            failed = self._sparks.failure()
            if failed is not None:
                return f"the Spark composer's job failed: {failed}"
            if clock.monotonic() > deadline:
                return f"the Spark composer's first micro-batch took longer than {seconds:.0f} s"
            clock.sleep(0.05)
        return None

    def _await_fed_links(self, seconds: float = FED_GRACE) -> None:
        """Give the fed services a moment to connect before the stored subscriptions are
        planned: one still out of reach then is planned around."""
        deadline = clock.monotonic() + seconds
        fed = [link for link in self.links.values() if not link.info.autonomous]
        while (any(link.status() != "SERVING" for link in fed)
               and clock.monotonic() < deadline):
            clock.sleep(0.05)

    def failure(self, owner: str, name: str) -> str | None:
        """Why a stored subscription is not evaluated (None: it is)."""
        return self._failed.get((owner, name))

    def suspended(self, owner: str, name: str) -> str | None:
        """The limit a stored subscription was suspended at (``composite_limit`` or
        ``state_cap``; None: it was not): it is not evaluated any more (:meth:`failure` says
        why), until it is removed and registered again."""
        return self._suspended.get((owner, name))

    def _refusals(self, link: str) -> Callable[[Handle, str], None]:
        return lambda handle, why: self._refused(link, handle, why)

    def _refused(self, link: str, handle: Handle, why: str) -> None:
        """An autonomous service refused a query registered while it was out of reach, or
        ended one whose evaluation passed its limits (``RESOURCE_EXHAUSTED: …``), in its
        session's thread: the subscriptions holding it are failed, said — at a limit,
        suspended as at the mediator's own (their owners are answered RESOURCE_EXHAUSTED)."""
        if why.startswith("RESOURCE_EXHAUSTED"):
            # Kept: a subscription that takes the handle later (one restored, one sharing
            # it) is suspended too — in the pipeline's thread (_suspend_limited).
            self._ended_handles[(link, handle)] = f"service {link} ended its query {handle}: {why}"
            self._ended_seen = False
            self._wakeup.set()
            return
        for key, sub in list(self._subs.items()):
            if any(handle in f.handles.get(link, ()) for f in sub.federations):
                reason = f"service {link} refuses its query {handle}: {why}"
                self._failed[key] = reason
                log.error("subscription %s/%s is no longer evaluated: %s", *key, reason)

    def stop(self, timeout: float = 5.0) -> None:
        """Evaluate what the logs hold, then unsubscribe every federation at its services —
        within ``timeout`` whatever the services do. A batch still waiting on a service then
        (one out of reach: its link reconnects without end) is cut short: the links are closed
        (their calls raise ConnectionError, which the thread takes as the stop), nothing that
        batch decided is appended, and it stays in the event log for the next start to
        evaluate. The same for unsubscribing. Returns within about ``timeout + 3 * CUT``.
        (An autonomous service's registrations are not unsubscribed: they are durable, the
        next start takes them up again.)"""
        deadline = clock.monotonic() + timeout
        thread, self._thread = self._thread, None
        self._draining = True
        self._wakeup.set()
        if thread is not None:
            thread.join(timeout)
            if thread.is_alive():
                log.warning("the pipeline did not evaluate the event log within %.1f s (a "
                            "service out of reach?); closing the links: the next start "
                            "evaluates it from position %d", timeout, self._own.position)
                self._cut()
                thread.join(CUT)
        self._halt = True
        self._wakeup.set()
        if not self._lock.acquire(timeout=max(deadline - clock.monotonic(), CUT)):
            log.error("the pipeline thread did not stop; leaving it (the next start evaluates "
                      "the event log from position %d)", self._own.position)
            return
        try:
            if not self._cut_short and self._since and (self._origin is not None
                                                        or not self._feeds):
                self._checkpoint()  # a clean stop: the next start reads nothing again
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
            self._users.clear()
            self._handles = dict.fromkeys(self.links, 0)
            if self._sparks is not None:
                self._sparks.close()
            self._own.keep()
        finally:
            self._lock.release()

    def _cut(self) -> None:
        """Cut short whatever waits on a service: the links closed, the thread halted, and
        nothing more appended (a batch whose answers a closed link cut may be incomplete)."""
        self._cut_short = True
        self._halt = True
        close_links(self.links.values(), CUT)

    def _unsubscribe_all(self) -> None:
        if self._sparks is not None:
            self._sparks.unsubscribe()
        for sub in list(self._subs.values()):
            for federation in sub.federations:
                try:
                    _unsubscribe_fed(federation)
                except Exception as exc:  # gone, or closed meanwhile: its service forgets it
                    log.warning("unsubscribing %s/%s: %s", *sub.key, exc)

    @property
    def position(self) -> int:
        """The last event-log position evaluated."""
        return self._own.position

    def wake(self) -> None:
        """An input grew."""
        self._wakeup.set()

    def handed(self, head: int, lines: list[str], events: list[Event]) -> None:
        """The door appended ``lines`` up to ``head``, decoded as ``events``
        (OwnFeed.hand)."""
        self._own.hand(head, lines, events)

    def newest(self) -> int | None:
        """The newest event time in the event log as far as the pipeline knows (evaluated, or
        there at start)."""
        return self._own.known_newest()

    def advance(self, time: int) -> None:
        """A watermark of the own feed: no event at or before ``time`` will come any more.
        Applied once the events logged before it are evaluated."""
        self._own.advance(time)
        self._wakeup.set()

    # ---------------------------------------------------------------- subscriptions

    def add(self, record: SubscriptionRecord, doc: ast.Document | None = None,
            summary: Callable[[list[Plan]], str] | None = None) -> list[Plan]:
        """Plan every profile of the record's document over the connected services, subscribe
        the federation, and evaluate it on what comes after the record's start: the events
        after its position in the event log (the log's head when it was registered: the
        pipeline first evaluates the log up to there) and the entries after its positions in
        the link logs. The record's start is then set to where the pipeline is — the position,
        the instant the profiles see events after (the newest event time evaluated; with
        autonomous services, the instant every input has reported), and the link logs' heads —
        and stored, if the record is (a restart replays it from there): store it before
        ``add``. ``ProfileError`` for a document that does not parse, ``ValueError``
        (``PushRefused``) for one a service refuses. ``doc``: the record's text parsed already
        (parsing is most of the cost). ``summary``: the record is not stored yet — the pipeline
        stores it once planned, its ``plans`` the summary of the plans, in one write
        (:meth:`record` reads it back)."""
        return self._add(record, doc, restoring=False, summary=summary)

    def record(self, owner: str, name: str) -> SubscriptionRecord | None:
        """The record of a live subscription as the pipeline stored it (None: not live)."""
        sub = self._subs.get((owner, name))
        return sub.record if sub is not None else None

    def _add(self, record: SubscriptionRecord, doc: ast.Document | None,
             restoring: bool, saved: list[Any] | None = None,
             checkpoint: dict[str, Any] | None = None,
             summary: Callable[[list[Plan]], str] | None = None) -> list[Plan]:
        doc = doc if doc is not None else parse(record.text)
        # A fed service out of reach is planned around (the own feed holds its events): an
        # AddProfile never waits on it. An autonomous one holds events nobody else has: its
        # queries are registered when it is back (AutonomousLink.subscribe).
        infos = [link.info for link in self.links.values()
                 if link.info.autonomous or link.status() == "SERVING"]
        with self._locked():
            key = (record.owner, record.name)
            if key in self._subs:
                raise ValueError(f"subscription {record.owner}/{record.name} is already live")
            while (saved is None and self._own.position < record.start_position
                   and self._step(record.start_position)):
                pass
            starts = _link_starts(record)
            if not restoring:
                starts = {name: self.store.link_bounds(name)[0] for name in self._feeds}
                # (before what the own feed's reorder buffer holds: read again after a restart)
                stamped = replace(record, start_position=self._own.kept_from() - 1,
                                  start_time=self._start_time(),
                                  links=json.dumps(starts) if starts else "")
                if stamped != record:
                    # Registered while events were on their way, or evaluated past its start
                    # already (the services have seen those events): it starts here.
                    record = stamped
                    if summary is None and self.store.subscription(
                            record.owner, record.name) is not None:
                        self.store.put_subscription(record)
            plans = [plan_federated(p, doc, infos, live=True, refuses=self._refuses(doc))
                     for p in doc.profiles]
            if summary is not None:  # (before its federations: what they append needs it)
                record = replace(record, plans=summary(plans))
                self.store.put_subscription(record)
            sparked = [p for p in plans if self._composer(p, doc) == "spark"]
            ran = [p for p in plans if p not in sparked]
            federations: list[Federation] = []
            owner = f"{record.owner}/{record.name}@{record.created_us}"
            try:
                for p in ran:
                    federation = Federation(doc, [p], self.links, tick=self.tick,
                                            start=record.start_time,
                                            owner=f"{owner}/{p.profile.name}",
                                            limit=self.composites)
                    federations.append(federation)
                    if record.start_time is None and self._origin is not None and self._feeds:
                        federation.set_origin(self._origin)
                sub = _Subscription(record, doc, plans, federations, types(doc),
                                    horizon(doc, self.tick), [p.profile.name for p in sparked],
                                    links=starts)
                if saved is not None and checkpoint is not None:
                    self._restore(sub, saved, checkpoint)
                if sparked and self._sparks is not None:
                    # (restored ones start together: Pipeline.start)
                    self._sparks.add(record, doc, sparked, restoring)
                    sub.sparked = self._sparks.handles(key)
            except BaseException:  # nothing half-subscribed stays at the services
                for federation in federations:
                    federation.unsubscribe()
                raise
            self._subs[key] = sub
            self._fresh[key] = sub
            if self._ended_handles:  # it may hold a handle a service ended already
                self._ended_seen = False
            self._failed.pop(key, None)
            self._suspended.pop(key, None)
            self._count(sub, 1)
            self._origins.widen(sub.types, sub.horizon)
            return plans

    def _restore(self, sub: _Subscription, saved: list[Any], checkpoint: dict[str, Any]) -> None:
        """A subscription's federations take up their checkpointed state; it reads the logs
        after the checkpoint's positions."""
        if len(saved) != len(sub.federations):
            raise ValueError(f"its checkpoint holds {len(saved)} federations, its plans make "
                             f"{len(sub.federations)}")
        for federation, state in zip(sub.federations, saved, strict=True):
            federation.import_state(state)
        sub.own_after = checkpoint["own"]["position"]
        sub.own_held = frozenset(checkpoint["own"].get("held") or ())
        for name, feed in checkpoint["feeds"].items():
            if name in self._feeds:
                sub.links[name] = max(sub.links.get(name, 0), feed["position"])

    def _newest_checkpoint(self) -> dict[str, Any] | None:
        """The newest kept checkpoint that reads (one that does not is refused by name, in
        one line, and the one before is tried); None: a replay from the subscriptions'
        starts."""
        found = self.store.checkpoints()
        for number, data in found:
            try:
                state = checkpoints.read(data)
            except checkpoints.CheckpointError as exc:
                log.error("checkpoint %d refused: %s; %s", number, exc,
                          "trying the one before" if number != found[-1][0] else
                          "replaying the logs from the subscriptions' starts (what they hold)")
                continue
            self._kept = [checkpoints.positions(kept) for n, d in reversed(found)
                          if n <= number and (kept := _read(d)) is not None]
            return state
        return None

    def _checkpoint(self) -> None:
        """Write a checkpoint (between rounds, under the lock): where each input was read to,
        their progress, the origin, and the state of every subscription that can be taken up
        so (none of its queries at a fed service, none of its profiles with Spark)."""
        subs: dict[str, Any] = {}
        for sub in self._subs.values():
            if sub.composed or any(name not in self._feeds for f in sub.federations
                                   for name, handles in f.handles.items() if handles):
                continue
            subs[_sub_id(sub.record)] = [f.export_state() for f in sub.federations]
        state = {"own": self._own.export_state(),
                 "feeds": {name: {"position": feed.position, "watermark": feed.watermark}
                           for name, feed in self._feeds.items()},
                 "origin": self._origin, "subs": subs, "origins": self._origins.export_state()}
        try:
            data = checkpoints.write(state)
        except (checkpoints.CheckpointError, TypeError) as exc:
            log.error("no checkpoint written: %s (a restart replays from the subscriptions' "
                      "starts)", exc)
            return
        self.store.put_checkpoint(data, keep=CHECKPOINTS_KEPT)
        self._kept = [*self._kept, checkpoints.positions(state)][-CHECKPOINTS_KEPT:]
        self._since = 0
        self._checkpointed = clock.monotonic()

    def _start_time(self) -> int | None:
        """The instant a subscription registered now sees events after: the newest event time
        evaluated; with autonomous services, the instant every input has reported (the origin
        before any has; None: not known yet — the origin, once known)."""
        if not self._feeds:
            return self._own.newest
        if self._origin is None:
            return None
        found = bound(self._states())
        return self._origin if found is None else max(found, self._origin)

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
        """Count a subscription's handles in (1) or out (-1) of their links', and index those
        at autonomous services by handle."""
        for name, _ in sub.sparked:
            self._handles[name] += sign
        for federation in sub.federations:
            for name, handles in federation.handles.items():
                self._handles[name] += sign * len(handles)
                if name not in self._feeds:
                    continue
                for handle in handles:
                    users = self._users.setdefault((name, handle), Takers())
                    if sign > 0:
                        users.add((sub, federation), federation.selective.get(
                            (name, federation.text_of(name, handle))))
                    else:
                        users.remove(federation)
                        if not users:
                            del self._users[(name, handle)]

    def remove(self, owner: str, name: str) -> bool:
        """Unsubscribe a live subscription at its services and drop it."""
        with self._locked():
            self._failed.pop((owner, name), None)
            self._suspended.pop((owner, name), None)
            return self._drop((owner, name))

    def _drop(self, key: Key) -> bool:
        """Unsubscribe a live subscription at its services and drop it (under the lock)."""
        sub = self._subs.pop(key, None)
        if sub is None:
            return False
        self._count(sub, -1)
        self._fresh.pop(key, None)
        self._remeasure = True
        for federation in sub.federations:
            federation.unsubscribe()
        if sub.composed and self._sparks is not None:
            self._sparks.remove(sub.key)
        self._retarget()
        return True

    def _suspend_limited(self, among: list[_Subscription] | None = None) -> None:
        """Every subscription one of whose runners reached a limit (Runner.limited), or one of
        whose queries a service ended at its own limit: its answers from there on would be
        incomplete, and its output or state is what the limit bounds — it is dropped, its
        status says why (GetProfile, Subscribe), and a dead letter is kept. The others go on
        as before. ``among``: only these were evaluated since the last check (None: all)."""
        ended = self._holders_of_ended() if not self._ended_seen else {}
        for sub in list(self._subs.values()) if among is None or ended else among:
            key = sub.key
            letters = [letter for f in sub.federations for letter in f.runner.limited]
            if key in ended:
                letters.append(ended[key])
            if not letters:
                continue
            first = letters[0]
            self._drop(key)
            self._failed[key] = (f"suspended: {first.detail}; unsubscribe it and register it "
                                 "again once the profile is bounded")
            self._suspended[key] = first.reason
            log.error("subscription %s/%s suspended: %s", *key, first.detail)
            if self.letters is not None:
                self.letters.record([Letter(first.reason, RESERVED_SERVICE, first.detail,
                                            where=f"subscription {key[0]}/{key[1]}",
                                            kind="report")])
            try:  # its open streams end, with the status, once they have sent its log
                self.on_append(*key, self.store.notification_bounds(*key)[1])
            except Exception:
                log.exception("waking the streams of %s/%s failed", *key)

    def _holders_of_ended(self) -> dict[Key, DeadLetter]:
        """The subscriptions holding a handle a service ended, each with the first such end."""
        self._ended_seen = True  # (before reading: a link thread's addition now is seen next)
        ended = dict(self._ended_handles)
        out: dict[Key, DeadLetter] = {}
        for key, sub in self._subs.items():
            held = [(link, h) for f in sub.federations for link, handles in f.handles.items()
                    for h in handles] + list(sub.sparked)  # (its Spark filters' handles too)
            for pair in held:
                detail = ended.get(pair)
                if detail is not None:
                    out[key] = DeadLetter(str(Reason.SERVICE_LIMIT), detail)
                    break
        return out

    def _retarget(self) -> None:
        """What the origins index keeps: the types and horizons of the live documents."""
        self._origins.clear()
        for sub in self._subs.values():
            self._origins.widen(sub.types, sub.horizon)

    def _composer(self, p: Plan, doc: ast.Document) -> str:
        """Where a plan's mediator-side part is composed (:mod:`mediator.placement`)."""
        return "spark" if self._sparks is not None and spark_composes(p, doc) else "inprocess"

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
        plans = [plan_federated(p, doc, infos, live=True, refuses=self._refuses(doc))
                 for p in doc.profiles]
        render = service_renderer(((i.name, i.group) for i in infos), doc)
        console = Console(record=True, width=120, file=io.StringIO())
        out = []
        for p in plans:
            composer = self._composer(p, doc)
            console.print(explain(p, render))
            console.print(f"  composed by: {composer}")
            out.append({**as_json(p, render), "composer": composer})
        return console.export_text(), json.dumps(out, indent=2, ensure_ascii=False)

    def _refuses(self, doc: ast.Document) -> Refuses:
        """The planner's check that each service's language takes the query it would be
        asked (its group's reference language: the limits of bracket depth, chain length and
        query size a base service applies): a subtree one refuses is composed at the mediator,
        as ``replay --via`` does, rather than failing the subscription at the service."""
        return language_refuses(doc, {name: shared_language(link.info.group)
                                      for name, link in self.links.items()})

    def services(self) -> list[ServiceStatus]:
        return [ServiceStatus(link.info, link.status(), self._handles[name])
                for name, link in self.links.items()]

    def inputs(self) -> list[tuple[str, State, int, int]]:
        """Each input — the own feed, then the autonomous services — as ``evamed status``
        shows it: (name, state, last log position read, log head). Read without the round's
        lock: a snapshot, not a decision."""
        return [(RESERVED_SERVICE, *self._own.progress()),
                *((name, *feed.progress()) for name, feed in self._feeds.items())]

    # ---------------------------------------------------------------- the thread

    def _run(self) -> None:
        try:
            while True:
                self._wakeup.clear()
                with self._lock:
                    if self._halt:
                        return
                    evaluated = 0
                    if self._ready():
                        evaluated = self._step() + self._listen()
                        self._since += evaluated
                        released, time = self._own.due()
                        if released:
                            self._origins.note(released)
                        if released or time is not None:
                            self._round(released, time)
                        self._decide()
                        if self._since and (
                                self._since >= self.checkpoint_events
                                or clock.monotonic() - self._checkpointed
                                >= self.checkpoint_interval):
                            self._checkpoint()
                        if clock.monotonic() - self._trimmed >= TRIM_SECONDS:
                            # Also when only the services' notifications flow (no batch of
                            # the own feed counts towards trim_every then).
                            self._trim()
                            self._trimmed = clock.monotonic()
                    if not self._ended_seen:  # a service ended a query (nothing due, perhaps)
                        self._suspend_limited()
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
                         "(%s)", self._own.position, exc)
                return
            self.error = exc
            log.exception("the pipeline stopped at event-log position %d", self._own.position)

    def _states(self, peek: bool = False) -> list[State]:
        return [self._own.state(peek), *(feed.state() for feed in self._feeds.values())]

    def _ready(self) -> bool:
        """Whether the profiles' clocks can start: always without autonomous services; with
        them, once the origin of the merged trace is known (:meth:`_start_time`)."""
        if self._origin is not None or not self._feeds:
            return True
        states = self._states(peek=True)
        if any(s.origin is None and not s.idle for s in states):
            return False
        origins = [s.origin for s in states if s.origin is not None]
        if not origins:
            return False
        self._origin = min(origins)
        self._settled = None
        self.store.set_meta(ORIGIN_KEY, str(self._origin))
        log.info("the merged trace starts after %d µs: the profiles' clocks start there",
                 self._origin)
        for sub in self._subs.values():
            for federation in sub.federations:
                federation.set_origin(self._origin)
            if sub.record.start_time is None and self.store.subscription(*sub.key) is not None:
                sub.record = replace(sub.record, start_time=self._origin)
                self.store.put_subscription(sub.record)
        return True

    def _step(self, upto: int | None = None) -> int:
        """Evaluate the next batch of the event log (up to position ``upto``); how many
        entries it held."""
        limit = self.batch if upto is None else min(self.batch, upto - self._own.position)
        logged, events = self._own.read(limit)
        if not logged:
            return 0
        if events:
            self._origins.note(events)
            self._round(events, None)
            if upto is not None:  # a replay up to a registration: decided as it goes
                self._decide()
        self._own.position = logged[-1].position
        self._batches += 1
        if self._batches % self.trim_every == 0:
            self._trim()
            self._trimmed = clock.monotonic()
        return len(logged)

    def _round(self, events: list[Event], until: int | None) -> None:
        """The own feed's batch (or, with ``until`` and no events, a watermark) to every
        federation that takes it, each fed link with subscriptions published once, with the
        ticks every federation asks of it; each federation takes its handles' detections."""
        self._settled = None
        feds = [(s, f) for s in self._subs.values() for f in s.federations if f.own_inputs]
        late = self._sparks.begin(events) if self._sparks is not None else []
        ticks: dict[str, list[Event]] = {}
        lowest = min(map(_SEQ, events)) if events else None  # (map: no Python per event)
        for sub, fed in feds:
            given = events
            if lowest is not None and sub.own_after >= lowest:
                # Restored from a checkpoint taken after some of these: it has them (all but
                # those the own feed's reorder buffer held then).
                given = [e for e in events if e.seq > sub.own_after or e.seq in sub.own_held]
            for name, asked in fed.begin(given, until).items():
                ticks.setdefault(name, []).extend(asked)
        used = {name: link for name, link in self.links.items()
                if self._handles[name] and name not in self._feeds}
        detections = publish(used, events, ticks, until)
        for name, found in detections.items():
            for handle, reported in found.items():
                self._origins.reported(name, handle, reported)
            count = sum(len(v) for v in found.values())
            if self.metrics and count:
                self.metrics.notifications_in.labels(name).inc(count)
        for _, fed in feds:
            fed.take(detections)
        if self._sparks is not None:
            late += self._sparks.take(detections)
        if late:
            self._late(late)

    def _listen(self) -> int:
        """The next entries of every link log, each detection to the federations holding its
        handle that were registered before it; how many entries were read."""
        read = 0
        late: list[Late] = []
        for name, feed in self._feeds.items():
            notices = feed.read(LINK_READ)
            read += len(notices)
            for notice in notices:
                for handle, detection in notice.detections:
                    users = self._users.get((name, handle))
                    sparked = self._sparks is not None and self._sparks.holds(name, handle)
                    if not users and not sparked:
                        continue  # a registration no live subscription holds any more
                    self._origins.reported(name, handle, [detection])
                    for sub, federation in users.of(detection) if users else ():
                        if notice.position > sub.links.get(name, 0):
                            late += federation.learn(name, handle, [detection])
                    if sparked and self._sparks is not None:
                        late += self._sparks.learn(name, handle, detection, notice.position)
                feed.heard(notice)
            if self.metrics and notices:
                self.metrics.notifications_in.labels(name).inc(
                    sum(len(n.detections) for n in notices))
        if read:
            self._settled = None
        if late:
            self._late(late)
        return read

    def _late(self, late: list[Late]) -> None:
        """Reports of services behind an instant decided already: dead letters ``late``, kept
        in the dead-letter log (one batch per service)."""
        if self.letters is not None:
            by_link: dict[str, list[Letter]] = {}
            for item in late:
                by_link.setdefault(item.link, []).append(Letter(
                    Reason.LATE, item.link, f"reported {item.what} after the mediator had "
                    "decided past its time (the service was idle longer than its idle timeout)",
                    item.what, where=f"registration {item.handle}", kind="report"))
            for letters in by_link.values():
                self.letters.record(letters)
            return
        if self.metrics:
            for item in late:
                self.metrics.dead_letters.labels(item.link, str(Reason.LATE)).inc()
        for item in late[:LATE_SHOWN]:
            log.warning("late: service %s reported %s after the mediator had decided past its "
                        "time (the service was idle longer than its idle timeout)", item.link,
                        item.what)

    def _decide(self) -> None:
        """Every federation decides up to where its inputs have reported everything; each
        subscription's composites appended, in detection order."""
        own = self._own.state()
        states = {name: feed.state() for name, feed in self._feeds.items()}
        everything = [own, *states.values()]
        whole = everything != self._settled
        # Nothing moved since every subscription was decided: deciding one again at the same
        # bound settles nothing new; those added since are decided now.
        subs = list((self._subs if whole else self._fresh).values())  # (_drop keeps both)
        self._fresh = {}
        decided: dict[Key, list[Notification]] = {}
        slowest: int | None = None  # the least bound decided: a composite still to come of
        # the federation behind the others may name what lies a horizon before it
        for sub in subs:
            for federation in sub.federations:
                used = ([own] if federation.own_inputs else []) + [
                    states[name] for name in federation.inputs]
                found = bound(used or everything)
                if found is None:
                    continue
                # The slowest federation's: it may still name an event the others are past.
                slowest = found if slowest is None else min(slowest, found)
                notes = federation.decide(found)
                if notes:
                    decided.setdefault(sub.key, []).extend(notes)
        began = clock.perf_counter()
        for key, notes in decided.items():
            # One runner per profile: merged in detection order, as one runner would report.
            notes.sort(key=lambda n: n.emitted)
            self._append(self._subs[key], notes)
        if self.metrics:
            if decided:
                self.metrics.composer_latency.observe(clock.perf_counter() - began)
            if whole or (self._remeasure
                         and clock.monotonic() - self._measured >= MEASURED):
                self._measure(self.metrics)
            elif subs:  # (the others' state did not change: added to the sum)
                self._measure(self.metrics, subs)
        if whole:
            self._settled = everything
            if slowest is not None:  # (the slowest of all: only a whole round knows it)
                self._origins.forget(slowest)
        self._suspend_limited(None if whole else subs)
        if self._sparks is not None and self._sparks.subs:
            used = ([own] if self._sparks.own_inputs else []) + [
                states[name] for name in sorted(self._sparks.inputs)]
            self._sparks.release(bound(used or everything),
                                 self._origin if self._feeds else own.origin)

    def _measure(self, metrics: Metrics, added: list[_Subscription] | None = None) -> None:
        """After a round: what the runners hold, summed over every subscription per part (a
        fixed label set however many subscriptions there are), with the pipeline's own index
        of origins; and the services' answers the post-filters dropped, per service.
        ``added``: only these were evaluated since the last sum, they are added to it."""
        if added is None:
            self._remeasure = False
            self._measured = clock.monotonic()
        held = RunnerStats() if added is None else self._held
        for federation in (f for sub in (self._subs.values() if added is None else added)
                           for f in sub.federations):
            held += federation.stats()
            for service, count in federation.take_drops().items():
                metrics.post_filter_drops.labels(service).inc(count)
        self._held = held
        for part, value in [*asdict(held).items(), ("origins", len(self._origins))]:
            metrics.state_size.labels(part).set(value)

    def _append(self, sub: _Subscription, notes: list[Notification]) -> None:
        if not notes:
            return
        handles = sub.handles()
        items = []
        for n in notes:
            ident, line = composite_line(n)
            described = self._origins.describe(n.occ.events, handles, n.occ.ident)
            items.append((ident, encode(Entry(line, n.profile, sub.record.name,
                                              described.sources, described.types,
                                              described.times, described.services), ident)))
        self._store_items(sub.key, items)

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
        """Drop the log entries nothing needs any more: each subscription the oldest kept
        checkpoint holds needs those after that checkpoint's positions (and what its reorder
        buffer held), any other those after its start positions; and nothing the own feed
        still needs (its reorder buffer's, and what it has not read)."""
        oldest = self._kept[0] if self._kept else None
        held = oldest["subs"] if oldest is not None else set()
        starts = [oldest["own"] if _sub_id(s.record) in held and oldest is not None
                  else s.record.start_position for s in self._subs.values()]
        before = min([*starts, self._own.kept_from()])
        self._own.keep()
        dropped = self.store.trim_events(before)
        if dropped:
            log.debug("event log trimmed: %d entries before position %d", dropped, before)
        for name, feed in self._feeds.items():
            needed = [(oldest["feeds"].get(name, 0) if _sub_id(s.record) in held
                       and oldest is not None else _link_starts(s.record).get(name, 0)) + 1
                      for s in self._subs.values() if name in s.links]
            self.store.trim_link(name, min([*needed, feed.position + 1]))
        if self._sparks is not None:
            self._sparks.trim()


def _sub_id(record: SubscriptionRecord) -> str:
    """A subscription as a checkpoint names it: owner, name and registration (the same name
    registered again is another subscription)."""
    return f"{record.owner}\n{record.name}\n{record.created_us}"


def _read(data: bytes) -> dict[str, Any] | None:
    try:
        return checkpoints.read(data)
    except checkpoints.CheckpointError:
        return None


def _link_starts(record: SubscriptionRecord) -> dict[str, int]:
    """Where a stored subscription starts in each link log."""
    if not record.links:
        return {}
    try:
        found = json.loads(record.links)
        return {str(name): int(position) for name, position in found.items()}
    except (ValueError, TypeError, AttributeError):
        log.error("subscription %s/%s: its link-log starts %r cannot be read; it starts at "
                  "the links' heads", record.owner, record.name, record.links)
        return {}


def _unsubscribe_fed(federation: Federation) -> None:
    """A federation's handles at the fed services: unsubscribed. Those at autonomous services
    stay registered (durable: the next start takes them up again, and what they report
    meanwhile is kept)."""
    federation.unsubscribe(keep=lambda link: link.info.autonomous)


__all__ = ["CUT", "Pipeline", "ServiceStatus", "Stopping", "close_links"]
