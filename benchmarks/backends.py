"""Base services: native evaluation speed per language, the --via path against plain replay,
and events/s through a gRPC base service, each the median (min–max) of --repeat runs after a
warm-up run (the first run of a service pays for connecting, starting its streams and the
first parses: it measured about half the rate of the next ones). Prints a table; numbers go
to docs/performance.md.

    .venv/bin/python benchmarks/backends.py [--events 20000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import functools
import json
import random
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # examples/ is not installed

from adapters.backends.native import run
from adapters.backends.registry import language
from adapters.backends.service import serve
from adapters.client import BaseClient
from adapters.federation import via
from benchmarks.engine import spread
from benchmarks.replay import decimals
from eva.ast import Document
from eva.events import Event, from_cloudevent
from eva.parser import parse
from eva.reference import evaluate
from examples.logistics.generate import day

ROOT = Path(__file__).resolve().parents[1]

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


def timed(runs: int, work: Callable[[], object]) -> list[float]:
    """Seconds of ``runs`` calls of ``work``, after one that is not counted."""
    work()
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        work()
        times.append(time.perf_counter() - start)
    return times


def native_speed(n: int, repeat: int) -> None:
    events = stream(n)
    print(f"native evaluation, {n:,} events (a/b/c uniform, one per second), median (min–max) "
          f"of {repeat}")
    print(f"  {'group':6} {'events/s':>28} {'detections':>11}  query")
    for group, text in QUERIES.items():
        query = language(group).parse(text)
        count = len(run(query, events))
        rates = [n / t for t in timed(repeat, functools.partial(run, query, events))]
        print(f"  {group:6} {spread(rates):>28} {count:>11,}  {text.splitlines()[-1][:60]}")


def via_overhead(repeat: int) -> None:
    doc = parse((ROOT / "examples" / "logistics" / "profiles.eva").read_text())
    trace = [from_cloudevent(e, i) for i, e in enumerate(day(7))]
    print(f"\n--via on the logistics day ({len(trace)} events, P1–P7), median (min–max) of "
          f"{repeat}")
    print(f"  {'path':8} {'ms':>22}")
    plain = timed(repeat, lambda: evaluate(doc, trace))
    print(f"  {'plain':8} {decimals([t * 1000 for t in plain]):>22}  (reference evaluator)")
    for group in ("cg0", "cg1", "cg2", "cg3", "cg4", "cg5"):
        times = timed(repeat, functools.partial(via_group, group, doc, trace))
        print(f"  {group:8} {decimals([t * 1000 for t in times]):>22}")


def via_group(group: str, doc: Document, trace: list[Event]) -> object:
    return via(language(group), doc, trace)


def grpc_throughput(n: int, repeat: int) -> None:
    """Events published to a cg3 service with one (unpacked) subscription, until the last
    notification is back."""
    running = serve("cg3", "127.0.0.1:0")
    events = stream(n, seed=2)
    received: list[int] = []
    try:
        with BaseClient(f"127.0.0.1:{running.port}") as client:
            client.wait_ready()

            def publish() -> None:
                received.clear()
                calls = client.subscribe(QUERIES["cg3"], "bench")
                assert next(calls).ready
                reader = threading.Thread(target=lambda: received.extend(1 for _ in calls))
                reader.start()
                client.publish(events)
                client.unsubscribe("bench")
                reader.join()

            rates = [n / t for t in timed(repeat, publish)]
        print(f"\ngRPC: {n:,} events published to a cg3 service with one subscription, "
              f"median (min–max) of {repeat}: {spread(rates)} events/s, {len(received):,} "
              "notifications streamed back (one message each)")
    finally:
        running.server.stop(grace=0).wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--events", type=int, default=20_000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    native_speed(args.events, args.repeat)
    via_overhead(args.repeat)
    grpc_throughput(args.events // 4, args.repeat)
    print(json.dumps({"done": True}))


if __name__ == "__main__":
    main()
