"""End to end as a user runs it: `evamed replay` over CloudEvents JSON lines, composites out.

Events of types A/B/C, one per second, each with a ``data.key`` of 10⁴ keys (benchmarks/engine.py's
``keyed_trace``), written as a JSON-lines file; then `python -m mediator replay` timed as a
subprocess (start-up, parsing, reading, admission, engine, composite output to a file) for each
profile, and the *parse floor* — a fresh interpreter that only reads the file and parses each
line with orjson — in interleaved rounds: median (min–max) of ``--repeat`` rounds, wall and CPU
time (the CPU time is what a loaded machine hardly moves), and each row's CPU time as a multiple
of the floor's. Then where the time of one row goes, per event and per composite, in process,
through the functions `replay` runs: reading the lines (``events.read_lines``), admission and
engine (``engine.push_admitted``), writing the composites (``notify.composite_lines``), against
start-up and the whole command. The subprocess rows use only the command line: run it with
another checkout on PYTHONPATH to compare versions (``--split ''`` then).

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
from typing import Any

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from anywhere
from benchmarks.engine import PER_PROFILE, keyed_trace, spread

CLASSES = 'class A = type == "A"\nclass B = type == "B"\nclass Z = type == "Z"\n'
PROFILES = {
    "seq 5s all_pairs": f"profile P0 = {PER_PROFILE}\n",
    "seq 4s all_pairs (= Flink followedByAny within 5s)":
        "profile P0 = ((all_dup(A); all_dup(B))_4s)_all_pairs\n",
    "seq 4s first B unique_pairs (= Flink followedBy within 5s)":
        "profile P0 = ((all_dup(A); first_dup(B))_4s)_unique_pairs\n",
    "seq 4s unique_pairs":
        "profile P0 = ((all_dup(A); all_dup(B))_4s)_unique_pairs\n",
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
    return timed_child([sys.executable, "-m", "mediator", "replay", "--profiles", str(profiles),
                        "--events", str(events)], out)


FLOOR = ("import sys, orjson\n"
         "with open(sys.argv[1], 'rb') as f:\n"
         "    for line in f:\n"
         "        orjson.loads(line)\n")
"""The parse floor: a fresh interpreter reading the file and parsing each line with orjson —
what any reader of the same input pays, and nothing else."""


def timed_child(command: list[str], out: Path) -> tuple[float, float]:
    """(wall, CPU) seconds of a child process, its output to ``out``."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    with out.open("wb") as sink:
        subprocess.run(command, stdout=sink, check=True,
                       env={**os.environ, "PYTHONHASHSEED": "0"})
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def split(text: str, events: Path, repeat: int) -> None:
    """Where one row's time goes, per event and per composite: the parse floor (orjson alone),
    reading (``events.read_lines``), admission and engine (``engine.push_admitted``), writing
    (``notify.composite_lines``) — CPU seconds, medians, timed a batch at a time as `replay`
    streams them (holding every decoded event at once would time the collector walking
    them); then a whole `replay` of the same row and of an empty file (start-up), whose
    difference to the parts is the rest (the command's loop, the output file)."""
    from eva.admission import Stream
    from eva.engine import Engine, EngineConfig, push_admitted
    from eva.events import read_lines
    from eva.notify import composite_lines
    from eva.parser import parse
    from mediator.cli.runs import BATCH, admission_rules, evaluating
    from mediator.cli.serve import tune_gc

    tune_gc()  # as `replay` does
    lines = list(enumerate(events.read_bytes().splitlines(), start=1))
    doc = parse(text)
    floors, reads, pushes, writes = [], [], [], []
    composites = 0
    clock = time.process_time
    loads = orjson.loads
    for _ in range(repeat):
        t0 = clock()
        for _number, line in lines:
            loads(line)
        floors.append(clock() - t0)
        config = EngineConfig()
        engine = Engine(evaluating(config))
        engine.add_document(doc)
        stream = Stream(admission_rules(config), lambda letter: None)
        read = push = write = 0.0
        composites = 0
        for i in range(0, len(lines), BATCH):
            t0 = clock()
            decoded = read_lines(lines[i:i + BATCH])
            t1 = clock()
            notes: list[Any] = []
            push_admitted(engine, stream, decoded, notes)
            if i + BATCH >= len(lines):
                for one in stream.close(None):
                    notes += engine.push(one)
                notes += engine.close()
            t2 = clock()
            composite_lines(notes, {})
            t3 = clock()
            read += t1 - t0
            push += t2 - t1
            write += t3 - t2
            composites += len(notes)
        reads.append(read)
        pushes.append(push)
        writes.append(write)
    with tempfile.TemporaryDirectory() as tmp:
        profiles, empty, out = Path(tmp, "p.eva"), Path(tmp, "empty.jsonl"), Path(tmp, "out")
        profiles.write_text(text)
        empty.write_bytes(b"")
        wholes, starts = [], []
        for _ in range(repeat):
            wholes.append(run(profiles, events, out)[1])
            starts.append(run(profiles, empty, out)[1])
    n = len(lines)
    whole, start = statistics.median(wholes), statistics.median(starts)
    parts = [statistics.median(t) for t in (reads, pushes, writes)]
    floor = statistics.median(floors)
    print(f"\nwhere the time goes (a batch of {BATCH:,} at a time, CPU, median (min–max) of "
          f"{repeat}; {n:,} events, {composites:,} composites, "
          f"{composites / n:.2f} an event):\n")
    print("| part | seconds | µs per event | µs per composite |\n|---|---:|---:|---:|")

    def row(label: str, times: list[float], per_composite: bool = False) -> None:
        median = statistics.median(times)
        each = f"{median / max(composites, 1) * 1e6:.2f}" if per_composite else ""
        print(f"| {label} | {decimals(times)} | {median / n * 1e6:.2f} | {each} |")

    row("parse floor (orjson.loads per line, in process)", floors)
    row("reading (read_lines)", reads)
    row("admission and engine (push_admitted)", pushes)
    row("writing (composite_lines)", writes, per_composite=True)
    row("start-up (`replay` of an empty file)", starts)
    row("the rest (loop, output file: whole − parts − start-up)",
        [whole - sum(parts) - start])
    row("whole `replay` (subprocess)", wholes)
    print(f"\nwhole ÷ parse floor: {whole / floor:.1f}; without start-up "
          f"{(whole - start) / floor:.1f}")


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
              "× parse floor (CPU) | composites |")
        print("|---|---:|---:|---:|---:|---:|---:|")
        # Interleaved: each round runs the floor and every row once, so a change in the
        # machine's load falls on all of them alike.
        files: dict[str, Path] = {}
        for label, profile in PROFILES.items():
            files[label] = Path(tmp, f"p{len(files)}.eva")
            files[label].write_text(CLASSES + profile)
        out = Path(tmp, "out.jsonl")
        floor: list[tuple[float, float]] = []
        runs: dict[str, list[tuple[float, float]]] = {label: [] for label in PROFILES}
        counts: dict[str, int] = {}
        for _ in range(args.repeat):
            floor.append(timed_child([sys.executable, "-c", FLOOR, str(events)], out))
            for label in PROFILES:
                runs[label].append(run(files[label], events, out))
                counts[label] = sum(1 for _ in out.open("rb"))
        floor_cpu = statistics.median([c for _, c in floor])
        print(f"| parse floor (orjson.loads per line) | {decimals([w for w, _ in floor])} "
              f"| {spread([args.events / w for w, _ in floor])} "
              f"| {decimals([c for _, c in floor])} | {args.events / floor_cpu:,.0f} | 1.0 | – |")
        for label in PROFILES:
            walls = [w for w, _ in runs[label]]
            cpus = [c for _, c in runs[label]]
            print(f"| {label} | {decimals(walls)} "
                  f"| {spread([args.events / w for w in walls])} "
                  f"| {decimals(cpus)} | {args.events / statistics.median(cpus):,.0f} "
                  f"| {statistics.median(cpus) / floor_cpu:.1f} | {counts[label]:,} |")
        if args.split:
            split(CLASSES + PROFILES[args.split], events, args.repeat)


if __name__ == "__main__":
    main()
