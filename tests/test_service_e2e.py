"""The mediator end to end with real processes (issue 13, item 9): ``evamed serve`` over a real
redis-server, two base services over different sources — traffic at a cg2 service, trucks at a
cg3 service (examples/logistics/generate.py names each event's source after its type) — and a
subscription client.

One scenario, in order, because each step starts from what the one before left:

1. a client subscribes P1 of the paper (a jam in area A and a truck there within 5 min: one
   operand at each service, composed at the mediator) and the logistics day is published; the
   client receives exactly what ``evamed replay`` prints for the day;
2. the mediator is SIGKILLed after some of the day's composites were delivered and before the
   rest of the day was published, then started again: the client resumes — nothing lost,
   nothing twice;
3. the trucks' service is SIGKILLed and started again on its port: the mediator resubscribes,
   and of a second day published afterwards it misses nothing;
4. a second client cannot list, read, explain, tail or cancel the first client's profile.

That scenario runs the in-process composer (the services' runners). And the same path once
with the Spark composer: ``evamed serve`` over a SQLite store, P1 at the mediator alone
(no services), composed by a live Spark job, the mediator SIGKILLed mid-stream and restarted.

Serial (xdist group "service"; the Spark one in the "spark" group, with the other Spark
tests): processes and ports, a few seconds each.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from eva.events import format_time
from examples.logistics.generate import day
from mediator.client import MediatorClient, MediatorError, Notification
from mediator.wire import mediator_pb2, mediator_pb2_grpc
from tests.helpers import Reader
from tests.servers import RedisServer, free_port

EVAMED = str(Path(sys.executable).with_name("evamed"))
ROOT = Path(__file__).resolve().parent.parent
PROFILES = ROOT / "examples/logistics/profiles.eva"


def p1_document() -> str:
    """P1 of the paper with the classes it names (the whole file would subscribe P1–P7)."""
    lines = PROFILES.read_text().splitlines()
    return "\n".join(line for line in lines
                     if line.startswith(("class Jam ", "class TruckA ", "profile P1 "))) + "\n"


P1_STYLE = """class Jam = type == "traffic.jam"
class Truck = type == "truck.location"
profile J = ((all_dup(Jam), last_dup(Truck))_5min)_all_pairs
"""
"""P1 of the paper in any area: more composites a day than P1's one or two."""


def second_day() -> list[dict[str, Any]]:
    """Another day (seed 8, the next date), its ids made unique against the first."""
    return [{**e, "id": "d2-" + e["id"]} for e in day(8, "2026-03-03")]


class Process:
    """An ``evamed`` command that prints "serving … on HOST:PORT" once it answers; it can be
    killed and started again with the same arguments."""

    def __init__(self, *args: str) -> None:
        self.args = [EVAMED, *args]
        self.proc: subprocess.Popen[str] | None = None
        self.start()

    def start(self) -> None:
        self.proc = subprocess.Popen(self.args, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line.startswith("serving "):
            self.proc.kill()
            _, stderr = self.proc.communicate(timeout=10)
            pytest.fail(f"{' '.join(self.args[1:3])} did not start: {line}{stderr}")
        self.address = line.split()[-1]
        if "--listen" in self.args:  # started again on the same port
            self.args[self.args.index("--listen") + 1] = self.address

    def kill(self) -> None:
        """SIGKILL, as a crash."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)

    def stop(self) -> None:
        if os.environ.get("E2E_DEBUG") and self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            print(self.args[1:3], self.proc.communicate(timeout=20)[1][-5000:])
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def replay(events: list[dict[str, Any]], tmp_path: Path, profiles: Path = PROFILES,
           profile: str = "P1") -> list[dict[str, Any]]:
    """What ``evamed replay`` prints for the profile over ``events`` (the reference)."""
    trace = tmp_path / "trace.jsonl"
    trace.write_text("".join(json.dumps(e) + "\n" for e in events))
    out = subprocess.run([EVAMED, "replay", "--profiles", str(profiles), "--events", str(trace),
                          "--profile", profile], capture_output=True, text=True, timeout=60,
                         check=True)
    return [json.loads(line) for line in out.stdout.splitlines()]


def cli(*args: str) -> str:
    out = subprocess.run([EVAMED, *args], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout


@pytest.fixture
def system(tmp_path: Path) -> Iterator[dict[str, Any]]:
    """Redis, the two base services and the mediator, its configuration naming them."""
    redis = RedisServer(tmp_path)
    started: list[Process] = []
    try:
        traffic = Process("base-service", "--group", "cg2", "--listen", "127.0.0.1:0")
        started.append(traffic)
        trucks = Process("base-service", "--group", "cg3", "--listen", "127.0.0.1:0")
        started.append(trucks)
        config = tmp_path / "mediator.toml"
        config.write_text(f"""
listen = "127.0.0.1:{free_port()}"
store = "{redis.url}/0"
composer = "inprocess"
log_level = "WARNING"

[limits]
rate = 0

[[services]]
name = "traffic"
group = "cg2"
address = "{traffic.address}"
types = ["traffic.*"]
mode = "fed"

[[services]]
name = "trucks"
group = "cg3"
address = "{trucks.address}"
types = ["truck.*"]
mode = "fed"
""")
        tokens = {name: cli("clients", "add", name, "--operator", "--config", str(config)).strip()
                  for name in ("alice", "bob")}
        mediator = Process("serve", "--config", str(config))
        started.append(mediator)
        yield {"mediator": mediator, "trucks": trucks, "tokens": tokens}
    finally:
        for process in reversed(started):
            process.stop()
        redis.stop()


def composites(notes: list[Notification]) -> list[dict[str, Any]]:
    return [n.cloudevent for n in notes]


@pytest.mark.xdist_group("service")
def test_p1_across_two_services_survives_a_mediator_and_a_service_crash(
        system: dict[str, Any], tmp_path: Path) -> None:
    mediator, trucks, tokens = system["mediator"], system["trucks"], system["tokens"]
    first = day(7)
    expected = replay(first, tmp_path)
    assert len(expected) >= 4  # the day has composites on both sides of the cut below
    alice = MediatorClient(mediator.address, tokens["alice"], backoff=(0.05, 0.5))
    bob = MediatorClient(mediator.address, tokens["bob"])
    try:
        plans = alice.add_profile(p1_document()).plans
        assert plans == ("P1: decompose, traffic, trucks",), plans
        reader = Reader(alice.subscribe(name="P1"))

        # 1-2. Half the day; some composites delivered; the mediator crashes and comes back.
        cut = next(i for i, e in enumerate(first)
                   if e["id"] == expected[2]["data"]["constituents"][-1]) + 1
        assert alice.publish(first[:cut]).accepted == cut
        reader.wait_for(2)
        mediator.kill()
        mediator.start()
        end = "2026-03-03T00:00:00Z"
        with MediatorClient(mediator.address, tokens["alice"]) as publisher:
            result = publisher.publish(first[cut:], advance_to=_us(end))
        assert (result.accepted, result.dead_lettered) == (len(first) - cut, 0)
        reader.wait_for(len(expected))
        time.sleep(0.5)  # nothing more comes
        assert composites(reader.got) == expected  # nothing lost, nothing twice, in order

        # 3. The trucks' service crashes and comes back on its port; a second day follows.
        trucks.kill()
        trucks.start()
        second = second_day()
        both = replay(first + second, tmp_path)
        assert len(both) > len(expected)
        with MediatorClient(mediator.address, tokens["alice"]) as publisher:
            result = publisher.publish(second, advance_to=_us("2026-03-04T00:00:00Z"))
        assert result.accepted == len(second)
        reader.wait_for(len(both))
        time.sleep(0.5)
        assert composites(reader.got) == both

        # 4. Bob sees nothing of Alice's.
        assert bob.profiles() == []
        for call in (lambda: bob.profile("P1"), lambda: bob.explain(name="P1"),
                     lambda: next(bob.subscribe(name="P1"))):
            with pytest.raises(MediatorError) as refused:
                call()
            assert refused.value.code == grpc.StatusCode.NOT_FOUND
        assert bob.unsubscribe("P1") is False
        assert [p.name for p in alice.profiles()] == ["P1"]
        services = {s.name: (s.status, s.subscriptions) for s in alice.services()}
        assert services == {"traffic": ("SERVING", 1), "trucks": ("SERVING", 1)}
    finally:
        alice.close()
        bob.close()


def _us(text: str) -> int:
    from eva.events import parse_time

    return parse_time(text)


HOSTILE_A = 'class A = type == "a"\n'
WORST = {
    # name: (document, the status of each call, what its message says)
    "a profile and 1 MiB of blanks": (HOSTILE_A + "profile P = A" + " " * ((1 << 20) - 40),
                                      grpc.StatusCode.OK, ""),
    "256 KiB of opening brackets": ("profile P = " + "(" * (1 << 18), grpc.StatusCode.INVALID_ARGUMENT,
                                    "profile:1:262157: error: found end of input, expected a name"),
    "a predicate in brackets nested 500,000 deep":
        ("class C = " + "(" * 500_000 + "x == 1" + ")" * 500_000 + "\nprofile P = C\n",
         grpc.StatusCode.RESOURCE_EXHAUSTED, "took longer than 2s, the limit (limits.read_time)"),
    "4 KiB of brackets nested 2,000 deep (small: read in the registration's thread)":
        (HOSTILE_A + "profile P = " + "(" * 2000 + "A" + ")" * 2000,
         grpc.StatusCode.INVALID_ARGUMENT, "expected an operator inside them"),
    "1 MiB of escaped quotes without their end":
        ('class A = type == "' + '\\"' * ((1 << 19) - 20), grpc.StatusCode.INVALID_ARGUMENT,
         "profile:1:19: error: found an unterminated string"),
}
"""The worst documents of issue 28 (1 MiB, the default limit): reading the second takes about
1 s, the third about 10 s (killed at the 2 s this test configures)."""


@pytest.mark.xdist_group("service")
def test_one_client_s_worst_documents_never_stall_health_or_another_client(tmp_path: Path) -> None:
    """Issue 28, item 2: while one client sends the worst documents to AddProfile, Explain and
    Subscribe, another publishes and a probe asks for health every 50 ms: every health answer
    comes within 200 ms, every publish is accepted, and each hostile call gets its answer (a
    document too slow to read is refused after ``limits.read_time``). Before, parsing ran on
    the server's loop: health timed out (5 s) while a 256 KiB document was read."""
    config = tmp_path / "mediator.toml"
    config.write_text(f'listen = "127.0.0.1:{free_port()}"\nstore = "sqlite:///{tmp_path / "m.db"}"\n'
                      'composer = "inprocess"\nlog_level = "WARNING"\n'
                      '[limits]\nrate = 0\nread_time = "2s"\n')
    tokens = {name: cli("clients", "add", name, "--operator", "--config", str(config)).strip()
              for name in ("mallory", "bob")}
    mediator = Process("serve", "--config", str(config))
    done = threading.Event()
    health: list[float] = []
    published: list[int] = []

    def probe() -> None:
        with grpc.insecure_channel(mediator.address) as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            while not done.is_set():
                start = time.perf_counter()
                try:
                    stub.Check(health_pb2.HealthCheckRequest(), timeout=5)
                    health.append(time.perf_counter() - start)
                except grpc.RpcError:
                    health.append(float("inf"))
                time.sleep(0.05)

    def publish() -> None:
        with MediatorClient(mediator.address, tokens["bob"]) as bob:
            n = 0
            while not done.is_set():
                batch = [{"specversion": "1.0", "id": f"e{n}-{k}", "source": "s", "type": "a",
                          "time": format_time(_us("2026-03-02T00:00:00Z") + n * 1000)}
                         for k in range(10)]
                result = bob.publish(batch)
                published.append(result.accepted)
                n += 1
                time.sleep(0.05)

    threads = [threading.Thread(target=probe), threading.Thread(target=publish)]
    for thread in threads:
        thread.start()
    answers: dict[tuple[str, str], tuple[grpc.StatusCode, str]] = {}
    try:
        with grpc.insecure_channel(mediator.address) as channel:
            stub = mediator_pb2_grpc.MediatorServiceStub(channel)
            metadata = [("authorization", f"Bearer {tokens['mallory']}")]
            time.sleep(0.5)
            for number, (name, (text, _, _)) in enumerate(WORST.items()):
                calls: dict[str, Callable[[], Any]] = {
                    "AddProfile": lambda: stub.AddProfile(mediator_pb2.AddProfileRequest(
                        profile_text=text, name=f"add{number}"), metadata=metadata, timeout=60),  # noqa: B023
                    "Explain": lambda: stub.Explain(mediator_pb2.ExplainRequest(
                        profile_text=text), metadata=metadata, timeout=60),  # noqa: B023
                    "Subscribe": lambda: next(stub.Subscribe(mediator_pb2.SubscribeRequest(
                        profile_text=text, name=f"sub{number}"), metadata=metadata, timeout=60)),  # noqa: B023
                }
                for method, call in calls.items():
                    try:
                        call()
                        answers[name, method] = (grpc.StatusCode.OK, "")
                    except grpc.RpcError as exc:
                        answers[name, method] = (exc.code(), exc.details() or "")
            # 40 of the worst small documents in one AddProfiles: read in its hops (each
            # ended after 0.2 s), ≈ 2 s of reading in all, the loop answering between hops.
            small = next(text for name, (text, _, _) in WORST.items() if "(small" in name)
            batch = stub.AddProfiles(mediator_pb2.AddProfilesRequest(profiles=[
                mediator_pb2.AddProfileRequest(profile_text=small, name=f"b{i}")
                for i in range(40)]), metadata=metadata, timeout=60)
            time.sleep(0.5)
    finally:
        done.set()
        for thread in threads:
            thread.join()
        assert mediator.proc is not None
        mediator.proc.terminate()
        _, log = mediator.proc.communicate(timeout=30)
    for name, (_, status, words) in WORST.items():
        for method in ("AddProfile", "Explain", "Subscribe"):
            code, message = answers[name, method]
            # On a loaded machine a document that reads in about a second may pass the 2 s
            # this test configures: refused for its time then, as clean a status.
            slow = (code == grpc.StatusCode.RESOURCE_EXHAUSTED
                    and "(limits.read_time)" in message)
            assert (code == status and words in message) or slow, (
                name, method, code, message[:300])
    assert len(batch.results) == 40 and all(
        r.refused.code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
        and "expected an operator inside them" in r.refused.message for r in batch.results)
    print(f"health: {len(health)} answers, the slowest {max(health) * 1000:.1f} ms; "
          f"{sum(published)} events published in {len(published)} calls")
    assert len(health) > 100, len(health)
    slow = [round(s * 1000) for s in health if s >= 0.2]
    assert not slow, f"{len(slow)} of {len(health)} health answers took 200 ms or more: {slow}"
    assert len(published) > 50 and set(published) == {10}, published
    assert "Traceback" not in log, log[-3000:]


# The worker that runs tests/test_spark.py (one JVM at a time). Only the one mark: xdist
# groups a test by all its marks joined ("service_spark" would be a group of its own).
@pytest.mark.xdist_group("spark")
def test_p1_through_the_spark_composer_survives_a_sigkill(tmp_path: Path) -> None:
    """``evamed serve`` with the Spark composer (as ``make demo`` runs it) and no services: a
    P1-style profile
    (a jam and a truck report within 5 min, in any area: a dozen composites a day) is the
    mediator's own, composed by a live Spark job over the event log (local mode, in the
    mediator's process), its checkpoint beside the SQLite store. The mediator is SIGKILLed
    once the first composites were delivered, before the rest of the day is published, and
    started again: the job resumes from its checkpoint, the client from its token — it
    receives what ``evamed replay`` prints for the day, each composite once (compared as a
    multiset: the job hands a micro-batch's composites over in its own order within it)."""
    store = tmp_path / "mediator.db"
    config = tmp_path / "mediator.toml"
    config.write_text(f"""
listen = "127.0.0.1:{free_port()}"
store = "sqlite:///{store}"
composer = "spark"
log_level = "WARNING"

[limits]
rate = 0
""")
    token = cli("clients", "add", "alice", "--operator", "--config", str(config)).strip()
    profiles = tmp_path / "p1.eva"
    profiles.write_text(P1_STYLE)
    events = day(7)
    expected = replay(events, tmp_path, profiles, "J")
    assert len(expected) >= 10
    half = 180  # past the first instant that decides composites (the 174th event)
    mediator = Process("serve", "--config", str(config))
    alice = MediatorClient(mediator.address, token, reconnect_for=180)
    try:
        assert alice.add_profile(P1_STYLE, name="J").plans == ("J: decompose, mediator",)
        assert alice.explain(name="J").json[0]["composer"] == "spark"
        reader = Reader(alice.subscribe(name="J"))
        assert alice.publish(events[:half]).accepted == half
        reader.wait_for(1, seconds=240)  # the first micro-batch takes Spark a while
        mediator.kill()
        assert (tmp_path / "mediator.db.spark" / "composer-0" / "checkpoint").is_dir()
        mediator.start()
        result = alice.publish(events[half:], advance_to=_us("2026-03-03T00:00:00Z"))
        assert (result.accepted, result.dead_lettered) == (len(events) - half, 0)
        reader.wait_for(len(expected), seconds=240)
        time.sleep(2)  # nothing more comes
        got = composites(reader.got)
        assert sorted(got, key=json.dumps) == sorted(expected, key=json.dumps)
        assert len({n.id for n in reader.got}) == len(got)  # each once
        assert {n.services for n in reader.got} == {("mediator",)}
    finally:
        alice.close()
        mediator.stop()


def _rss_kib(pid: int) -> int:
    """A process's resident set now (VmRSS, KiB)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError(f"no VmRSS for process {pid}")


def nested_all_pairs(depth: int) -> str:
    """``depth`` nested untimed all_pairs conjunctions over A: after k events, one event makes
    about k^depth composites (issue 28's probe grew the mediator to 1.45 GB with these)."""
    expr = "A"
    for _ in range(depth):
        expr = f"((all_dup({expr}), all_dup(A))_inf)_all_pairs"
    return f'class A = type == "a"\nprofile Deep = {expr}\n'


@pytest.mark.xdist_group("service")
def test_a_subscription_whose_output_explodes_is_suspended_and_memory_stays_flat(
        tmp_path: Path) -> None:
    """Issue 28, item 4: with ``limits.composites`` a subscription of 12 nested untimed
    all_pairs conjunctions — 200^12 composites over this trace without a bound — is suspended
    when one event reaches the limit: GetProfile says why, Subscribe is RESOURCE_EXHAUSTED
    naming the limit (a stream open then ends so, once it has what was decided before), the
    mediator's resident memory stays within 10 % of what it was before
    the trace, and another client's subscription over the same events is exact."""
    config = tmp_path / "mediator.toml"
    config.write_text(f'listen = "127.0.0.1:{free_port()}"\n'
                      f'store = "sqlite:///{tmp_path / "m.db"}"\ncomposer = "inprocess"\n'
                      'log_level = "WARNING"\n[limits]\nrate = 0\ncomposites = 300\n')
    # bob publishes the events (source "s") and advances the clock: an operator's rights.
    tokens = {name: cli("clients", "add", name, *extra, "--config", str(config)).strip()
              for name, extra in (("mallory", ()), ("bob", ("--operator",)))}
    exact = tmp_path / "exact.eva"
    exact.write_text('class A = type == "a"\nclass B = type == "b"\n'
                     'profile Pairs = ((last_dup(A); first_dup(B))_10s)_all_pairs\n')
    start = _us("2026-03-02T00:00:00Z")

    def events(first: int, count: int) -> list[dict[str, Any]]:
        return [{"specversion": "1.0", "id": f"e{n}", "source": "s", "type": "ab"[n % 2],
                 "time": format_time(start + n * 1_000_000)} for n in range(first, first + count)]

    warm, trace = events(0, 100), events(100, 200)
    expected = replay(warm + trace, tmp_path, exact, "Pairs")
    mediator = Process("serve", "--config", str(config))
    mallory = MediatorClient(mediator.address, tokens["mallory"])
    bob = MediatorClient(mediator.address, tokens["bob"])
    try:
        assert mediator.proc is not None
        bob.add_profile(exact.read_text(), name="exact")
        reader = Reader(bob.subscribe(name="exact"))
        # The mediator warmed up (a subscription evaluated, the store and the streams used)
        # before the exploding one comes.
        assert bob.publish(warm, advance_to=start + 99_500_000).accepted == len(warm)
        done = replay(warm, tmp_path, exact, "Pairs")
        reader.wait_for(len(done))
        mallory.add_profile(nested_all_pairs(12), name="deep")
        deep = Reader(mallory.subscribe(name="deep"))  # open when it is suspended
        time.sleep(0.5)
        before = _rss_kib(mediator.proc.pid)
        assert bob.publish(trace, advance_to=start + 400 * 1_000_000).accepted == len(trace)
        reader.wait_for(len(expected))
        time.sleep(0.5)  # nothing more comes
        after = _rss_kib(mediator.proc.pid)
        assert composites(reader.got) == expected  # the other subscription is exact
        status = mallory.profile("deep").status
        assert status.startswith("suspended: profile 'Deep' reached its limit of 300 "
                                 "composites per step"), status
        with pytest.raises(MediatorError) as refused:
            next(mallory.subscribe(name="deep"))
        assert refused.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert refused.value.reason == "COMPOSITE_LIMIT"
        assert "limit of 300 composites" in refused.value.message
        assert "300 composites per step (limits.composites)" in refused.value.message
        print(f"mediator RSS: {before} KiB before the trace, {after} KiB after")
        assert after <= before * 1.1, (before, after)
        # The open stream got what was decided before the suspension, then the same status.
        deep.thread.join(30)
        assert isinstance(deep.error, MediatorError), deep.error
        assert deep.error.code == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert deep.error.reason == "COMPOSITE_LIMIT"
        head = mallory.profile("deep").log_head
        assert 0 < len(deep.got) == head <= 300 * len(trace)
    finally:
        mallory.close()
        bob.close()
        mediator.stop()
