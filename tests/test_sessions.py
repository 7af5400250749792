"""Durable sessions of autonomous base services (eva.base.v1 Open/Register/Deregister/Ack;
adapters/backends/service.py, adapters/backends/sessions.py) and their client
(adapters/session.py): the watermark contract against a fresh evaluation for every group,
constituents in full with arrival numbers, messages kept across disconnections and
acknowledged, retention and timeout, duplicates, heartbeats, and — with real `evamed
base-service` processes — a SIGKILL with `--data` and a service stopped for 10 s, after which
nothing is lost or repeated."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.rpc import error_details_pb2
from grpc_status import rpc_status
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from adapters.backends.native import NativeQueryError, run
from adapters.backends.registry import GROUPS, language
from adapters.backends.service import Running, serve
from adapters.client import cloudevent_json
from adapters.federation import TICK_SEQ, through_group
from adapters.links import InProcessLink
from adapters.session import Message, Session
from adapters.wire import base_pb2, base_pb2_grpc
from eva import ast
from eva.classes import label, ticks_between
from eva.events import Event, tick_event, to_cloudevent
from tests.strategies import documents, trace_of, traces
from tests.test_base_services import EVAMED
from tests.test_federated import FEDERATED_CLASSES, NAMES, SOURCES, service
from tests.test_remote_link import free_port
from transforms.dialects.base import Detection

PAIRS = 'AND([type = "a"], [type = "b"])'
ONLY_A = '[type = "a"]'


# ------------------------------------------------------------------ helpers


def stub_of(address: str) -> tuple[grpc.Channel, Any]:
    channel = grpc.insecure_channel(address)
    return channel, base_pb2_grpc.BaseServiceStub(channel)


def publish(stub: Any, events: list[Event], advance: int | None = None) -> Any:
    """One Publish message (the call's reply)."""
    return stub.Publish(iter([base_pb2.PublishRequest(
        cloudevents=[cloudevent_json(e) for e in events], advance_to_us=advance or 0)]))


def shifted(events: list[Event], offset: int, tag: str) -> list[Event]:
    """The events ``offset`` µs later, their ids prefixed by ``tag`` (unique at a service that
    has seen other examples: a repeated (source, id) would be a duplicate)."""
    return [Event(f"{tag}-{e.id}", e.source, e.type, e.time + offset, e.seq, e.data)
            for e in events]


class Inbox:
    """What a Session hands to on_message (and on_lost), waited on by the test."""

    def __init__(self) -> None:
        self.messages: list[Message] = []
        self.lost: list[str] = []
        self._changed = threading.Condition()

    def __call__(self, message: Message) -> None:
        with self._changed:
            self.messages.append(message)
            self._changed.notify_all()

    def on_lost(self, reason: str) -> None:
        with self._changed:
            self.lost.append(reason)
            self._changed.notify_all()

    def wait(self, condition: Callable[[], bool], seconds: float = 10.0) -> None:
        with self._changed:
            assert self._changed.wait_for(condition, seconds), "timed out"

    def numbered(self) -> list[Message]:
        return [m for m in self.messages if m.seq > 0]

    def watermark(self) -> int | None:
        marks = [m.watermark for m in self.messages if m.watermark is not None]
        return marks[-1] if marks else None

    def found(self, ident: str) -> list[Detection]:
        return [d for m in self.numbered() for i, d in m.detections if i == ident]


def ids(detections: list[Detection]) -> list[tuple[str, ...]]:
    return [tuple(e.id for e in d.constituents) for d in detections]


def cut(session: Session) -> None:
    """Cancel the session's stream under it (as a dropped connection would end it), once it
    is serving."""
    deadline = time.monotonic() + 10
    while (conn := session._conn) is None:
        assert time.monotonic() < deadline, "never served"
        time.sleep(0.01)
    conn.call.cancel()


def kept_messages(port: int, session: str = "s") -> list[bytes]:
    """Every message the service keeps for ``session``, serialized (up to the first
    heartbeat: the kept ones come first)."""
    channel, stub = stub_of(f"127.0.0.1:{port}")
    with channel:
        call = stub.Open(base_pb2.OpenRequest(session=session, heartbeat_ms=100))
        assert next(call).ready
        out = []
        for m in call:
            if m.seq == 0:
                break
            out.append(m.SerializeToString())
        call.cancel()
        return out


def code_and_details(call: Callable[[], Any]) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.RpcError) as info:
        call()
    return info.value.code(), info.value.details()


@pytest.fixture
def cg1() -> Iterator[Running]:
    running = serve("cg1", "127.0.0.1:0")
    yield running
    running.stop()


class Process:
    """`evamed base-service` as its own process on a fixed loopback port (so that it can be
    killed, stopped and started again where the client expects it)."""

    def __init__(self, group: str, *options: str) -> None:
        self.group = group
        self.address = f"127.0.0.1:{free_port()}"
        self.options = options
        self.start()

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [EVAMED, "base-service", "--group", self.group, "--listen", self.address,
             *self.options], stdout=subprocess.PIPE, text=True,
            env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])})
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        assert line.startswith(f"serving {self.group} on "), line

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)  # a stopped one cannot drain
            self.proc.terminate()
            self.proc.wait(timeout=10)


# ------------------------------------------------------------------ 1. the watermark contract


@pytest.fixture(scope="module")
def services() -> Iterator[dict[str, Running]]:
    """One in-process service per group (tick 1 µs, as the strategies' time class needs),
    shared by the examples: each example's trace comes later, with ids of its own."""
    running: dict[str, Running] = {}
    yield running
    for r in running.values():
        r.stop()


def report_time(d: Detection) -> int:
    """When a detection is reported: a peer's (cg5) report key, else its occurrence time."""
    emitted = d.extra.get("emitted")
    return int(emitted[0]) if emitted else d.time


@pytest.mark.parametrize("group", GROUPS[1:])
def test_a_sessions_watermark_covers_what_a_fresh_evaluation_reports_up_to_it(
        services: dict[str, Running], group: str) -> None:
    """Random queries (random profiles rendered in the group's dialect) × random traces
    published in random Publish messages, some with an advance: once a message with watermark
    W has arrived, what the session has delivered for each registration starts with what a
    fresh evaluation of the same query over the events at or before W, its clock run to W,
    reports; and no detection arrives reported at or before a watermark received earlier."""
    if group not in services:
        services[group] = serve(group, "127.0.0.1:0", tick=1)
    address = f"127.0.0.1:{services[group].port}"
    info = service(group, group)
    examples = iter(range(10**6))

    @settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
    @given(documents(3, FEDERATED_CLASSES, NAMES), traces(16, sources=SOURCES), st.data())
    def prop(doc: ast.Document, trace: list[Event], data: st.DataObject) -> None:
        texts = through_group(language(group, 1), doc, tick=1).rendered
        if not texts or not trace:
            return
        n = next(examples)
        trace = shifted(trace, (n + 1) * 10_000, f"x{n}")
        every = doc.class_map()["T"].body
        assert isinstance(every, ast.Every)
        ticks = [tick_event("T", t, label(t), TICK_SEQ + i) for i, t in enumerate(
            ticks_between(every, trace[0].time - 1, trace[-1].time))]
        stream = sorted([*trace, *(ticks if not info.capability.clock else [])],
                        key=lambda e: e.key)
        channel, stub = stub_of(address)
        session = f"prop-{group}-{n}"
        try:
            call = stub.Open(base_pb2.OpenRequest(session=session, create=True,
                                                  heartbeat_ms=60_000))
            assert next(call).ready
            for i, text in enumerate(texts):
                stub.Register(base_pb2.RegisterRequest(session=session, subscription_id=str(i),
                                                       query=text))
            final: int | None = None
            at = 0
            while at < len(stream):
                batch = stream[at:at + data.draw(st.integers(1, 5))]
                at += len(batch)
                newest = batch[-1].time
                advance = None  # an advance stops short of the next event (none late)
                bound = stream[at].time - 1 if at < len(stream) else newest + 3
                if bound >= newest and data.draw(st.booleans()):
                    advance = newest + data.draw(st.integers(0, bound - newest))
                reply = publish(stub, batch, advance)
                assert reply.rejected == 0 or group == "cg5", list(reply.errors)
                final = max(newest - 1, advance or newest - 1, final or newest - 1)
            delivered: dict[str, list[Detection]] = {str(i): [] for i in range(len(texts))}
            earlier: int | None = None
            for message in call:
                for d in message.detections:
                    found = detection_of(d)
                    assert earlier is None or report_time(found) > earlier, (group, earlier)
                    delivered[d.subscription_id].append(found)
                if not message.has_watermark:
                    continue
                w = message.watermark_us
                assert earlier is None or w >= earlier
                earlier = w
                fresh = InProcessLink(info, language(group, 1))
                handles = [fresh.subscribe(text) for text in texts]
                before = fresh.publish([e for e in stream if e.time <= w], until=w)
                for i, h in enumerate(handles):
                    want = shape(before[h])
                    assert shape(delivered[str(i)])[:len(want)] == want, (group, w, texts[i])
                if w >= final:
                    break
            call.cancel()
        finally:  # the next examples' events are not for these
            for i in range(len(texts)):
                stub.Deregister(base_pb2.DeregisterRequest(session=session,
                                                           subscription_id=str(i)))
            channel.close()

    prop()


def detection_of(d: Any) -> Detection:
    from adapters.client import detection
    from eva.events import from_json_line

    return detection(d, [from_json_line(c, seq=a) for c, a in zip(d.constituents, d.arrivals,
                                                                 strict=True)])


def shape(detections: list[Detection]) -> list[tuple[Any, ...]]:
    return [(d.time, tuple(e.id for e in d.constituents), d.text) for d in detections]


# ------------------------------------------------------------------ 2. what a message holds


def test_constituents_come_in_full_with_arrival_numbers_registrations_in_order(
        cg1: Running) -> None:
    """One Publish message's detections of two registrations come in one message: the
    registrations in registration order, each one's in its evaluator's order; constituents
    as CloudEvents JSON in full (data too), each with the arrival number the service gave it
    (Event.seq of the detection's events)."""
    inbox = Inbox()
    address = f"127.0.0.1:{cg1.port}"
    session = Session(address, "order", "cg1", on_message=inbox, heartbeat=10)
    try:
        session.register("pairs", PAIRS)
        session.register("b", '[type = "b"]')
        trace = [Event("a1", "s", "a", 1, 0, {"k": [1, 2], "text": "é"}),
                 Event("b1", "s", "b", 2, 1, {"k": 3}), Event("a2", "s", "a", 3, 2)]
        channel, stub = stub_of(address)
        with channel:
            assert publish(stub, trace).accepted == 3
        inbox.wait(lambda: session.delivered == 1)
    finally:
        session.close()
    (message,) = inbox.numbered()
    assert message.seq == 1 and message.watermark == 2 and message.origin == 0
    got = [(ident, [(to_cloudevent(e), e.seq) for e in d.constituents])
           for ident, d in message.detections]
    a1, b1, a2 = ((to_cloudevent(e), e.seq) for e in trace)
    assert got == [("pairs", [a1, b1]), ("pairs", [a2, b1]), ("b", [b1])]


def test_a_message_over_the_packs_bound_is_split_the_watermark_on_its_last_part(
        cg1: Running, monkeypatch: pytest.MonkeyPatch) -> None:
    """More detections than PACK_DETECTIONS from one Publish message: consecutive seqs, in
    order; every part but the last carries the watermark from before that message (true: the
    rest of its detections are still to come), the last the new one."""
    from adapters.backends import service

    monkeypatch.setattr(service, "PACK_DETECTIONS", 2)
    channel, stub = stub_of(f"127.0.0.1:{cg1.port}")
    with channel:
        call = stub.Open(base_pb2.OpenRequest(session="split", create=True,
                                              heartbeat_ms=60_000))
        assert next(call).ready
        stub.Register(base_pb2.RegisterRequest(session="split", subscription_id="a",
                                               query=ONLY_A))
        publish(stub, trace_of("a0@1"))
        publish(stub, trace_of("a1@5 a2@6 a3@7 a4@8 a5@9"))
        got = []
        for m in call:
            got.append((m.seq, [json.loads(d.constituents[0])["id"] for d in m.detections],
                        m.watermark_us))
            if m.seq == 4:
                break
        call.cancel()
    assert got == [(1, ["a0"], 0), (2, ["a1", "a2"], 0), (3, ["a3", "a4"], 0), (4, ["a5"], 8)]


def test_the_origin_is_the_watermark_at_creation_or_the_first_event_after_it(
        cg1: Running) -> None:
    """A session created before any event starts at its first event's time less 1; one
    created once the service has a watermark starts there; the origin never moves."""
    channel, stub = stub_of(f"127.0.0.1:{cg1.port}")
    with channel:
        early = stub.Open(base_pb2.OpenRequest(session="early", create=True))
        ready = next(early)
        assert ready.ready and not ready.has_origin and not ready.has_watermark
        assert ready.retention == 100_000
        publish(stub, trace_of("a1@10 a2@20"))
        late = stub.Open(base_pb2.OpenRequest(session="late", create=True))
        ready = next(late)
        assert (ready.origin_us, ready.watermark_us) == (19, 19)
        publish(stub, trace_of("a3@30", "t"), advance=40)
        progress = next(m for m in early if m.has_watermark and m.watermark_us == 40)
        assert (progress.seq, progress.origin_us) == (0, 9)
        early.cancel()
        late.cancel()


def test_the_protocols_refusals_are_clear(cg1: Running) -> None:
    """Register: a bad query is INVALID_ARGUMENT with the position (a NativeQueryError at
    the client), the same id with the same query is nothing, with another ALREADY_EXISTS, an
    unknown session NOT_FOUND; Deregister says whether it found it; an event at or before the
    watermark is refused as late; a newer stream supersedes an older one (ABORTED)."""
    address = f"127.0.0.1:{cg1.port}"
    channel, stub = stub_of(address)
    with channel:
        caps = stub.Capabilities(base_pb2.CapabilitiesRequest())
        assert caps.sessions and caps.retention == 100_000
        first = stub.Open(base_pb2.OpenRequest(session="s", create=True))
        assert next(first).ready

        def register(ident: str, query: str, session: str = "s") -> Any:
            return stub.Register(base_pb2.RegisterRequest(session=session,
                                                          subscription_id=ident, query=query))

        with pytest.raises(grpc.RpcError) as refused:
            register("x", 'AND([type = "a"])')
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert refused.value.details() == ("boolean query:1:17: error: found ')', expected ','"
                                           '\n  AND([type = "a"])\n                  ^')
        status = rpc_status.from_call(refused.value)
        assert status is not None
        bad = error_details_pb2.BadRequest()
        status.details[0].Unpack(bad)
        assert [(v.field, v.description) for v in bad.field_violations] == [
            ("query", "line 1, column 17: found ')', expected ','")]
        register("a", ONLY_A)
        register("a", ONLY_A)
        assert code_and_details(lambda: register("a", PAIRS)) == (
            grpc.StatusCode.ALREADY_EXISTS, "subscription 'a' of session s is registered with "
            "another query (deregister it first)")
        code, details = code_and_details(lambda: register("a", ONLY_A, "nobody"))
        assert code == grpc.StatusCode.NOT_FOUND and details.startswith(
            "session nobody is not known to this base service")
        assert code_and_details(lambda: next(stub.Open(base_pb2.OpenRequest(
            session="nobody"))))[0] == grpc.StatusCode.NOT_FOUND
        reply = publish(stub, trace_of("a1@5 a0@4"))  # in one message: not late
        assert (reply.accepted, reply.rejected) == (2, 0)
        reply = publish(stub, trace_of("a2@5 a3@4", "t"))  # the watermark is 4: a2 may follow
        assert (reply.accepted, reply.rejected) == (1, 1)
        assert list(reply.errors) == ["event 2: late: at or before the watermark 4 µs (the "
                                      "sessions do not see it)"]
        found = stub.Deregister(base_pb2.DeregisterRequest(session="s", subscription_id="a"))
        again = stub.Deregister(base_pb2.DeregisterRequest(session="s", subscription_id="a"))
        assert (found.found, again.found) == (True, False)
        second = stub.Open(base_pb2.OpenRequest(session="s"))
        assert next(second).ready
        code, details = code_and_details(lambda: list(first))
        assert (code, details) == (grpc.StatusCode.ABORTED, "superseded by a newer stream")
        second.cancel()

    inbox = Inbox()
    session = Session(address, "t", "cg1", on_message=inbox)
    try:
        with pytest.raises(NativeQueryError, match="1:17: error: found"):
            session.register("x", 'AND([type = "a"])')
        session.register("a", ONLY_A)
        with pytest.raises(ValueError, match="registered with another query"):
            session.register("a", PAIRS)
    finally:
        session.close()


def test_a_service_that_predates_sessions_is_named_as_such() -> None:
    """A service whose Capabilities do not say `sessions` (one built before them): the client
    says so, naming the address and what to configure, and the session is lost."""

    class Old(base_pb2_grpc.BaseServiceServicer):  # type: ignore[misc]
        def Capabilities(self, request: Any, context: Any) -> Any:
            return base_pb2.CapabilitiesReply(group="cg1", language="boolean")

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    base_pb2_grpc.add_BaseServiceServicer_to_server(Old(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    inbox = Inbox()
    session = Session(f"127.0.0.1:{port}", "s", "cg1", on_message=inbox,
                      on_lost=inbox.on_lost)
    try:
        inbox.wait(lambda: bool(inbox.lost))
        reason = (f"the base service at 127.0.0.1:{port} predates durable sessions "
                  '(eva.base.v1 Open): configure it with mode = "fed"')
        assert inbox.lost == [reason] and session.status() == "LOST"
        with pytest.raises(ConnectionError, match="predates durable sessions"):
            session.register("a", ONLY_A)
    finally:
        session.close()
        server.stop(0)


# ------------------------------------------------------------------ 3. durability


def test_a_session_gets_every_message_once_in_order_across_disconnections(
        cg1: Running) -> None:
    """Producers keep publishing while the client's stream is cancelled (it reconnects by
    itself) and while no client is connected at all (a new one resumes after what the first
    delivered): every message exactly once, in order."""
    address = f"127.0.0.1:{cg1.port}"
    channel, stub = stub_of(address)
    inbox = Inbox()
    first = Session(address, "durable", "cg1", on_message=inbox)
    events = trace_of(" ".join(f"a{i}@{i + 1}" for i in range(60)))
    try:
        first.register("a", ONLY_A)
        for i, e in enumerate(events[:40]):
            publish(stub, [e])
            if i in (10, 25):
                cut(first)
        inbox.wait(lambda: first.delivered == 40)
    finally:
        first.close()
    for e in events[40:]:
        publish(stub, [e])  # nobody connected: kept
    second = Session(address, "durable", "cg1", on_message=inbox,
                     resume_after=first.delivered)
    try:
        inbox.wait(lambda: second.delivered == 60)
        second.ack(60)
    finally:
        second.close()
        channel.close()
    assert [m.seq for m in inbox.numbered()] == list(range(1, 61))
    assert ids(inbox.found("a")) == [(e.id,) for e in events]


def test_acknowledged_messages_are_not_sent_again(cg1: Running) -> None:
    address = f"127.0.0.1:{cg1.port}"
    channel, stub = stub_of(address)
    inbox = Inbox()
    first = Session(address, "acks", "cg1", on_message=inbox)
    try:
        first.register("a", ONLY_A)
        for e in trace_of("a1@1 a2@2 a3@3 a4@4"):
            publish(stub, [e])
        inbox.wait(lambda: first.delivered == 4)
        first.ack(3)
    finally:
        first.close()  # sends the last acknowledgement
    again = Inbox()
    second = Session(address, "acks", "cg1", on_message=again)  # resume_after 0: all kept
    try:
        publish(stub, trace_of("a5@5"))
        again.wait(lambda: second.delivered == 5)
    finally:
        second.close()
        channel.close()
    assert [(m.seq, ids([d for _, d in m.detections])) for m in again.numbered()] == [
        (4, [("a4",)]), (5, [("a5",)])]


def test_a_client_resuming_a_session_the_service_does_not_know_is_told(cg1: Running) -> None:
    """A caller that resumes after messages it had (a restarted mediator) does not create the
    session: if the service forgot it (restarted without --data), the session is lost rather
    than silently started anew with those seq numbers skipped."""
    inbox = Inbox()
    session = Session(f"127.0.0.1:{cg1.port}", "forgotten", "cg1", on_message=inbox,
                      on_lost=inbox.on_lost, resume_after=5)
    try:
        inbox.wait(lambda: bool(inbox.lost))
        assert inbox.lost[0].startswith("session forgotten is not known to this base service")
        assert session.status() == "LOST" and cg1.service.sessions == []
    finally:
        session.close()


def test_a_session_over_its_retention_is_dropped_and_the_client_told() -> None:
    """More unacknowledged messages than --retention: the session is dropped (registrations,
    messages), its stream ends, on_lost is called once, and every later call about it is
    FAILED_PRECONDITION saying why and what to do — until it is created anew."""
    running = serve("cg1", "127.0.0.1:0", retention=3)
    address = f"127.0.0.1:{running.port}"
    channel, stub = stub_of(address)
    inbox = Inbox()
    session = Session(address, "full", "cg1", on_message=inbox, on_lost=inbox.on_lost)
    try:
        session.register("a", ONLY_A)
        for e in trace_of("a1@1 a2@2 a3@3 a4@4"):
            publish(stub, [e])
        inbox.wait(lambda: bool(inbox.lost))
        reason = ("session full was dropped: more than 3 messages unacknowledged (the "
                  "service's --retention); open it anew (create) and register again")
        assert inbox.lost == [reason] and session.status() == "LOST"
        for call in (lambda: stub.Register(base_pb2.RegisterRequest(
                         session="full", subscription_id="a", query=ONLY_A)),
                     lambda: stub.Ack(base_pb2.AckRequest(session="full", seq=1)),
                     lambda: next(stub.Open(base_pb2.OpenRequest(session="full")))):
            assert code_and_details(call) == (grpc.StatusCode.FAILED_PRECONDITION, reason)
        anew = stub.Open(base_pb2.OpenRequest(session="full", create=True))
        assert next(anew).ready
        stub.Register(base_pb2.RegisterRequest(session="full", subscription_id="a",
                                               query=ONLY_A))
        publish(stub, trace_of("a5@5"))
        assert next(m for m in anew if m.seq).seq == 1
        anew.cancel()
    finally:
        session.close()
        channel.close()
        running.stop()


def test_a_session_without_a_stream_for_its_timeout_is_dropped() -> None:
    running = serve("cg1", "127.0.0.1:0", session_timeout=0.2)
    channel, stub = stub_of(f"127.0.0.1:{running.port}")
    try:
        call = stub.Open(base_pb2.OpenRequest(session="idle", create=True))
        assert next(call).ready
        time.sleep(0.5)  # open: kept
        assert running.service.sessions == ["idle"]
        call.cancel()
        deadline = time.monotonic() + 5
        while running.service.sessions and time.monotonic() < deadline:
            time.sleep(0.05)
        assert code_and_details(lambda: next(stub.Open(base_pb2.OpenRequest(
            session="idle")))) == (
            grpc.StatusCode.FAILED_PRECONDITION, "session idle was dropped: no open stream for "
            "0.2 s (the service's --session-timeout); open it anew (create) and register again")
    finally:
        channel.close()
        running.stop()


# ------------------------------------------------------------------ 4. persistence


PEER = ('class A = type == "a"\nclass B = type == "b"\n'
        'profile P = ((all_dup(A); all_dup(B))_5us)_all_pairs\n'
        'profile N = ((not A)_3us)_all_pairs\n')


def test_a_restarted_service_regenerates_the_same_messages_from_its_log(tmp_path: Path) -> None:
    """--data: a service stopped and started again replays its log — registrations made and
    withdrawn between messages, a clock-driven peer query — and sends the very same messages
    (seq numbers, detections, arrival numbers, watermarks); a re-sent event is a duplicate
    across the restart; the numbering of arrivals goes on."""
    running = serve("cg5", "127.0.0.1:0", tick=1, data=tmp_path)
    channel, stub = stub_of(f"127.0.0.1:{running.port}")
    with channel:
        call = stub.Open(base_pb2.OpenRequest(session="s", create=True))
        assert next(call).ready
        call.cancel()

        def register(ident: str, query: str) -> None:
            stub.Register(base_pb2.RegisterRequest(session="s", subscription_id=ident,
                                                   query=query))

        register("p", PEER)
        events = trace_of("a1@10 b1@12 a2@20 b2@21 a3@30 b3@40 a4@41 b4@50")
        publish(stub, events[:2])
        register("q", PEER)
        publish(stub, events[2:4], advance=25)
        stub.Deregister(base_pb2.DeregisterRequest(session="s", subscription_id="p"))
        publish(stub, events[4:6])
        register("p", 'class A = type == "a"\nprofile A1 = A\n')  # the id again, anew
        publish(stub, events[6:])
    before = kept_messages(running.port)
    assert len(before) >= 3
    running.stop()
    again = serve("cg5", "127.0.0.1:0", tick=1, data=tmp_path)
    try:
        assert kept_messages(again.port) == before
        channel, stub = stub_of(f"127.0.0.1:{again.port}")
        with channel:
            reply = publish(stub, [*events[-2:], *trace_of("a9@60", "t")], advance=60)
            assert (reply.accepted, reply.duplicates) == (1, 2)
            call = stub.Open(base_pb2.OpenRequest(session="s", resume_after=len(before)))
            message = next(m for m in call if m.seq)
            call.cancel()
    finally:
        again.stop()
    found = {json.loads(c)["id"]: a for d in message.detections
             for c, a in zip(d.constituents, d.arrivals, strict=True)}
    assert found["a9"] > 7  # after the eight events logged before the restart


def fast_channel(address: str) -> tuple[grpc.Channel, Any]:
    """A producer's channel that finds a restarted service within half a second."""
    channel = grpc.insecure_channel(address, options=[
        ("grpc.initial_reconnect_backoff_ms", 100), ("grpc.min_reconnect_backoff_ms", 100),
        ("grpc.max_reconnect_backoff_ms", 500)])
    return channel, base_pb2_grpc.BaseServiceStub(channel)


class Producer(threading.Thread):
    """Publishes its messages in order, each until the service accepts it: a message whose
    call failed is sent again (the service counts what it had logged as duplicates)."""

    def __init__(self, address: str, messages: list[list[Event]], pause: float = 0.02) -> None:
        super().__init__(daemon=True)
        self.channel, self.stub = fast_channel(address)
        self.messages = messages
        self.pause = pause  # between messages: still publishing when the test strikes
        self.done = 0
        self.failures = 0
        self.duplicates = 0

    def run(self) -> None:
        for message in self.messages:
            while True:
                try:
                    reply = publish(self.stub, message)
                    break
                except grpc.RpcError:
                    self.failures += 1
                    time.sleep(0.05)
            assert reply.rejected == 0, list(reply.errors)
            self.duplicates += reply.duplicates
            self.done += 1
            time.sleep(self.pause)
        self.channel.close()


def test_a_killed_service_with_data_loses_nothing_and_repeats_nothing(tmp_path: Path) -> None:
    """`evamed base-service --data DIR` killed (SIGKILL) while a producer publishes and the
    client reads and acknowledges; started again on the same port and directory: the same
    Session object reconnects by itself and gets every detection exactly once, equal to one
    evaluation of the whole trace in this process; each event keeps its arrival number."""
    proc = Process("cg1", "--data", str(tmp_path))
    inbox = Inbox()
    holder: list[Session] = []

    def on_message(message: Message) -> None:
        inbox(message)
        if message.seq:
            holder[0].ack(message.seq)  # as the mediator would once it has stored it

    events = [Event(f"{'ab'[i % 2]}{i}", "s", "ab"[i % 2], i + 1, i) for i in range(90)]
    messages = [events[i:i + 3] for i in range(0, 90, 3)]
    try:
        holder.append(Session(proc.address, "killed", "cg1", on_message=on_message,
                              heartbeat=0.1, timeout=5))
        session = holder[0]
        session.register("pairs", PAIRS)
        session.register("a", ONLY_A)
        producer = Producer(proc.address, messages)
        producer.start()
        deadline = time.monotonic() + 20
        while producer.done < 10:
            assert time.monotonic() < deadline
            time.sleep(0.005)
        proc.kill()
        time.sleep(0.3)
        proc.start()
        producer.join(timeout=30)
        assert producer.done == len(messages) and producer.failures  # some were sent again
        inbox.wait(lambda: (inbox.watermark() or 0) >= 89, 30)
        assert session.status() == "SERVING"
    finally:
        if holder:
            holder[0].close()
        proc.stop()
    seqs = [m.seq for m in inbox.numbered()]
    assert seqs == list(range(1, len(seqs) + 1))
    cg1 = language("cg1")
    for ident, query in (("pairs", PAIRS), ("a", ONLY_A)):
        assert ids(inbox.found(ident)) == ids(run(cg1.parse(query), events)), ident
    arrivals: dict[str, set[int]] = {}
    for d in [*inbox.found("pairs"), *inbox.found("a")]:
        for e in d.constituents:
            arrivals.setdefault(e.id, set()).add(e.seq)
    assert all(len(numbers) == 1 for numbers in arrivals.values())
    in_order = [arrivals[e.id].pop() for e in events if e.id in arrivals]
    assert in_order == sorted(set(in_order))


# ------------------------------------------------------------------ 5. out of reach


def test_a_service_out_of_reach_for_10_s_loses_nothing() -> None:
    """The service stopped (SIGSTOP) for 10 s — its connections open but silent: the client
    notices the silence (no heartbeat), keeps trying, and when the service is back (SIGCONT)
    resumes after what it had: nothing lost, nothing twice."""
    proc = Process("cg1")
    inbox = Inbox()
    session = Session(proc.address, "stopped", "cg1", on_message=inbox, heartbeat=0.1)
    channel, stub = fast_channel(proc.address)
    events = trace_of(" ".join(f"a{i}@{i + 1}" for i in range(10)))
    try:
        session.register("a", ONLY_A)
        for e in events[:5]:
            publish(stub, [e])
        inbox.wait(lambda: session.delivered == 5)
        proc.proc.send_signal(signal.SIGSTOP)
        stopped = time.monotonic()
        deadline = stopped + 8
        while session.status() == "SERVING":
            assert time.monotonic() < deadline, "the silence went unnoticed"
            time.sleep(0.05)
        time.sleep(max(0.0, 10 - (time.monotonic() - stopped)))
        proc.proc.send_signal(signal.SIGCONT)
        for e in events[5:]:
            publish(stub, [e])
        inbox.wait(lambda: session.delivered == 10, 20)
    finally:
        session.close()
        channel.close()
        proc.stop()
    assert [m.seq for m in inbox.numbered()] == list(range(1, 11))
    assert ids(inbox.found("a")) == [(e.id,) for e in events]


# ------------------------------------------------------------------ 6. heartbeats, duplicates


def test_heartbeats_arrive_while_idle_and_carry_the_watermark(cg1: Running) -> None:
    inbox = Inbox()
    session = Session(f"127.0.0.1:{cg1.port}", "beats", "cg1", on_message=inbox,
                      heartbeat=0.05)
    channel, stub = stub_of(f"127.0.0.1:{cg1.port}")
    try:
        session.register("a", ONLY_A)
        publish(stub, trace_of("b1@7"))  # no detection: the watermark comes in a heartbeat
        time.sleep(0.6)
        beats = [m for m in inbox.messages if m.seq == 0]
        assert len(beats) >= 6 and not inbox.numbered()
        assert beats[-1].watermark == 6 and beats[-1].origin == 6
    finally:
        session.close()
        channel.close()


def test_re_sent_events_are_duplicates_not_evaluated_again(cg1: Running) -> None:
    """An event whose (source, id) the service accepted before is counted in
    PublishReply.duplicates and not evaluated again for the sessions (a producer re-sends
    after a failure); a fed-mode subscription still sees it, as before sessions (a mediator
    re-publishes to fresh subscriptions after reconnecting)."""
    address = f"127.0.0.1:{cg1.port}"
    inbox = Inbox()
    session = Session(address, "dups", "cg1", on_message=inbox, heartbeat=10)
    channel, stub = stub_of(address)
    try:
        session.register("a", ONLY_A)
        fed = stub.Subscribe(base_pb2.SubscribeRequest(query=ONLY_A, subscription_id="fed"))
        assert next(fed).ready
        trace = trace_of("a1@1 a2@2 b1@3")
        first = publish(stub, trace)
        again = publish(stub, [*trace, *trace_of("a3@4", "t")])
        assert (first.accepted, first.duplicates) == (3, 0)
        assert (again.accepted, again.rejected, again.duplicates) == (1, 0, 3)
        inbox.wait(lambda: session.delivered == 2)
        stub.Unsubscribe(base_pb2.UnsubscribeRequest(subscription_id="fed"))
        fed_ids = [json.loads(m.constituents[0])["id"] for m in fed]
    finally:
        session.close()
        channel.close()
    assert ids(inbox.found("a")) == [("a1",), ("a2",), ("a3",)]
    assert fed_ids == ["a1", "a2", "a1", "a2", "a3"]


def test_without_data_the_latest_pairs_are_remembered() -> None:
    from adapters.backends.sessions import MemoryStore

    store = MemoryStore(remember=2)
    a, b, c = trace_of("a1@1 b1@2 c1@3")
    assert [store.add_event(e, "", 1) for e in (a, b, a, c)] == [True, True, False, True]
    assert (store.known(a), store.known(b), store.known(c)) == (False, True, True)
