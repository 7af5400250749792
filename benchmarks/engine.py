"""Engine throughput on one core (issue 2): events/s, composites, peak stored state.

Workloads: ((all_dup(A); all_dup(B))_5s) with unique_pairs and all_pairs, and the same with a
500 s window, over pre-generated events (types A/B/C uniform, one per second). Each is run with
1, 100 and 10,000 registered profiles: the measured one plus others of the same shape on their
own event types, which the stream never carries — with type-indexed matching the cost per
event must not grow with them. Prints a markdown table (docs/performance.md keeps the figures).

The ``per`` rows (issue 12): ``((all_dup(A); all_dup(B))_5s)_all_pairs per data.key`` over 10⁴
keys against the same profile unpartitioned, on the same events (each carries a random key), and
the time to snapshot and restore an engine holding 10⁴ partitions (each with an A stored).
Medians of ``--repeat`` runs with their range.

    python benchmarks/engine.py [--events 1000000] [--profiles 1,100,10000] [--only per]
"""

from __future__ import annotations

import argparse
import gc
import random
import time

from eva import native
from eva.engine import Engine, EngineConfig
from eva.events import Event
from eva.parser import parse
from eva.snapshot import restore, snapshot

WORKLOADS = [
    ("seq 5s unique_pairs", "5s", "unique_pairs"),
    ("seq 5s all_pairs", "5s", "all_pairs"),
    ("seq 500s unique_pairs", "500s", "unique_pairs"),
    ("seq 500s all_pairs", "500s", "all_pairs"),
]


def trace(n: int, seed: int = 1) -> list[Event]:
    rng = random.Random(seed)
    return [Event(f"e{i}", "bench", rng.choice("ABC"), i * 1_000_000, i) for i in range(n)]


KEYS = 10_000
PER_PROFILE = "((all_dup(A); all_dup(B))_5s)_all_pairs"


def keyed_trace(n: int, seed: int = 1) -> list[Event]:
    """``trace`` with a ``data.key`` drawn from ``KEYS`` keys."""
    rng = random.Random(seed)
    return [Event(f"e{i}", "bench", rng.choice("ABC"), i * 1_000_000, i,
                  {"key": f"k{rng.randrange(KEYS)}"}) for i in range(n)]


def per_document(per: bool) -> str:
    head = "profile P0 per data.key" if per else "profile P0"
    return f'class A = type == "A"\nclass B = type == "B"\n{head} = {PER_PROFILE}\n'


def spread(samples: list[float]) -> str:
    """Median and range, e.g. ``12,345 (11,900–12,800)``."""
    ordered = sorted(samples)
    mid = ordered[len(ordered) // 2]
    return f"{mid:,.0f} ({ordered[0]:,.0f}–{ordered[-1]:,.0f})"


def per_rows(n: int, repeat: int) -> None:
    """Events/s per key against unpartitioned; snapshot + restore of many partitions."""
    events = keyed_trace(n)
    print(f"\n`per` ({KEYS:,} keys, {n:,} events, `{PER_PROFILE}`), median (range) of "
          f"{repeat}:\n")
    print("| profile | events/s | composites |")
    print("|---|---:|---:|")
    for label_, per in (("per data.key", True), ("unpartitioned", False)):
        doc = parse(per_document(per))
        rates = []
        composites = 0
        for _ in range(repeat):
            engine = Engine()
            engine.add_document(doc)
            composites = 0
            gc.disable()
            t0 = time.perf_counter()
            push = engine.push
            for event in events:
                composites += len(push(event))
            composites += len(engine.close())
            rates.append(n / (time.perf_counter() - t0))
            gc.enable()
        print(f"| {label_} | {spread(rates)} | {composites:,} |", flush=True)
    # One A per key, no sweep: every partition holds its A when the snapshot is taken.
    engine = Engine(EngineConfig(sweep=0))
    engine.add_document(parse(per_document(True)))
    for i in range(KEYS):
        engine.push(Event(f"s{i}", "bench", "A", i * 1000, i, {"key": f"k{i}"}))
    writes, reads = [], []
    size = 0
    for _ in range(repeat):
        t0 = time.perf_counter()
        data = snapshot(engine)
        writes.append((time.perf_counter() - t0) * 1000)
        t0 = time.perf_counter()
        restore(data)
        reads.append((time.perf_counter() - t0) * 1000)
        size = len(data)
    print(f"\nsnapshot of {KEYS:,} partitions ({engine.stored():,} stored, {size:,} bytes): "
          f"snapshot {spread(writes)} ms, restore {spread(reads)} ms\n")


def document(span: str, pairs: str, profiles: int) -> str:
    lines = ['class A = type == "A"', 'class B = type == "B"',
             f"profile P0 = ((all_dup(A); all_dup(B))_{span})_{pairs}"]
    for i in range(1, profiles):
        lines += [f'class X{i} = type == "X{i}"', f'class Y{i} = type == "Y{i}"',
                  f"profile P{i} = ((all_dup(X{i}); all_dup(Y{i}))_{span})_{pairs}"]
    return "\n".join(lines) + "\n"


def run(events: list[Event], text: str, repeat: int = 1) -> tuple[float, int, int, float, float]:
    """(events/s, composites, peak stored, parse s, register s), best of ``repeat`` runs of the
    event loop — the machine's noise only ever slows a run down."""
    t0 = time.perf_counter()
    doc = parse(text)
    parsing = time.perf_counter() - t0
    best: tuple[float, int, int, float] | None = None
    for _ in range(repeat):
        t0 = time.perf_counter()
        engine = Engine()
        engine.add_document(doc)
        register = time.perf_counter() - t0
        composites = 0
        gc.disable()  # the collector's pauses are not the engine's cost
        t0 = time.perf_counter()
        push = engine.push
        for event in events:
            composites += len(push(event))
        composites += len(engine.close())
        elapsed = time.perf_counter() - t0
        gc.enable()
        result = (len(events) / elapsed, composites, engine.peak_stored(), register)
        if best is None or result[0] > best[0]:
            best = result
    assert best is not None
    return best[0], best[1], best[2], parsing, best[3]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--profiles", default="1,100,10000")
    parser.add_argument("--repeat", type=int, default=3, help="best of N runs per row")
    parser.add_argument("--per-events", type=int, default=200_000,
                        help="events of the per rows (default 200,000)")
    parser.add_argument("--only", choices=["per"], help="run only the per rows")
    args = parser.parse_args()
    compiled = ", ".join(native.compiled()) or "none (pure Python)"
    print(f"compiled: {compiled}")
    per_rows(args.per_events, args.repeat)
    if args.only == "per":
        return
    counts = [int(c) for c in args.profiles.split(",")]
    events = trace(args.events)
    print(f"{args.events:,} events, types A/B/C uniform, one per second\n")
    print("| workload | profiles | events/s | composites | peak stored | parse s | register s |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for label, span, pairs in WORKLOADS:
        for count in counts:
            rate, composites, peak, parsing, register = run(
                events, document(span, pairs, count), args.repeat)
            print(f"| {label} | {count:,} | {rate:,.0f} | {composites:,} | {peak:,} "
                  f"| {parsing:.1f} | {register:.1f} |", flush=True)
    print("\nstate as the trace grows (seq 5s all_pairs):\n")
    print("| events | peak stored |")
    print("|---:|---:|")
    for n in (10_000, 100_000, args.events):
        print(f"| {n:,} | {run(events[:n], document('5s', 'all_pairs', 1))[2]:,} |", flush=True)


if __name__ == "__main__":
    main()
