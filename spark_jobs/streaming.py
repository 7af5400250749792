"""The streaming composition job: profiles evaluated over a stream of primitive notifications
inside Spark stateful processing (``transformWithState``, event time, RocksDB state store).

Layout (docs/spark.md):

    spool directory (CloudEvents JSON lines)
      → fan-out (mapInPandas): each event to the (profile, bucket) keys it belongs to
      → withWatermark(ts, lateness)
      → groupBy(profile, bucket).transformWithState(Composer): one engine per key, kept as a
        snapshot (mediator/eva/snapshot.py) in a ValueState; events pushed in order, the clock
        advanced to the watermark, an event-time timer armed for the engine's next instant
      → foreachBatch: composites and dead letters written per batch id (a re-run batch after a
        restart overwrites its own files: no loss, no duplicates)

A bucket holds many ``per`` partitions (the engine keeps them apart), so Spark's per-key cost is
paid per bucket, not per partition (research/spark.md: per-key Python calls dominate).
"""

from __future__ import annotations

import json
import os
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from mediator.eva.engine import DeadLetter, Engine, EngineConfig
from mediator.eva.events import Event, EventError, from_json_line
from mediator.eva.notify import dead_letter_record
from mediator.eva.notify import to_cloudevent as composite_event
from mediator.eva.snapshot import restore, snapshot
from spark_jobs.routing import bucket, config_tuple, document, event_matchers

__all__ = ["Registration", "StreamJob", "config_tuple", "directory_sink", "route", "spool_lines",
           "start", "write_table"]

ROUTED = "profile STRING, bucket INT, seq LONG, ts TIMESTAMP, line STRING"
OUT = "kind STRING, profile STRING, ident STRING, payload STRING"
ANCHOR = -1  # a row that only keeps a profile without `per` alive (its clock may report)


@dataclass(frozen=True)
class StreamJob:
    table: str  # path of the profile table (write_table); read again whenever it changes
    config: tuple[Any, ...]  # EngineConfig as a tuple
    buckets: int = 16


@dataclass(frozen=True)
class Registration:
    """A registered document: its text and when it was registered (µs; its profiles see
    events after that, EVA Def. 3.5)."""

    text: str
    registered: int
    removed: frozenset[str] = frozenset()  # profiles of the document no longer evaluated

    @property
    def token(self) -> str:
        """Identifies this registration: a profile re-registered later gets a fresh engine."""
        return f"{self.registered}:{zlib.crc32(self.text.encode())}"


def write_table(path: str, registrations: list[Registration]) -> None:
    """The profile table the running job follows: written whole and atomically."""
    with open(path + ".tmp", "w", encoding="utf-8") as handle:
        json.dump([{"text": r.text, "registered": r.registered, "removed": sorted(r.removed)}
                   for r in registrations], handle)
    os.replace(path + ".tmp", path)


@lru_cache(maxsize=32)
def _table(path: str, version: int) -> dict[str, tuple[Registration, str | None, list[Any]]]:
    """profile name → (its registration, its per path, matchers of its event classes)."""
    with open(path, encoding="utf-8") as handle:
        entries = [Registration(e["text"], int(e["registered"]), frozenset(e.get("removed", ())))
                   for e in json.load(handle)]
    out = {}
    for entry in entries:
        doc = document(entry.text)
        for profile in doc.profiles:
            if profile.name not in entry.removed:
                out[profile.name] = (entry, profile.per, event_matchers(profile, doc))
    return out


def profiles(job: StreamJob) -> dict[str, tuple[Registration, str | None, list[Any]]]:
    """The table as it is now (re-read when the file changes: profiles come and go while the
    job runs)."""
    return _table(job.table, os.stat(job.table).st_mtime_ns)


def route(table: list[tuple[str, tuple[Registration, str | None, list[Any]]]], buckets: int,
          event: Event | None) -> list[tuple[str, int]]:
    """The (profile, bucket) keys an event belongs to, by the (sorted) profile table; a
    malformed line (None) goes to one profile's bucket 0, whose engine reports it as a dead
    letter."""
    if event is None:
        return [(name, 0) for name, _ in table[:1]]
    out = []
    for name, (_, per, matchers) in table:
        if any(match(event) for match in matchers):
            group = bucket(event, per, buckets)
            if group is not None:
                out.append((name, group))
    return out


def composer_processor(job: StreamJob) -> Any:
    """A ``StatefulProcessor`` running one engine per (profile, bucket)."""
    from pyspark.sql import Row
    from pyspark.sql.streaming.stateful_processor import StatefulProcessor

    class Composer(StatefulProcessor):
        def init(self, handle: Any) -> None:
            self.handle = handle
            self.engine_state = handle.getValueState("engine", "blob BINARY, token STRING")

        def _engine(self, profile: str, letters: list[str]) -> Engine | None:
            """The key's engine, or None once its profile has left the table (its state and
            timers are dropped)."""

            def dead(letter: DeadLetter) -> None:
                letters.append(json.dumps(dead_letter_record(letter)))

            found = profiles(job).get(profile)
            if found is None:
                self.engine_state.clear()
                for timer in self.handle.listTimers():
                    self.handle.deleteTimer(timer)
                return None
            entry = found[0]
            if self.engine_state.exists():
                blob, token = self.engine_state.get()
                if token == entry.token:
                    return restore(bytes(blob), dead)
            engine = Engine(EngineConfig(*job.config), dead)
            engine.add_document(document(entry.text), [profile])
            engine.begin(entry.registered)
            return engine

        def _finish(self, profile: str, engine: Engine, notes: list[Any], letters: list[str],
                    watermark_ms: int) -> Iterator[Any]:
            entry = profiles(job)[profile][0]
            self.engine_state.update((snapshot(engine), entry.token))
            for timer in self.handle.listTimers():
                self.handle.deleteTimer(timer)
            upcoming = engine.next_instant()
            if upcoming is not None:
                self.handle.registerTimer(max(-(-upcoming // 1000), watermark_ms + 1))
            for n in notes:
                event = composite_event(n)
                yield Row(kind="composite", profile=profile, ident=event["id"],
                          payload=json.dumps(event))
            for text in letters:
                yield Row(kind="dead_letter", profile=profile, ident="", payload=text)

        def handleInputRows(self, key: Any, rows: Any, timerValues: Any) -> Iterator[Any]:
            profile = key[0]
            letters: list[str] = []
            engine = self._engine(profile, letters)
            if engine is None:
                return
            registered = profiles(job)[profile][0].registered
            notes = []
            for row in sorted(rows, key=lambda r: r.seq):
                if row.seq == ANCHOR:
                    continue
                try:
                    event = from_json_line(row.line, seq=row.seq)
                except EventError as exc:
                    engine.malformed(str(exc), row.line)
                    continue
                if event.time <= registered:
                    continue  # before the profile was registered: not its event (Def. 3.5)
                notes.extend(engine.push(event))
            watermark = timerValues.getCurrentWatermarkInMs()
            if watermark > 0:
                notes.extend(engine.advance(watermark * 1000))
            yield from self._finish(profile, engine, notes, letters, watermark)

        def handleExpiredTimer(self, key: Any, timerValues: Any,
                               expiredTimerInfo: Any) -> Iterator[Any]:
            profile = key[0]
            letters: list[str] = []
            engine = self._engine(profile, letters)
            if engine is None:
                return
            watermark = timerValues.getCurrentWatermarkInMs()
            notes = engine.advance(watermark * 1000)
            yield from self._finish(profile, engine, notes, letters, watermark)

        def close(self) -> None:
            pass

    return Composer()


def spool_lines(spark: Any, spool: str, max_files: int | None = None) -> Any:
    """A spool directory of CloudEvents JSON-lines files as a stream of lines. Arrival order:
    files in modification order (the order the file source takes them), lines in file order."""
    import pyspark.sql.functions as F

    # One task reads a file whole: line positions are the arrival order within a file, and a
    # file cut into splits would number its lines twice (these are runtime SQL settings).
    spark.conf.set("spark.sql.files.maxPartitionBytes", "1g")
    spark.conf.set("spark.sql.files.openCostInBytes", "1g")
    reader = spark.readStream.format("text")
    if max_files:
        reader = reader.option("maxFilesPerTrigger", max_files)
    return reader.load(spool).select(
        "value", F.col("_metadata.file_modification_time").alias("mtime"),
        F.col("_metadata.file_name").alias("file"))


def start(spark: Any, job: StreamJob, spool: str, checkpoint: str,
          sink: Callable[[int, list[Any]], None], *, lateness: str = "0 seconds",
          max_files: int | None = None, trigger: dict[str, Any] | None = None,
          lines: Any = None) -> Any:
    """Start the job over a spool directory of CloudEvents JSON-lines files (or over ``lines``,
    a stream with columns ``value`` and ``seq``, e.g. the Redis log); ``sink(batch_id, rows)``
    receives each micro-batch's (kind, profile, ident, payload) rows."""
    import pandas as pd

    if lines is None:
        lines = spool_lines(spark, spool, max_files)

    def fan_out(frames: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
        # Line positions run on across the Arrow frames of one task: a file is read by one
        # task, in order, but cut into frames of at most 10,000 rows.
        position: dict[str, int] = {}
        for frame in frames:
            events: list[Event | None] = []
            for line in frame["value"]:
                try:
                    events.append(from_json_line(line))
                except EventError:
                    events.append(None)
            times = [e.time for e in events if e is not None]
            if not times:
                continue
            if "seq" in frame:
                seqs = [int(s) for s in frame["seq"]]
            else:
                seqs = []
                for mtime, name in zip(frame["mtime"], frame["file"], strict=True):
                    index = position[name] = position.get(name, -1) + 1
                    seqs.append(int(pd.Timestamp(mtime).value // 1_000_000) * 1_000_000 + index)
            table = sorted(profiles(job).items())  # once per frame: profiles come and go
            out: list[tuple[str, int, int, int, str]] = []
            for line, seq, event in zip(frame["value"], seqs, events, strict=True):
                # A malformed line rides on the frame's earliest time to reach an engine,
                # which reports it as a dead letter.
                stamp = event.time if event is not None else min(times)
                out.extend((profile, group, seq, stamp, line)
                           for profile, group in route(table, job.buckets, event))
            # Anchors carry the frame's newest time to every profile without `per` (its one
            # key: clock-only profiles stay alive) — and to one key at least, so that an event
            # no profile wants (a heartbeat) still moves the watermark, which is global: every
            # key's timer for a buffered instant then fires.
            keys = [name for name, (_, per, _) in table if per is None] or [n for n, _ in table[:1]]
            out.extend((name, 0, ANCHOR, max(times), "") for name in keys)
            frame_out = pd.DataFrame(out, columns=["profile", "bucket", "seq", "ts", "line"])
            frame_out["ts"] = pd.to_datetime(frame_out["ts"], unit="us", utc=True)
            yield frame_out

    routed = lines.mapInPandas(fan_out, ROUTED)
    composed = (routed.withWatermark("ts", lateness)
                .groupBy("profile", "bucket")
                .transformWithState(statefulProcessor=composer_processor(job), outputStructType=OUT,
                                    outputMode="Append", timeMode="EventTime"))

    def each(batch: Any, batch_id: int) -> None:
        sink(batch_id, batch.collect())

    writer = composed.writeStream.foreachBatch(each).option("checkpointLocation", checkpoint)
    writer = writer.trigger(**trigger) if trigger else writer
    return writer.start()


def directory_sink(out_dir: str) -> Callable[[int, list[Any]], None]:
    """Composites and dead letters to ``out_dir`` as one file per batch id, written atomically:
    a batch re-run after a restart replaces its own file (idempotent)."""
    os.makedirs(out_dir, exist_ok=True)

    def write(batch_id: int, rows: list[Any]) -> None:
        for kind in ("composite", "dead_letter"):
            chosen = sorted(r.payload for r in rows if r.kind == kind)
            if not chosen:
                continue
            path = os.path.join(out_dir, f"{kind}s-{batch_id:08d}.jsonl")
            with open(path + ".tmp", "w", encoding="utf-8") as handle:
                handle.write("\n".join(chosen) + "\n")
            os.replace(path + ".tmp", path)

    return write
