"""The operator's first minutes with the Spark composer: ``evamed serve`` (SQLite, ``composer =
"spark"``, local mode) is started as a process on a fresh store; measured, per round:

* **serving**: from the start of the process to its ``serving on HOST:PORT`` line;
* **first**: from then — a client adds a profile, subscribes and publishes one event it
  notifies (advancing the clock past it) — to that composite at the client: what a user
  waits for once the mediator says it is ready;
* **next**: publish → client for ``--events`` more events, one every 0.2 s (p50 and p99 of the
  round), the steady latency once the job runs.

A fresh store each round: every round is a first start (a JVM started, a job planned).

    .venv/bin/python benchmarks/first_composite.py [--rounds 3] [--events 20]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from anywhere

from benchmarks.restart import EVAMED
from eva.events import Event
from mediator.client import MediatorClient

PROFILE = 'class A = type == "a"\nprofile First = A\n'


def once(events: int) -> tuple[float, float, list[float]]:
    """Seconds to serving, to the first composite after it, and each next one's delay."""
    with tempfile.TemporaryDirectory() as directory:
        config = Path(directory) / "m.toml"
        config.write_text(f'listen = "127.0.0.1:0"\nstore = "sqlite:///{directory}/m.db"\n'
                          'composer = "spark"\nlog_level = "WARNING"\n[limits]\nrate = 0\n')
        token = subprocess.run([EVAMED, "clients", "add", "bench", "--operator", "--config",
                                str(config)], capture_output=True, text=True,
                               check=True).stdout.strip()
        began = time.perf_counter()
        errors = open(os.environ.get("BENCH_LOG", os.devnull), "a")  # noqa: SIM115
        proc = subprocess.Popen([EVAMED, "serve", "--config", str(config)],
                                stdout=subprocess.PIPE, stderr=errors, text=True,
                                env={**os.environ, "PYTHONUNBUFFERED": "1"})
        try:
            assert proc.stdout is not None
            line = proc.stdout.readline()
            if not line.startswith("serving "):
                raise RuntimeError(f"evamed serve did not start: {line!r}")
            ready = time.perf_counter()
            client = MediatorClient(line.split()[-1], token, timeout=300)
            client.add_profile(PROFILE, name="first")
            arrived: dict[str, float] = {}
            got = threading.Condition()

            def read() -> None:
                try:
                    for note in client.subscribe(name="first"):
                        with got:
                            ident = note.cloudevent["data"]["constituents"][0]
                            arrived[ident] = time.perf_counter()
                            got.notify_all()
                except Exception:  # the client closed at the round's end
                    return

            threading.Thread(target=read, daemon=True).start()
            sent: dict[str, float] = {}
            for i in range(events + 1):
                if i:
                    time.sleep(0.2)
                now = time.time_ns() // 1000
                sent[f"e{i}"] = time.perf_counter()
                client.publish([Event(f"e{i}", "bench", "a", now, 0, {})], advance_to=now + 1)
                if not i:  # the first: waited for before the rest
                    with got:
                        got.wait_for(lambda: "e0" in arrived, timeout=300)
            with got:
                got.wait_for(lambda: len(arrived) == len(sent), timeout=60)
            if len(arrived) < len(sent):
                raise RuntimeError(f"{len(sent) - len(arrived)} composites never came")
            client.close()
            return (ready - began, arrived["e0"] - ready,
                    [arrived[k] - sent[k] for k in sent if k != "e0"])
        finally:
            proc.kill()
            proc.wait()
            errors.close()


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} ({min(values):.2f}–{max(values):.2f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--events", type=int, default=20)
    # (BENCH_LOG=FILE in the environment: the mediator's standard error appended there.)
    args = parser.parse_args()
    runs = []
    for r in range(args.rounds):
        serving, first, nexts = once(args.events)
        ms = sorted(d * 1e3 for d in nexts)
        q = statistics.quantiles(ms, n=100, method="inclusive")
        print(f"round {r + 1}: serving {serving:.1f} s, first composite {first:.2f} s after, "
              f"next p50 {q[49]:.0f} ms p99 {q[98]:.0f} ms", flush=True)
        runs.append((serving, first, q[49], q[98]))
    print(f"serving s: {spread([r[0] for r in runs])}; first composite after serving s: "
          f"{spread([r[1] for r in runs])}; next p50 ms: {spread([r[2] for r in runs])}; "
          f"next p99 ms: {spread([r[3] for r in runs])}  (median (min–max) of {len(runs)} rounds)")


if __name__ == "__main__":
    main()
