"""Batch replay on Spark (``evamed replay --engine spark``): the same answer as the in-process
engine, computed by Spark tasks.

The trace is admitted first (watermarks, late and malformed events: the engine's own ingestion
rules, with no profile registered). Then Spark fans every event out to the (profile, bucket)
groups it belongs to — a ``per`` profile's partitions are hashed into ``buckets`` buckets, a
profile without ``per`` is one group — and each group runs the incremental engine over its
events alone (``groupBy().applyInPandas``); the engine keeps the bucket's partitions apart
itself. Partitions are independent by definition (a ``per`` partition sees only its own
events), so the engines agree with one engine over the whole trace once they share its clock:
every group engine is started at the trace's origin and closed at its end. The driver merges
the groups' composites in the order the in-process engine reports them: report key, then
profile in document order, then partition in order of creation.

Why buckets, not one group per partition: Spark's cost is per group (a Python call, a pandas
frame, an engine), not per event — with 10⁴ keys, one group per key ran at 3k events/s
(research/spark.md measured the same for per-key streaming state).
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from eva.engine import Engine, EngineConfig
from eva.events import PRIMITIVE, Event, from_json_line, to_cloudevent
from eva.notify import composite_line, tuples_from_json, tuples_to_json
from eva.semantics import partition_key
from spark_jobs.routing import document, event_matchers, memberships
from transforms.runner import trace_key

GROUPS_SCHEMA = "profile INT, grp INT, seq LONG, line STRING"
OUT_SCHEMA = "profile INT, created LONG, rkey STRING, ord INT, event STRING"
NO_EVENT = -1


@dataclass(frozen=True)
class Job:
    """Everything a task needs, small enough to ship with each task."""

    profiles_text: str
    profile_indices: tuple[int, ...]
    buckets: int
    config: dict[str, Any]  # EngineConfig.to_json(): plain data, shipped with every task
    origin: int
    end: int


@lru_cache(maxsize=8)
def _routes(text: str, indices: tuple[int, ...]) -> list[tuple[int, str | None, list[Any]]]:
    """Per profile: its index, its ``per`` path and the matchers of its event classes."""
    doc = document(text)
    return [(i, doc.profiles[i].per, event_matchers(doc.profiles[i], doc)) for i in indices]


def run_group(job: Job, profile_index: int, rows: list[tuple[int, str]]) -> list[tuple[Any, ...]]:
    """One group's engine over its events (in trace order): (profile, partition created at,
    report key as JSON, order within the group, composite CloudEvent JSON)."""
    doc = document(job.profiles_text)
    per = doc.profiles[profile_index].per
    engine = Engine(EngineConfig.from_json(job.config))
    engine.add_document(doc, [doc.profiles[profile_index].name])
    engine.begin(job.origin)
    events = sorted((seq, line) for seq, line in rows if seq != NO_EVENT)
    keys = []  # the trace's key of each event the group's engine numbers
    created: dict[Any, int] = {}  # partition → the trace position of the event that opened it
    notes = []
    for local, (seq, line) in enumerate(events):
        event = from_json_line(line, seq=local)
        keys.append((event.time, PRIMITIVE, seq))
        if per is not None:
            created.setdefault(partition_key(event.field(per)), seq)
        notes.extend(engine.push(event))
    notes.extend(engine.close(job.end))
    return [(profile_index, created.get(partition_key(n.partition), 0) if per is not None else 0,
             json.dumps(tuples_to_json(trace_key(n.emitted, keys))), i,
             composite_line(n)[1]) for i, n in enumerate(notes)]


@dataclass(frozen=True)
class Spooled:
    """Admitted events written to a JSON-lines file as they streamed in (``seq`` and the
    CloudEvent line): Spark reads the file, the driver holds none of them."""

    path: str
    count: int
    newest: int | None  # the latest event time


@contextmanager
def spooled(events: Iterable[Event]) -> Iterator[Spooled]:
    """Spool ``events`` (as they come) to a temporary file, removed afterwards."""
    with tempfile.TemporaryDirectory(prefix="evamed-replay-") as folder:
        path = os.path.join(folder, "events.jsonl")
        count, newest = 0, None
        with open(path, "w", encoding="utf-8") as out:
            for e in events:
                out.write(json.dumps({"seq": e.seq, "line": json.dumps(to_cloudevent(e))}) + "\n")
                count += 1
                newest = e.time if newest is None else max(newest, e.time)
        yield Spooled(path, count, newest)


SPOOL_SCHEMA = "seq LONG, line STRING"


def source(spark: Any, spool: Spooled, *, shared: bool | None = None) -> Any:
    """The spooled events as a DataFrame. In local mode (``shared``: the tasks see the driver's
    files) Spark reads the file itself; with a cluster's executors, which cannot open the
    driver's temporary file, the rows go with the plan, as they did before the spool."""
    if shared is None:
        shared = str(spark.sparkContext.master).startswith("local")
    if shared:
        return spark.read.schema(SPOOL_SCHEMA).json(spool.path)
    with open(spool.path, encoding="utf-8") as lines:
        rows = [(record["seq"], record["line"]) for record in map(json.loads, lines)]
    return spark.createDataFrame(rows, SPOOL_SCHEMA)


def replay(spark: Any, profiles_text: str, events: Spooled | Iterable[Event], *,
           config: EngineConfig, origin: int, end: int | None = None,
           profiles: list[str] | None = None, buckets: int = 16,
           shared: bool | None = None) -> list[str]:
    """The composites (CloudEvents JSON, in report order) of admitted ``events`` on Spark;
    the trace ends at ``end`` (default: the newest event's time). ``shared``: see
    :func:`source`."""
    if not isinstance(events, Spooled):
        with spooled(events) as spool:
            return replay(spark, profiles_text, spool, config=config, origin=origin, end=end,
                          profiles=profiles, buckets=buckets, shared=shared)
    import pandas as pd

    last = end if end is not None else events.newest if events.newest is not None else origin
    doc = document(profiles_text)
    indices = tuple(i for i, p in enumerate(doc.profiles) if profiles is None or p.name in profiles)
    job = Job(profiles_text, indices, buckets, config.to_json(), origin, last)

    def fan_out(frames: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
        routes = _routes(job.profiles_text, job.profile_indices)
        for frame in frames:
            out: list[tuple[int, int, int, str]] = []
            for seq, line in zip(frame["seq"], frame["line"], strict=True):
                event = from_json_line(line, seq=int(seq))
                out.extend((index, grp, int(seq), line)
                           for index, grp in memberships(routes, event, job.buckets))
            yield pd.DataFrame(out, columns=["profile", "grp", "seq", "line"])

    def evaluate(frame: pd.DataFrame) -> pd.DataFrame:
        rows = list(zip(frame["seq"].tolist(), frame["line"].tolist(), strict=True))
        result = run_group(job, int(frame["profile"].iloc[0]), rows)
        return pd.DataFrame(result, columns=["profile", "created", "rkey", "ord", "event"])

    grouped = source(spark, events, shared=shared).mapInPandas(fan_out, GROUPS_SCHEMA)
    # Every profile without `per` runs even if no event reaches it (its clock may report).
    anchors = [(i, 0, NO_EVENT, "") for i in indices if doc.profiles[i].per is None]
    if anchors:
        grouped = grouped.unionByName(spark.createDataFrame(anchors, GROUPS_SCHEMA))
    result = grouped.groupBy("profile", "grp").applyInPandas(evaluate, OUT_SCHEMA).collect()
    ordered = sorted(result, key=lambda r: (tuples_from_json(json.loads(r.rkey)), r.profile, r.created,
                                            r.ord))
    return [r.event for r in ordered]
