"""``SparkComposer``: the mediator's composer (mediator/composer.py, the protocol it
satisfies) backed by the streaming job (spark_jobs/job.py) — in local mode embedded, or on a
cluster. Profiles are registered in a profile table the running job re-reads. Two ways in:

* **fed** (``lines`` None): events are fed as spool files and ``collect`` waits for the job to
  have evaluated them (tests compare it with the in-process composer this way);
* **live** (``lines``: a store's log, spark_jobs/log_source.py or spark_jobs/redis_io.py —
  the mediator's composer log, ``ordered``): the job reads the log itself, continuously, one
  micro-batch per ``trigger`` interval, and hands each micro-batch's rows to ``deliver`` as
  they come (in the query's thread; none given: kept for ``collect``) — each a
  :data:`Delivered`, with its report key and its constituents' sources. Nothing waits on the
  job: ``feed`` is refused, ``register``/``register_at`` and ``remove`` only rewrite the
  table; ``committed`` says where in the log the job's last micro-batch began (what the log
  may be trimmed below). The mediator's pipeline uses this mode (docs/spark.md, "What runs
  where in the mediator service").
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from eva.engine import EngineConfig
from eva.events import Event, to_cloudevent
from eva.parser import parse
from spark_jobs.job import StreamJob, start
from spark_jobs.profiles import Registration, profiles, write_table
from spark_jobs.spool import spool_file

# mediator.composer.Output, spelled out: spark_jobs does not import the mediator above it.
Output = tuple[str, str, dict[str, Any]]
Delivered = tuple[str, str, dict[str, Any], str, list[str]]
"""A live job's row: (kind, profile, payload, report key as JSON — processor.report_key reads
it —, the constituents' sources: processor.constituent_sources)."""

TRIGGER = "200 milliseconds"
"""The live job's processing-time trigger: a micro-batch every 200 ms, or as soon as the
previous one is done if it took longer (a quiet log runs none). An instant is decided in the
micro-batch that reads a later event; a batch's last instant waits for the watermark, moved at
the batch's end, and is decided in the next. So publish → subscriber is the wait for a batch to
start, plus one or two batches' work: benchmarks/service.py measures it (docs/performance.md,
"The Spark composer's latency")."""


class SparkComposer:
    """The streaming job in ``workdir`` (its profile table, checkpoint and, fed, its spool);
    the profile table is a file the running job re-reads, so profiles come and go without a
    restart. ``lines``: a function of the session giving the live input stream (the module
    docstring); ``deliver``: where a live job's rows go."""

    def __init__(self, spark: Any, workdir: str, config: EngineConfig | None = None,
                 buckets: int = 16, lateness: str = "0 seconds", *,
                 lines: Callable[[Any], Any] | None = None,
                 deliver: Callable[[list[Delivered]], None] | None = None,
                 trigger: str = TRIGGER, ordered: bool = False) -> None:
        self.spark = spark
        self._lines = lines
        self._deliver = deliver
        self.trigger = trigger
        self.spool = os.path.join(workdir, "spool")
        self.checkpoint = os.path.join(workdir, "checkpoint")
        self.table = os.path.join(workdir, "profiles.json")
        os.makedirs(self.spool, exist_ok=True)
        self._registrations: list[Registration] = []
        write_table(self.table, [])
        self.job = StreamJob(self.table, (config or EngineConfig()).to_json(), buckets, ordered)
        self.lateness = lateness
        self._rows: list[Output] = []
        self._lock = threading.Lock()
        self._starting = threading.Lock()  # begin and close: one query at a time on the checkpoint
        self._closed = False
        self._files = 0
        self._stamp = time.time()
        self._newest: int | None = None
        self._query: Any = None

    def _sink(self, batch_id: int, rows: list[Any]) -> None:
        if self._deliver is not None:
            if rows:  # a failure fails the batch: re-run at the next start
                self._deliver([(r.kind, r.profile, json.loads(r.payload), r.key,
                                [str(s) for s in r.sources]) for r in rows])
            return
        with self._lock:
            self._rows.extend((r.kind, r.profile, json.loads(r.payload)) for r in rows)

    def _settle(self) -> None:
        if self._query is not None and self._lines is None:
            self._query.processAllAvailable()

    def begin(self) -> None:
        """Live: start the job on the table as registered (a restart: once every stored
        profile is registered again, so the job clears no state of one not yet back); it
        resumes from its checkpoint. Fed, the first ``feed`` starts it."""
        with self._starting:
            if self._lines is None or self._query is not None or self._closed:
                return
            self._query = start(self.spark, self.job, self.spool, self.checkpoint, self._sink,
                                lateness=self.lateness,
                                trigger={"processingTime": self.trigger},
                                lines=self._lines(self.spark))

    def failure(self) -> BaseException | None:
        """What stopped the job, if it stopped by itself (a sink or a task that failed)."""
        if self._query is None or self._query.isActive:
            return None
        found = self._query.exception()
        return RuntimeError(str(found)) if found is not None else None

    def register(self, text: str, at: int | None = None) -> list[str]:
        # Nothing fed yet: at the first event, as the in-process composer (and replay) registers.
        return self.register_at(text, at if at is not None else self._newest)

    def register_at(self, text: str, at: int | None, after: int = 0) -> list[str]:
        """Register a profile document whose profiles see the events after time ``at`` (None:
        the job's first) among the lines after input position ``after`` (a live job: the
        position the pipeline registered it at, spark_jobs/log_source.py)."""
        self._settle()  # what was fed before is evaluated under the table it was fed under
        doc = parse(text)
        self._registrations.append(Registration(text, at, after=after))
        write_table(self.table, self._registrations)
        return [p.name for p in doc.profiles]

    def committed(self) -> int | None:
        """Live: the input position the job's latest micro-batch started after — everything
        up to it is evaluated and in the checkpoint, and the job's clock has passed the
        newest watermark there (None: no micro-batch yet since it started)."""
        return self._offset("startOffset")

    def read_to(self) -> int | None:
        """Live: the input position the job's latest micro-batch read up to (None: no
        micro-batch yet since it started)."""
        return self._offset("endOffset")

    def _offset(self, which: str) -> int | None:
        progress = self._query.lastProgress if self._query is not None else None
        if not progress or not progress.sources:
            return None
        found = getattr(progress.sources[0], which)
        offset = json.loads(found) if isinstance(found, str) else found
        if not isinstance(offset, dict):
            return 0  # its first micro-batch: from the start
        if "position" in offset:
            return int(offset["position"])
        return int(str(offset["id"]).partition("-")[0])

    def remove(self, name: str) -> bool:
        self._settle()
        found = False
        updated = []
        for r in self._registrations:
            if name in {p.name for p in parse(r.text).profiles} and name not in r.removed:
                r = Registration(r.text, r.registered, r.removed | {name}, r.after)
                found = True
            updated.append(r)
        self._registrations = updated
        write_table(self.table, updated)
        return found

    def feed(self, events: Sequence[Event]) -> None:
        if self._lines is not None:
            raise ValueError("this Spark composer reads the event log itself: nothing is fed "
                             "to it")
        if not events:
            return
        if self._query is None:
            self._query = start(self.spark, self.job, self.spool, self.checkpoint, self._sink,
                                lateness=self.lateness, max_files=1)
        # The file source takes files in modification order: make it the feeding order.
        self._stamp = max(self._stamp + 1, time.time())
        spool_file(self.spool, f"part-{self._files:08d}.jsonl",
                   [json.dumps(to_cloudevent(e)) for e in events], self._stamp)
        self._files += 1
        self._newest = max([e.time for e in events] + ([self._newest] if self._newest else []))

    def collect(self) -> list[Output]:
        self._settle()
        with self._lock:
            out, self._rows = self._rows, []
        return out

    def close(self) -> None:
        with self._starting:
            self._closed = True
            if self._query is not None:
                self._query.stop()
                self._query = None

    def profiles(self) -> list[str]:
        return sorted(profiles(self.job.table))
