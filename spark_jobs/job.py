"""The streaming composition job: the Spark plan from input lines to a sink, and the guard that
keeps a checkpoint to the layout it was written with. Data flow (docs/spark.md):

    spool directory (spark_jobs/spool.py) or the Redis log (spark_jobs/redis_io.py)
      → fan-out (mapInPandas): each event to the (profile, bucket) keys it belongs to, by the
        profile table (spark_jobs/profiles.py); event rows carry no event time, anchor rows
        carry each frame's newest time
      → withWatermark(ts, lateness): moved by the anchors only
      → groupBy(profile, bucket).transformWithStateInPandas: one engine per key
        (spark_jobs/processor.py)
      → foreachBatch: composites and dead letters to a sink per batch id (spark_jobs/sinks.py;
        a re-run batch after a restart overwrites its own output: no loss, no duplicates)

A bucket holds many ``per`` partitions (the engine keeps them apart), so Spark's per-key cost is
paid per bucket, not per partition (research/spark.md: per-key Python calls dominate).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from functools import reduce
from typing import TYPE_CHECKING, Any

from eva.engine import EngineConfig
from eva.events import Event, EventError, from_json_line
from eva.snapshot import FORMAT as SNAPSHOT_FORMAT
from spark_jobs.processor import ANCHOR, anchor_line, composer_processor
from spark_jobs.profiles import profiles, route
from spark_jobs.sinks import Sink
from spark_jobs.spool import spool_lines, write_whole

if TYPE_CHECKING:
    import pandas as pd

ROUTED = "profile STRING, bucket INT, seq LONG, ts TIMESTAMP, line STRING"
OUT = "kind STRING, profile STRING, ident STRING, payload STRING"


@dataclass(frozen=True)
class StreamJob:
    table: str  # path of the profile table (profiles.write_table); read again whenever it changes
    config: dict[str, Any]  # EngineConfig.to_json(): plain data, shipped with every task
    buckets: int = 16
    # A key's engine is written whole again once its log holds this many rows (a call with
    # more rows writes it at once; calls with few rows, and timer calls, only log).
    log_rows: int = 2_000


# ------------------------------------------------------------------ the checkpoint's layout


class LayoutError(ValueError):
    """A checkpoint written by a job laid out differently (buckets, engine configuration)."""


LAYOUT = "evamed-layout.json"


def check_layout(checkpoint: str, job: StreamJob) -> None:
    """Refuse a checkpoint whose state was filed under another layout, or written in another
    state format; record the layout in a new one. State is keyed by (profile, bucket) and each
    engine keeps the configuration it was created with, so resuming with other buckets would
    evaluate a partition in two engines (or in none of its old state), and another
    configuration would mix two in one job."""
    config = EngineConfig.from_json(job.config).to_json()  # checked, in its canonical form
    layout = {"buckets": job.buckets, "config": config, "state": SNAPSHOT_FORMAT}
    path = os.path.join(checkpoint, LAYOUT)
    if not os.path.exists(path):
        os.makedirs(checkpoint, exist_ok=True)
        write_whole(path, json.dumps(layout))
        return
    found = _recorded(checkpoint, path)
    if found.get("state", 1) != SNAPSHOT_FORMAT:  # format 1 (pickles) had no such entry
        raise LayoutError(f"checkpoint {checkpoint} holds state in format {found.get('state', 1)}"
                          f"; this evamed reads format {SNAPSHOT_FORMAT} only (data, where 1 "
                          "was pickles): start on a fresh checkpoint")
    if found != layout:
        had = found.get("config")
        had = had if isinstance(had, dict) else {}
        changed = [f"{name} {found.get(name)} → {value}" for name, value in layout.items()
                   if name != "config" and found.get(name) != value]
        changed += [f"config.{name} {had.get(name)} → {value}" for name, value in config.items()
                    if had.get(name) != value]
        changed += [f"{name} {found[name]} → none" for name in found if name not in layout]
        raise LayoutError(f"checkpoint {checkpoint} was written by a job with other settings "
                          f"({', '.join(changed)}): run with its settings, or start on a fresh "
                          "checkpoint")


def _recorded(checkpoint: str, path: str) -> dict[str, Any]:
    """The layout a checkpoint records. (One written before the configuration was kept by
    field name, as a positional list, is of an older state format: refused by that.)"""
    try:
        with open(path, encoding="utf-8") as handle:
            found = json.load(handle)
    except (OSError, ValueError) as exc:
        raise LayoutError(f"checkpoint {checkpoint}: {LAYOUT} cannot be read ({exc}): start "
                          "on a fresh checkpoint") from None
    if not isinstance(found, dict):
        raise LayoutError(f"checkpoint {checkpoint}: {LAYOUT} holds {type(found).__name__}, "
                          "expected a JSON object: start on a fresh checkpoint")
    return found


# ------------------------------------------------------------------ the plan


def fan_out(job: StreamJob, frame: pd.DataFrame) -> pd.DataFrame:
    """One frame of input lines as ROUTED rows: each event to its (profile, bucket) keys, and
    anchors carrying the frame's newest time."""
    import pandas as pd

    events: list[Event | None] = []
    for line in frame["value"]:
        try:
            events.append(from_json_line(line))
        except EventError:
            events.append(None)
    times = [e.time for e in events if e is not None]
    seqs = frame["seq"].tolist()
    table = sorted(profiles(job.table).items())  # once per frame: profiles come and go
    out: list[tuple[str, int, int, int | None, str]] = []
    for line, seq, event in zip(frame["value"], seqs, events, strict=True):
        # Event rows carry no event time: Spark would drop a row behind its watermark
        # unseen, and the engine reports it as a late dead letter instead.
        out.extend((profile, group, seq, None, line)
                   for profile, group in route(table, job.buckets, event))
    # Anchors carry the frame's newest time (they alone move the watermark) to every
    # profile without `per` (its one key: clock-only profiles stay alive) — and to one
    # key at least, so that an event no profile wants (a heartbeat) still moves the
    # watermark, which is global: every key's timer for a buffered instant then fires.
    keys = [name for name, (_, per, _) in table if per is None] or [n for n, _ in table[:1]]
    if times:
        first = anchor_line(seqs, events)
        out.extend((name, 0, ANCHOR, max(times), first) for name in keys)
    routed = pd.DataFrame(out, columns=["profile", "bucket", "seq", "ts", "line"])
    routed["ts"] = pd.to_datetime(routed["ts"], unit="us", utc=True)
    return routed


def _by_source(spark: Any, lines: Any, sources: tuple[str, ...]) -> list[Any]:
    """The input split into one part per declared source, each to be watermarked on its own
    (Spark's ``min`` policy then takes the slowest); one part without declared sources."""
    import pyspark.sql.functions as F

    if len(sources) <= 1:
        return [lines]
    spark.conf.set("spark.sql.streaming.multipleWatermarkPolicy", "min")
    source = F.get_json_object("value", "$.source")
    # Lines of other sources, and malformed lines, go with the first source's.
    first = ~source.isin(*sources[1:]) | source.isNull()
    return [lines.where(first)] + [lines.where(source == s) for s in sources[1:]]


def start(spark: Any, job: StreamJob, spool: str, checkpoint: str, sink: Sink, *,
          lateness: str = "0 seconds", max_files: int | None = None,
          trigger: dict[str, Any] | None = None, lines: Any = None) -> Any:
    """Start the job over a spool directory of CloudEvents JSON-lines files (or over ``lines``,
    a stream with columns ``value`` and ``seq``, e.g. the Redis log); ``sink(batch_id, rows)``
    receives each micro-batch's (kind, profile, ident, payload) rows.

    With sources declared (``EngineConfig.sources``), each has its own watermark — the stream
    is split by source, each part watermarked, and Spark's ``min`` policy takes the slowest —
    so a source running behind the others is waited for, as the in-process engine waits for
    it; otherwise the watermark is the newest time of any source."""
    check_layout(checkpoint, job)
    if lines is None:
        lines = spool_lines(spark, spool, max_files)

    def routed(frames: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
        return (fan_out(job, frame) for frame in frames)

    parts = _by_source(spark, lines, EngineConfig.from_json(job.config).sources)
    watermarked = reduce(lambda a, b: a.union(b), [
        part.mapInPandas(routed, ROUTED).withWatermark("ts", lateness) for part in parts])
    composed = (watermarked
                .groupBy("profile", "bucket")
                .transformWithStateInPandas(statefulProcessor=composer_processor(job),
                                            outputStructType=OUT, outputMode="Append",
                                            timeMode="EventTime"))

    def each(batch: Any, batch_id: int) -> None:
        # Through Arrow: collect() would build a Row per composite in the driver.
        sink(batch_id, list(batch.toPandas().itertuples(index=False)))

    writer = composed.writeStream.foreachBatch(each).option("checkpointLocation", checkpoint)
    writer = writer.trigger(**trigger) if trigger else writer
    return writer.start()
