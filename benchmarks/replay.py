"""End to end as a user runs it: `evamed replay` over CloudEvents JSON lines, composites out.

Events of types A/B/C, one per second, each with a ``data.key`` of 10⁴ keys (benchmarks/engine.py's
``keyed_trace``), written as a JSON-lines file; then `python -m mediator replay` timed as a
subprocess (start-up, parsing, reading, admission, engine, composite output to a file) for each
profile: median (min–max) of ``--repeat`` runs, wall and CPU time (the CPU time is what a
loaded machine hardly moves). Then where the time of one row goes, in process, through the
functions `replay` runs: reading the lines (``events.read_lines``), the engine's pushes over the
decoded events, writing the composites (``notify.composite_line``). Run it with another
checkout on PYTHONPATH to compare versions: the command line is the only interface the table
uses.

    .venv/bin/python benchmarks/replay.py [--events 200000] [--repeat 5] [--split "seq 5s all_pairs"]
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from anywhere
from benchmarks.engine import PER_PROFILE, keyed_trace, spread

CLASSES = 'class A = type == "A"\nclass B = type == "B"\nclass Z = type == "Z"\n'
PROFILES = {
    "seq 5s all_pairs": f"profile P0 = {PER_PROFILE}\n",
    "per data.key (10⁴ keys)": f"profile P0 per data.key = {PER_PROFILE}\n",
    "seq 500s unique_pairs": "profile P0 = ((all_dup(A); all_dup(B))_500s)_unique_pairs\n",
    "no match (type Z)": "profile P0 = ((all_dup(Z); all_dup(B))_5s)_all_pairs\n",
}


def write_events(path: Path, n: int) -> None:
    with path.open("wb") as out:
        for e in keyed_trace(n):
            stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ",
                                  time.gmtime(1_767_225_600 + e.time // 1_000_000))
            out.write(orjson.dumps({"specversion": "1.0", "id": e.id, "source": e.source,
                                    "type": e.type, "time": stamp, "data": e.data}) + b"\n")


def decimals(samples: list[float]) -> str:
    """Median and range with two decimals, e.g. ``1.23 (1.20–1.31)``."""
    return (f"{statistics.median(samples):.2f} ({min(samples):.2f}–{max(samples):.2f})")


def run(profiles: Path, events: Path, out: Path) -> tuple[float, float]:
    """(wall, CPU) seconds of one `python -m mediator replay`."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    with out.open("wb") as sink:
        subprocess.run([sys.executable, "-m", "mediator", "replay", "--profiles", str(profiles),
                        "--events", str(events)], stdout=sink, check=True,
                       env={**os.environ, "PYTHONHASHSEED": "0"})
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def split(text: str, events: Path, repeat: int) -> None:
    """Where one row's time goes: reading, the engine, writing (CPU seconds, medians), timed
    a batch at a time as `replay` streams them (holding every decoded event at once would
    time the garbage collector walking them)."""
    from eva.engine import Engine
    from eva.events import EventError, read_lines
    from eva.notify import composite_line
    from eva.parser import parse
    from mediator.cli.runs import BATCH
    from mediator.cli.serve import tune_gc

    tune_gc()  # as `replay` does
    lines = list(enumerate(events.read_bytes().splitlines(), start=1))
    doc = parse(text)
    reads, pushes, writes = [], [], []
    composites = 0
    clock = time.process_time
    for _ in range(repeat):
        engine = Engine()
        engine.add_document(doc)
        read = push = write = 0.0
        composites = 0
        for i in range(0, len(lines) + 1, BATCH):
            t0 = clock()
            decoded = read_lines(lines[i:i + BATCH])
            t1 = clock()
            notes = [n for e in decoded if not isinstance(e, EventError) for n in engine.push(e)]
            if i + BATCH > len(lines):
                notes += engine.close()
            t2 = clock()
            for note in notes:
                composite_line(note)
            t3 = clock()
            read += t1 - t0
            push += t2 - t1
            write += t3 - t2
            composites += len(notes)
        reads.append(read)
        pushes.append(push)
        writes.append(write)
    n = len(lines)
    print(f"\nwhere the time goes (in process, a batch of {BATCH:,} at a time, CPU, median of "
          f"{repeat}; {n:,} events, {composites:,} composites):\n")
    print("| part | seconds | per item |\n|---|---:|---:|")
    for label, times, items, unit in (("reading (read_lines)", reads, n, "line"),
                                      ("engine (push)", pushes, n, "event"),
                                      ("writing (composite_line)", writes, composites,
                                       "composite")):
        median = statistics.median(times)
        print(f"| {label} | {median:.2f} | {median / max(items, 1) * 1e6:.2f} µs per {unit} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--split", default="seq 5s all_pairs",
                        help="the row whose time is split into its parts ('' for none)")
    args = parser.parse_args()
    from eva import native

    with tempfile.TemporaryDirectory() as tmp:
        events = Path(tmp, "events.jsonl")
        write_events(events, args.events)
        engine = "compiled" if native.compiled() else "pure Python"
        print(f"`evamed replay`, {args.events:,} events ({events.stat().st_size / 1e6:.1f} MB of "
              f"JSON lines), engine {engine}, median (min–max) of {args.repeat}:\n")
        print("| profile | wall s | events/s (wall) | CPU s | events/s (median CPU) | "
              "composites |")
        print("|---|---:|---:|---:|---:|---:|")
        for label, profile in PROFILES.items():
            profiles = Path(tmp, "p.eva")
            profiles.write_text(CLASSES + profile)
            out = Path(tmp, "out.jsonl")
            runs = [run(profiles, events, out) for _ in range(args.repeat)]
            walls = [w for w, _ in runs]
            cpus = [c for _, c in runs]
            composites = sum(1 for _ in out.open("rb"))
            print(f"| {label} | {decimals(walls)} "
                  f"| {spread([args.events / w for w in walls])} "
                  f"| {decimals(cpus)} | {args.events / statistics.median(cpus):,.0f} "
                  f"| {composites:,} |")
        if args.split:
            split(CLASSES + PROFILES[args.split], events, args.repeat)


if __name__ == "__main__":
    main()
