"""Restart in bounded time (issue 24, item 1): ``evamed serve`` (SQLite, in-process composer,
the default checkpoint settings) is given N events of history through ``Publish`` for one
``per`` profile, SIGKILLed, and started again; measured: from the restart to the first
composite of two new events at a subscriber that resumes with the token of the last composite it
read before the crash (as a subscriber does; without one it would first be sent the whole
notification log again) — and what the store holds.

    .venv/bin/python benchmarks/restart.py [--history 100000,1000000] [--rounds 3]
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

from eva.events import Event
from mediator.client import MediatorClient

EVAMED = str(Path(sys.executable).with_name("evamed"))
PROFILE = ('class A = type == "a"\nclass B = type == "b"\n'
           "profile Pair per data.k = ((all_dup(A); all_dup(B))_2s)_all_pairs\n")
BASE = 1_767_225_600_000_000


def serve(config: Path) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen([EVAMED, "serve", "--config", str(config)], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line.startswith("serving "):
        raise RuntimeError(f"evamed serve did not start: {line!r}")
    return proc, line.split()[-1]


def events(first: int, count: int) -> list[Event]:
    return [Event(f"e{i}", "bench", "ab"[i % 2], BASE + i * 1000, 0, {"k": i // 2})
            for i in range(first, first + count)]


def once(history: int) -> tuple[float, float, int]:
    """Seconds from the restart to serving, and to the first new composite; the store's size
    in bytes after."""
    with tempfile.TemporaryDirectory() as directory:
        config = Path(directory) / "m.toml"
        store = Path(directory) / "m.db"
        config.write_text(f'listen = "127.0.0.1:0"\nstore = "sqlite:///{store}"\n'
                          'composer = "inprocess"\nlog_level = "WARNING"\n[limits]\nrate = 0\n')
        token = subprocess.run([EVAMED, "clients", "add", "bench", "--operator", "--config", str(config)],
                               capture_output=True, text=True, check=True).stdout.strip()
        proc, address = serve(config)
        try:
            with MediatorClient(address, token, timeout=600) as client:
                client.add_profile(PROFILE, name="p")
                for at in range(0, history, 20_000):
                    client.publish(events(at, min(20_000, history - at)), batch=2000)
                # The history's last instant decided too (nothing would follow it).
                client.publish([], advance_to=BASE + (history - 1) * 1000)
                # Evaluated (every pair's composite is in its log), then the crash: the
                # subscriber reads the log once it is complete (reading along, a Python client
                # slower than the pipeline would fall behind the log's retention) and keeps the
                # token of the last composite.
                last = history - 1 if history % 2 == 0 else history - 2
                deadline = time.monotonic() + 900
                while client.profile("p").log_head < history // 2:
                    if time.monotonic() > deadline:
                        raise RuntimeError("the history was not evaluated in 15 min")
                    time.sleep(0.2)
                token_read = ""
                for note in client.subscribe(name="p"):
                    token_read = note.resume_token
                    if note.cloudevent["data"]["constituents"][-1] == f"e{last}":
                        break
        finally:
            proc.kill()
            proc.wait()
        began = time.perf_counter()
        proc, address = serve(config)
        try:
            serving = time.perf_counter() - began
            with MediatorClient(address, token, timeout=600) as client:
                done = threading.Event()
                new = history + 2

                def read() -> None:  # resumed after what it read, as a subscriber does
                    for note in client.subscribe(name="p", resume_token=token_read):
                        if note.cloudevent["data"]["constituents"][-1] == f"e{new - 1}":
                            done.set()
                            return

                threading.Thread(target=read, daemon=True).start()
                client.publish(events(history, 2), advance_to=BASE + (history + 10) * 1000)
                if not done.wait(600):
                    raise RuntimeError("no new composite within 10 min of the restart")
                first = time.perf_counter() - began
        finally:
            proc.terminate()
            proc.wait(30)
        size = sum(f.stat().st_size for f in Path(directory).glob("m.db*"))
    return serving, first, size


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--history", default="100000,1000000")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    print("restart → first composite of two new events, after N events of history "
          "(evamed serve, SQLite, in process, default checkpoints)")
    print(f"{'history':>10} {'serving s':>10} {'first composite s':>18} {'store MB':>9}")
    for history in (int(n) for n in args.history.split(",")):
        runs = [once(history) for _ in range(args.rounds)]
        firsts = [r[1] for r in runs]
        print(f"{history:>10,} {statistics.median(r[0] for r in runs):>10.2f} "
              f"{statistics.median(firsts):>10.2f} ({min(firsts):.2f}–{max(firsts):.2f}) "
              f"{statistics.median(r[2] for r in runs) / 1e6:>9.1f}", flush=True)


if __name__ == "__main__":
    main()
