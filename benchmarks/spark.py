"""The streaming composition job, side by side: the job (one engine per profile × bucket), the
naive job (every partition key its own state) and Spark alone on the same plan (the JVM parse,
shuffle, watermark, RocksDB state and sink with a Python that only counts), at each
micro-batch size, on local[1] and local[2]; then the job's Python work per event, by part.

    .venv/bin/python benchmarks/spark.py [--keys 10000] [--sizes 100000,250000]
        [--batches 2] [--buckets 16] [--masters local[1],local[2]] [--skip-naive]
        [--per-source]

A cross-source sequence per truck over ``--keys`` trucks. Each micro-batch arrives as one
spool file with both sources mixed and no sources declared; with ``--per-source`` as one file
per source with both sources declared (a watermark each). Each master runs in a process of its
own (a process has one SparkContext); the first micro-batch of every run warms up and is not
counted. Prints a table to paste into docs/performance.md.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any

from eva.engine import EngineConfig
from eva.events import format_time
from eva.parser import parse
from spark_jobs.job import ROUTED_COLUMNS, StreamJob, start
from spark_jobs.profiles import Registration, write_table
from spark_jobs.spool import spool_file

# A and B come from two different sources (a truck feed and a depot feed): a cross-source
# sequence per truck, within 10 s.
PROFILES = ('class A = type == "truck.departure" and source == "urn:trucks"\n'
            'class B = type == "depot.arrival" and source == "urn:depots"\n'
            "profile S per data.truck = ((all_dup(A); all_dup(B))_10s)_all_pairs\n")
ORIGIN = 1_772_000_000_000_000
SOURCES = ("urn:trucks", "urn:depots")

Fields = tuple[str, str, str, int, str]  # id, source, type, time (µs), data as JSON text


def batch_events(rng: random.Random, k: int, n: int, keys: int) -> list[Fields]:
    """Micro-batch ``k`` of ``n`` events: 5,000 events per second of event time."""
    out = []
    for i in range(n):
        kind, source = rng.choice([("truck.departure", "urn:trucks"),
                                   ("depot.arrival", "urn:depots")])
        out.append((f"e{k * n + i}", source, kind, ORIGIN + 1 + (k * n + i) * 200,
                    json.dumps({"truck": f"T{rng.randrange(keys)}"})))
    return out


def line(fields: Fields) -> str:
    ident, source, kind, time_us, data = fields
    return (f'{{"specversion": "1.0", "id": "{ident}", "source": "{source}", "type": "{kind}", '
            f'"time": "{format_time(time_us)}", "data": {data}}}')


def arrivals(events: list[Fields], per_source: bool) -> list[list[Fields]]:
    """A micro-batch's events as the files they arrive in, in arrival order."""
    if not per_source:
        return [events]
    return [[e for e in events if e[1] == source] for source in SOURCES]


def config(per_source: bool) -> EngineConfig:
    return EngineConfig(sources=SOURCES) if per_source else EngineConfig()


def batches(keys: int, size: int, count: int) -> list[list[Fields]]:
    rng = random.Random(7)
    return [batch_events(rng, k, size, keys) for k in range(count + 1)]  # + the warm-up


# ------------------------------------------------------------------ Spark runs (one master)


def run(spark: Any, label: str, buckets: int, trace: list[list[Fields]],
        per_source: bool) -> dict[str, Any]:
    """The job over the trace's micro-batches: events/s over the counted ones."""
    root = tempfile.mkdtemp(prefix=f"evamed-bench-{label}-")
    spool = os.path.join(root, "spool")
    os.makedirs(spool)
    table = os.path.join(root, "profiles.json")
    write_table(table, [Registration(PROFILES, ORIGIN)])
    job = StreamJob(table, config(per_source).to_json(), buckets)
    produced = 0

    def sink(batch_id: int, rows: list[Any]) -> None:
        nonlocal produced
        produced += sum(1 for r in rows if r.kind == "composite")

    files = len(SOURCES) if per_source else 1
    query = start(spark, job, spool, os.path.join(root, "ckpt"), sink, max_files=files)
    latencies = []
    try:
        for k, events in enumerate(trace):
            # The file source takes files in modification order.
            for i, part in enumerate(arrivals(events, per_source)):
                spool_file(spool, f"part-{k:04d}-{i}.jsonl", [line(e) for e in part],
                           time.time() + k + i / 10)
            began = time.perf_counter()
            query.processAllAvailable()
            latencies.append(time.perf_counter() - began)
        # Heartbeats no profile wants move the watermark past the last events.
        for i, source in enumerate(SOURCES if per_source else ("bench",)):
            heartbeat = {"specversion": "1.0", "id": f"heartbeat-{i}", "source": source,
                         "type": "heartbeat", "time": "2027-01-01T00:00:00Z"}
            spool_file(spool, f"part-9999-{i}.jsonl", [json.dumps(heartbeat)],
                       time.time() + len(trace) + i / 10)
        query.processAllAvailable()
    finally:
        query.stop()
        shutil.rmtree(root, ignore_errors=True)
    counted = latencies[1:]
    return {"rate": sum(len(e) for e in trace[1:]) / sum(counted),
            "latency": [min(counted), max(counted)], "composites": produced}


def spark_alone(spark: Any, buckets: int, trace: list[list[Fields]]) -> dict[str, Any]:
    """Spark's own cost for the job's plan: the same spool source, JVM parse, shuffle into
    (profile, bucket) keys, watermark, event-time ``transformWithStateInPandas`` on RocksDB,
    the JVM's composite JSON and ``foreachBatch`` sink — with the Python reduced to a
    vectorised fan-out and a processor that only counts its rows."""
    import pandas as pd
    import pyspark.sql.functions as F
    from pyspark.sql.streaming.stateful_processor import StatefulProcessor

    from spark_jobs.job import OUT, ROUTED, composite_json, parse_lines
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
            yield frame.assign(profile="S", bucket=(frame["seq"] % buckets).astype("int32"),
                               ts=pd.Timestamp.now(tz="UTC"))[ROUTED_COLUMNS]

    root = tempfile.mkdtemp(prefix="evamed-bench-alone-")
    spool = os.path.join(root, "spool")
    os.makedirs(spool)
    composed = (parse_lines(spool_lines(spark, spool, 1)).mapInPandas(fan_out, ROUTED)
                .withWatermark("ts", "0 seconds").groupBy("profile", "bucket")
                .transformWithStateInPandas(statefulProcessor=Count(), outputStructType=OUT,
                                            outputMode="Append", timeMode="EventTime"))
    query = (composed.select("kind", F.coalesce("payload", composite_json()).alias("payload"))
             .writeStream.foreachBatch(lambda frame, _: frame.toPandas())
             .option("checkpointLocation", os.path.join(root, "ckpt")).start())
    seconds = []
    try:
        for k, events in enumerate(trace):
            spool_file(spool, f"part-{k:04d}.jsonl", [line(e) for e in events], time.time() + k)
            began = time.perf_counter()
            query.processAllAvailable()
            seconds.append(time.perf_counter() - began)
    finally:
        query.stop()
        shutil.rmtree(root, ignore_errors=True)
    return {"rate": sum(len(e) for e in trace[1:]) / sum(seconds[1:])}


def measure(args: argparse.Namespace, master: str) -> dict[str, Any]:
    """Every Spark run of one master (this process's SparkContext)."""
    from spark_jobs.session import build_session

    spark = build_session(master, f"evamed-bench-{master}")
    out: dict[str, Any] = {}
    for size in args.sizes:
        trace = batches(args.keys, size, args.batches)
        row = {"job": run(spark, "job", args.buckets, trace, args.per_source),
               "alone": spark_alone(spark, args.buckets, trace)}
        if not args.skip_naive and master == args.masters[-1]:
            # Naive: every key its own state (crc32 modulo 2^31 − 1 separates them).
            row["naive"] = run(spark, "naive", 2**31 - 1, trace[:2], args.per_source)
        out[str(size)] = row
    return out


# ------------------------------------------------------------------ in one process


def in_process(keys: int, size: int, count: int, per_source: bool) -> int:
    from eva.engine import Engine
    from eva.events import from_fields

    engine = Engine(config(per_source))
    engine.add_document(parse(PROFILES))
    engine.begin(ORIGIN)
    produced = seq = 0
    for events in batches(keys, size, count):
        for ident, source, kind, time_us, data in (
                e for part in arrivals(events, per_source) for e in part):
            produced += len(engine.push(from_fields(ident, source, kind, time_us, seq, data,
                                                    {"specversion": "1.0"})))
            seq += 1
    return produced + len(engine.close())


def python_work(keys: int, size: int, count: int, buckets: int,
                miss: float = 0.5) -> dict[str, float]:
    """The job's Python work per event (µs of this process's CPU time: other load on the
    machine does not count), on the same trace, through the
    job's own functions: fan-out (events from the JVM's columns, routing, the routed frame),
    engine (the key's rows to events, pushed), output (a composite as columns), state (each
    bucket's changed partitions and core written once per micro-batch, and for the share
    ``miss`` of calls that miss the worker's cache a lazy restore whose records are all read
    — at 10⁴ keys every partition is touched every micro-batch)."""
    import pandas as pd

    from eva.engine import Engine
    from eva.snapshot import restore_core, snapshot_core, take_changed
    from spark_jobs.job import fan_out
    from spark_jobs.processor import FIELDS, _evaluate, as_columns, rows_of

    root = tempfile.mkdtemp(prefix="evamed-bench-python-")
    table = os.path.join(root, "profiles.json")
    write_table(table, [Registration(PROFILES, ORIGIN)])
    job = StreamJob(table, EngineConfig().to_json(), buckets)
    doc = parse(PROFILES)
    engines = {}
    for group in range(buckets):
        engines[group] = Engine(EngineConfig())
        engines[group].add_document(doc)
        engines[group].begin(ORIGIN)
    stored: dict[int, dict[str, bytes]] = {group: {} for group in range(buckets)}
    spent = dict.fromkeys(("fan-out", "engine", "output", "state"), 0.0)
    seq = 0
    try:
        for k, events in enumerate(batches(keys, size, count)):
            frame = pd.DataFrame([(seq + i, *e, None, None) for i, e in enumerate(events)],
                                 columns=FIELDS)
            seq += len(events)
            clock = time.process_time()
            routed = fan_out(job, frame)
            rows = {int(group): rows_of(part) for group, part in routed.groupby("bucket")
                    if int(group) in engines}
            clock, before = time.process_time(), clock
            spent["fan-out"] += clock - before
            notes = []
            for group, taken in rows.items():
                notes += _evaluate(engines[group], [r for r in taken if r[0] >= 0], None,
                                   ORIGIN)[0]
            clock, before = time.process_time(), clock
            spent["engine"] += clock - before
            for note in notes:
                as_columns("S", note)
            clock, before = time.process_time(), clock
            spent["output"] += clock - before
            for group, engine in engines.items():
                for ident, record in take_changed(engine).items():
                    if record is None:
                        stored[group].pop(ident, None)
                    else:
                        stored[group][ident] = record
                core = snapshot_core(engine)
                if group < miss * buckets:
                    engines[group] = restore_core(core, stored[group].get)
                    engines[group].export_state()  # every record read
            spent["state"] += time.process_time() - clock
            if k == 0:  # like the job's, the first micro-batch warms up
                spent = dict.fromkeys(spent, 0.0)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return {part: seconds / (size * count) * 1e6 for part, seconds in spent.items()}


# ------------------------------------------------------------------ the table


def table(args: argparse.Namespace, results: dict[str, dict[str, Any]],
          expected: dict[int, int], work: dict[int, dict[str, float]]) -> str:
    lines = ["| events per micro-batch | master | the job (events/s) | micro-batch (s) | "
             "Spark alone (events/s) | job / Spark alone | naive (events/s) | job / naive |",
             "|---|---|---|---|---|---|---|---|"]
    for size in args.sizes:
        for master in args.masters:
            row = results[master][str(size)]
            job, alone, naive = row["job"], row["alone"], row.get("naive")
            assert job["composites"] == expected[size], (master, size, job, expected[size])
            assert naive is None or naive["composites"] == expected[-size], (size, naive)
            lines.append(
                f"| {size:,} | {master} | {job['rate']:,.0f} | {job['latency'][0]:.1f}–"
                f"{job['latency'][1]:.1f} | {alone['rate']:,.0f} | "
                f"{job['rate'] / alone['rate']:.0%} | "
                + (f"{naive['rate']:,.0f} | {job['rate'] / naive['rate']:.1f}× |" if naive
                   else "– | – |"))
    if len(args.masters) == 2:
        one, two = args.masters
        lines.append("")
        for size in args.sizes:
            faster = {run: results[two][str(size)][run]["rate"] / results[one][str(size)][run]["rate"]
                      for run in ("job", "alone")}
            lines.append(f"- scaling at {size:,}: the job on {two} does {faster['job']:.2f}× what "
                         f"it does on {one} (Spark alone {faster['alone']:.2f}×)")
    lines.append("")
    for size, parts in work.items():
        lines.append(f"- Python work per event at {size:,} per micro-batch (µs, one core): "
                     + ", ".join(f"{part} {us:.1f}" for part, us in parts.items())
                     + f" = **{sum(parts.values()):.1f}**")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--keys", type=int, default=10_000)
    parser.add_argument("--sizes", default="100000,250000")
    parser.add_argument("--batches", type=int, default=2, help="counted micro-batches per run")
    parser.add_argument("--buckets", type=int, default=16)
    parser.add_argument("--masters", default="local[1],local[2]")
    parser.add_argument("--skip-naive", action="store_true")
    parser.add_argument("--per-source", action="store_true")
    parser.add_argument("--worker", help=argparse.SUPPRESS)  # one master's runs, as JSON
    args = parser.parse_args()
    args.sizes = [int(s) for s in args.sizes.split(",")]
    args.masters = args.masters.split(",")
    if args.worker:
        print(json.dumps(measure(args, args.worker)))
        return
    shape = (f"a file per source per micro-batch, sources declared: {', '.join(SOURCES)}"
             if args.per_source else "one file per micro-batch, sources mixed, none declared")
    print(f"{args.batches} counted micro-batches (after one warm-up) per run, "
          f"{args.keys:,} partition keys, {args.buckets} buckets; {shape}", flush=True)
    results = {}
    for master in args.masters:  # one after the other: they share the machine's cores
        done = subprocess.run([sys.executable, __file__, *sys.argv[1:], "--worker", master],
                              capture_output=True, text=True, check=False)
        if done.returncode:
            sys.exit(f"the {master} runs failed:\n{done.stderr[-3000:]}")
        results[master] = json.loads(done.stdout.strip().splitlines()[-1])
        print(f"  {master}: {json.dumps(results[master])}", flush=True)
    expected = {size: in_process(args.keys, size, args.batches, args.per_source)
                for size in args.sizes}
    if not args.skip_naive:  # the naive runs count one micro-batch
        expected.update({-size: in_process(args.keys, size, 1, args.per_source)
                         for size in args.sizes})
    work = {size: python_work(args.keys, size, args.batches, args.buckets)
            for size in args.sizes}
    print(table(args, results, expected, work))


if __name__ == "__main__":
    main()
