"""Federation of autonomous services end to end, with real processes (issue 23, item 7).

Two base services with producers of their own — a Snoop service (cg2) that observes types a
and b, a streaming-SQL service (cg3) that observes c and d, both with ``--data`` — and
``evamed serve`` configured with them as autonomous services. A client subscribes profiles
across them at the mediator; the producers publish to the services' own ``Publish``, never to
the mediator. In order, each step starting from what the one before left:

1. a first part of the trace is published, the producers in random batches, concurrently;
2. the mediator is SIGKILLed while the producers go on, and started again: its sessions at the
   services kept what it had not acknowledged;
3. the SQL service is SIGKILLed mid-stream and started again on its port with its data: its
   producer publishes again the batch that failed;
4. the Snoop service is out of reach for 10 s (SIGSTOP), then back (SIGCONT);
5. the rest, and each service's clock advanced past the end.

The client has received exactly what ``evamed replay`` prints over the merged trace (each
event at its place: time, then the services in the configured order, then each service's
arrival order): nothing lost, nothing twice, nothing extra, each profile in replay's order —
with the in-process composer, and with the Spark composer (issue 23 item 4: its plans' filters
subscribed at the services, its jobs fed the composer log, killed with the mediator).
"""

from __future__ import annotations

import contextlib
import json
import random
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from adapters.client import BaseClient
from eva import ast
from eva.events import Event, format_time, from_cloudevent, to_cloudevent
from mediator.client import MediatorClient, MediatorError
from tests.helpers import Reader
from tests.servers import free_port
from tests.strategies import traces
from tests.test_autonomous import disjoint_services
from tests.test_service_e2e import EVAMED, Process, cli

CLASSES = ('class A = type == "a"\nclass B = type == "b"\nclass C = type == "c"\n'
           'class D = type == "d"\n')
DOCUMENT = CLASSES + (
    "profile Across = ((all_dup(A); all_dup(C))_4s)_all_pairs\n"
    "profile Pushed = ((all_dup(((all_dup(A); all_dup(B))_3s)_all_pairs), "
    "all_dup(((all_dup(C), all_dup(D))_2s)_all_pairs))_6s)_all_pairs\n"
    "profile Keyed per data.k = ((first_dup(A); first_dup(D))_5s)_unique_pairs\n"
    "profile Last = ((last_dup(B), all_dup(C))_3s)_all_pairs\n")
SERVICES = {"snoop": ("cg2", "ab"), "sql": ("cg3", "cd")}
"""In the configured order: its rank in the merged trace."""
T0 = 1_780_000_000_000_000


def trace(seed: int, size: int) -> list[dict[str, Any]]:
    draw = random.Random(seed)
    out, t = [], T0
    for i in range(size):
        t += draw.choice([0, 500_000, 1_000_000, 1_000_000, 2_000_000])
        kind = draw.choice("abcd")
        out.append({"specversion": "1.0", "id": f"{kind}{i}", "source": f"urn:{kind}",
                    "type": kind, "time": format_time(t), "data": {"k": draw.choice([1, 2])}})
    return out


def service_of(event: dict[str, Any]) -> str:
    return next(name for name, (_, kinds) in SERVICES.items() if event["type"] in kinds)


def merged(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The merged trace: by time, then the services in the configured order, then each
    service's order (its producer publishes its events in the trace's order)."""
    rank = {name: i for i, name in enumerate(SERVICES)}
    return [e for _, e in sorted(enumerate(events), key=lambda p: (
        from_cloudevent(p[1]).time, rank[service_of(p[1])], p[0]))]


def replay(events: list[dict[str, Any]], tmp_path: Path) -> list[dict[str, Any]]:
    doc, trace_file = tmp_path / "doc.eva", tmp_path / "merged.jsonl"
    doc.write_text(DOCUMENT)
    trace_file.write_text("".join(json.dumps(e) + "\n" for e in merged(events)))
    out = subprocess.run([EVAMED, "replay", "--profiles", str(doc), "--events", str(trace_file)],
                         capture_output=True, text=True, timeout=60, check=True)
    return [json.loads(line) for line in out.stdout.splitlines()]


class Producer:
    """A service's own producer: publishes its events to the service in random batches, and
    publishes a batch again when the service failed to take it (a crash)."""

    def __init__(self, service: Process, seed: int) -> None:
        self.service = service
        self.draw = random.Random(seed)
        self.failures = 0
        self.pace = 0.01  # seconds between batches at most

    def publish(self, events: list[Event], advance_to: int | None = None) -> None:
        at = 0
        while at < len(events) or advance_to is not None:
            batch = events[at:at + self.draw.randint(1, 12)]
            last = at + len(batch) >= len(events)
            try:
                with BaseClient(self.service.address, timeout=5) as client:
                    reply = client.publish(batch, advance_to=advance_to if last else None)
            except Exception:
                self.failures += 1
                time.sleep(0.2)
                continue
            assert reply.rejected == 0, list(reply.errors)
            at += len(batch)
            if last:
                return
            time.sleep(self.draw.random() * self.pace)


def publish_all(producers: dict[str, Producer], parts: dict[str, list[Event]],
                advance_to: int | None = None) -> None:
    """Each producer publishes its part, concurrently."""
    threads = [threading.Thread(target=producers[name].publish, args=(part, advance_to))
               for name, part in parts.items()]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
        assert not thread.is_alive()


def split(events: list[dict[str, Any]], first: int, last: int) -> dict[str, list[Event]]:
    """The events of trace positions [first, last) by service, as each producer sends them."""
    out: dict[str, list[Event]] = {name: [] for name in SERVICES}
    for i, e in enumerate(events[first:last], start=first):
        out[service_of(e)].append(from_cloudevent(e, i))
    return out


@pytest.fixture
def federation(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[dict[str, Any]]:
    with federated(tmp_path, getattr(request, "param", "inprocess")) as running:
        yield running


@contextlib.contextmanager
def federated(tmp_path: Path, composer: str, *options: str) -> Iterator[dict[str, Any]]:
    """The two services (each with ``options`` too) and a mediator federating them."""
    started: list[Process] = []
    try:
        services = {}
        for name, (group, _) in SERVICES.items():
            services[name] = Process("base-service", "--group", group, "--listen", "127.0.0.1:0",
                                     "--data", str(tmp_path / name), *options)
            started.append(services[name])
        config = tmp_path / "mediator.toml"
        parts = [f'listen = "127.0.0.1:{free_port()}"',
                 f'store = "sqlite:///{tmp_path / "mediator.db"}"', f'composer = "{composer}"',
                 'log_level = "INFO"', 'idle_timeout = "1s"', "[limits]", "rate = 0"]
        for name, (group, kinds) in SERVICES.items():
            parts += ["[[services]]", f'name = "{name}"', f'group = "{group}"',
                      f'address = "{services[name].address}"', f"types = {json.dumps(list(kinds))}",
                      'idle_timeout = "60s"']
        config.write_text("\n".join(parts) + "\n")
        token = cli("clients", "add", "alice", "--operator", "--config", str(config)).strip()
        mediator = Process("serve", "--config", str(config))
        started.append(mediator)
        yield {"mediator": mediator, "services": services, "token": token,
               "wait": 240 if composer == "spark" else 60}  # (a first micro-batch: seconds)
    finally:
        for process in reversed(started):
            process.stop()


@pytest.mark.xdist_group("service")
def test_autonomous_services_federated_through_crashes_of_everyone(
        federation: dict[str, Any], tmp_path: Path) -> None:
    through_crashes(federation, tmp_path)


# The worker that runs tests/test_spark.py (one JVM at a time): only the one mark.
@pytest.mark.xdist_group("spark")
@pytest.mark.parametrize("federation", ["spark"], indirect=True)
def test_autonomous_services_federated_through_crashes_with_the_spark_composer(
        federation: dict[str, Any], tmp_path: Path) -> None:
    through_crashes(federation, tmp_path)


def through_crashes(federation: dict[str, Any], tmp_path: Path) -> None:
    mediator, services = federation["mediator"], federation["services"]
    wait = federation["wait"]
    events = trace(3, 420)
    expected = replay(events, tmp_path)
    assert len(expected) > 100
    producers = {name: Producer(services[name], seed) for seed, name in enumerate(SERVICES)}
    alice = MediatorClient(mediator.address, federation["token"], backoff=(0.05, 0.5))
    try:
        plans = alice.add_profile(DOCUMENT, name="x").plans
        assert plans == ("Across: decompose, snoop, sql", "Pushed: decompose, snoop, sql",
                         "Keyed: decompose, snoop, sql", "Last: decompose, snoop, sql"), plans
        assert {s.name: s.mode for s in alice.services()} == {"snoop": "autonomous",
                                                               "sql": "autonomous"}
        composers = {p["profile"]: p["composer"] for p in alice.explain(name="x").json}
        assert composers == ({"Across": "spark", "Pushed": "inprocess", "Keyed": "spark",
                              "Last": "spark"} if federation["wait"] > 60
                             else dict.fromkeys(composers, "inprocess")), composers
        reader = Reader(alice.subscribe(name="x"))
        cuts = [0, 120, 220, 300, 420]

        # 1. A first part; some composites delivered.
        publish_all(producers, split(events, cuts[0], cuts[1]))
        reader.wait_for(10, wait)

        # 2. The mediator crashes while the producers go on; it comes back.
        mediator.kill()
        publish_all(producers, split(events, cuts[1], cuts[2]))
        mediator.start()

        # 3. The SQL service crashes mid-stream and comes back with its data.
        part = split(events, cuts[2], cuts[3])
        producers["sql"].pace = 0.2  # its part takes a few seconds: the crash falls inside
        def crash() -> None:
            services["sql"].kill()
            time.sleep(0.5)
            services["sql"].start()

        killer = threading.Timer(0.5, crash)
        killer.start()
        publish_all(producers, part)
        killer.join()
        producers["sql"].pace = 0.01

        # 4. The Snoop service out of reach for 10 s, the SQL one publishing meanwhile.
        services["snoop"].proc.send_signal(19)  # SIGSTOP
        later = split(events, cuts[3], cuts[4])
        sql = threading.Thread(target=producers["sql"].publish, args=(later["sql"],))
        sql.start()
        time.sleep(10)
        services["snoop"].proc.send_signal(18)  # SIGCONT
        producers["snoop"].publish(later["snoop"])
        sql.join(60)

        # 5. Every service's clock past the end: everything is decided.
        end = from_cloudevent(events[-1]).time + 60_000_000
        publish_all(producers, {name: [] for name in SERVICES}, advance_to=end)
        reader.wait_for(len(expected), wait)
        time.sleep(1.0 if wait <= 60 else 3.0)  # nothing more comes
        got = [n.cloudevent for n in reader.got]
        assert sorted(got, key=json.dumps) == sorted(expected, key=json.dumps)
        for profile in {e["subject"] for e in expected}:
            assert ([e for e in got if e["subject"] == profile]
                    == [e for e in expected if e["subject"] == profile])
        assert all(set(n.services) <= set(SERVICES) and n.services for n in reader.got)
        assert producers["sql"].failures > 0  # the crash was mid-stream
        print(f"\n{len(got)} composites over {len(events)} events published to two autonomous "
              f"services; the mediator and the SQL service SIGKILLed once, the Snoop service "
              f"stopped 10 s; lost 0, repeated 0, extra 0")
    finally:
        alice.close()


BOOM = CLASSES + ("profile Boom = ((all_dup(((all_dup(C), all_dup(D))_1h)_all_pairs), "
                  "all_dup(((all_dup(C), all_dup(D))_1h)_all_pairs))_1h)_all_pairs\n")
"""Nested spanned conjunctions over one service's events: pushed to it whole (a self-join of
four aliases at the SQL service), whose results grow with the cube of the events in the span."""


@pytest.mark.xdist_group("service")
def test_a_query_a_service_ends_at_its_limit_suspends_only_its_subscription(
        tmp_path: Path) -> None:
    """Issue 28: the SQL service ends the pushed query of a profile whose results multiply
    (its --work-limit), its session tells the mediator, and the subscription is suspended —
    ``Subscribe`` RESOURCE_EXHAUSTED naming the service's limit — while another client's
    subscription over both services gets exactly the reference's composites."""
    with federated(tmp_path, "inprocess", "--work-limit", "20000") as federation:
        events = trace(5, 160)
        expected = [e for e in replay(events, tmp_path) if e["subject"] == "Across"]
        assert expected
        producers = {name: Producer(federation["services"][name], seed)
                     for seed, name in enumerate(SERVICES)}
        alice = MediatorClient(federation["mediator"].address, federation["token"],
                               backoff=(0.05, 0.5))
        try:
            assert alice.add_profile(BOOM, name="boom").plans == ("Boom: equivalent, sql",)
            alice.add_profile(CLASSES + "profile Across = ((all_dup(A); all_dup(C))_4s)"
                              "_all_pairs\n", name="across")
            boom, across = (Reader(alice.subscribe(name=n)) for n in ("boom", "across"))
            publish_all(producers, split(events, 0, len(events)),
                        advance_to=from_cloudevent(events[-1]).time + 60_000_000)
            across.wait_for(len(expected), federation["wait"])
            boom.thread.join(federation["wait"])
            assert isinstance(boom.error, MediatorError), boom.error
            assert boom.error.code == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "work_limit" in str(boom.error) and "service sql" in str(boom.error)
            assert boom.error.reason == "SERVICE_LIMIT"
            status = alice.profile("boom").status
            assert status.startswith("suspended: service sql ended its query"), status
            time.sleep(1.0)  # nothing more comes
            assert [n.cloudevent for n in across.got] == expected
        finally:
            alice.close()


@pytest.mark.xdist_group("service")
@pytest.mark.parametrize("mode", ["embedded", "fed"])
def test_a_query_a_fed_service_ends_at_its_limit_suspends_only_its_subscription(
        mode: str, tmp_path: Path) -> None:
    """Issue 28: the same through services the mediator feeds — evaluated in its own process
    (``embedded``, the default) or running ones (``mode = "fed"``, with a lower
    ``--work-limit``): the pushed query ends at the service's limit, its subscription is
    suspended with SERVICE_LIMIT, and the mediator goes on — another subscription over both
    services exact, health SERVING."""
    started: list[Process] = []
    parts = [f'listen = "127.0.0.1:{free_port()}"', f'store = "sqlite:///{tmp_path / "m.db"}"',
             'composer = "inprocess"', 'log_level = "INFO"', "[limits]", "rate = 0",
             "composites = 1000000"]  # (the service's limit, not the mediator's, is the test)
    try:
        for name, (group, kinds) in SERVICES.items():
            address = "embedded"
            if mode == "fed":
                started.append(Process("base-service", "--group", group, "--listen",
                                       "127.0.0.1:0", "--work-limit", "20000"))
                address = started[-1].address
            parts += ["[[services]]", f'name = "{name}"', f'group = "{group}"',
                      f'address = "{address}"', f"types = {json.dumps(list(kinds))}",
                      'mode = "fed"']
        config = tmp_path / "mediator.toml"
        config.write_text("\n".join(parts) + "\n")
        token = cli("clients", "add", "alice", "--operator", "--config", str(config)).strip()
        mediator = Process("serve", "--config", str(config))
        started.append(mediator)
        events = trace(5, 240 if mode == "embedded" else 160)
        expected = [e for e in replay(events, tmp_path) if e["subject"] == "Across"]
        with MediatorClient(mediator.address, token, backoff=(0.05, 0.5)) as alice:
            assert alice.add_profile(BOOM, name="boom").plans == ("Boom: equivalent, sql",)
            alice.add_profile(CLASSES + "profile Across = ((all_dup(A); all_dup(C))_4s)"
                              "_all_pairs\n", name="across")
            boom, across = (Reader(alice.subscribe(name=n)) for n in ("boom", "across"))
            for start in range(0, len(events), 20):
                assert alice.publish(events[start:start + 20]).accepted == len(
                    events[start:start + 20])
            alice.publish([], advance_to=from_cloudevent(events[-1]).time + 60_000_000)
            across.wait_for(len(expected), 60)
            boom.thread.join(60)
            assert isinstance(boom.error, MediatorError), boom.error
            assert boom.error.code == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert boom.error.reason == "SERVICE_LIMIT"
            assert "work_limit" in str(boom.error) and "service sql" in str(boom.error)
            time.sleep(1.0)  # nothing more comes
            assert [n.cloudevent for n in across.got] == expected
            assert alice.status().health == "SERVING"
    finally:
        for process in reversed(started):
            process.stop()


# ------------------------------------------------------------------ random profiles, real sessions


def merged_parts(services: list[Any], trace: list[Event]) -> dict[int, list[Event]]:
    """Each input's part of the trace (rank 0: the own feed), each event numbered as its
    input gives it: a service in its arrival order from 0, the own feed by log position."""
    parts: dict[int, list[Event]] = {rank: [] for rank in range(len(services) + 1)}
    for e in trace:
        rank = next((i + 1 for i, s in enumerate(services) if s.coverage.observes(e)), 0)
        parts[rank].append(e.renumbered(len(parts[rank]) + (1 if rank == 0 else 0)))
    return parts


@st.composite
def bounded_documents(draw: st.DrawFn) -> Any:
    """A profile of disjunctions, conjunctions and sequences (tests/test_autonomous.py's
    ``pushable``), continuous and without a time class: nothing it reports waits on the clock
    or the end of the input."""
    from tests.test_autonomous import pushable
    from transforms.federated import clock_driven

    doc = draw(pushable())
    p = doc.profiles[0]
    assume(p.evaluation is ast.Evaluation.CONTINUOUS
           and not clock_driven(p.expr, doc.class_map()))
    return doc


@pytest.mark.xdist_group("service")
@settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck),
          database=None)
@given(doc=bounded_documents(), services=disjoint_services(), trace=traces(24, sources=("s1", "s2")),
       draw=st.randoms(use_true_random=False))
def test_random_profiles_through_real_sessions_give_the_reference(
        doc: Any, services: list[Any], trace: list[Event], draw: random.Random) -> None:
    """Random profiles over random sets of real base services (gRPC, durable sessions), the
    merged trace published to the services directly in random batches and interleavings, one
    service pausing a while: the subscription's log is the reference over the merged trace.
    (Profiles that act without events are left to tests/test_autonomous.py, which closes the
    input: a live mediator decides an instant only once every input has passed it.)"""
    from adapters.backends.service import serve as serve_base
    from adapters.service_link import AutonomousLink
    from eva.notify import composite_line
    from eva.printer import to_text
    from mediator.pipeline import Pipeline
    from mediator.store.base import SubscriptionRecord
    from mediator.store.sqlite import SqliteStore
    from tests.test_autonomous import reference

    with tempfile.TemporaryDirectory() as directory:
        running = {s.name: serve_base(s.group, "127.0.0.1:0", tick=1) for s in services}
        links = {s.name: AutonomousLink(s, f"127.0.0.1:{running[s.name].port}", f"t/{s.name}",
                                        heartbeat=0.05) for s in services}
        store = SqliteStore(f"{directory}/m.db")
        pipeline = Pipeline(store, links, tick=1, idle_default=0.3)
        try:
            pipeline.start()
            record = SubscriptionRecord("alice", "s", to_text(doc), 1, 0, None)
            store.put_subscription(record)
            pipeline.add(record)
            parts = merged_parts(services, trace)
            own = parts.pop(0)
            store.append_events([json.dumps(to_cloudevent(e)) for e in own])
            pipeline.wake()
            pending = {rank: list(part) for rank, part in parts.items()}
            resting = draw.choice(list(pending)) if pending else None
            while any(pending.values()):
                rank = draw.choice([r for r, p in pending.items() if p])
                size = draw.randint(1, 5)
                batch, pending[rank] = pending[rank][:size], pending[rank][size:]
                with BaseClient(f"127.0.0.1:{running[services[rank - 1].name].port}") as c:
                    assert c.publish(batch).rejected == 0
                if rank == resting and draw.random() < 0.3:
                    time.sleep(0.2)  # a pause, shorter than an idle timeout would need
            end = max((e.time for e in trace), default=0) + 1_000
            for s in services:
                with BaseClient(f"127.0.0.1:{running[s.name].port}") as c:
                    c.publish([], advance_to=end)
            pipeline.advance(end)
            want = sorted(composite_line(n)[1] for n in reference(services, doc, trace))
            got: list[str] = []
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                got = sorted(json.loads(i.payload)["cloudevent"]
                             for i in store.read_notifications("alice", "s", 0, 100_000))
                if len(got) >= len(want):
                    time.sleep(0.3)
                    got = sorted(json.loads(i.payload)["cloudevent"]
                                 for i in store.read_notifications("alice", "s", 0, 100_000))
                    break
                time.sleep(0.05)
            assert got == want
        finally:
            pipeline.stop(2.0)
            for link in links.values():
                link.close()
            for server in running.values():
                server.stop()
            store.close()
