"""Links: events/s and the per-batch round trip of a RemoteLink to a running base service (a
process of its own, as deployed), against the in-process link on the same batches. Each
publish returns once the service's progress markers say the batch is answered.

    .venv/bin/python benchmarks/links.py [--group cg3] [--events 50000] [--batch 500]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from anywhere

from adapters.backends.registry import language
from adapters.links import InProcessLink, Link
from adapters.remote_link import RemoteLink
from benchmarks.backends import QUERIES, stream
from eva.events import Event
from transforms.federated import ServiceInfo


def run(link: Link, query: str, events: list[Event], batch: int) -> tuple[float, list[float], int]:
    """Events/s over ``events`` in batches, each batch's round trip (s), detections."""
    handle = link.subscribe(query)
    rounds: list[float] = []
    found = 0
    started = time.perf_counter()
    for i in range(0, len(events), batch):
        sent = time.perf_counter()
        found += len(link.publish(events[i:i + batch])[handle])
        rounds.append(time.perf_counter() - sent)
    elapsed = time.perf_counter() - started
    link.unsubscribe(handle)
    return len(events) / elapsed, rounds, found


def percentile(values: list[float], p: float) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[int(p) - 1] if len(
        values) > 1 else values[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--group", default="cg3", choices=sorted(QUERIES))
    parser.add_argument("--events", type=int, default=50_000)
    parser.add_argument("--batch", type=int, default=500)
    args = parser.parse_args()
    query = QUERIES[args.group]
    events = stream(args.events)
    evamed = str(Path(sys.executable).with_name("evamed"))
    proc = subprocess.Popen([evamed, "base-service", "--group", args.group, "--listen",
                             "127.0.0.1:0"], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    address = proc.stdout.readline().split()[-1]
    info = ServiceInfo("bench", args.group, language(args.group).capability)
    remote = RemoteLink(info, address, patience=10)
    try:
        run(remote, query, stream(2_000, seed=2), args.batch)  # warm-up: connections, imports
        print(f"{args.group}, one query, {args.events:,} events in batches of {args.batch}:")
        print(f"{'link':<10} {'events/s':>10} {'batch p50':>10} {'batch p99':>10} {'found':>8}")
        found = {}
        links: list[tuple[str, Link]] = [("remote", remote), ("in-process", InProcessLink(
            info, language(args.group)))]
        for name, link in links:
            rate, rounds, found[name] = run(link, query, events, args.batch)
            print(f"{name:<10} {rate:>10,.0f} {percentile(rounds, 50) * 1e3:>8.2f}ms "
                  f"{percentile(rounds, 99) * 1e3:>8.2f}ms {found[name]:>8,}")
        assert found["remote"] == found["in-process"], found
        rate, rounds, _ = run(remote, query, stream(2_000, seed=3), 1)
        print(f"round trip of a one-event batch (remote): p50 {percentile(rounds, 50) * 1e3:.2f} "
              f"ms, p99 {percentile(rounds, 99) * 1e3:.2f} ms ({rate:,.0f} events/s)")
    finally:
        remote.close()
        proc.terminate()
        proc.wait(timeout=10)


if __name__ == "__main__":
    main()
