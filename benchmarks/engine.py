"""Engine throughput on one core — engine only, events built beforehand (issues 2, 12, 17).

Every figure here is the engine's push loop over ``Event`` objects made before the clock starts:
no JSON is read or written. End to end (JSON lines in, composites out, through the code
``evamed replay`` runs) is ``benchmarks/replay.py``. Each row is the median, with the minimum
and maximum, of ``--repeat`` runs (``12,345 (11,900–12,800)``); the collector is paused during
the event loop (its pauses are not the engine's cost), not during registration.

* Workloads: ``((all_dup(A); all_dup(B))_<span>)_<pairs>`` over 10⁶ events, types A/B/C
  uniform, one per second, with 1, 100 and 10,000 registered profiles, the others of the same
  shape on their own event types, which the stream never carries. The 4 s rows give the
  composites Flink CEP's ``within(Time.seconds(5))`` gives (it excludes a pair exactly 5 s
  apart; EVA's frame includes it).
* Many subscribers on the *same* types (issue 17): the measured profile plus 99 or 9,999
  profiles on types A and B whose data filter no event passes — equality
  (``data.customer == "c17"``), two fields (… ``and data.area in ["n17", "s17"]``), ``in``
  alone, a range (``data.price > 1017``) — over events that carry a customer, an area and a
  price. The predicate index decides them by look-up (docs/semantics.md, "Matching").
* A nested profile (depth 3), a ``per`` profile over 10⁴ keys against the same profile
  unpartitioned, snapshot + restore of 10⁴ partitions, and registering 10⁵ profiles (the
  document built beforehand, as the events are) with the memory it takes.

    python benchmarks/engine.py [--events 1000000] [--profiles 1,100,10000] [--repeat 3]
                                [--only per|same-types|register] [--no-index]
"""

from __future__ import annotations

import argparse
import gc
import random
import resource
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from anywhere
from eva import ast, classes, native
from eva.engine import Engine, EngineConfig
from eva.events import Event
from eva.parser import parse
from eva.snapshot import restore, snapshot

WORKLOADS = [
    ("seq 4s all_pairs (= Flink within 5s)", "4s", "all_pairs"),
    ("seq 5s unique_pairs", "5s", "unique_pairs"),
    ("seq 5s all_pairs", "5s", "all_pairs"),
    ("seq 500s unique_pairs", "500s", "unique_pairs"),
    ("seq 500s all_pairs", "500s", "all_pairs"),
]
FILTERS = {
    "equality": 'data.customer == "c{i}"',
    "two fields": 'data.customer == "c{i}" and data.area in ["n{i}", "s{i}"]',
    "in": 'data.area in ["n{i}", "s{i}", "w{i}"]',
    "range": "data.price > {bound}",
}
NESTED = ("((all_dup(((all_dup(((first_dup(A); all_dup(B))_5s)_unique_pairs), last_dup(C))_5s)"
          "_unique_pairs); all_dup(B))_10s)_all_pairs")
"""A depth-3 profile: a sequence of a conjunction of a sequence."""


def trace(n: int, seed: int = 1) -> list[Event]:
    rng = random.Random(seed)
    return [Event(f"e{i}", "bench", rng.choice("ABC"), i * 1_000_000, i) for i in range(n)]


def data_trace(n: int, seed: int = 1) -> list[Event]:
    """``trace`` with a customer, an area and a price no filter of ``FILTERS`` admits."""
    rng = random.Random(seed)
    return [Event(f"e{i}", "bench", rng.choice("ABC"), i * 1_000_000, i,
                  {"customer": f"u{rng.randrange(10_000)}", "area": f"z{rng.randrange(50)}",
                   "price": rng.randrange(1000)}) for i in range(n)]


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
    return f"{statistics.median(ordered):,.0f} ({ordered[0]:,.0f}–{ordered[-1]:,.0f})"


def timed(step: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    step()
    return time.perf_counter() - t0


class Row:
    """Runs of one document over one trace: events/s of each, composites, peak stored state,
    registration seconds of each."""

    def __init__(self, events: list[Event], doc: ast.Document, repeat: int = 0) -> None:
        self.events, self.doc = events, doc
        self.rates: list[float] = []
        self.registers: list[float] = []
        self.composites = self.peak = 0
        for _ in range(repeat):
            self.run()

    def run(self) -> None:
        engine = Engine()
        t0 = time.perf_counter()
        engine.add_document(self.doc)
        self.registers.append(time.perf_counter() - t0)
        composites = 0
        gc.disable()  # the collector's pauses are not the engine's cost
        t0 = time.perf_counter()
        push = engine.push
        for event in self.events:
            composites += len(push(event))
        composites += len(engine.close())
        self.rates.append(len(self.events) / (time.perf_counter() - t0))
        gc.enable()
        self.composites, self.peak = composites, engine.peak_stored()

    def rate(self) -> float:
        return statistics.median(self.rates)


def parsed(text: str) -> tuple[ast.Document, float]:
    t0 = time.perf_counter()
    doc = parse(text)
    return doc, time.perf_counter() - t0


def document(span: str, pairs: str, profiles: int) -> str:
    lines = ['class A = type == "A"', 'class B = type == "B"',
             f"profile P0 = ((all_dup(A); all_dup(B))_{span})_{pairs}"]
    for i in range(1, profiles):
        lines += [f'class X{i} = type == "X{i}"', f'class Y{i} = type == "Y{i}"',
                  f"profile P{i} = ((all_dup(X{i}); all_dup(Y{i}))_{span})_{pairs}"]
    return "\n".join(lines) + "\n"


def same_types_document(kind: str, profiles: int) -> str:
    """P0 plus profiles on types A and B whose filter of kind ``kind`` no event passes."""
    lines = ['class A = type == "A"', 'class B = type == "B"',
             "profile P0 = ((all_dup(A); all_dup(B))_5s)_unique_pairs"]
    for i in range(1, profiles):
        test = FILTERS[kind].format(i=i, bound=1000 + i)
        lines += [f'class X{i} = type == "A" and {test}', f'class Y{i} = type == "B" and {test}',
                  f"profile P{i} = ((all_dup(X{i}); all_dup(Y{i}))_5s)_unique_pairs"]
    return "\n".join(lines) + "\n"


def workload_rows(n: int, counts: list[int], repeat: int) -> None:
    events = trace(n)
    print(f"\n{n:,} events, types A/B/C uniform, one per second; the other profiles on types "
          f"the stream never carries; median (min–max) of {repeat}:\n")
    print("| workload | profiles | events/s | composites | peak stored | parse s | register s |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for label, span, pairs in WORKLOADS:
        for count in counts:
            doc, parsing = parsed(document(span, pairs, count))
            row = Row(events, doc, repeat)
            print(f"| {label} | {count:,} | {spread(row.rates)} | {row.composites:,} "
                  f"| {row.peak:,} | {parsing:.1f} | {statistics.median(row.registers):.1f} |",
                  flush=True)
    doc, _ = parsed(f'class A = type == "A"\nclass B = type == "B"\nclass C = type == "C"\n'
                    f"profile P0 = {NESTED}\n")
    row = Row(events, doc, repeat)
    assert ast.depth(doc.profiles[0].expr) == 3
    print(f"| nested, depth 3: `{NESTED}` | 1 | {spread(row.rates)} | {row.composites:,} "
          f"| {row.peak:,} | | |", flush=True)
    print("\nstate as the trace grows (seq 5s all_pairs, one profile):\n")
    print("| events | peak stored |")
    print("|---:|---:|")
    doc, _ = parsed(document("5s", "all_pairs", 1))
    for size in sorted({min(size, n) for size in (10_000, 100_000, n)}):
        print(f"| {size:,} | {Row(events[:size], doc, 1).peak:,} |", flush=True)


def same_type_rows(n: int, counts: list[int], repeat: int) -> None:
    """Issue 17: the extra profiles on the measured profile's own types, with data filters."""
    events = data_trace(n)
    print(f"\nMany subscribers on the same types: {n:,} events (A/B/C, each with a customer, an "
          f"area and a price), `P0 = ((all_dup(A); all_dup(B))_5s)_unique_pairs` plus profiles "
          f"on A and B whose filter no event passes; median (min–max) of {repeat}:\n")
    print("The one-profile run alternates with each row's runs, so that the ratio compares "
          "runs on the machine as loaded at the time.\n")
    print("| filter of the others | profiles | events/s | one profile, alternated | ratio "
          "| composites | parse s | register s |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    one_doc, _ = parsed(same_types_document("equality", 1))
    for kind in FILTERS:
        for count in counts:
            if count == 1:
                continue
            doc, parsing = parsed(same_types_document(kind, count))
            one, row = Row(events, one_doc), Row(events, doc)
            for _ in range(repeat):
                one.run()
                row.run()
            assert row.composites == one.composites  # the others never match
            print(f"| {kind} | {count:,} | {spread(row.rates)} | {spread(one.rates)} "
                  f"| {row.rate() / one.rate():.0%} | {row.composites:,} | {parsing:.1f} "
                  f"| {statistics.median(row.registers):.1f} |", flush=True)


def per_rows(n: int, repeat: int) -> None:
    """Events/s per key against unpartitioned; snapshot + restore of many partitions."""
    events = keyed_trace(n)
    print(f"\n`per` ({KEYS:,} keys, {n:,} events, `{PER_PROFILE}`), median (min–max) of "
          f"{repeat}:\n")
    print("| profile | events/s | composites |")
    print("|---|---:|---:|")
    for label_, per in (("per data.key", True), ("unpartitioned", False)):
        row = Row(events, parse(per_document(per)), repeat)
        print(f"| {label_} | {spread(row.rates)} | {row.composites:,} |", flush=True)
    # One A per key, no sweep: every partition holds its A when the snapshot is taken.
    engine = Engine(EngineConfig(sweep=0))
    engine.add_document(parse(per_document(True)))
    for i in range(KEYS):
        engine.push(Event(f"s{i}", "bench", "A", i * 1000, i, {"key": f"k{i}"}))
    writes, reads = [], []
    data = b""
    for _ in range(repeat):
        t0 = time.perf_counter()
        data = snapshot(engine)
        writes.append((time.perf_counter() - t0) * 1000)
        t0 = time.perf_counter()
        restore(data)
        reads.append((time.perf_counter() - t0) * 1000)
    print(f"\nsnapshot of {KEYS:,} partitions ({engine.stored():,} stored, {len(data):,} bytes): "
          f"snapshot {spread(writes)} ms, restore {spread(reads)} ms\n")


def peak_rss_mib() -> float:
    """This process's peak resident memory so far (Linux: KiB), MiB."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def register_rows(count: int, n: int) -> None:
    """Registering ``count`` profiles with equality filters on types A and B (the document
    built beforehand), the first event of each type (which builds its plan), the memory the
    engine takes, and events/s with them all."""
    a, b = ast.Compare("type", "==", "A"), ast.Compare("type", "==", "B")
    defs = [ast.ClassDef("A", a), ast.ClassDef("B", b)]
    profiles = []
    for i in range(count):
        left, right = ("A", "B") if i == 0 else (f"X{i}", f"Y{i}")
        if i:
            test = ast.Compare("data.customer", "==", f"c{i}")
            defs += [ast.ClassDef(left, ast.And(a, test)), ast.ClassDef(right, ast.And(b, test))]
        profiles.append(ast.Profile(f"P{i}", ast.Sequence(
            ast.Operand(ast.ALL, ast.Prim(left)), ast.Operand(ast.ALL, ast.Prim(right)),
            5_000_000, ast.Pairs.UNIQUE)))
    doc = ast.Document(tuple(defs), tuple(profiles))
    events = data_trace(n)
    gc.collect()
    before = peak_rss_mib()
    engine = Engine()
    register = timed(lambda: engine.add_document(doc))
    first = timed(lambda: [engine.push(e) for e in events[:10]])  # A, B and C among them
    memory = peak_rss_mib() - before
    gc.disable()
    loop = timed(lambda: [engine.push(e) for e in events[10:]])
    gc.enable()
    print(f"\nregistering {count:,} profiles ({2 * count - 2:,} equality-filter classes on "
          f"types A and B): {register:.1f} s, the first events (building each type's plan) "
          f"{first:.1f} s, engine memory {memory:,.0f} MiB (peak RSS growth; "
          f"{memory * 2**20 / count:,.0f} B a profile); then {(n - 10) / loop:,.0f} events/s\n", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--profiles", default="1,100,10000")
    parser.add_argument("--repeat", type=int, default=3, help="runs per row (median, min–max)")
    parser.add_argument("--per-events", type=int, default=200_000,
                        help="events of the per rows (default 200,000)")
    parser.add_argument("--register", type=int, default=100_000,
                        help="profiles of the registration row (default 100,000)")
    parser.add_argument("--only", choices=["per", "same-types", "register"],
                        help="run only those rows")
    parser.add_argument("--no-index", action="store_true",
                        help="evaluate every candidate predicate one by one (no predicate index)")
    args = parser.parse_args()
    classes.INDEXED = not args.no_index
    compiled = ", ".join(native.compiled()) or "none (pure Python)"
    print("Engine only, events built beforehand (end to end: benchmarks/replay.py)")
    print(f"compiled: {compiled}; predicate index: {'on' if classes.INDEXED else 'off'}")
    counts = [int(c) for c in args.profiles.split(",")]
    if args.only in (None, "per"):
        per_rows(args.per_events, args.repeat)
    if args.only in (None, "same-types"):
        same_type_rows(args.events, counts, args.repeat)
    if args.only in (None, "register"):
        register_rows(args.register, min(args.events, 100_000))
    if args.only is None:
        workload_rows(args.events, counts, args.repeat)


if __name__ == "__main__":
    main()
