"""The streaming composition job on local[2]: a cross-source sequence with many partition keys,
one engine per profile × bucket (the job) against one state per partition key (naive: every
key its own bucket), side by side on the same input. Prints events/s and micro-batch latency.

    .venv/bin/python benchmarks/spark.py [--keys 10000] [--batch 50000] [--batches 4]
        [--buckets 16] [--skip-naive]
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

from mediator.eva.engine import EngineConfig
from spark_jobs.session import build_session
from spark_jobs.streaming import (
    Registration,
    StreamJob,
    config_tuple,
    spool_file,
    start,
    write_table,
)

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


def run(spark: Any, label: str, buckets: int, keys: int, batch: int, batches: int) -> int:
    root = tempfile.mkdtemp(prefix=f"evamed-bench-{label}-")
    spool = os.path.join(root, "spool")
    os.makedirs(spool)
    table = os.path.join(root, "profiles.json")
    origin = 1_772_000_000_000_000
    write_table(table, [Registration(PROFILES, origin)])
    job = StreamJob(table, config_tuple(EngineConfig()), buckets)
    produced = 0

    def sink(batch_id: int, rows: list[Any]) -> None:
        nonlocal produced
        produced += sum(1 for r in rows if r.kind == "composite")

    rng = random.Random(7)
    query = start(spark, job, spool, os.path.join(root, "ckpt"), sink, max_files=1)
    latencies = []
    total = 0
    try:
        for k in range(batches + 1):  # the first batch warms the Python workers up
            lines = batch_lines(rng, origin + 1 + k * batch * 200, batch, keys, k * batch)
            # The file source takes files in modification order.
            spool_file(spool, f"part-{k:04d}.jsonl", lines, time.time() + k)
            began = time.perf_counter()
            query.processAllAvailable()
            if k:
                latencies.append(time.perf_counter() - began)
                total += batch
        # A heartbeat no profile wants moves the watermark past the last events.
        heartbeat = {"specversion": "1.0", "id": "heartbeat", "source": "bench",
                     "type": "heartbeat", "time": "2027-01-01T00:00:00Z"}
        spool_file(spool, "part-9999.jsonl", [json.dumps(heartbeat)], time.time() + batches + 1)
        query.processAllAvailable()
    finally:
        query.stop()
        shutil.rmtree(root, ignore_errors=True)
    seconds = sum(latencies)
    print(f"  {label:8} buckets={buckets:>13,}  {total / seconds:>8,.0f} events/s  "
          f"micro-batch {min(latencies):5.2f}–{max(latencies):5.2f} s  ({produced:,} composites)")
    return produced


def in_process(keys: int, batch: int, batches: int) -> int:
    from mediator.eva.engine import Engine
    from mediator.eva.events import from_json_line
    from mediator.eva.parser import parse

    rng = random.Random(7)
    origin = 1_772_000_000_000_000
    engine = Engine(EngineConfig())
    engine.add_document(parse(PROFILES))
    engine.begin(origin)
    count = seq = 0
    for k in range(batches + 1):
        for line in batch_lines(rng, origin + 1 + k * batch * 200, batch, keys, k * batch):
            count += len(engine.push(from_json_line(line, seq)))
            seq += 1
    return count + len(engine.close())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--keys", type=int, default=10_000)
    parser.add_argument("--batch", type=int, default=50_000)
    parser.add_argument("--batches", type=int, default=4)
    parser.add_argument("--buckets", type=int, default=16)
    parser.add_argument("--skip-naive", action="store_true")
    args = parser.parse_args()
    spark = build_session()
    print(f"{args.batches} micro-batches of {args.batch:,} events, {args.keys:,} partition keys, "
          "local[2]")
    expected = in_process(args.keys, args.batch, args.batches)
    bucketed = run(spark, "bucketed", args.buckets, args.keys, args.batch, args.batches)
    print(f"  in-process engine: {expected:,} composites")
    assert bucketed == expected > 0, "the job must report the engine's composites"
    if not args.skip_naive:
        # Naive: every key its own state (crc32 modulo 2^31 − 1 separates them, bar collisions).
        naive = run(spark, "naive", 2**31 - 1, args.keys, args.batch, args.batches)
        assert naive == expected, "the naive job must report the engine's composites"


if __name__ == "__main__":
    main()
