"""The mediator service end to end, through its gRPC API and the public client
(mediator/client.py) against a mediator in this process (mediator.server.serve, SQLite store in
a temporary directory unless --store, embedded services):

* **subscribe**: the time to register N profiles (AddProfile: parse, check, plan over the
  services, subscribe the native queries, store) with S services connected, each profile a
  sequence of two classes of types that S services cover in turn (so most are cross-service):
  one AddProfile at a time (the latency of each), and with ``--concurrency K`` from K clients
  at once (each a thread registering its share: the throughput of a mediator many clients
  register with); with ``--batch B`` each client sends its documents in AddProfiles calls of
  B (``--batch 1,100``: a row each);
* **latency**: publish → client, p50/p99, at a fixed rate of events/s (batches every 10 ms,
  event times the wall clock), one subscription notified of one event in ten, with each
  composer of ``--composers`` (``spark``: the live Spark job over the event log, its trigger
  ``--trigger``; warmed up first: the first micro-batch plans the query);
* **publish**: sustained events/s through Publish, by batch size: accepted (durably in the
  event log) and evaluated (the pipeline done with the last one: its composite received),
  each the median (min–max) of ``--repeat`` runs;
* **where**: where a published event's time goes — the CPU time of each thread of the process
  (the server's event loop: gRPC handlers and the door; its worker threads: the durable
  appends; the pipeline; the client) per event while ``--events`` events are published in
  batches of 2,000 and evaluated, median (min–max) of ``--repeat`` runs. CPU time is what the
  machine's other load hardly moves.

    .venv/bin/python benchmarks/service.py [--part subscribe|latency|publish|where|all] [--quick]
        [--profiles 10,100,1000,10000] [--services 1,3,6] [--per-client 100] [--concurrency 1]
        [--process] [--batch 1,100] [--repeat 3]
        [--rates 1000,10000] [--store URL] [--composers inprocess,spark] [--trigger "200 milliseconds"]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from anywhere

from mediator.cli.serve import tune_gc
from mediator.client import MediatorClient
from mediator.config import Config, Limits, ServiceConfig
from mediator.security import add_client
from mediator.server import Running, serve

GROUPS = ("cg2", "cg3", "cg4", "cg5", "cg2", "cg3")
"""The groups of the services, in order (those that evaluate a sequence natively)."""
TYPES = 6


PER_CLIENT = 100
"""Profiles per client: the default ``limits.profiles`` (N profiles come from N / 100 clients;
``--per-client``: the limit and the profiles per client, e.g. 10000 from one client)."""


@contextmanager
def mediator(services: int, store: str | None, per_client: int = PER_CLIENT,
             composer: str = "inprocess") -> Iterator[tuple[Running, MediatorClient]]:
    """A mediator with ``services`` embedded services — service j observes the types t<k> with
    k mod services = j — and a client of it."""
    with tempfile.TemporaryDirectory() as directory:
        config = Config(
            listen="127.0.0.1:0", store=store or f"sqlite:///{directory}/bench.db",
            composer=composer,
            limits=Limits(profiles=per_client, rate=0), log_level="WARNING",
            services=tuple(ServiceConfig(f"s{j}", GROUPS[j], "embedded", ("*",),
                                         tuple(f"t{k}" for k in range(TYPES) if k % services == j))
                           for j in range(services)))
        tune_gc()  # as `evamed serve` does
        running = serve(config)
        try:
            with client_of(running) as client:
                yield running, client
        finally:
            running.stop(1.0)


def client_of(running: Running) -> MediatorClient:
    # An operator: it publishes under the source "bench" and advances the clock.
    token = add_client(running.served.store, f"bench{time.monotonic_ns()}", operator=True)
    return MediatorClient(f"127.0.0.1:{running.port}", token, timeout=120)


def profile(i: int) -> str:
    a, b = i % TYPES, (i // TYPES + 1 + i) % TYPES
    return (f'class X = type == "t{a}" and data.k == {i}\nclass Y = type == "t{b}"\n'
            f"profile P{i} = ((all_dup(X); all_dup(Y))_10s)_all_pairs\n")


@contextmanager
def mediator_process(services: int, clients: int, per_client: int = PER_CLIENT
                     ) -> Iterator[tuple[list[MediatorClient], int]]:
    """``evamed serve`` as its own process, as a user runs it (SQLite in a temporary
    directory, ``services`` embedded services as :func:`mediator` lays them out), and
    ``clients`` clients of it in this process (their gRPC work is not the mediator's), with
    the process id."""
    from mediator.store import open_store

    with tempfile.TemporaryDirectory() as directory:
        url = f"sqlite:///{directory}/bench.db"
        lines = ['listen = "127.0.0.1:0"', f'store = "{url}"', 'composer = "inprocess"',
                 'log_level = "WARNING"', "[limits]", f"profiles = {per_client}", "rate = 0"]
        for j in range(services):
            types = [f"t{k}" for k in range(TYPES) if k % services == j]
            lines += ["[[services]]", f'name = "s{j}"', f'group = "{GROUPS[j]}"',
                      'address = "embedded"', f"types = {json.dumps(types)}"]
        config = Path(directory) / "mediator.toml"
        config.write_text("\n".join(lines) + "\n")
        store = open_store(url)
        try:  # the tokens in the store before it starts (a CLI call each would take longer)
            tokens = [add_client(store, f"bench{c}", operator=True) for c in range(clients)]
        finally:
            store.close()
        evamed = str(Path(sys.executable).with_name("evamed"))
        errors = Path(directory) / "serve.err"
        with errors.open("w") as err:
            root = str(Path(__file__).resolve().parents[1])  # this tree's code, as here
            proc = subprocess.Popen([evamed, "serve", "--config", str(config)],
                                    stdout=subprocess.PIPE, stderr=err, text=True,
                                    env={**os.environ, "PYTHONPATH": root})
        try:
            assert proc.stdout is not None
            line = proc.stdout.readline()
            if not line.startswith("serving "):
                raise SystemExit(f"evamed serve did not start: {line!r}\n{errors.read_text()}")
            address = line.split()[-1]
            made = [MediatorClient(address, token, timeout=120) for token in tokens]
            try:
                yield made, proc.pid
            finally:
                for client in made:
                    client.close()
        finally:
            proc.terminate()
            proc.wait(30)


def subscribe(sizes: list[int], services: list[int], store: str | None,
              per_client: int = PER_CLIENT, concurrency: int = 1, process: bool = False,
              batches: tuple[int, ...] = (1,), repeat: int = 1) -> None:
    at_once = "one at a time" if concurrency == 1 else f"{concurrency} clients at once"
    where = "`evamed serve` in its own process" if process else "the mediator in this process"
    print(f"subscription time: N profiles from N / {per_client} clients ({at_once}; batch: "
          f"documents per call, 1 = AddProfile, more = AddProfiles), S embedded services, "
          f"{where}, median (min–max) of {repeat}")
    print("| services | profiles | batch | total s | per profile ms | profiles/s |"
          + (" server CPU s |" if process else "") + "\n|---:|---:|---:|---:|---:|---:|"
          + ("---:|" if process else ""))
    for s in services:
        for n in sizes:
            for batch in batches:
                runs = [registration_run(s, n, store, per_client, concurrency, process, batch)
                        for _ in range(repeat)]
                elapsed = [e for e, _ in runs]
                cpu = f" {spread([c for _, c in runs], 2)} |" if process else ""
                print(f"| {s} | {n:,} | {batch} | {spread(elapsed, 2)} "
                      f"| {spread([e / n * 1e3 for e in elapsed], 2)} "
                      f"| {spread([n / e for e in elapsed])} |" + cpu, flush=True)


def registration_run(s: int, n: int, store: str | None, per_client: int, concurrency: int,
                     process: bool, batch: int) -> tuple[float, float]:
    """Seconds to register ``n`` profiles, and the server's CPU seconds meanwhile (process)."""
    if process:
        with mediator_process(s, (n - 1) // per_client + 1, per_client) as (clients, pid):
            before = process_cpu(pid)
            elapsed = timed_registration(clients, n, per_client, concurrency, batch)
            # (what the machine's other load hardly moves, unlike the wall time)
            return elapsed, process_cpu(pid) - before
    with mediator(s, store, per_client) as (running, first):
        clients = [first] + [client_of(running) for _ in range((n - 1) // per_client)]
        elapsed = timed_registration(clients, n, per_client, concurrency, batch)
        for client in clients[1:]:
            client.close()
        return elapsed, 0.0


def process_cpu(pid: int) -> float:
    """CPU seconds (user and system, every thread) another process has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def timed_registration(clients: list[MediatorClient], n: int, per_client: int,
                       concurrency: int, batch: int = 1) -> float:
    """Seconds to register ``n`` profiles through ``clients`` (``concurrency`` at once,
    ``batch`` documents a call)."""
    texts = [profile(i) for i in range(n)]
    threads = [threading.Thread(target=register, args=(
        clients[part::concurrency], texts, per_client, part, concurrency, batch))
        for part in range(concurrency)]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return time.perf_counter() - started


def register(clients: list[MediatorClient], texts: list[str], per_client: int, part: int,
             step: int, batch: int = 1) -> None:
    """Each client's share of ``texts`` (client c of ``clients`` is the ``part + c * step``-th
    of all: its ``per_client`` profiles), one AddProfile at a time or ``batch`` documents an
    AddProfiles call."""
    for c, client in enumerate(clients):
        first = (part + c * step) * per_client
        mine = range(first, min(len(texts), first + per_client))
        if batch == 1:
            for i in mine:
                client.add_profile(texts[i], name=f"p{i}")
            continue
        for start in range(mine.start, mine.stop, batch):
            done = client.add_profiles([(texts[i], f"p{i}")
                                        for i in range(start, min(mine.stop, start + batch))])
            refused = [r for r in done if isinstance(r, Exception)]
            if refused:
                raise SystemExit(f"{len(refused)} refused, the first: {refused[0]}")


def event(i: int, when: int, kind: str) -> str:
    seconds, micros = divmod(when, 1_000_000)
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)) + f".{micros:06d}Z"
    return json.dumps({"specversion": "1.0", "id": f"e{i}", "source": "bench", "type": kind,
                       "time": stamp})


def latency(rates: list[int], seconds: float, store: str | None, composers: list[str],
            trigger: str) -> None:
    import spark_jobs.composer

    spark_jobs.composer.TRIGGER = trigger  # what the pipeline's Spark composers are given
    print(f"publish → client latency, {seconds:g} s per rate, batches every 10 ms, one event in "
          "ten notified")
    print(f"{'composer':>9} {'events/s':>9} {'sent/s':>9} {'notified':>9} {'p50 ms':>8} "
          f"{'p99 ms':>8} {'max ms':>8}")
    for composer in composers:
        for rate in rates:
            sent_rate, delays, settings = latency_at(rate, seconds, store, composer)
            ms = sorted(d * 1e3 for d in delays)
            q = statistics.quantiles(ms, n=100, method="inclusive")
            print(f"{composer:>9} {rate:>9,} {sent_rate:>9,.0f} {len(ms):>9,} {q[49]:>8.1f} "
                  f"{q[98]:>8.1f} {ms[-1]:>8.1f}  {settings}", flush=True)


def _spark_settings() -> str:
    """The live Spark job's settings that set its latency."""
    from pyspark.sql import SparkSession

    import spark_jobs.composer

    conf = SparkSession.builder.getOrCreate().conf
    return (f"trigger {spark_jobs.composer.TRIGGER}, master {conf.get('spark.master')}, "
            f"shuffle partitions {conf.get('spark.sql.shuffle.partitions')}")


def latency_at(rate: int, seconds: float, store: str | None, composer: str = "inprocess"
               ) -> tuple[float, list[float], str]:
    """Events/s sent, each notified event's delay (s) from its batch's Publish call to its
    notification at the client, and the composer's settings. Publish's watermark reaches the
    runners and, as a watermark line of the composer log, the Spark jobs; events that notify
    nobody still follow the measured ones until all are in (a steady stream, as measured)."""
    total = int(rate * seconds)
    per_batch = max(1, rate // 100)
    sent: dict[str, float] = {}  # id of a notified event → when its batch was sent
    delays: list[float] = []
    done = threading.Event()
    warm = threading.Event()
    newest = 0

    def lines_of(first: int, count: int, notified: bool) -> list[str]:
        nonlocal newest
        out = []
        for i in range(first, first + count):
            newest = max(newest + 1, time.time_ns() // 1000)
            out.append(event(i, newest, "a" if notified and i % 10 == 0 else "b"))
        return out

    with mediator(0, store, composer=composer) as (_, client):
        client.add_profile('class A = type == "a"\nclass W = type == "warm"\n'
                           'profile P = A\nprofile Warm = W\n')

        def read() -> None:
            for note in client.subscribe(name="P"):
                if note.profile == "Warm":
                    warm.set()
                    continue
                ident = note.cloudevent["data"]["constituents"][0]
                delays.append(time.perf_counter() - sent[ident])
                if len(delays) >= (total + 9) // 10:
                    done.set()
                    return

        threading.Thread(target=read, daemon=True).start()
        time.sleep(0.2)  # the stream is open
        # Warm-up: the first micro-batch of a Spark job plans and compiles its query (seconds).
        deadline = time.monotonic() + 300
        while not warm.is_set() and time.monotonic() < deadline:
            client.publish([event(-1, newest := max(newest + 1, time.time_ns() // 1000),
                                  "warm"), *lines_of(total + 10**9, 1, False)])
            warm.wait(0.5)
        started = time.perf_counter()
        for b in range(0, total, per_batch):  # one call per batch: a publisher as events come
            pause = started + b / rate - time.perf_counter()
            if pause > 0:
                time.sleep(pause)
            lines = lines_of(b, min(total, b + per_batch) - b, True)
            now = time.perf_counter()
            sent.update((f"e{i}", now) for i in range(b, b + len(lines)) if i % 10 == 0)
            client.publish(lines)
        sent_rate = total / (time.perf_counter() - started)
        client.publish([], advance_to=newest + 1)
        tail = 2 * 10**9
        while not done.wait(0.05) and time.perf_counter() - started < seconds + 120:
            client.publish(lines_of(tail, per_batch, False))  # moves Spark's watermark
            tail += per_batch
        settings = _spark_settings() if composer == "spark" else ""
    return sent_rate, delays, settings


def publish(count: int, batches: list[int], store: str | None, repeat: int = 1) -> None:
    print(f"Publish throughput: {count:,} events in one call per row, one subscription, "
          f"median (min–max) of {repeat}")
    print("| batch | accepted/s | evaluated/s |\n|---:|---:|---:|")
    for size in batches:
        runs = [publish_at(count, size, store) for _ in range(repeat)]
        print(f"| {size:,} | {spread([count / a for a, _ in runs])} "
              f"| {spread([count / e for _, e in runs])} |", flush=True)


def spread(samples: list[float], digits: int = 0) -> str:
    """Median and range, e.g. ``12,345 (11,900–12,800)``."""
    ordered = sorted(samples)
    return (f"{statistics.median(ordered):,.{digits}f} "
            f"({ordered[0]:,.{digits}f}–{ordered[-1]:,.{digits}f})")


def thread_times() -> dict[str, float]:
    """CPU seconds of each Python thread of the process so far, by a name that groups them."""
    times: dict[str, float] = {}
    for thread in threading.enumerate():
        if thread.ident is None:
            continue
        try:
            used = time.clock_gettime(time.pthread_getcpuclockid(thread.ident))
        except (OSError, AttributeError):
            continue
        name = thread.name
        group = ("server event loop (gRPC handlers, the door)" if name == "evamed-mediator"
                 else "server workers (durable appends, dead letters)"
                 if name.startswith("asyncio_") else "pipeline (feed, runners, notification "
                 "appends)" if name == "evamed-pipeline" else "client and benchmark")
        times[group] = times.get(group, 0.0) + used
    return times


class Clocks:
    """The process's and each thread group's CPU time between :meth:`start` and :meth:`stop`."""

    def __init__(self) -> None:
        self.threads: dict[str, float] = {}
        self.cpu = self.wall = 0.0
        self._usage: Any = None
        self._t0 = 0.0

    def start(self) -> None:
        self.threads = {group: -used for group, used in thread_times().items()}
        self._usage = resource.getrusage(resource.RUSAGE_SELF)
        self._t0 = time.perf_counter()

    def stop(self) -> None:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        self.wall = time.perf_counter() - self._t0
        self.cpu = ((usage.ru_utime - self._usage.ru_utime)
                    + (usage.ru_stime - self._usage.ru_stime))
        for group, used in thread_times().items():
            self.threads[group] = self.threads.get(group, 0.0) + used


def where(count: int, store: str | None, repeat: int) -> None:
    """Per event, the CPU time of each thread group while ``count`` events are published in
    batches of 2,000 and evaluated; the rest of the process's CPU time is gRPC's C core (its
    own threads: the messages' transport and protobuf) and threads that ended."""
    per: dict[str, list[float]] = {}
    for _ in range(repeat):
        clocks = Clocks()
        publish_at(count, 2000, store, clocks.start, clocks.stop)
        for group, used in sorted(clocks.threads.items()):
            per.setdefault(group, []).append(used / count * 1e6)
        per.setdefault("rest (gRPC's C core, ended threads)", []).append(
            (clocks.cpu - sum(clocks.threads.values())) / count * 1e6)
        per.setdefault("process CPU", []).append(clocks.cpu / count * 1e6)
        per.setdefault("wall, publish to evaluated", []).append(clocks.wall / count * 1e6)
    print(f"where a published event's time goes: {count:,} events in batches of 2,000, one "
          f"subscription, µs per event, median (min–max) of {repeat}")
    print("| part | µs per event |\n|---|---:|")
    for group, values in per.items():
        ordered = sorted(values)
        print(f"| {group} | {statistics.median(ordered):.2f} ({ordered[0]:.2f}–{ordered[-1]:.2f}) |")


def publish_at(count: int, size: int, store: str | None,
               start: Callable[[], None] | None = None,
               stop: Callable[[], None] | None = None) -> tuple[float, float]:
    """Seconds until Publish returned (every event durably logged), and until the pipeline
    had evaluated the last event (its composite received); ``start`` and ``stop`` are called
    just before the call and once the last event was evaluated."""
    base = 1_767_225_600_000_000  # 2026-01-01
    lines = [event(i, base + i * 1000, "b") for i in range(count)]
    lines.append(event(count, base + count * 1000, "end"))
    done = threading.Event()
    with mediator(0, store) as (_, client):
        client.add_profile('class Z = type == "end"\nprofile P = Z\n')

        def read() -> None:
            for _ in client.subscribe(name="P"):
                done.set()
                return

        threading.Thread(target=read, daemon=True).start()
        time.sleep(0.2)
        if start is not None:
            start()
        started = time.perf_counter()
        result = client.publish(lines, batch=size, advance_to=base + (count + 1) * 1000)
        accepted = time.perf_counter() - started
        done.wait(600)
        evaluated = time.perf_counter() - started
        if stop is not None:
            stop()
    assert result.accepted == count + 1, result
    return accepted, evaluated


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", choices=("subscribe", "latency", "publish", "where", "all"),
                        default="all")
    parser.add_argument("--quick", action="store_true", help="Small sizes (a smoke run).")
    parser.add_argument("--profiles", default="10,100,1000,10000")
    parser.add_argument("--services", default="1,3,6")
    parser.add_argument("--per-client", type=int, default=PER_CLIENT,
                        help="Profiles per client (and the limit per client).")
    parser.add_argument("--concurrency", type=int, default=1,
                        help="Clients registering at once (subscribe).")
    parser.add_argument("--batch", default="1",
                        help="subscribe: documents per call (1: AddProfile; more: AddProfiles); "
                             "a comma list gives a row each.")
    parser.add_argument("--process", action="store_true",
                        help="subscribe: `evamed serve` in a process of its own, the clients in "
                             "this one (as users run them), not all in this process.")
    parser.add_argument("--rates", default="1000,10000")
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--batches", default="100,500,2000")
    parser.add_argument("--repeat", type=int, default=3, help="Runs per row (subscribe, publish, where).")
    parser.add_argument("--store", default=None, help="A store URL (default: SQLite in a "
                                                      "temporary directory).")
    parser.add_argument("--composers", default="inprocess,spark",
                        help="The composers the latency part measures.")
    parser.add_argument("--trigger", default="200 milliseconds",
                        help="The live Spark job's processing-time trigger.")
    args = parser.parse_args()
    sizes = [int(n) for n in args.profiles.split(",")]
    services = [int(n) for n in args.services.split(",")]
    rates = [int(n) for n in args.rates.split(",")]
    if args.quick:
        sizes, services, rates = [10, 100], [1, 6], [1000]
        args.seconds, args.events = 2.0, 10_000
    if args.part in ("subscribe", "all"):
        subscribe(sizes, services, args.store, args.per_client, max(1, args.concurrency),
                  args.process, tuple(int(b) for b in args.batch.split(",")), args.repeat)
    if args.part in ("latency", "all"):
        latency(rates, args.seconds, args.store, args.composers.split(","), args.trigger)
    if args.part in ("publish", "all"):
        publish(args.events, [int(n) for n in args.batches.split(",")], args.store, args.repeat)
    if args.part in ("where", "all"):
        where(args.events, args.store, args.repeat)


if __name__ == "__main__":
    main()


