"""Placement: where each plan's mediator-side part is composed.

The ``composer`` setting names the class that composes: ``"inprocess"`` — every plan in its
federation's runner, in this process (:class:`adapters.federation.Federation`) — or
``"spark"``, which gives the Spark job (:class:`SparkSlots`, spark_jobs/composer.py) the plans
it composes exactly (:func:`spark_composes`) and leaves the others to the runners. Whichever
composes, every service is subscribed what its plan assigns it.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import threading
import time as clock
from collections.abc import Callable
from typing import Any

from eva import ast
from eva.printer import to_text
from mediator.composer import LiveComposer
from mediator.store.base import Store, SubscriptionRecord
from transforms.plans import Plan, Remote, nodes

log = logging.getLogger("mediator.pipeline")

Key = tuple[str, str]
"""A subscription: (owner, name)."""


def spark_composes(p: Plan, doc: ast.Document) -> bool:
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


class SparkSlots:
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


__all__ = ["SparkSlots", "spark_composes", "spark_dir", "spark_session"]
