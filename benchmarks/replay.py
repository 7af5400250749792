"""End to end as a user runs it: `evamed replay` over CloudEvents JSON lines, composites out.

The `per` workload of benchmarks/engine.py (10⁴ keys, `((all_dup(A); all_dup(B))_5s)_all_pairs`,
with and without `per data.key`) written as a JSON-lines file, then `python -m mediator replay`
timed as a subprocess (start-up, parsing, admission, engine, composite output to a file), median
and range of --repeat runs. Run it with another checkout on PYTHONPATH to compare versions:
the command line is the only interface it uses.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from anywhere
from benchmarks.engine import keyed_trace, per_document


def _write_events(path: Path, n: int) -> None:
    with path.open("wb") as out:
        for e in keyed_trace(n):
            seconds = e.time // 1_000_000
            stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(1_767_225_600 + seconds))
            out.write(orjson.dumps({"specversion": "1.0", "id": e.id, "source": e.source,
                                    "type": e.type, "time": stamp, "data": e.data}) + b"\n")


def _run(profiles: Path, events: Path, out: Path) -> float:
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "mediator", "replay", "--profiles", str(profiles),
                    "--events", str(events)], stdout=out.open("wb"), check=True,
                   env={**os.environ, "PYTHONHASHSEED": "0"})
    return time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        events = Path(tmp, "events.jsonl")
        _write_events(events, args.events)
        print(f"`evamed replay`, {args.events:,} events ({events.stat().st_size / 1e6:.1f} MB of "
              f"JSON lines), median (range) of {args.repeat}:\n")
        print("| profile | seconds | events/s | composites |\n|---|---:|---:|---:|")
        for label, per in (("per data.key", True), ("unpartitioned", False)):
            profiles = Path(tmp, "p.eva")
            profiles.write_text(per_document(per))
            out = Path(tmp, "out.jsonl")
            times = sorted(_run(profiles, events, out) for _ in range(args.repeat))
            median = statistics.median(times)
            composites = sum(1 for _ in out.open("rb"))
            print(f"| {label} | {median:.2f} ({times[0]:.2f}–{times[-1]:.2f}) | "
                  f"{args.events / median:,.0f} | {composites:,} |")


if __name__ == "__main__":
    main()
