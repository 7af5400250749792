"""The streaming composition job: the Spark plan from input lines to a sink, and the guard that
keeps a checkpoint to the layout it was written with. Data flow (docs/spark.md):

    spool directory (spark_jobs/spool.py), the store's log (spark_jobs/log_source.py) or the
    Redis log (spark_jobs/redis_io.py): lines (value, seq) — the mediator's composer log read
    in releases, (value, seq, clock): ordered input (spark_jobs/processor.py)
      → parse_lines, in the JVM: each line's envelope as columns (id, source, type, time in
        µs, data as JSON text) where the JVM reads it as the engine would; any other line
        whole
      → fan-out (mapInPandas): each event to the (profile, bucket) keys it belongs to, by the
        profile table (spark_jobs/profiles.py) — the row copied, not rewritten; event rows
        carry no event time, anchor rows carry each frame's newest time, drop rows clear a
        removed profile's keys (ordered input: clock rows give each frame's newest release
        watermark to the keys that act without events)
      → withWatermark(ts, lateness): moved by the anchors only
      → groupBy(profile, bucket).transformWithStateInPandas: one engine per key
        (spark_jobs/processor.py; its state by partition, spark_jobs/state.py)
      → composites as columns, their JSON written in the JVM (composite_json)
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
from eva.events import MAX_DEPTH
from eva.notify import SOURCE
from spark_jobs.processor import (
    ANCHOR,
    CLOCK,
    DROP,
    anchor_line,
    composer_processor,
    parsed_events,
    watermark_of,
)
from spark_jobs.profiles import acts_alone, profiles, removed, router
from spark_jobs.sinks import Sink
from spark_jobs.spool import spool_lines, write_whole
from spark_jobs.state import FORMAT as STATE_FORMAT

if TYPE_CHECKING:
    import pandas as pd

@dataclass(frozen=True)
class StreamJob:
    table: str  # path of the profile table (profiles.write_table); read again whenever it changes
    config: dict[str, Any]  # EngineConfig.to_json(): plain data, shipped with every task
    buckets: int = 16
    ordered: bool = False
    """The input is the mediator's composer log read in releases (events in trace order,
    released in whole instants, each release closed by a watermark line; rows with their
    release's watermark, ``clock``): keys decide up to the watermarks they are given, not up to
    Spark's (spark_jobs/processor.py, "Ordered input")."""


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
    layout: dict[str, Any] = {"buckets": job.buckets, "config": config, "state": STATE_FORMAT}
    if job.ordered:  # its clock's unit, its state variables and its offsets differ
        layout["input"] = "ordered"
    path = os.path.join(checkpoint, LAYOUT)
    if not os.path.exists(path):
        os.makedirs(checkpoint, exist_ok=True)
        write_whole(path, json.dumps(layout))
        return
    found = _recorded(checkpoint, path)
    if found.get("state", 1) != STATE_FORMAT:  # format 1 (pickles) had no such entry
        raise LayoutError(f"checkpoint {checkpoint} holds state in format {found.get('state', 1)}"
                          f"; this evamed reads format {STATE_FORMAT} only (data, where 1 "
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


# ------------------------------------------------------------------ parsing, in the JVM

PARSED = ("seq LONG, id STRING, source STRING, type STRING, time LONG, data STRING, "
          "attrs STRING, line STRING, clock LONG")
"""The input as the fan-out gets it: a line the JVM parsed as its envelope's columns (``time``
in µs, ``data`` the data member's JSON text, ``attrs`` the extension attributes as a JSON
object or null, ``line`` null); any other line as itself (``line``, the rest null), for the
engine to parse and, if malformed, report as replay reports it. ``clock``: the watermark of
its release (a log read in releases; else null)."""
ROUTED = f"profile STRING, bucket INT, ts TIMESTAMP, {PARSED}"
"""The fan-out's rows: ``ts``, the event time that moves the watermark (anchors only)."""
OUT = ("kind STRING, profile STRING, ident STRING, time LONG, partition STRING, "
       "constituents ARRAY<STRING>, payload STRING, key STRING, sources ARRAY<STRING>")
"""The processor's rows: a composite as columns (``payload`` null; the JVM writes its JSON,
``composite_json``), or a row whose ``payload`` Python wrote (a dead letter, a composite with
text the JVM's quoting would write otherwise than Python's json); a composite's report key
(JSON) and its constituents' sources (processor.as_columns)."""

EXTRAS = ("subject", "datacontenttype", "dataschema")
"""The optional attributes a JVM-parsed line may carry besides the required ones and data:
a line with any other is parsed in Python (its attributes are the engine's to keep)."""
_END = '{"evamed:end":""}'
# The JVM's JSON reader stops at the end of the first value and ignores what follows, where
# a line's reader refuses it: each line is read as the first element of an array that must
# end with this marker, so a line with anything after its object is not vouched for — nor
# one holding the marker's key itself (a line cannot spell it otherwise: no \u escapes).
_STAMP = r"^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]{3}|\.[0-9]{6})?Z$"
# A map of strings reads a number, boolean, object or array as its JSON text: a value of this
# shape may not have been a string. (Unicode escapes, numbers the JVM would round — runs of 19
# digits or more — go to Python whole: the JVM reads \ud800 and big integers otherwise.)
_NOT_SURELY_STRING = r"(?s)^(-?[0-9][0-9.eE+-]*|true|false|[\[{].*)$"
_RAW = r"\\u|[0-9]{19}"


def parse_lines(lines: Any) -> Any:
    """The input stream (``value``, ``seq``) as PARSED rows: the envelope read by Spark's JSON
    reader, vouched for only where the engine's own reader (eva.events.from_json_line) would
    read the same event — otherwise the line travels whole."""
    import pyspark.sql.functions as F

    parsed = F.from_json(F.concat(F.lit("["), "value", F.lit("," + _END + "]")),
                         "ARRAY<MAP<STRING, STRING>>",
                         {"allowSingleQuotes": "false", "allowNonNumericNumbers": "false"})
    m = F.col("m")
    value = F.col("value")

    def text(name: str) -> Any:
        return F.try_element_at(m, F.lit(name))

    def string(name: str) -> Any:  # a non-empty JSON string
        return (F.length(text(name)) > 0) & ~text(name).rlike(_NOT_SURELY_STRING)

    def string_or_absent(name: str) -> Any:
        return text(name).isNull() | ~text(name).rlike(_NOT_SURELY_STRING)

    allowed = ("specversion", "id", "source", "type", "time", "data", *EXTRAS)
    present = reduce(lambda a, b: a + b, [F.map_contains_key(m, k).cast("int") for k in allowed])
    us = F.unix_micros(F.try_to_timestamp(text("time")))
    vouched = (
        (F.size("a") == 2)
        & (F.try_element_at(F.try_element_at("a", F.lit(2)), F.lit("evamed:end")) == "")
        & ~value.contains('"evamed:end"')
        & (F.size(m) == present)
        & (text("specversion") == "1.0")
        & ~value.rlike(r'"specversion"\s*:\s*[^\s"]')  # 1.0 as a number reads as "1.0" too
        & string("id") & string("source") & string("type")
        & reduce(lambda a, b: a & b, [string_or_absent(k) for k in EXTRAS])
        & text("time").rlike(_STAMP) & ~text("time").startswith("0000") & us.isNotNull()
        # data: absent, null, or not a string (a string reads as its text, unquoted); no
        # number past a double's range (the JVM writes it as the string "Infinity")
        & ~value.rlike(r'"data"\s*:\s*"')
        & ~F.coalesce(text("data"), F.lit("")).contains("Infinity")
        & ~value.rlike(_RAW)
        & ((F.length(value) <= 2 * MAX_DEPTH)
           | (F.length(value) - F.length(F.translate(value, "{[", "")) <= MAX_DEPTH)))
    extras = F.when(reduce(lambda a, b: a | b, [F.map_contains_key(m, k) for k in EXTRAS]),
                    F.to_json(F.map_filter(m, lambda k, _: k.isin(*EXTRAS))))
    ok = F.coalesce(vouched, F.lit(False))
    clock = F.col("clock") if "clock" in lines.columns else F.lit(None).cast("long")
    return (lines.select("value", "seq", clock.alias("clock"), parsed.alias("a"))
            .select("value", "seq", "clock", F.try_element_at("a", F.lit(1)).alias("m"), "a")
            .select("seq", *[F.when(ok, c).alias(name) for name, c in (
                        ("id", text("id")), ("source", text("source")), ("type", text("type")))],
                    # 0, not null, for a whole line: pandas would read the column as floats
                    F.when(ok, us).otherwise(F.lit(0)).alias("time"),
                    *[F.when(ok, c).alias(name) for name, c in (
                        ("data", text("data")), ("attrs", extras))],
                    F.when(~ok, value).alias("line"), "clock"))


# ------------------------------------------------------------------ the plan


def fan_out(job: StreamJob, frame: pd.DataFrame) -> pd.DataFrame:
    """One frame of PARSED rows as ROUTED rows: each event to its (profile, bucket) keys (the
    row itself copied, not rewritten), anchors carrying the frame's newest time, and a drop
    row to every bucket of a removed profile (its keys' state goes at once, processor.DROP).
    An ordered job's watermark lines go to no key; its anchors carry the frame's newest
    release watermark (``clock``), and so does a clock row (processor.CLOCK) to every bucket
    of each ``per`` profile whose engine acts without events (``acts_alone``)."""
    import pandas as pd

    if "clock" not in frame.columns:  # (a frame built without it: no releases)
        frame = frame.assign(clock=pd.Series(pd.NA, index=frame.index, dtype="Int64"))
    events = parsed_events(frame)
    marks_at = ([watermark_of(line) is not None for line in frame["line"].tolist()]
                if job.ordered else [False] * len(events))
    keys_of = router(job.table, job.buckets).keys  # once per frame: profiles come and go
    table = sorted(profiles(job.table).items())
    taken: list[int] = []
    names: list[str] = []
    groups: list[int] = []
    for position, event in enumerate(events):
        if marks_at[position]:
            continue  # a watermark line: no event
        for profile, group in keys_of(event):
            taken.append(position)
            names.append(profile)
            groups.append(group)
    # Event rows carry no event time: Spark would drop a row behind its watermark unseen,
    # and the engine reports it as a late dead letter instead.
    taken_at = frame.index[taken]
    # Typed even when empty (no profile in the table yet): an empty list is an object column,
    # which Arrow cannot send as the INT the schema says.
    routed = frame.iloc[taken].assign(profile=pd.Series(names, index=taken_at, dtype=object),
                                      bucket=pd.Series(groups, index=taken_at, dtype="int32"))
    routed["ts"] = pd.Series(pd.NaT, index=routed.index, dtype="datetime64[ns, UTC]")
    marks: list[tuple[str, int, int, int | None, str | None]] = []
    seen = [e for e, mark in zip(events, marks_at, strict=True) if e is not None and not mark]
    clocks = [int(c) for c in frame["clock"].dropna().tolist()] if job.ordered else []
    clock = max(clocks, default=None)
    if seen or clock is not None:
        # Anchors carry the frame's newest time (they alone move the watermark) to every
        # profile without `per` (its one key: clock-only profiles stay alive) — and to one
        # key at least, so that an event no profile wants (a heartbeat) still moves the
        # watermark, which is global: every key's timer for a buffered instant then fires.
        keys = [name for name, (_, per, _) in table if per is None] or [n for n, _ in table[:1]]
        first = (anchor_line([s for s, mark in zip(frame["seq"].tolist(), marks_at, strict=True)
                              if not mark], [e for e, mark in zip(events, marks_at, strict=True)
                                             if not mark]) if seen else None)
        newest = max(e.time for e in seen) if seen else None
        marks.extend((name, 0, ANCHOR, newest, first) for name in keys)
    if clock is not None:
        marks.extend((name, group, CLOCK, None, None) for name in acts_alone(job.table)
                     for group in range(job.buckets))
    marks.extend((name, group, DROP, None, None) for name in removed(job.table)
                 for group in range(job.buckets))
    if not marks:
        return routed[ROUTED_COLUMNS]
    at = [m[3] for m in marks]  # as ints: a column of ints and Nones would be floats
    extra = pd.DataFrame([(m[0], m[1], m[2], m[4]) for m in marks],
                         columns=["profile", "bucket", "seq", "line"]).assign(
        id=None, source=None, type=None, time=0, data=None, attrs=None)
    extra["ts"] = pd.Series(pd.to_datetime(pd.array(at, dtype="Int64"), unit="us", utc=True),
                            index=extra.index).astype("datetime64[ns, UTC]")
    extra["clock"] = pd.array([clock if m[2] in (ANCHOR, CLOCK) else None for m in marks],
                              dtype="Int64")
    return pd.concat([routed, extra[ROUTED_COLUMNS]], ignore_index=True)[ROUTED_COLUMNS]


ROUTED_COLUMNS = [column.split()[0] for column in ROUTED.split(", ")]


def _by_source(spark: Any, parsed: Any, sources: tuple[str, ...]) -> list[Any]:
    """The PARSED input split into one part per declared source, each to be watermarked on its
    own (Spark's ``min`` policy then takes the slowest); one part without declared sources."""
    import pyspark.sql.functions as F

    if len(sources) <= 1:
        return [parsed]
    spark.conf.set("spark.sql.streaming.multipleWatermarkPolicy", "min")
    source = F.coalesce(F.col("source"), F.get_json_object("line", "$.source"))
    # Lines of other sources, and malformed lines, go with the first source's.
    first = ~source.isin(*sources[1:]) | source.isNull()
    return [parsed.where(first)] + [parsed.where(source == s) for s in sources[1:]]


def composite_json() -> Any:
    """A composite row's CloudEvent JSON, written in the JVM from its columns: the text
    ``eva.notify.composite_line`` writes, to the byte (the processor leaves a composite to the
    JVM only when its text needs no escape: processor.as_columns)."""
    import pyspark.sql.functions as F

    time = F.col("time")
    fraction = F.pmod(time, F.lit(1_000_000))
    stamp = F.concat(F.date_format(F.timestamp_micros(time), "yyyy-MM-dd'T'HH:mm:ss"),
                     F.when(fraction == 0, F.lit("Z")).otherwise(F.concat(
                         F.lit("."), F.lpad(fraction.cast("string"), 6, "0"), F.lit("Z"))))
    name = F.concat(F.lit('"'), F.col("profile"), F.lit('"'))
    ids = F.when(F.size("constituents") == 0, F.lit("[]")).otherwise(F.concat(
        F.lit('["'), F.array_join("constituents", '", "'), F.lit('"]')))
    partition = F.when(F.col("partition").isNull(), F.lit("")).otherwise(
        F.concat(F.lit(', "partition": '), F.col("partition")))
    return F.concat(
        F.lit('{"specversion": "1.0", "id": "'), F.col("ident"),
        F.lit(f'", "source": {json.dumps(SOURCE)}, "type": "eva.composite", "subject": '), name,
        F.lit(', "time": "'), stamp,
        F.lit('", "datacontenttype": "application/json", "data": {"profile": '), name,
        F.lit(', "constituents": '), ids, partition, F.lit("}}"))


def start(spark: Any, job: StreamJob, spool: str, checkpoint: str, sink: Sink, *,
          lateness: str = "0 seconds", max_files: int | None = None,
          trigger: dict[str, Any] | None = None, lines: Any = None) -> Any:
    """Start the job over a spool directory of CloudEvents JSON-lines files (or over ``lines``,
    a stream with columns ``value`` and ``seq`` — and ``clock``, a log read in releases —,
    e.g. the Redis log); ``sink(batch_id, rows)``
    receives each micro-batch's (kind, profile, ident, payload, key, sources) rows.

    With sources declared (``EngineConfig.sources``), each has its own watermark — the stream
    is split by source, each part watermarked, and Spark's ``min`` policy takes the slowest —
    so a source running behind the others is waited for, as the in-process engine waits for
    it; otherwise the watermark is the newest time of any source."""
    check_layout(checkpoint, job)
    if lines is None:
        lines = spool_lines(spark, spool, max_files)

    def routed(frames: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
        return (fan_out(job, frame) for frame in frames)

    parts = _by_source(spark, parse_lines(lines), EngineConfig.from_json(job.config).sources)
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

    import pyspark.sql.functions as F

    written = composed.select("kind", "profile", "ident",
                              F.coalesce("payload", composite_json()).alias("payload"),
                              "key", "sources")
    writer = written.writeStream.foreachBatch(each).option("checkpointLocation", checkpoint)
    writer = writer.trigger(**trigger) if trigger else writer
    return writer.start()
