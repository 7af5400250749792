"""The pipeline over autonomous services (issue 23): the producers publish to the services
themselves, the mediator sees only the services' messages — logged per link, acknowledged once
logged, composed with the own feed — and the subscriptions' logs hold exactly the reference's
composites over the merged trace, across a crash of the mediator.

The services here are test doubles in this process that speak the session's terms (numbered
messages with constituents in full and a watermark, kept until acknowledged, resent after a
restart); the real gRPC sessions are tested in tests/test_sessions.py and end to end in
tests/test_federation_e2e.py.

The same scenarios run with the Spark composer (issue 23 item 4; a module-scoped local
session, a few examples: Spark is slow here): the plans whose leaves are filters go to live
Spark jobs fed by the composer log — their filters subscribed at the services — and the logs
hold the reference's composites all the same, with each constituent's provenance and each
profile's composites in replay order."""

from __future__ import annotations

import json
import random
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from adapters.backends.registry import language
from adapters.federation import merged_seq
from adapters.links import Handle, InProcessLink, Link
from adapters.service_link import AutonomousLink, OnLost, OnMessage
from eva.events import Event, to_cloudevent
from eva.notify import composite_line
from eva.parser import parse
from eva.reference import evaluate
from mediator.pipeline import Pipeline
from mediator.store.base import Store, SubscriptionRecord
from mediator.store.sqlite import SqliteStore
from transforms.capability import PRESETS
from transforms.dialects.base import Detection
from transforms.federated import Coverage, ServiceInfo

CLASSES = ('class A = type == "a"\nclass B = type == "b"\nclass C = type == "c"\n'
           'class D = type == "d"\n')
PROFILES = (
    "profile Across = ((all_dup(A); all_dup(C))_5us)_all_pairs\n"
    "profile Pushed = ((all_dup(((all_dup(A); all_dup(B))_3us)_all_pairs), all_dup(C))_4us)"
    "_all_pairs\n"
    "profile Keyed per data.k = ((first_dup(A); last_dup(B))_4us)_unique_pairs\n"
    "profile Own = ((all_dup(D); all_dup(C))_5us)_all_pairs\n")
DOC = CLASSES + PROFILES


@dataclass(frozen=True)
class Msg:
    seq: int
    detections: tuple[tuple[str, Detection], ...]
    watermark: int | None
    origin: int | None


class Producing(AutonomousLink):
    """An autonomous service in this process: its producers call :meth:`produce`; the
    mediator registers queries in its session and reads the messages, which it keeps (a
    durable session) and sends again after a restart of the mediator."""

    def __init__(self, info: ServiceInfo) -> None:
        super().__init__(info, "in-process", f"test/{info.name}")
        self.service = InProcessLink(info, language(info.group, 1))
        self.names: dict[str, Handle] = {}  # registration → the evaluator's handle
        self.texts: dict[str, str] = {}  # registration → its native query
        self.messages: list[Msg] = []
        self.acked = 0
        self.origin: int | None = None
        self.watermark: int | None = None
        self._deliver: OnMessage | None = None
        self._mutex = threading.Lock()

    def start(self, on_message: OnMessage, on_lost: OnLost, resume_after: int) -> None:
        with self._mutex:
            self._deliver = on_message
            for m in self.messages:
                if m.seq > resume_after:
                    on_message(m)

    def subscribe(self, text: str, name: str = "") -> Handle:
        with self._mutex:
            if name not in self.names:
                self.names[name] = self.service.subscribe(text)
                self.texts[name] = text
        return name

    def unsubscribe(self, handle: Handle) -> None:
        with self._mutex:
            found = self.names.pop(handle, None)
            self.texts.pop(handle, None)
            if found is not None:
                self.service.unsubscribe(found)

    def ack(self, number: int) -> None:
        self.acked = max(self.acked, number)

    def status(self) -> str:
        return "SERVING"

    def close(self) -> None:
        self._deliver = None

    def produce(self, events: Sequence[Event], until: int | None = None) -> None:
        """The service's own producers publish ``events`` (then, with ``until``, its clock
        moves there): its registrations' detections go to the mediator in one message."""
        with self._mutex:
            found = self.service.publish(events, until)
            if self.origin is None and events:
                self.origin = events[0].time - 1
            newest = max((e.time for e in events), default=None)
            marks = [t for t in (self.watermark, None if newest is None else newest - 1, until)
                     if t is not None]
            self.watermark = max(marks) if marks else None
            detections = tuple((name, d) for name, handle in self.names.items()
                               for d in found.get(handle, []))
            seq = len(self.messages) + 1 if detections else 0
            message = Msg(seq, detections, self.watermark, self.origin)
            if seq:
                self.messages.append(message)
            if self._deliver is not None:
                self._deliver(message)


def services() -> dict[str, Link]:
    return {"ab": Producing(ServiceInfo("ab", "cg3", PRESETS["cg3"], Coverage(types=("a", "b")),
                                        autonomous=True)),
            "cs": Producing(ServiceInfo("cs", "cg2", PRESETS["cg2"], Coverage(types=("c",)),
                                        autonomous=True))}


def trace(seed: int, size: int = 60) -> list[Event]:
    draw = random.Random(seed)
    out, t = [], 10
    for i in range(size):
        t += draw.choice([0, 1, 1, 2, 3])
        kind = draw.choice("abcd")
        out.append(Event(f"{kind}{i}", f"urn:{kind}", kind, t, i, {"k": draw.choice([1, 2])}))
    return out


def split(events: list[Event]) -> dict[str, list[Event]]:
    """Each input's part, each event numbered as its input gives it (its arrival number
    there: the rank goes into the merged key when the mediator reads it)."""
    parts: dict[str, list[Event]] = {"ab": [], "cs": [], "own": []}
    for e in events:
        name = "ab" if e.type in "ab" else "cs" if e.type == "c" else "own"
        parts[name].append(e.renumbered(len(parts[name]) + (1 if name == "own" else 0)))
    return parts


def reference(events: list[Event], ordered: bool = False) -> list[str]:
    """The composites over the merged trace, each event at its place (merged_seq; the own
    feed's arrival numbers are its log positions): sorted, or (``ordered``) in replay's
    order."""
    ranks = {"ab": 1, "cs": 2, "own": 0}
    merged = sorted((e.renumbered(merged_seq(ranks[name], e.seq))
                     for name, part in split(events).items() for e in part), key=lambda e: e.key)
    notes = evaluate(parse(DOC), merged, tick=1)
    found = [composite_line(n)[1] for n in notes]
    return found if ordered else sorted(found)


SERVICES = {"Across": ["ab", "cs"], "Pushed": ["ab", "cs"], "Keyed": ["ab"],
            "Own": ["mediator", "cs"]}
"""The services each profile's composites came through (the own feed: the mediator)."""


def check_entries(store: Store, events: list[Event]) -> None:
    """Each profile's composites in the log in replay's order, and each naming where its
    constituents came from: their source, type and time as published, and the services."""
    published = {e.id: e for e in events}
    items = [json.loads(i.payload) for i in store.read_notifications("alice", "s", 0, 100_000)]
    for profile in SERVICES:
        got = [i["cloudevent"] for i in items if i["profile"] == profile]
        want = [line for line in reference(events, ordered=True)
                if json.loads(line)["subject"] == profile]
        assert got == want, f"{profile}: not in replay's order"
    for item in items:
        ids = json.loads(item["cloudevent"])["data"]["constituents"]
        assert item["sources"] == [published[i].source for i in ids], item
        assert item["types"] == [published[i].type for i in ids], item
        assert item["times"] == [published[i].time for i in ids], item
        assert item["services"] == SERVICES[item["profile"]], item


def logged(store: Store) -> list[str]:
    items = store.read_notifications("alice", "s", 0, limit=100_000)
    ids = [i.composite_id for i in items]
    assert len(ids) == len(set(ids)), "a composite logged twice"
    return sorted(json.loads(i.payload)["cloudevent"] for i in items)


def play(pipeline: Pipeline, store: Store, links: dict[str, Link], parts: dict[str, list[Event]],
         draw: random.Random, until: float = 1.0) -> None:
    """Each input publishes a random batch in turn until the share ``until`` of its part is
    out: the services to themselves, the own feed to the mediator's event log."""
    sent = dict.fromkeys(parts, 0)
    while True:
        left = [n for n, part in parts.items() if sent[n] < int(len(part) * until)]
        if not left:
            return
        name = draw.choice(left)
        batch = parts[name][sent[name]:min(sent[name] + draw.randint(1, 6),
                                           int(len(parts[name]) * until))]
        sent[name] += len(batch)
        if name == "own":
            store.append_events([json.dumps(to_cloudevent(e)) for e in batch])
            pipeline.wake()
        else:
            link = links[name]
            assert isinstance(link, Producing)
            link.produce(batch)


def finish(pipeline: Pipeline, store: Store, links: dict[str, Link], end: int) -> None:
    """Every input's clock run well past the trace (so everything is decided)."""
    for link in links.values():
        assert isinstance(link, Producing)
        link.produce([], until=end)
    pipeline.advance(end)


def settled(store: Store, want: list[str], seconds: float = 20.0,
            pipeline: Pipeline | None = None) -> list[str]:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        assert pipeline is None or pipeline.error is None, pipeline.error
        got = logged(store)
        if len(got) >= len(want):
            time.sleep(0.2 if seconds <= 20 else 2.0)  # nothing more comes
            return logged(store)
        time.sleep(0.02)
    return logged(store)


def subscribe(pipeline: Pipeline, store: Store, text: str = DOC, name: str = "s") -> None:
    record = SubscriptionRecord("alice", name, text, 1, store.event_head(), None)
    store.put_subscription(record)
    pipeline.add(record)


@pytest.fixture(scope="module")
def spark() -> Any:
    """The local session (the one tests/test_spark.py starts, in the same xdist worker)."""
    from spark_jobs.session import build_session

    return build_session("local[2]", "evamed-tests")


def composer(kind: str, request: pytest.FixtureRequest, tmp_path: Path) -> dict[str, Any]:
    """The pipeline's composer settings: in process, or Spark (its jobs beside the store)."""
    if kind == "inprocess":
        return {}
    return {"composer": "spark", "spark": request.getfixturevalue("spark"),
            "spark_dir": str(tmp_path / "spark"), "trigger": "100 milliseconds"}


WAIT = {"inprocess": 20.0, "spark": 240.0}
"""Seconds to wait for the logs: the first micro-batch of a Spark job plans its query."""


SCENARIOS = [pytest.param("inprocess", seed, id=f"inprocess-{seed}") for seed in range(6)] + [
    pytest.param("spark", seed, id=f"spark-{seed}", marks=pytest.mark.xdist_group("spark"))
    for seed in range(2)]


@pytest.mark.parametrize(("kind", "seed"), SCENARIOS)
def test_autonomous_services_and_the_own_feed_give_the_reference_over_the_merged_trace(
        tmp_path: Path, kind: str, seed: int, request: pytest.FixtureRequest) -> None:
    """Two autonomous services (a/b at a streaming-SQL service, c at a Snoop service) and the
    own feed (d, published to the mediator): the profiles cross them; the producers publish
    in random batches and interleavings; the subscription's log is the reference's — with
    the Spark composer too, which composes Across (A at one service, C at the other), Keyed
    (its parameters no service takes: A and B filtered there) and Own (D of the own feed, C
    at a service) and leaves the pushed sequence to its runner."""
    store = SqliteStore(tmp_path / "s.db")
    links = services()
    pipeline = Pipeline(store, links, tick=1, idle_default=30.0,
                        **composer(kind, request, tmp_path))
    pipeline.start()
    subscribe(pipeline, store)
    if kind == "spark":
        assert pipeline.placement("alice", "s") == {
            "Across": "spark", "Pushed": "inprocess", "Keyed": "spark", "Own": "spark"}
    events = trace(seed)
    want = reference(events)
    assert len(want) > 5
    play(pipeline, store, links, split(events), random.Random(seed))
    finish(pipeline, store, links, events[-1].time + 100)
    assert settled(store, want, WAIT[kind], pipeline) == want
    check_entries(store, events)
    pipeline.stop()
    store.close()


CRASHES = [pytest.param("inprocess", seed, id=f"inprocess-{seed}") for seed in range(4)] + [
    pytest.param("spark", 0, id="spark-0", marks=pytest.mark.xdist_group("spark"))]


@pytest.mark.parametrize(("kind", "seed"), CRASHES)
def test_a_crash_of_the_mediator_loses_nothing_and_repeats_nothing(
        tmp_path: Path, kind: str, seed: int, request: pytest.FixtureRequest) -> None:
    """The mediator dies (its thread abandoned, nothing stopped cleanly) halfway; a new one on
    the same store resumes each session after the newest message it logged: the log holds
    every composite of the reference once. With Spark, its jobs die with it (their queries
    stopped where they are, as the JVM would be) and the new mediator's resume from their
    checkpoints over the composer log."""
    store = SqliteStore(tmp_path / "s.db")
    links = services()
    events = trace(seed)
    want = reference(events)
    parts = split(events)
    draw = random.Random(seed)
    settings = composer(kind, request, tmp_path)
    first = Pipeline(store, links, tick=1, idle_default=30.0, **settings)
    first.start()
    subscribe(first, store)
    play(first, store, links, parts, draw, until=0.5)
    time.sleep(0.2 if kind == "inprocess" else 5.0)
    first._halt = True  # the crash: no stop, no unsubscribing, nothing flushed
    first.wake()
    if first._sparks is not None:
        first._sparks.close()  # the JVM dies with the process
    for link in links.values():
        link.close()
    assert all(link.acked > 0 for link in links.values())  # type: ignore[attr-defined]
    second = Pipeline(store, links, tick=1, idle_default=30.0, **settings)
    second.start()
    for name, part in parts.items():
        parts[name] = part  # the rest of each part comes now
    play_rest(second, store, links, parts, draw)
    finish(second, store, links, events[-1].time + 100)
    assert settled(store, want, WAIT[kind], second) == want
    check_entries(store, events)
    second.stop()
    store.close()


def play_rest(pipeline: Pipeline, store: Store, links: dict[str, Link],
              parts: dict[str, list[Event]], draw: random.Random) -> None:
    """The second half of each part (what :func:`play` with ``until=0.5`` left)."""
    rest = {name: part[int(len(part) * 0.5):] for name, part in parts.items()}
    play(pipeline, store, links, rest, draw)


# -- the Spark composer composes notifications (issue 23 item 4)

ACROSS = CLASSES + "profile Across = ((all_dup(A); all_dup(C))_5us)_all_pairs\n"


def sparked(spark: Any, tmp_path: Path, **more: Any) -> dict[str, Any]:
    return {"composer": "spark", "spark": spark, "spark_dir": str(tmp_path / "spark"),
            "trigger": "100 milliseconds", **more}


def handles(pipeline: Pipeline) -> dict[str, int]:
    return {s.info.name: s.handles for s in pipeline.services()}


@pytest.mark.xdist_group("spark")
def test_a_spark_plans_filters_are_subscribed_at_their_services(tmp_path: Path,
                                                                spark: Any) -> None:
    """Whichever composer runs, every service is subscribed for what its plan says: a
    profile the Spark job composes (A filtered at ab, C at cs) registers those filters at
    both autonomous services, under durable names; explain shows them with the composer, and
    ListServices counts them. A second subscription of the same filters shares the
    registrations; a stop leaves them (durable: the next start takes them up and registers
    nothing new); the last subscription removed unsubscribes them."""
    store = SqliteStore(tmp_path / "s.db")
    links = services()
    ab, cs = links["ab"], links["cs"]
    assert isinstance(ab, Producing) and isinstance(cs, Producing)
    pipeline = Pipeline(store, links, tick=1, idle_default=30.0, **sparked(spark, tmp_path))
    pipeline.start()
    subscribe(pipeline, store, ACROSS, "one")
    assert list(ab.texts.values()) == ['SELECT a1.id FROM "a" AS a1']
    assert list(cs.texts.values()) == ["c CONTEXT unrestricted"]
    assert all(name.startswith("q-") for name in [*ab.names, *cs.names])  # shared, durable
    text, as_json = pipeline.explain(parse(ACROSS))
    assert "service ab evaluates: A" in text and "service cs evaluates: C" in text, text
    assert "composed by: spark" in text
    plan = json.loads(as_json)[0]
    assert plan["composer"] == "spark"
    assert [leaf["service"] for leaf in plan["root"]["children"]] == ["ab", "cs"]
    assert handles(pipeline) == {"ab": 1, "cs": 1}
    subscribe(pipeline, store, ACROSS, "two")
    assert handles(pipeline) == {"ab": 2, "cs": 2}
    registered = (dict(ab.names), dict(cs.names))
    assert len(registered[0]) == len(registered[1]) == 1
    pipeline.stop()
    assert (ab.names, cs.names) == registered
    again = Pipeline(store, links, tick=1, idle_default=30.0, **sparked(spark, tmp_path))
    again.start()
    assert (ab.names, cs.names) == registered and handles(again) == {"ab": 2, "cs": 2}
    assert again.remove("alice", "one")
    assert (ab.names, cs.names) == registered and handles(again) == {"ab": 1, "cs": 1}
    assert again.remove("alice", "two")
    assert ab.names == cs.names == {} and handles(again) == {"ab": 0, "cs": 0}
    again.stop()
    store.close()


def arrived(store: Store, name: str, count: int, pipeline: Pipeline,
            seconds: float = 240.0) -> list[dict[str, Any]]:
    """The subscription's log once it holds ``count`` entries."""
    deadline = time.monotonic() + seconds
    while len(store.read_notifications("alice", name, 0, 100_000)) < count:
        assert pipeline.error is None, pipeline.error
        assert time.monotonic() < deadline, "the Spark composer did not deliver in time"
        time.sleep(0.1)
    return [json.loads(i.payload) for i in store.read_notifications("alice", name, 0, 100_000)]


def own(events: list[Event]) -> list[str]:
    return [json.dumps(to_cloudevent(e)) for e in events]


@pytest.mark.xdist_group("spark")
def test_a_watermark_line_decides_the_last_instant_without_a_later_event(
        tmp_path: Path, spark: Any) -> None:
    """The own feed's newest instant may still get events: it is not released to the
    composer log, and the job does not decide it. A watermark (Publish's ``advance_to_us``)
    releases it, closed by a watermark line, and the job decides it — no later event needed
    (before: 3 of 5,937 composites waited for one)."""
    store = SqliteStore(tmp_path / "s.db")
    pipeline = Pipeline(store, {}, **sparked(spark, tmp_path))
    pipeline.start()
    subscribe(pipeline, store, 'class A = type == "a"\nprofile S = A\n')
    start = 1_772_445_600_000_000
    events = [Event(f"e{i}", "urn:a", "a", start + i * 1_000_000, i + 1) for i in range(3)]
    store.append_events(own(events))
    pipeline.wake()
    assert len(arrived(store, "s", 2, pipeline)) == 2
    time.sleep(3)  # a dozen micro-batches: the last instant waits
    assert len(store.read_notifications("alice", "s", 0, 100)) == 2
    lines = [c.line for c in store.read_composer(0)]
    assert json.loads(lines[-1]) == {"evamed:watermark": events[-1].time - 1}
    pipeline.advance(events[-1].time)
    got = arrived(store, "s", 3, pipeline)
    assert [json.loads(g["cloudevent"])["data"]["constituents"] for g in got] == [
        ["e0"], ["e1"], ["e2"]]
    assert json.loads(store.read_composer(0)[-1].line) == {"evamed:watermark": events[-1].time}
    pipeline.stop()
    store.close()


@pytest.mark.xdist_group("spark")
def test_spark_composites_name_their_provenance_however_far_the_job_lags(
        tmp_path: Path, spark: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The job is held back (its cap stays at 0) while the services and the own feed play a
    whole trace and the mediator releases it to the composer log; then it catches up in one
    go. Every composite names its constituents' source, type and time and the services they
    came through — the composer log answers for them, whatever the pipeline has forgotten
    (before: 2,126 of 2,150 Spark composites lacked them). Once the job has committed, the
    lines no composite still to come can name are trimmed, and the composites of a second
    trace, composed after the trim, name theirs all the same."""
    store = SqliteStore(tmp_path / "s.db")
    links = services()
    pipeline = Pipeline(store, links, tick=1, idle_default=30.0, batch=5, trim_every=1,
                        **sparked(spark, tmp_path))
    assert pipeline._sparks is not None
    slots = pipeline._sparks.slots
    with monkeypatch.context() as held:
        held.setattr(slots, "mark", lambda position: None)
        pipeline.start()
        subscribe(pipeline, store)
        whole = trace(3, 120)
        first = whole[:60]
        second = [Event(e.id, e.source, e.type, e.time + 1_000, e.seq, e.data)
                  for e in whole[60:]]
        draw = random.Random(3)
        play(pipeline, store, links, split(first), draw)
        end = first[-1].time + 100
        finish(pipeline, store, links, end)
        time.sleep(3)
        logged_so_far = store.read_notifications("alice", "s", 0, 1000)
        assert {json.loads(i.payload)["profile"] for i in logged_so_far} <= {"Pushed"}
        assert store.composer_head() > 10
    slots.mark(store.composer_head())  # the job catches up
    assert settled(store, reference(first), WAIT["spark"], pipeline) == reference(first)
    check_entries(store, first)
    deadline = time.monotonic() + 60
    tick = 0
    while store.read_composer(0)[0].position == 1:  # trimmed once the job has committed
        assert time.monotonic() < deadline, "the composer log was not trimmed"
        tick += 1  # an event no profile wants: a batch of the own feed, which trims
        store.append_events(own([Event(f"x{tick}", "urn:x", "x", end + tick, 1)]))
        pipeline.wake()
        time.sleep(0.5)
    events = first + second
    rest = split(events)
    rest = {name: part[len(split(first)[name]):] for name, part in rest.items()}
    play(pipeline, store, links, rest, draw)
    finish(pipeline, store, links, second[-1].time + 100)
    assert settled(store, reference(events), WAIT["spark"], pipeline) == reference(events)
    check_entries(store, events)
    pipeline.stop()
    store.close()


@pytest.mark.xdist_group("spark")
def test_a_client_receives_each_profiles_spark_composites_in_replay_order(
        tmp_path: Path, spark: Any) -> None:
    """A ``per`` profile's partitions spread over the job's buckets, whose rows reach the
    mediator in no particular order; published in chunks, the day spans many micro-batches.
    Each profile's composites are logged in replay's order (before: 15:03, 14:55, 15:07):
    each micro-batch's sorted by order key, and no micro-batch reports behind an earlier one
    (a micro-batch holds whole releases, and every key decides in it up to its newest
    watermark line: docs/spark.md, "Order")."""
    from eva.engine import Engine, EngineConfig

    text = ('class A = type == "a"\nclass B = type == "b"\n'
            "profile K per data.k = ((all_dup(A); last_dup(B))_30s)_all_pairs\n"
            "profile N per data.k = ((not A)_20s)_all_pairs\n"
            "profile L = ((all_dup(A), all_dup(B))_5s)_all_pairs\n")
    store = SqliteStore(tmp_path / "s.db")
    pipeline = Pipeline(store, {}, **sparked(spark, tmp_path))
    pipeline.start()
    subscribe(pipeline, store, text)
    draw = random.Random(5)
    start = 1_772_445_600_000_000
    events, t = [], start
    for i in range(300):
        t += draw.choice([0, 1_000_000, 3_000_000])
        events.append(Event(f"e{i}", "urn:s", draw.choice("ab"), t, i + 1,
                            {"k": draw.randrange(12)}))
    engine = Engine(EngineConfig())
    engine.add_document(parse(text), start=start)
    engine.begin(events[0].time - 1)
    notes = [n for e in events for n in engine.push(e)] + engine.close(events[-1].time)
    want = {p: [composite_line(n)[1] for n in notes if n.profile == p] for p in "KNL"}
    for at in range(0, len(events), 30):
        store.append_events(own(events[at:at + 30]))
        pipeline.wake()
        time.sleep(0.4)
    pipeline.advance(events[-1].time)
    got = arrived(store, "s", len(notes), pipeline)
    time.sleep(2)
    assert len(store.read_notifications("alice", "s", 0, 100_000)) == len(notes)
    for p in "KNL":
        assert [g["cloudevent"] for g in got if g["profile"] == p] == want[p], p
    assert all(len(want[p]) > 10 for p in "KNL")
    pipeline.stop()
    store.close()


def test_a_service_out_of_reach_holds_back_no_registration_and_gets_its_queries_when_back(
        tmp_path: Path) -> None:
    """Issue 24.4: a subscription added while its autonomous service is down is not waited
    on (the pipeline's lock is not held for the link's timeout): its queries are registered
    when the service is back, and the composites come."""
    from adapters.backends.service import serve as serve_base
    from adapters.client import BaseClient
    from tests.servers import free_port

    port = free_port()
    info = ServiceInfo("cs", "cg3", PRESETS["cg3"], Coverage(types=("a", "c")), autonomous=True)
    link = AutonomousLink(info, f"127.0.0.1:{port}", "t/cs", heartbeat=0.05, timeout=30.0)
    store = SqliteStore(tmp_path / "s.db")
    # The own feed (nothing comes there) soon idle: the origin is the service's.
    pipeline = Pipeline(store, {"cs": link}, tick=1, idle={"cs": 30.0}, idle_default=0.5)
    pipeline.start()
    try:
        record = SubscriptionRecord("alice", "s", CLASSES + PROFILES.splitlines()[0] + "\n", 1,
                                    store.event_head(), None)
        store.put_subscription(record)
        began = time.monotonic()
        pipeline.add(record)
        assert time.monotonic() - began < 10.0  # the link's timeout is 30 s
        assert pipeline.services()[0].status == "CONNECTING"
        running = serve_base("cg3", f"127.0.0.1:{port}", tick=1)
        try:
            deadline = time.monotonic() + 20
            while pipeline.services()[0].status != "SERVING" and time.monotonic() < deadline:
                time.sleep(0.05)
            time.sleep(0.3)  # the registration is made as the session opens
            with BaseClient(f"127.0.0.1:{port}") as client:
                client.publish([Event("a1", "urn:a", "a", 10, 0), Event("c2", "urn:c", "c", 12, 1)],
                               advance_to=100)
            deadline = time.monotonic() + 20
            while not logged(store) and time.monotonic() < deadline:
                time.sleep(0.05)
            assert len(logged(store)) == 1
        finally:
            running.stop()
    finally:
        pipeline.stop(2.0)
        link.close()
        store.close()


def test_a_query_refused_when_the_service_is_back_fails_the_subscription_visibly(
        tmp_path: Path) -> None:
    """Issue 24.4: a query registered while the service was out of reach and refused once it
    is back makes the subscriptions holding it failed, with the service's reason — not a
    silently empty stream."""
    store = SqliteStore(tmp_path / "s.db")
    links = services()
    pipeline = Pipeline(store, links, tick=1, idle_default=30.0)
    pipeline.start()
    try:
        subscribe(pipeline, store)
        assert pipeline.failure("alice", "s") is None
        link = links["cs"]
        assert isinstance(link, AutonomousLink)
        (handle, *_) = next(iter(pipeline._subs.values())).federations[0].handles["cs"]
        link.on_refused(handle, "the query is 70,000 bytes; a native query may be at most 65,536")
        failure = pipeline.failure("alice", "s")
        assert failure is not None and "service cs refuses its query" in failure
        assert "at most 65,536" in failure
    finally:
        pipeline.stop()
        store.close()


def test_a_query_a_service_ended_at_its_limit_suspends_every_holder_and_only_those(
        tmp_path: Path) -> None:
    """Issue 28: a service that ends a query at its work or store limit (its session says
    RESOURCE_EXHAUSTED) suspends the subscriptions holding it, as the mediator's own limits
    do — status and reason ``service_limit`` —: both that share the handle, and one that
    takes it later (restored, or subscribed anew); one with other handles at that service
    goes on."""
    store = SqliteStore(tmp_path / "s.db")
    links = services()
    pipeline = Pipeline(store, links, tick=1, idle_default=30.0)
    pipeline.start()
    only_a = CLASSES + "profile OnlyA = ((all_dup(A); all_dup(C))_5us)_all_pairs\n"
    only_b = CLASSES + "profile OnlyB = ((all_dup(B); all_dup(C))_5us)_all_pairs\n"

    def suspended(name: str) -> None:
        deadline = time.monotonic() + 10
        while pipeline.suspended("alice", name) is None:
            assert time.monotonic() < deadline, f"{name} never suspended"
            time.sleep(0.01)
        assert pipeline.suspended("alice", name) == "service_limit"
        failure = pipeline.failure("alice", name)
        assert failure is not None and failure.startswith("suspended: service ab ended")
        assert "work_limit" in failure

    try:
        subscribe(pipeline, store, only_a, name="s")
        subscribe(pipeline, store, only_a, name="t")  # shares the handle of A at ab
        subscribe(pipeline, store, only_b, name="other")  # a handle of its own at ab
        (shared,) = pipeline._subs[("alice", "s")].federations[0].handles["ab"]
        assert pipeline._subs[("alice", "t")].federations[0].handles["ab"] == [shared]
        assert shared not in pipeline._subs[("alice", "other")].federations[0].handles["ab"]
        link = links["ab"]
        assert isinstance(link, AutonomousLink)
        link.on_refused(shared, "RESOURCE_EXHAUSTED: work_limit: the query made more than "
                                "100,000 intermediate results")
        suspended("s")
        suspended("t")
        subscribe(pipeline, store, only_a, name="u")  # later: the same query, the same handle
        suspended("u")
        assert pipeline.failure("alice", "other") is None
        assert set(pipeline._subs) == {("alice", "other")}
    finally:
        pipeline.stop()
        store.close()


# ------------------------------------------------------------------ checkpoints (issue 24.1)


def crash(pipeline: Pipeline, links: dict[str, Link]) -> None:
    """The mediator dies: its thread abandoned, nothing stopped cleanly."""
    pipeline._halt = True
    pipeline.wake()
    for link in links.values():
        link.close()


def counting(store: SqliteStore) -> list[int]:
    """Count the log entries a pipeline reads from the store (the event log and link logs)."""
    reads = [0]
    events, links = store.read_events, store.read_link

    def read_events(after: int, limit: int = 1000) -> Any:
        found = events(after, limit)
        reads[0] += len(found)
        return found

    def read_link(link: str, after: int, limit: int = 1000) -> Any:
        found = links(link, after, limit)
        reads[0] += len(found)
        return found

    store.read_events = read_events  # type: ignore[method-assign]
    store.read_link = read_link  # type: ignore[method-assign]
    return reads


@pytest.mark.parametrize("seed", range(3))
def test_a_restart_from_a_checkpoint_reads_only_what_follows_it_and_loses_nothing(
        tmp_path: Path, seed: int, caplog: pytest.LogCaptureFixture) -> None:
    """Checkpoints every few entries; the mediator dies after most of the trace. The new one
    takes up the newest checkpoint — the runners' state, the positions, the progress — and
    reads the logs after it only: the log holds the reference's composites, each once."""
    store = SqliteStore(tmp_path / "s.db")
    links = services()
    events = trace(seed, 90)
    want = reference(events)
    parts = split(events)
    draw = random.Random(seed)
    first = Pipeline(store, links, tick=1, idle_default=30.0, checkpoint_events=25)
    first.start()
    subscribe(first, store)
    play(first, store, links, parts, draw, until=0.8)
    time.sleep(0.5)
    assert store.checkpoints(), "no checkpoint was written"
    crash(first, links)
    total = store.event_head() + sum(store.link_bounds(n)[0] for n in links)
    reads = counting(store)
    with caplog.at_level("INFO", logger="mediator.pipeline"):
        second = Pipeline(store, links, tick=1, idle_default=30.0, checkpoint_events=25)
        second.start()
    assert "restarting from checkpoint: 1 of 1 subscriptions restored" in caplog.text
    rest = {name: part[int(len(part) * 0.8):] for name, part in parts.items()}
    play(second, store, links, rest, draw)
    finish(second, store, links, events[-1].time + 100)
    assert settled(store, want) == want
    second.stop()
    assert reads[0] < total  # what the checkpoint held was not read again
    store.close()


def test_a_checkpoint_that_does_not_read_is_refused_and_the_one_before_taken(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The newest checkpoint is corrupt: refused by name in one line, the previous one is
    taken up; with none readable, the logs are replayed from the subscriptions' starts (here
    nothing was trimmed yet). The answers are the same."""
    import sqlite3

    events = trace(5, 80)
    want = reference(events)
    for broken in (1, 2):
        store = SqliteStore(tmp_path / f"s{broken}.db")
        links = services()
        parts = split(events)
        draw = random.Random(5)
        first = Pipeline(store, links, tick=1, idle_default=30.0)
        first.start()
        subscribe(first, store)
        for begin, share in ((0.0, 0.35), (0.35, 0.7)):
            play(first, store, links, {n: p[int(len(p) * begin):int(len(p) * share)]
                                       for n, p in parts.items()}, random.Random(5))
            time.sleep(0.4)
            with first._lock:
                first._checkpoint()
        crash(first, links)
        kept = store.checkpoints()
        assert len(kept) == 2
        with sqlite3.connect(tmp_path / f"s{broken}.db") as db:
            for number, _ in kept[:broken]:
                db.execute("UPDATE checkpoints SET data = ? WHERE number = ?",
                           (b"evamed-pipeline-checkpoint 1\nnot zlib", number))
        with caplog.at_level("INFO", logger="mediator.pipeline"):
            second = Pipeline(store, links, tick=1, idle_default=30.0)
            second.start()
        assert f"checkpoint {kept[0][0]} refused: a malformed checkpoint" in caplog.text
        if broken == 1:
            assert "restarting from checkpoint: 1 of 1 subscriptions restored" in caplog.text
        else:
            assert "replaying the logs from the subscriptions' starts" in caplog.text
        rest = {name: part[int(len(part) * 0.7):] for name, part in parts.items()}
        play(second, store, links, rest, draw)
        finish(second, store, links, events[-1].time + 100)
        assert settled(store, want) == want
        second.stop()
        store.close()
        caplog.clear()


def test_the_logs_are_bounded_by_the_checkpoints_not_by_history(tmp_path: Path) -> None:
    """With checkpoints, the event log keeps what the oldest kept checkpoint needs after its
    position: as the history grows tenfold, what the store holds does not."""

    def held(count: int) -> int:
        store = SqliteStore(tmp_path / f"h{count}.db")
        pipeline = Pipeline(store, {}, tick=1, checkpoint_events=100, trim_every=1)
        pipeline.start()
        text = (CLASSES + "profile Pair per data.k = ((all_dup(A); all_dup(B))_3us)"
                "_all_pairs\n")
        record = SubscriptionRecord("alice", "s", text, 1, store.event_head(), None)
        store.put_subscription(record)
        pipeline.add(record)
        for start in range(0, count, 100):
            store.append_events([json.dumps(to_cloudevent(Event(
                f"e{i}", "urn:x", "ab"[i % 2], 10 + i, 0, {"k": i // 2})))
                for i in range(start, start + 100)])
            pipeline.wake()
            deadline = time.monotonic() + 10
            while pipeline.position < store.event_head() and time.monotonic() < deadline:
                time.sleep(0.01)
        with pipeline._lock:
            pipeline._checkpoint()
            pipeline._checkpoint()
            pipeline._trim()
        kept = len(store.read_events(0, 1_000_000))
        pipeline.stop()
        store.close()
        return kept

    small, large = held(500), held(5_000)
    assert large <= max(small, 200), (small, large)
