"""The mediator over autonomous services, end to end (issue 23, item 8): three base services
(``evamed base-service``: Snoop, streaming SQL, XChange), each with a producer of its own
publishing to it, and ``evamed serve`` (SQLite store in a temporary directory) subscribed
there — each a process of its own, as deployed; clients subscribe at the mediator from here.

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
import contextlib
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
from mediator.client import MediatorClient

SERVICES = (("snoop", "cg2", "a"), ("sql", "cg3", "b"), ("xchange", "cg4", "c"))
"""(name, group, the event type its producer publishes)."""
EVAMED = str(Path(sys.executable).with_name("evamed"))


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


def events_of(service: int, count: int, keys: int, base: int) -> list[Event]:
    """A service's producer's events: its type, keys in turn, 1 ms apart (times interleave
    with the other services')."""
    name, _, kind = SERVICES[service]
    return [Event(f"{name}-{i}", name, kind, base + i * 1000 + service, i, {"k": i % keys})
            for i in range(count)]


def throughput(profiles: int, events: int, rounds: int, data: bool) -> None:
    print(f"throughput end to end: {profiles:,} profiles at the mediator, {events:,} events per "
          f"service published to 3 autonomous services (batches of 500; `evamed serve`, the "
          f"base services and the producers each a process of its own)"
          f"{'; the services with --data' if data else ''}")
    print(f"{'round':>6} {'register s':>11} {'publish s':>10} {'end to end s':>13} "
          f"{'events/s':>10}")
    rates = []
    for r in range(rounds):
        with tempfile.TemporaryDirectory() as directory, served(
                directory, "inprocess", data, profiles + 10) as (address, token, addresses):
            client = MediatorClient(address, token, timeout=600)
            began = time.perf_counter()
            for i in range(profiles):
                client.add_profile(profile(i), name=f"p{i}")
            registered = time.perf_counter() - began
            client.add_profile(PROBE, name="probe")
            done = threading.Event()
            threading.Thread(target=wait_one, args=(client, done), daemon=True).start()
            time.sleep(0.5)
            base = 1_767_225_600_000_000
            end = base + events * 1000 + 10
            started_at = time.perf_counter()
            import multiprocessing

            with multiprocessing.get_context("spawn").Pool(3) as pool:
                pool.starmap(produce, [(addresses[SERVICES[s][0]], events, profiles, s, base, end)
                                       for s in range(3)])
            published = time.perf_counter() - started_at
            assert done.wait(1200), "the probe's composite did not come"
            elapsed = time.perf_counter() - started_at
            client.close()
        rates.append(3 * events / elapsed)
        print(f"{r + 1:>6} {registered:>11.2f} {published:>10.2f} {elapsed:>13.2f} "
              f"{rates[-1]:>10,.0f}", flush=True)
    print(f"median {statistics.median(rates):,.0f} events/s (min {min(rates):,.0f}, "
          f"max {max(rates):,.0f})")


def wait_one(client: MediatorClient, done: threading.Event) -> None:
    with contextlib.suppress(Exception):  # the stream ends with the client
        for _ in client.subscribe(name="probe"):
            done.set()
            return


def produce(address: str, count: int, keys: int, service: int, base: int, end: int) -> None:
    """A producer (a process of its own): its events in batches of 500, then its "end" event
    and its clock past it."""
    events = events_of(service, count, keys, base)
    source = SERVICES[service][0]
    with BaseClient(address, timeout=600) as client:
        for at in range(0, len(events), 500):
            reply = client.publish(events[at:at + 500], batch=500)
            assert reply.rejected == 0, list(reply.errors)[:3]
        last = Event(f"{source}-end", source, f"end.{source}", end, len(events))
        client.publish([last], advance_to=end + 1)


def latency(rate: int, seconds: float, composers: list[str], data: bool) -> None:
    print(f"publish → client latency at {rate:,} events/s per service (3 services, batches "
          f"every 10 ms), {seconds:g} s; one event in ten notifies; `evamed serve`, the base "
          "services and the producers each a process of its own")
    print(f"{'composer':>9} {'profile':>8} {'notified':>9} {'p50 ms':>8} {'p99 ms':>8} "
          f"{'max ms':>8}")
    for composer in composers:
        for name, delays in latency_of(rate, seconds, composer, data).items():
            ms = sorted(d * 1e3 for d in delays)
            if len(ms) < 2:
                print(f"{composer:>9} {name:>8} {len(ms):>9,}  (too few to tell)")
                continue
            q = statistics.quantiles(ms, n=100, method="inclusive")
            print(f"{composer:>9} {name:>8} {len(ms):>9,} {q[49]:>8.1f} {q[98]:>8.1f} "
                  f"{ms[-1]:>8.1f}", flush=True)


LATENCY = ('class A = type == "a" and data.n == 0\nclass B = type == "b" and data.n == 0\n'
           'class C = type == "c"\nprofile Filter = A\n'
           "profile Across = ((last_dup(C); all_dup(B))_50ms)_all_pairs\n")
"""Filter: one event in ten of the Snoop service's; Across: one event in ten of the SQL
service's completes a sequence with the XChange service's latest event."""


@contextmanager
def served(directory: str, composer: str, data: bool, profiles: int = 100
           ) -> Iterator[tuple[str, str, dict[str, str]]]:
    """The three base services and `evamed serve` over them, as processes: the mediator's
    address, a client token and the services' addresses."""
    processes: list[subprocess.Popen[str]] = []
    try:
        addresses = {}
        for name, group, _ in SERVICES:
            argv = [EVAMED, "base-service", "--group", group, "--listen", "127.0.0.1:0"]
            if data:
                argv += ["--data", f"{directory}/{name}"]
            processes.append(started(argv))
            addresses[name] = address_of(processes[-1])
        config = Path(directory) / "mediator.toml"
        lines = ['listen = "127.0.0.1:0"', f'store = "sqlite:///{directory}/m.db"',
                 f'composer = "{composer}"', 'log_level = "WARNING"', 'idle_timeout = "1s"',
                 "[limits]", "rate = 0", f"profiles = {profiles}"]
        for name, group, kind in SERVICES:
            lines += ["[[services]]", f'name = "{name}"', f'group = "{group}"',
                      f'address = "{addresses[name]}"', f'types = ["{kind}", "end.{name}"]',
                      'idle_timeout = "60s"']
        config.write_text("\n".join(lines) + "\n")
        token = subprocess.run([EVAMED, "clients", "add", "bench", "--config", str(config)],
                               capture_output=True, text=True, check=True).stdout.strip()
        processes.append(started([EVAMED, "serve", "--config", str(config)]))
        yield address_of(processes[-1], 300), token, addresses
    finally:
        for proc in reversed(processes):
            proc.terminate()
            proc.wait(20)


def started(argv: list[str]) -> subprocess.Popen[str]:
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})


def address_of(proc: subprocess.Popen[str], timeout: float = 60) -> str:
    """The address of a process that prints "serving … on HOST:PORT" once it answers."""
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line.startswith("serving "):
        raise RuntimeError(f"{proc.args!r} did not start: {line!r}")
    return line.split()[-1]


def latency_of(rate: int, seconds: float, composer: str, data: bool) -> dict[str, list[float]]:
    import multiprocessing

    delays: dict[str, list[float]] = {"Filter": [], "Across": []}
    received: dict[str, tuple[str, float]] = {}  # last constituent → (profile, when received)
    with tempfile.TemporaryDirectory() as directory, served(
            directory, composer, data) as (address, token, addresses):
        client = MediatorClient(address, token, timeout=600)
        client.add_profile(LATENCY, name="l")

        def read() -> None:
            with contextlib.suppress(Exception):  # the stream ends with the client
                for note in client.subscribe(name="l"):
                    received[note.cloudevent["data"]["constituents"][-1]] = (note.profile,
                                                                             time.time())

        threading.Thread(target=read, daemon=True).start()
        warm_up(addresses, received, time.monotonic() + (240 if composer == "spark" else 30))
        received.clear()
        stop = time.time() + seconds
        with multiprocessing.get_context("spawn").Pool(3) as pool:
            sent_parts = pool.starmap(steady, [(addresses[name], name, kind, rate, stop)
                                               for name, _, kind in SERVICES])
        time.sleep(3.0)  # the last ones in
        client.close()
    sent = {ident: at for part in sent_parts for ident, at in part.items()}
    for ident, (profile_name, at) in list(received.items()):
        if ident in sent:
            delays[profile_name].append(at - sent[ident])
    return delays


def warm_up(addresses: dict[str, str], received: dict[str, tuple[str, float]],
            deadline: float) -> None:
    """Publish until a first composite comes (a Spark job plans its query at its first
    micro-batch: seconds)."""
    i = 0
    while not received and time.monotonic() < deadline:
        now = time.time_ns() // 1000
        for name, _, kind in SERVICES:
            with BaseClient(addresses[name], timeout=60) as base:
                base.publish([Event(f"warm-{name}-{i}", name, kind, now, i, {"n": 0})])
        i += 1
        time.sleep(0.2)


def steady(address: str, source: str, kind: str, rate: int, stop: float) -> dict[str, float]:
    """A producer at ``rate`` events/s (a process of its own): a batch every 10 ms, stamped
    with the wall clock; when each notifying event's batch was published."""
    per_batch = max(1, rate // 100)
    sent: dict[str, float] = {}
    i = 0
    with BaseClient(address, timeout=60) as client:
        began = time.perf_counter()
        while time.time() < stop:
            pause = began + i / rate - time.perf_counter()
            if pause > 0:
                time.sleep(pause)
            now = time.time_ns() // 1000
            batch = [Event(f"{source}-{i + j}", source, kind, now + j, i + j, {"n": (i + j) % 10})
                     for j in range(per_batch)]
            at = time.time()
            sent.update((e.id, at) for e in batch if e.data["n"] == 0)
            client.publish(batch, batch=per_batch)
            i += per_batch
    return sent


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

