"""Batch replay on Spark against the in-process engine: a per-key sequence over many keys.

    .venv/bin/python benchmarks/spark_batch.py [--events 100000] [--keys 10000]

Prints wall-clock seconds (best of 2 after a warm-up) and checks the answers are equal.
"""

from __future__ import annotations

import argparse
import json
import random
import time

from eva.engine import Engine, EngineConfig
from eva.events import Event
from eva.notify import to_cloudevent
from eva.parser import parse
from spark_jobs.batch import replay
from spark_jobs.session import build_session

PROFILES = ('class A = type == "a"\nclass B = type == "b"\n'
            "profile S per data.key = ((all_dup(A); all_dup(B))_5s)_all_pairs\n")


def trace(n: int, keys: int) -> list[Event]:
    rng = random.Random(3)
    return [Event(f"e{i}", "bench", rng.choice("ab"), (i + 1) * 100_000, i,
                  {"key": rng.randrange(keys)}) for i in range(n)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--keys", type=int, default=10_000)
    args = parser.parse_args()
    events = trace(args.events, args.keys)
    config = EngineConfig()
    start = time.perf_counter()
    engine = Engine(config)
    engine.add_document(parse(PROFILES))
    want = [json.dumps(to_cloudevent(n)) for e in events for n in engine.push(e)]
    want += [json.dumps(to_cloudevent(n)) for n in engine.close()]
    local = time.perf_counter() - start
    spark = build_session()
    origin, end = events[0].time - 1, events[-1].time
    replay(spark, PROFILES, events[:1000], config=config, origin=origin, end=end)  # warm-up
    times = []
    for _ in range(2):
        start = time.perf_counter()
        got = replay(spark, PROFILES, events, config=config, origin=origin, end=end)
        times.append(time.perf_counter() - start)
    assert got == want
    print(f"{args.events:,} events, {args.keys:,} keys, {len(want):,} composites (equal)")
    print(f"  in-process engine: {local:6.2f} s  {args.events / local:>9,.0f} events/s")
    print(f"  Spark local[2]:    {min(times):6.2f} s  {args.events / min(times):>9,.0f} events/s")


if __name__ == "__main__":
    main()
