"""RemoteLink (adapters/remote_link.py) against real `evamed base-service` processes: the same
answers as the in-process link, live (each publish answered by the service's progress
markers), and through a service killed and restarted on the same port."""

from __future__ import annotations

import itertools
import json
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from concurrent import futures
from typing import Any

import grpc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from adapters.backends.native import NativeQueryError
from adapters.backends.registry import language
from adapters.federation import via
from adapters.links import InProcessLink, Link
from adapters.remote_link import RemoteLink, connect
from adapters.wire import base_pb2, base_pb2_grpc
from eva import ast
from eva.events import Event
from tests.strategies import documents, trace_of, traces
from tests.test_base_services import EVAMED
from transforms.dialects.base import Detection
from transforms.federated import ServiceInfo

PAIRS = 'AND([type = "a"], [type = "b"])'
MODES: dict[str, dict[str, Any]] = {
    "packed, by reference": {},
    "by reference, one event per message, one kept": {"keep": 1, "message_events": 1},
    "unpacked (before packing)": {"packed": False},
}
"""How a RemoteLink may talk to the service (docs/backends.md, "Remote links"): the defaults;
references to the messages of the last event only, so constituents of earlier publish calls
come as JSON, mixed with references within one detection; one message per detection."""


class Service:
    """`evamed base-service` as its own process on a fixed loopback port (so that it can be
    killed and started again where the link expects it)."""

    def __init__(self, group: str, port: int = 0) -> None:
        self.group = group
        self.port = port or free_port()
        self.start()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [EVAMED, "base-service", "--group", self.group, "--listen", self.address],
            stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        assert line.startswith(f"serving {self.group} on "), line

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=10)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def info(group: str, name: str = "svc") -> ServiceInfo:
    return ServiceInfo(name, group, language(group).capability)


def shape(detections: list[Detection]) -> list[tuple[Any, ...]]:
    """What a detection says, comparable across the wire (the events' arrival numbers and the
    JSON-shaped detail are the wire's own)."""
    return [(d.time, tuple(e.id for e in d.constituents), d.text,
             json.dumps(d.extra, sort_keys=True, default=list)) for d in detections]


def answers(link: Link, texts: list[str], chunks: list[tuple[list[Event], int | None]]
            ) -> list[list[tuple[Any, ...]]]:
    """Every query's detections, per publish call, in subscription order."""
    handles = [link.subscribe(text) for text in texts]
    out: list[list[tuple[Any, ...]]] = [[] for _ in texts]
    for events, until in chunks:
        got = link.publish(events, until)
        for i, handle in enumerate(handles):
            out[i].append(tuple(shape(got[handle])))
    return out


@pytest.fixture(scope="module")
def services() -> Iterator[dict[str, Service]]:
    running: dict[str, Service] = {}
    yield running
    for service in running.values():
        service.proc.terminate()  # all at once: each drains for a second
    for service in running.values():
        service.stop()


def service(services: dict[str, Service], group: str) -> Service:
    if group not in services:
        services[group] = Service(group)
    return services[group]


@pytest.mark.parametrize("group", ["cg1", "cg2", "cg3", "cg4", "cg5"])
def test_remote_link_answers_as_the_in_process_link(services: dict[str, Service],
                                                     group: str) -> None:
    """Random profiles rendered in the group's dialect, random traces cut into random
    batches (some with a final clock advance): per publish, the detections of every query at
    the running service equal those of the in-process link, in each of the link's MODES (in
    turn); by reference, the constituents are the very events published."""
    address = service(services, group).address
    modes = itertools.cycle(MODES.values())

    @settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck))
    @given(documents(max_depth=2), traces(max_size=16), st.data())
    def prop(doc: ast.Document, trace: list[Event], data: st.DataObject) -> None:
        _, _, texts = via(language(group), doc, trace)
        cuts = sorted(data.draw(st.sets(st.integers(0, len(trace)), max_size=4)))
        chunks: list[tuple[list[Event], int | None]] = []
        for begin, end in zip([0, *cuts], [*cuts, len(trace)], strict=True):
            part = trace[begin:end]
            until: int | None = None  # an advance stops short of the next event (none late)
            advance: bool = data.draw(st.booleans())
            if part and advance:
                bound = trace[end].time - 1 if end < len(trace) else part[-1].time + 3
                if bound >= part[-1].time:
                    until = data.draw(st.integers(part[-1].time, bound))
            chunks.append((part, until))
        mode = next(modes)
        remote = RemoteLink(info(group), address, patience=10, **mode)
        try:
            assert answers(remote, texts, chunks) == answers(
                InProcessLink(info(group), language(group)), texts, chunks)
        finally:
            remote.close()

    prop()


def test_a_refused_query_is_a_native_query_error_and_the_link_goes_on(
        services: dict[str, Service]) -> None:
    link = RemoteLink(info("cg1"), service(services, "cg1").address, patience=10)
    try:
        with pytest.raises(NativeQueryError) as error:
            link.subscribe('OR([type = "a"],\n  AND([type = "b"])')
        assert (error.value.line, error.value.column) == (2, 19)
        assert "expected ','" in str(error.value)
        handle = link.subscribe(PAIRS)
        got = link.publish(trace_of("a1@1 b1@2"))
        assert shape(got[handle]) == [(2, ("a1", "b1"), got[handle][0].text, "{}")]
        assert link.status() == "SERVING"
    finally:
        link.close()


def test_constituents_by_reference_are_the_events_published_and_a_lost_one_is_an_error(
        services: dict[str, Service]) -> None:
    """Packed and by reference, a constituent published in a kept message is that very Event
    object; one published before the link's `keep` comes as JSON (an equal event); and a
    reference to a message the link no longer holds is a ConnectionError naming it — never a
    constituent dropped — after which the link reconnects and answers again."""
    address = service(services, "cg1").address
    link = RemoteLink(info("cg1"), address, patience=10, keep=1)
    try:
        handle = link.subscribe(PAIRS)
        first, second = trace_of("a1@1 b1@2")
        [found] = link.publish([first, second])[handle]
        assert found.constituents[0] is first and found.constituents[1] is second
        late = trace_of("b2@3")[0]
        [found] = link.publish([late])[handle]  # pairs with a1, whose message is let go
        assert found.constituents[1] is late and found.constituents[0] is not first
        again = found.constituents[0]  # read back from JSON: the same event
        assert (again.id, again.source, again.type, again.time, again.data) == (
            first.id, first.source, first.type, first.time, first.data)
    finally:
        link.close()
    link = RemoteLink(info("cg1"), address, patience=10)
    try:
        handle = link.subscribe(PAIRS)
        link.publish(trace_of("a1@1"))
        link._sent.clear()  # as if the link had let go of a message the service still names
        with pytest.raises(ConnectionError, match=r"names constituent 0 of message \d+, which "
                           "this link did not send or no longer keeps"):
            link.publish(trace_of("b1@2"))
        assert [d.time for d in link.publish(trace_of("a4@5 b4@6"))[handle]] == [6]
    finally:
        link.close()


def test_unsubscribed_handles_stop_answering(services: dict[str, Service]) -> None:
    link = RemoteLink(info("cg1"), service(services, "cg1").address, patience=10)
    try:
        first, second = link.subscribe(PAIRS), link.subscribe('[type = "a"]')
        link.unsubscribe(first)
        got = link.publish(trace_of("a1@1 b1@2"))
        assert list(got) == [second] and [d.time for d in got[second]] == [1]
        assert link.publish([]) == {second: []}
    finally:
        link.close()


def publishing(link: RemoteLink, events: list[Event], until: int | None = None
               ) -> tuple[threading.Thread, list[Any]]:
    """``link.publish`` in a thread of its own (it waits for the service): the thread and
    where its answer goes."""
    result: list[Any] = []
    thread = threading.Thread(target=lambda: result.append(link.publish(events, until)))
    thread.start()
    time.sleep(0.5)
    assert thread.is_alive()  # it waits for the service
    return thread, result


def test_a_killed_service_is_reconnected_resubscribed_and_the_batch_in_flight_resent() -> None:
    """SIGKILL the base service while the link is idle, and again while a batch is in flight
    (the process stopped first, so that the batch is sent and unanswered), and start it again
    on the same port: the link reports CONNECTING, reconnects, re-subscribes every handle under
    its name, re-sends the batch in flight; everything published after a restart is detected
    exactly once — what fresh subscriptions over those events detect."""
    svc = Service("cg1")
    texts = [PAIRS, '[type = "a"]']
    link = RemoteLink(info("cg1"), svc.address, timeout=2)
    try:
        handles = [link.subscribe(text) for text in texts]
        before = link.publish(trace_of("a1@1 b1@2"))
        assert [len(before[h]) for h in handles] == [1, 1]
        svc.kill()
        deadline = time.monotonic() + 10
        while link.status() != "CONNECTING" and time.monotonic() < deadline:
            time.sleep(0.01)
        assert link.status() == "CONNECTING"
        batches = [(trace_of("a2@5 b2@6"), None), (trace_of("a3@7 b3@8 a4@9"), 12),
                   (trace_of("a5@20 b5@21"), None), (trace_of("b6@22"), None)]
        thread, result = publishing(link, *batches[0])  # the service is away
        svc.start()
        thread.join(timeout=20)
        assert link.status() == "SERVING"
        got = [result[0], link.publish(*batches[1])]
        svc.proc.send_signal(signal.SIGSTOP)
        thread, result = publishing(link, *batches[2])  # sent; the service cannot answer
        svc.kill()
        svc.start()
        thread.join(timeout=20)
        got += [result[0], link.publish(*batches[3])]
        for restart in (slice(0, 2), slice(2, 4)):  # fresh subscriptions at each restart
            assert [[tuple(shape(answer[h])) for answer in got[restart]] for h in handles] == \
                answers(InProcessLink(info("cg1"), language("cg1")), texts, batches[restart])
        assert shape(got[0][handles[0]])[0][1] == ("a2", "b2")  # not with b1: fresh state
        assert [d[1] for d in shape(got[3][handles[0]])] == [("a5", "b6")]
    finally:
        link.close()
        svc.stop()


def test_a_service_that_stays_away_runs_out_the_links_patience() -> None:
    link = RemoteLink(info("cg1"), f"127.0.0.1:{free_port()}", timeout=0.3, patience=1.0)
    try:
        assert link.status() == "CONNECTING"
        started = time.monotonic()
        with pytest.raises(ConnectionError, match="unreachable for 1 s"):
            link.subscribe(PAIRS)
        assert time.monotonic() - started < 5
    finally:
        link.close()


def test_closing_a_link_that_is_reconnecting_does_not_wait_for_the_service() -> None:
    link = RemoteLink(info("cg1"), f"127.0.0.1:{free_port()}", timeout=0.3)
    failure: list[BaseException] = []

    def call() -> None:
        try:
            link.subscribe(PAIRS)
        except ConnectionError as exc:
            failure.append(exc)

    waiting = threading.Thread(target=call)
    waiting.start()
    time.sleep(0.5)
    started = time.monotonic()
    link.close()
    waiting.join(timeout=5)
    assert time.monotonic() - started < 3 and "was closed" in str(failure[0])


class Silent(base_pb2_grpc.BaseServiceServicer):  # type: ignore[misc]
    """A base service (cg1) that accepts every call and leaves those named in ``silent``
    unanswered until ``released``: "capabilities", "subscribe" (not even the ready message),
    "unsubscribe", "publish" (the reply at the end of the stream)."""

    def __init__(self, silent: set[str]) -> None:
        self.silent = silent
        self.released = threading.Event()

    def _hold(self, call: str) -> None:
        if call in self.silent:
            self.released.wait()

    def Capabilities(self, request: Any, context: Any) -> Any:
        self._hold("capabilities")
        return base_pb2.CapabilitiesReply(group="cg1", language="boolean")

    def Subscribe(self, request: Any, context: Any) -> Iterator[Any]:
        self._hold("subscribe")
        yield base_pb2.NativeNotification(subscription_id=request.subscription_id, ready=True)
        self.released.wait()

    def Unsubscribe(self, request: Any, context: Any) -> Any:
        self._hold("unsubscribe")
        return base_pb2.UnsubscribeReply(found=True)

    def Publish(self, request_iterator: Any, context: Any) -> Any:
        self._hold("publish")
        return base_pb2.PublishReply()


@pytest.mark.parametrize("silent", [{"subscribe"}, {"unsubscribe", "publish"},
                                    {"capabilities"}])
def test_closing_a_link_to_a_service_that_never_answers_is_bounded(silent: set[str]) -> None:
    """A service that accepts the link's calls and never answers them: close() returns within
    a few seconds (not the link's timeout per call), and a call waiting on the service raises
    "was closed"."""
    servicer = Silent(silent)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=16))
    base_pb2_grpc.add_BaseServiceServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    link = RemoteLink(info("cg1"), f"127.0.0.1:{port}", timeout=30)
    failure: list[BaseException] = []

    def call() -> None:
        try:
            for _ in range(3):
                link.subscribe(PAIRS)
        except ConnectionError as exc:
            failure.append(exc)

    try:
        waiting = threading.Thread(target=call)
        waiting.start()
        waiting.join(timeout=0.5)
        assert waiting.is_alive() == bool(silent & {"subscribe", "capabilities"})
        started = time.monotonic()
        link.close()
        waiting.join(timeout=5)
        assert time.monotonic() - started < 3 and not waiting.is_alive()
        if silent & {"subscribe", "capabilities"}:
            assert "was closed" in str(failure[0])
    finally:
        servicer.released.set()
        server.stop(0)


def test_connect_embedded_is_in_process_and_a_service_of_another_group_is_refused(
        services: dict[str, Service]) -> None:
    assert isinstance(connect(info("cg3"), "embedded"), InProcessLink)
    link = connect(info("cg2"), service(services, "cg1").address, patience=5)
    try:
        with pytest.raises(ConnectionError, match="serves cg1, not cg2"):
            link.subscribe("a")
    finally:
        link.close()
