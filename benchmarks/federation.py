"""The mediator over autonomous services, end to end (issue 23, item 8): three base services
(``evamed base-service`` processes: Snoop, streaming SQL, XChange) each with a producer of its
own publishing to it, and the mediator in this process (SQLite store in a temporary directory)
subscribed there; clients subscribe at the mediator.

* **throughput**: N profiles registered (each a sequence of two classes at two different
  services, ``data.k`` picking one profile's events), then the producers publish as fast as
  they can, concurrently, in batches; the time from the first publish until the client has the
  composite that the last events complete — the mediator has decided everything before them —
  gives events/s end to end (published to the services, composed, delivered to the clients);
* **latency**: each producer publishes ``--rate`` events/s (batches every 10 ms, event times the
  wall clock); one in ten events of the first service notifies a filter profile, one in ten of
  the second completes a cross-service sequence; publish call → client, p50/p99 per profile,
  with each composer of ``--composers``.

    .venv/bin/python benchmarks/federation.py [--part throughput|latency|all] [--quick]
        [--profiles 10000] [--events 30000] [--rate 1000] [--seconds 10] [--rounds 3]
        [--composers inprocess,spark] [--data]
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
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from anywhere

from adapters.client import BaseClient
from eva.events import Event
from mediator.cli.serve import tune_gc
from mediator.client import MediatorClient
from mediator.config import Config, Limits, ServiceConfig
from mediator.security import add_client
from mediator.server import Running, serve

SERVICES = (("snoop", "cg2", "a"), ("sql", "cg3", "b"), ("xchange", "cg4", "c"))
"""(name, group, the event type its producer publishes)."""
EVAMED = str(Path(sys.executable).with_name("evamed"))


@contextmanager
def federation(directory: str, composer: str = "inprocess", data: bool = False,
               per_client: int = 100) -> Iterator[tuple[Running, dict[str, str]]]:
    """The three base services as processes and the mediator (in this process) over them."""
    processes, addresses = [], {}
    try:
        for name, group, _ in SERVICES:
            argv = [EVAMED, "base-service", "--group", group, "--listen", "127.0.0.1:0"]
            if data:
                argv += ["--data", f"{directory}/{name}"]
            proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                    text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
            processes.append(proc)
            assert proc.stdout is not None
            addresses[name] = proc.stdout.readline().split()[-1]
        config = Config(
            listen="127.0.0.1:0", store=f"sqlite:///{directory}/bench.db", composer=composer,
            limits=Limits(profiles=per_client, rate=0), log_level="WARNING",
            idle_timeout=1_000_000,
            services=tuple(ServiceConfig(name, group, addresses[name],
                                         types=(kind, f"end.{name}"), mode="autonomous",
                                         idle_timeout=60_000_000)
                           for name, group, kind in SERVICES))
        tune_gc()
        running = serve(config)
        try:
            yield running, addresses
        finally:
            running.stop(1.0)
    finally:
        for proc in processes:
            proc.terminate()
            proc.wait(10)


def client_of(running: Running) -> MediatorClient:
    token = add_client(running.served.store, f"bench{time.monotonic_ns()}")
    return MediatorClient(f"127.0.0.1:{running.port}", token, timeout=600)


def profile(i: int) -> str:
    """Profile i: an event of service i mod 3 with key i, then one of the next service."""
    x, y = SERVICES[i % 3][2], SERVICES[(i + 1) % 3][2]
    return (f'class X = type == "{x}" and data.k == {i}\nclass Y = type == "{y}" and '
            f"data.k == {i}\nprofile P{i} = ((all_dup(X); all_dup(Y))_10s)_all_pairs\n")


PROBE = ('class E0 = type == "end.snoop"\nclass E1 = type == "end.sql"\n'
         'class E2 = type == "end.xchange"\n'
         "profile Done = ((all_dup(((all_dup(E0), all_dup(E1))_1h)_all_pairs), all_dup(E2))_1h)"
         "_all_pairs\n")
"""Complete once the last event of every service is decided."""


def stamp(us: int) -> str:
    seconds, micros = divmod(us, 1_000_000)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)) + f".{micros:06d}Z"


def events_of(service: int, count: int, keys: int, base: int) -> list[Event]:
    """A service's producer's events: its type, keys in turn, 1 ms apart (times interleave
    with the other services')."""
    name, _, kind = SERVICES[service]
    return [Event(f"{name}-{i}", name, kind, base + i * 1000 + service, i, {"k": i % keys})
            for i in range(count)]


def throughput(profiles: int, events: int, rounds: int, data: bool) -> None:
    print(f"throughput end to end: {profiles:,} profiles at the mediator, {events:,} events per "
          f"service published to 3 autonomous services (batches of 500){', --data' if data else ''}")
    print(f"{'round':>6} {'register s':>11} {'publish s':>10} {'end to end s':>13} "
          f"{'events/s':>10} {'composites':>11}")
    rates = []
    for r in range(rounds):
        with tempfile.TemporaryDirectory() as directory, federation(
                directory, data=data) as (running, addresses):
            began = time.perf_counter()
            clients = [client_of(running) for _ in range((profiles + 99) // 100)]
            for i in range(profiles):
                clients[i // 100].add_profile(profile(i), name=f"p{i}")
            registered = time.perf_counter() - began
            probe = client_of(running)
            probe.add_profile(PROBE, name="probe")
            done = threading.Event()
            threading.Thread(target=wait_one, args=(probe, done), daemon=True).start()
            time.sleep(0.5)
            base = 1_767_225_600_000_000
            parts = [events_of(s, events, profiles, base) for s in range(3)]
            end = base + events * 1000 + 10
            started = time.perf_counter()
            threads = [threading.Thread(target=produce, args=(addresses[SERVICES[s][0]], parts[s],
                                                               SERVICES[s][0], end))
                       for s in range(3)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            published = time.perf_counter() - started
            assert done.wait(600), "the probe's composite did not come"
            elapsed = time.perf_counter() - started
            store = running.served.store
            composites = sum(store.notification_bounds(r.owner, r.name)[1]
                             for r in store.subscriptions() if r.name != "probe")
            for client in [*clients, probe]:
                client.close()
        rates.append(3 * events / elapsed)
        print(f"{r + 1:>6} {registered:>11.2f} {published:>10.2f} {elapsed:>13.2f} "
              f"{rates[-1]:>10,.0f} {composites:>11,}", flush=True)
    print(f"median {statistics.median(rates):,.0f} events/s (min {min(rates):,.0f}, "
          f"max {max(rates):,.0f})")


def wait_one(client: MediatorClient, done: threading.Event) -> None:
    for _ in client.subscribe(name="probe"):
        done.set()
        return


def produce(address: str, events: list[Event], source: str, end: int) -> None:
    """A producer: its events in batches of 500, then its "end" event and its clock past it."""
    with BaseClient(address, timeout=60) as client:
        for at in range(0, len(events), 500):
            reply = client.publish(events[at:at + 500], batch=500)
            assert reply.rejected == 0, list(reply.errors)[:3]
        last = Event(f"{source}-end", source, f"end.{source}", end, len(events))
        client.publish([last], advance_to=end + 1)


def latency(rate: int, seconds: float, composers: list[str], data: bool) -> None:
    print(f"publish → client latency at {rate:,} events/s per service (3 services, batches "
          f"every 10 ms), {seconds:g} s; one event in ten notifies")
    print(f"{'composer':>9} {'profile':>8} {'notified':>9} {'p50 ms':>8} {'p99 ms':>8} "
          f"{'max ms':>8}")
    for composer in composers:
        for name, delays in latency_of(rate, seconds, composer, data).items():
            ms = sorted(d * 1e3 for d in delays)
            q = statistics.quantiles(ms, n=100, method="inclusive")
            print(f"{composer:>9} {name:>8} {len(ms):>9,} {q[49]:>8.1f} {q[98]:>8.1f} "
                  f"{ms[-1]:>8.1f}", flush=True)


LATENCY = ('class A = type == "a" and data.n == 0\nclass B = type == "b" and data.n == 0\n'
           'class C = type == "c"\nprofile Filter = A\n'
           "profile Across = ((last_dup(C); all_dup(B))_50ms)_all_pairs\n")
"""Filter: one event in ten of the Snoop service's; Across: one event in ten of the SQL
service's completes a sequence with the XChange service's latest event."""


def latency_of(rate: int, seconds: float, composer: str, data: bool) -> dict[str, list[float]]:
    sent: dict[str, float] = {}  # event id → when its batch was published
    delays: dict[str, list[float]] = {"Filter": [], "Across": []}
    with tempfile.TemporaryDirectory() as directory, federation(
            directory, composer, data) as (running, addresses):
        client = client_of(running)
        client.add_profile(LATENCY, name="l")

        def read() -> None:
            for note in client.subscribe(name="l"):
                ident = note.cloudevent["data"]["constituents"][-1]
                if ident in sent:
                    delays[note.profile].append(time.perf_counter() - sent[ident])

        threading.Thread(target=read, daemon=True).start()
        time.sleep(0.5)
        stop = time.perf_counter() + seconds
        threads = [threading.Thread(target=steady, args=(addresses[name], name, kind, rate, stop,
                                                          sent))
                   for name, _, kind in SERVICES]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        time.sleep(2.0)  # the last ones in
        client.close()
    return delays


def steady(address: str, source: str, kind: str, rate: int, stop: float,
           sent: dict[str, float]) -> None:
    """A producer at ``rate`` events/s: a batch every 10 ms, stamped with the wall clock."""
    per_batch = max(1, rate // 100)
    i = 0
    with BaseClient(address, timeout=60) as client:
        began = time.perf_counter()
        while time.perf_counter() < stop:
            pause = began + i / rate - time.perf_counter()
            if pause > 0:
                time.sleep(pause)
            now = time.time_ns() // 1000
            batch = [Event(f"{source}-{i + j}", source, kind, now + j, i + j, {"n": (i + j) % 10})
                     for j in range(per_batch)]
            at = time.perf_counter()
            sent.update((e.id, at) for e in batch if e.data["n"] == 0)
            client.publish(batch, batch=per_batch)
            i += per_batch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", choices=("throughput", "latency", "all"), default="all")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--profiles", type=int, default=10_000)
    parser.add_argument("--events", type=int, default=30_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--rate", type=int, default=1000)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--composers", default="inprocess,spark")
    parser.add_argument("--data", action="store_true", help="The base services persist "
                                                            "(--data): SIGKILL-safe.")
    args = parser.parse_args()
    if args.quick:
        args.profiles, args.events, args.rounds, args.seconds = 300, 3000, 1, 3.0
    if args.part in ("throughput", "all"):
        throughput(args.profiles, args.events, args.rounds, args.data)
    if args.part in ("latency", "all"):
        latency(args.rate, args.seconds, args.composers.split(","), args.data)


if __name__ == "__main__":
    main()

