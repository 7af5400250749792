"""``SparkComposer``: the mediator's composer (mediator/composer.py, the protocol it
satisfies) backed by the streaming job (spark_jobs/job.py) — in local mode embedded, or on a
cluster. Profiles are registered in a profile table the running job re-reads, events are fed
as spool files, and the sink's rows are collected in the driver.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Sequence
from typing import Any

from eva.engine import EngineConfig
from eva.events import Event, to_cloudevent
from eva.parser import parse
from spark_jobs.job import StreamJob, start
from spark_jobs.profiles import Registration, profiles, write_table
from spark_jobs.spool import spool_file

# mediator.composer.Output, spelled out: spark_jobs does not import the mediator above it.
Output = tuple[str, str, dict[str, Any]]


class SparkComposer:
    """The streaming job over a spool directory in ``workdir``; the profile table is a file
    the running job re-reads, so profiles come and go without a restart."""

    def __init__(self, spark: Any, workdir: str, config: EngineConfig | None = None,
                 buckets: int = 16, lateness: str = "0 seconds") -> None:
        self.spark = spark
        self.spool = os.path.join(workdir, "spool")
        self.checkpoint = os.path.join(workdir, "checkpoint")
        self.table = os.path.join(workdir, "profiles.json")
        os.makedirs(self.spool, exist_ok=True)
        self._registrations: list[Registration] = []
        write_table(self.table, [])
        self.job = StreamJob(self.table, (config or EngineConfig()).to_json(), buckets)
        self.lateness = lateness
        self._rows: list[Output] = []
        self._lock = threading.Lock()
        self._files = 0
        self._stamp = time.time()
        self._newest: int | None = None
        self._query: Any = None

    def _sink(self, batch_id: int, rows: list[Any]) -> None:
        with self._lock:
            self._rows.extend((r.kind, r.profile, json.loads(r.payload)) for r in rows)

    def _settle(self) -> None:
        if self._query is not None:
            self._query.processAllAvailable()

    def register(self, text: str, at: int | None = None) -> list[str]:
        self._settle()  # what was fed before is evaluated under the table it was fed under
        doc = parse(text)
        # Nothing fed yet: at the first event, as the in-process composer (and replay) registers.
        start_at = at if at is not None else self._newest
        self._registrations.append(Registration(text, start_at))
        write_table(self.table, self._registrations)
        return [p.name for p in doc.profiles]

    def remove(self, name: str) -> bool:
        self._settle()
        found = False
        updated = []
        for r in self._registrations:
            if name in {p.name for p in parse(r.text).profiles} and name not in r.removed:
                r = Registration(r.text, r.registered, r.removed | {name})
                found = True
            updated.append(r)
        self._registrations = updated
        write_table(self.table, updated)
        return found

    def feed(self, events: Sequence[Event]) -> None:
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
        if self._query is not None:
            self._query.stop()
            self._query = None

    def profiles(self) -> list[str]:
        return sorted(profiles(self.job.table))
