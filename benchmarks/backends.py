"""Base services: native evaluation speed per language, the --via path against plain replay,
and events/s through a gRPC base service. Prints a table; numbers go to docs/performance.md.

    .venv/bin/python benchmarks/backends.py [--events 20000]
"""

from __future__ import annotations

import argparse
import json
import random
import threading
import time
from pathlib import Path

from adapters.backends.native import run
from adapters.backends.registry import language
from adapters.backends.service import serve
from adapters.client import BaseClient
from adapters.federation import via
from eva.events import Event, from_cloudevent
from eva.parser import parse
from eva.reference import evaluate
from examples.logistics.generate import day

QUERIES = {
    "cg1": 'OR([type = "a" & data.k = 1], [type = "b"])',
    "cg2": "a ; b CONTEXT recent",
    "cg3": ("SELECT x.id, y.id FROM a AS x JOIN b AS y ON y.time > x.time "
            "AND y.time <= x.time + INTERVAL '5' SECOND"),
    "cg4": "andthen[a, b] within 5s",
    "cg5": ('class A = type == "a"\nclass B = type == "b"\n'
            "profile S = ((all_dup(A); all_dup(B))_5s)_all_pairs\n"),
}


def stream(n: int, seed: int = 1) -> list[Event]:
    rng = random.Random(seed)
    return [Event(f"e{i}", "bench", rng.choice("abc"), (i + 1) * 1_000_000, i,
                  {"k": rng.randint(1, 3)}) for i in range(n)]


def best_of(runs: int, work: object) -> float:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        work()  # type: ignore[operator]
        times.append(time.perf_counter() - start)
    return min(times)


def native_speed(n: int) -> None:
    events = stream(n)
    print(f"native evaluation, {n:,} events (a/b/c uniform, one per second), best of 3")
    print(f"  {'group':6} {'events/s':>10} {'detections':>11}  query")
    for group, text in QUERIES.items():
        query = language(group).parse(text)
        count = len(run(query, events))
        seconds = best_of(3, lambda query=query: run(query, events))
        print(f"  {group:6} {n / seconds:>10,.0f} {count:>11,}  {text.splitlines()[-1][:60]}")


def via_overhead() -> None:
    doc = parse(Path("examples/logistics/profiles.eva").read_text())
    trace = [from_cloudevent(e, i) for i, e in enumerate(day(7))]
    plain = best_of(3, lambda: evaluate(doc, trace))
    print(f"\n--via on the logistics day ({len(trace)} events, P1–P7), best of 3")
    print(f"  {'path':8} {'ms':>8}")
    print(f"  {'plain':8} {plain * 1000:>8.1f}  (reference evaluator)")
    for group in ("cg0", "cg1", "cg2", "cg3", "cg4", "cg5"):
        seconds = best_of(3, lambda group=group: via(language(group), doc, trace))
        print(f"  {group:8} {seconds * 1000:>8.1f}")


def grpc_throughput(n: int) -> None:
    running = serve("cg3", "127.0.0.1:0")
    events = stream(n, seed=2)
    try:
        with BaseClient(f"127.0.0.1:{running.port}") as client:
            client.wait_ready()
            calls = client.subscribe(QUERIES["cg3"], "bench")
            assert next(calls).ready
            received: list[int] = []
            reader = threading.Thread(target=lambda: received.extend(1 for _ in calls))
            reader.start()
            start = time.perf_counter()
            client.publish(events)
            client.unsubscribe("bench")
            reader.join()
            seconds = time.perf_counter() - start
        print(f"\ngRPC: {n:,} events published to a cg3 service with one subscription: "
              f"{n / seconds:,.0f} events/s, {len(received):,} notifications streamed back")
    finally:
        running.server.stop(grace=0).wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--events", type=int, default=20_000)
    args = parser.parse_args()
    native_speed(args.events)
    via_overhead()
    grpc_throughput(args.events // 4)
    print(json.dumps({"done": True}))


if __name__ == "__main__":
    main()
