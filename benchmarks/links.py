"""Links: events/s and the per-batch round trip of a RemoteLink to a running base service (a
process of its own, as deployed), against the in-process link on the same batches. Each
publish returns once the service's progress markers say the batch is answered. Rows: the
remote link as configured by default (packed notifications, constituents by reference), the
same link talking as before packing (``packed=False``: one message per detection, its
constituents in JSON; one message per batch), and the in-process link. Each figure is the
median of ``--runs`` runs, with their range.

    .venv/bin/python benchmarks/links.py [--group cg3] [--events 50000] [--batch 500] [--runs 3]
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


def spread(values: list[float], scale: float = 1.0, digits: int = 0) -> str:
    """The median of ``values`` and their range, e.g. ``34,484 (33,907–34,888)``."""
    low, mid, high = (f"{v * scale:,.{digits}f}" for v in (min(values), statistics.median(values),
                                                           max(values)))
    return f"{mid} ({low}–{high})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--group", default="cg3", choices=sorted(QUERIES))
    parser.add_argument("--events", type=int, default=50_000)
    parser.add_argument("--batch", type=int, default=500)
    parser.add_argument("--runs", type=int, default=3)
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
    before = RemoteLink(info, address, patience=10, packed=False, message_events=args.batch)
    try:
        links: list[tuple[str, Link]] = [
            ("remote", remote), ("unpacked", before),
            ("in-process", InProcessLink(info, language(args.group)))]
        for _, link in links:  # warm-up: connections, imports, the service's caches
            run(link, query, stream(5_000, seed=2), args.batch)
        print(f"{args.group}, one query, {args.events:,} events in batches of {args.batch}; "
              f"median of {args.runs} runs (range):")
        print(f"{'link':<10} {'events/s':>26} {'batch p50 (ms)':>20} {'batch p99 (ms)':>20} "
              f"{'found':>8}")
        found = {}
        for name, link in links:
            rates, p50, p99 = [], [], []
            for _ in range(args.runs):
                rate, rounds, found[name] = run(link, query, events, args.batch)
                rates.append(rate)
                p50.append(percentile(rounds, 50))
                p99.append(percentile(rounds, 99))
            print(f"{name:<10} {spread(rates):>26} {spread(p50, 1e3, 1):>20} "
                  f"{spread(p99, 1e3, 1):>20} {found[name]:>8,}")
        assert found["remote"] == found["unpacked"] == found["in-process"], found
        rate, rounds, _ = run(remote, query, stream(2_000, seed=3), 1)
        print(f"round trip of a one-event batch (remote): p50 {percentile(rounds, 50) * 1e3:.2f} "
              f"ms, p99 {percentile(rounds, 99) * 1e3:.2f} ms ({rate:,.0f} events/s)")
    finally:
        remote.close()
        before.close()
        proc.terminate()
        proc.wait(timeout=10)


if __name__ == "__main__":
    main()
