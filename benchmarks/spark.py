"""The streaming composition job on local[2]: a cross-source sequence with many partition keys,
one engine per profile × bucket (the job) against one state per partition key (naive: every
key its own bucket), side by side on the same input. Prints events/s and micro-batch latency.

    .venv/bin/python benchmarks/spark.py [--keys 10000] [--batch 50000] [--batches 4]
        [--buckets 16] [--skip-naive] [--per-source]

Each micro-batch arrives as one spool file with both sources mixed and no sources declared;
with ``--per-source`` as one file per source (the trucks' adapter and the depots' adapter each
write their own) with both sources declared, so each has its own watermark.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import tempfile
import time
from typing import Any

from eva.engine import EngineConfig
from eva.parser import parse
from spark_jobs.job import StreamJob, start
from spark_jobs.profiles import Registration, write_table
from spark_jobs.session import build_session
from spark_jobs.spool import spool_file

# A and B come from two different sources (a truck feed and a depot feed): a cross-source
# sequence per truck, within 10 s.
PROFILES = ('class A = type == "truck.departure" and source == "urn:trucks"\n'
            'class B = type == "depot.arrival" and source == "urn:depots"\n'
            "profile S per data.truck = ((all_dup(A); all_dup(B))_10s)_all_pairs\n")


def batch_lines(rng: random.Random, start_us: int, n: int, keys: int, offset: int) -> list[str]:
    out = []
    for i in range(n):
        kind, source = rng.choice([("truck.departure", "urn:trucks"),
                                   ("depot.arrival", "urn:depots")])
        t = start_us + i * 200  # 5,000 events per second of event time
        seconds, micros = divmod(t, 1_000_000)
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)) + f".{micros:06d}Z"
        out.append(json.dumps({"specversion": "1.0", "id": f"e{offset + i}", "source": source,
                               "type": kind, "time": stamp,
                               "data": {"truck": f"T{rng.randrange(keys)}"}}))
    return out


SOURCES = ("urn:trucks", "urn:depots")


def arrivals(lines: list[str], per_source: bool) -> list[list[str]]:
    """A micro-batch's lines as the files they arrive in, in arrival order."""
    if not per_source:
        return [lines]
    sources = [json.loads(line)["source"] for line in lines]
    return [[line for line, s in zip(lines, sources, strict=True) if s == source]
            for source in SOURCES]


def config(per_source: bool) -> EngineConfig:
    return EngineConfig(sources=SOURCES) if per_source else EngineConfig()


def run(spark: Any, label: str, buckets: int, keys: int, batch: int, batches: int,
        per_source: bool) -> int:
    root = tempfile.mkdtemp(prefix=f"evamed-bench-{label}-")
    spool = os.path.join(root, "spool")
    os.makedirs(spool)
    table = os.path.join(root, "profiles.json")
    origin = 1_772_000_000_000_000
    write_table(table, [Registration(PROFILES, origin)])
    job = StreamJob(table, config(per_source).to_json(), buckets)
    produced = 0

    def sink(batch_id: int, rows: list[Any]) -> None:
        nonlocal produced
        produced += sum(1 for r in rows if r.kind == "composite")

    rng = random.Random(7)
    files = len(SOURCES) if per_source else 1
    query = start(spark, job, spool, os.path.join(root, "ckpt"), sink, max_files=files)
    latencies = []
    total = 0
    try:
        for k in range(batches + 1):  # the first batch warms the Python workers up
            lines = batch_lines(rng, origin + 1 + k * batch * 200, batch, keys, k * batch)
            # The file source takes files in modification order.
            for i, part in enumerate(arrivals(lines, per_source)):
                spool_file(spool, f"part-{k:04d}-{i}.jsonl", part, time.time() + k + i / 10)
            began = time.perf_counter()
            query.processAllAvailable()
            if k:
                latencies.append(time.perf_counter() - began)
                total += batch
        # Heartbeats no profile wants move the watermark past the last events.
        for i, source in enumerate(SOURCES if per_source else ("bench",)):
            heartbeat = {"specversion": "1.0", "id": f"heartbeat-{i}", "source": source,
                         "type": "heartbeat", "time": "2027-01-01T00:00:00Z"}
            spool_file(spool, f"part-9999-{i}.jsonl", [json.dumps(heartbeat)],
                       time.time() + batches + 1 + i / 10)
        query.processAllAvailable()
    finally:
        query.stop()
        shutil.rmtree(root, ignore_errors=True)
    seconds = sum(latencies)
    print(f"  {label:8} buckets={buckets:>13,}  {total / seconds:>8,.0f} events/s  "
          f"micro-batch {min(latencies):5.2f}–{max(latencies):5.2f} s  ({produced:,} composites)")
    return produced


def in_process(keys: int, batch: int, batches: int, per_source: bool) -> int:
    from eva.engine import Engine
    from eva.events import from_json_line

    rng = random.Random(7)
    origin = 1_772_000_000_000_000
    engine = Engine(config(per_source))
    engine.add_document(parse(PROFILES))
    engine.begin(origin)
    count = seq = 0
    for k in range(batches + 1):
        lines = batch_lines(rng, origin + 1 + k * batch * 200, batch, keys, k * batch)
        for line in (line for part in arrivals(lines, per_source) for line in part):
            count += len(engine.push(from_json_line(line, seq)))
            seq += 1
    return count + len(engine.close())


def floor(spark: Any, buckets: int, keys: int, batch: int, batches: int) -> float:
    """Spark's own cost for the job's plan shape (µs per event): the same spool source,
    shuffle into (profile, bucket) keys, watermark, event-time ``transformWithStateInPandas``
    on RocksDB and ``foreachBatch`` sink, with the Python reduced to a vectorised fan-out and a
    processor that only counts its rows."""
    import pandas as pd
    from pyspark.sql.streaming.stateful_processor import StatefulProcessor

    from spark_jobs.job import OUT, ROUTED
    from spark_jobs.spool import spool_lines

    class Count(StatefulProcessor):
        def init(self, handle: Any) -> None:
            self.seen = handle.getValueState("seen", "n LONG")

        def handleInputRows(self, key: Any, rows: Any, timerValues: Any) -> Any:
            before = self.seen.get()[0] if self.seen.exists() else 0
            self.seen.update((before + sum(len(frame) for frame in rows),))
            return iter(())

        def close(self) -> None:
            pass

    def fan_out(frames: Any) -> Any:
        for frame in frames:
            yield pd.DataFrame({"profile": "S", "bucket": (frame["seq"] % buckets).astype("int32"),
                                "seq": frame["seq"], "ts": pd.Timestamp.now(tz="UTC"),
                                "line": frame["value"]})

    root = tempfile.mkdtemp(prefix="evamed-bench-floor-")
    spool = os.path.join(root, "spool")
    os.makedirs(spool)
    query = (spool_lines(spark, spool, 1).mapInPandas(fan_out, ROUTED)
             .withWatermark("ts", "0 seconds").groupBy("profile", "bucket")
             .transformWithStateInPandas(statefulProcessor=Count(), outputStructType=OUT,
                                         outputMode="Append", timeMode="EventTime")
             .writeStream.foreachBatch(lambda frame, _: frame.toPandas())
             .option("checkpointLocation", os.path.join(root, "ckpt")).start())
    rng = random.Random(7)
    seconds = 0.0
    try:
        for k in range(batches + 1):
            lines = batch_lines(rng, 1 + k * batch * 200, batch, keys, k * batch)
            spool_file(spool, f"part-{k:04d}.jsonl", lines, time.time() + k)
            began = time.perf_counter()
            query.processAllAvailable()
            seconds += (time.perf_counter() - began) if k else 0.0
    finally:
        query.stop()
        shutil.rmtree(root, ignore_errors=True)
    return seconds / (batch * batches) * 1e6


def python_work(keys: int, batch: int, batches: int, buckets: int) -> dict[str, float]:
    """The job's Python work per event (µs on one core), measured in-process on the same
    trace: fan-out (parse, route), engine (parse, push), output (a line per composite),
    state (each bucket's snapshot written and restored once per micro-batch)."""
    from eva.engine import Engine
    from eva.events import from_json_line
    from eva.notify import composite_line
    from eva.snapshot import restore, snapshot
    from spark_jobs.profiles import profiles, route

    root = tempfile.mkdtemp(prefix="evamed-bench-python-")
    table = os.path.join(root, "profiles.json")
    origin = 1_772_000_000_000_000
    write_table(table, [Registration(PROFILES, origin)])
    routes = sorted(profiles(table).items())
    shutil.rmtree(root, ignore_errors=True)
    doc = parse(PROFILES)
    engines = {}
    for group in range(buckets):
        engines[group] = Engine(EngineConfig())
        engines[group].add_document(doc)
        engines[group].begin(origin)
    spent = dict.fromkeys(("fan-out", "engine", "output", "state"), 0.0)
    rng = random.Random(7)
    seq = 0
    for k in range(batches + 1):
        lines = batch_lines(rng, origin + 1 + k * batch * 200, batch, keys, k * batch)
        clock = time.perf_counter()
        rows: dict[int, list[tuple[int, str]]] = {group: [] for group in range(buckets)}
        for line in lines:
            for _, group in route(routes, buckets, from_json_line(line)):
                rows[group].append((seq, line))
            seq += 1
        clock, before = time.perf_counter(), clock
        spent["fan-out"] += clock - before
        notes = []
        for group, taken in rows.items():
            for at, line in taken:
                notes.extend(engines[group].push(from_json_line(line, at)))
        clock, before = time.perf_counter(), clock
        spent["engine"] += clock - before
        for note in notes:
            composite_line(note)
        clock, before = time.perf_counter(), clock
        spent["output"] += clock - before
        engines = {group: restore(snapshot(engine)) for group, engine in engines.items()}
        spent["state"] += time.perf_counter() - clock
        if k == 0:  # like the job's, the first micro-batch warms up
            spent = dict.fromkeys(spent, 0.0)
    return {part: seconds / (batch * batches) * 1e6 for part, seconds in spent.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--keys", type=int, default=10_000)
    parser.add_argument("--batch", type=int, default=50_000)
    parser.add_argument("--batches", type=int, default=4)
    parser.add_argument("--buckets", type=int, default=16)
    parser.add_argument("--skip-naive", action="store_true")
    parser.add_argument("--per-source", action="store_true")
    parser.add_argument("--bound", action="store_true",
                        help="also measure Spark's own cost for the plan and the Python work "
                             "per event, and the throughput they leave room for on 2 cores")
    args = parser.parse_args()
    spark = build_session()
    print(f"{args.batches} micro-batches of {args.batch:,} events, {args.keys:,} partition keys, "
          "local[2]")
    shape = (f"a file per source per micro-batch, sources declared: {', '.join(SOURCES)}"
             if args.per_source else "one file per micro-batch, sources mixed, none declared")
    print(f"  {shape}")
    expected = in_process(args.keys, args.batch, args.batches, args.per_source)
    bucketed = run(spark, "bucketed", args.buckets, args.keys, args.batch, args.batches,
                   args.per_source)
    print(f"  in-process engine: {expected:,} composites")
    assert bucketed == expected > 0, "the job must report the engine's composites"
    if not args.skip_naive:
        # Naive: every key its own state (crc32 modulo 2^31 − 1 separates them, bar collisions).
        naive = run(spark, "naive", 2**31 - 1, args.keys, args.batch, args.batches,
                    args.per_source)
        assert naive == expected, "the naive job must report the engine's composites"
    if args.bound:
        spark_us = floor(spark, args.buckets, args.keys, args.batch, args.batches)
        work = python_work(args.keys, args.batch, args.batches, args.buckets)
        print(f"  Spark alone (same plan, trivial Python): {1e6 / spark_us:,.0f} events/s "
              f"= {spark_us:.1f} µs/event")
        print("  Python work per event on one core: "
              + ", ".join(f"{part} {us:.1f} µs" for part, us in work.items())
              + f" = {sum(work.values()):.1f} µs")
        bound = 1e6 / (spark_us + sum(work.values()) / 2)
        print(f"  bound on 2 cores (Spark's time + the Python work spread perfectly over both "
              f"cores): {bound:,.0f} events/s")


if __name__ == "__main__":
    main()
