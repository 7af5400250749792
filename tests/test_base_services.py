"""Base services as real gRPC servers (issue 4): a separate `evamed base-service` process on
the whole transformation path, health checking, and robustness — bad queries, malformed
events, disconnecting subscribers, back-pressure."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from adapters.backends.registry import language
from adapters.backends.service import Running, serve
from adapters.client import BaseClient, remote_transport
from adapters.federation import via
from eva.events import Event, to_cloudevent
from eva.notify import to_cloudevent as composite_event
from eva.reference import evaluate
from tests.strategies import trace_of
from tests.test_backends import logistics
from transforms.plans import Remote

EVAMED = str(Path(sys.executable).with_name("evamed"))


@pytest.fixture
def cg1() -> Iterator[Running]:
    running = serve("cg1", "127.0.0.1:0", queue_size=2, stall_timeout=0.5)
    yield running
    running.server.stop(grace=0).wait()


def wait_until(condition: object, seconds: float = 10.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():  # type: ignore[operator]
            return True
        time.sleep(0.02)
    return False


@pytest.mark.parametrize(("group", "name"), [("cg2", "snoop"), ("cg3", "sql"), ("cg5", "eva")])
def test_a_base_service_process_serves_the_whole_path(group: str, name: str) -> None:
    """`evamed base-service --group G` as its own process: healthy, describes its language,
    and `--via G` through it equals plain replay on the paper's profiles."""
    proc = subprocess.Popen([EVAMED, "base-service", "--group", group, "--listen", "127.0.0.1:0"],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith(f"serving {group} on 127.0.0.1:"), line
        address = line.split()[-1]
        with BaseClient(address) as client:
            client.wait_ready()
            assert client.health() == "SERVING"
            caps = client.capabilities()
            assert caps["language"] == name and caps["capability"]["name"] == group.upper().replace(
                "CG", "CG-")
        doc, trace = logistics()
        want = [composite_event(n) for n in evaluate(doc, trace)]
        got, _, rendered = via(language(group), doc, trace,
                               transport=remote_transport(address, group))
        assert [composite_event(n) for n in got] == want and rendered
        with pytest.raises(ConnectionError, match=f"serves {group}, not cg1"):
            remote_transport(address, "cg1")
    finally:
        proc.terminate()
        assert proc.wait(timeout=10) == 0


def test_a_bad_query_is_invalid_argument_with_the_parsers_message(cg1: Running) -> None:
    with BaseClient(f"127.0.0.1:{cg1.port}") as client:
        with pytest.raises(grpc.RpcError) as info:
            next(client.subscribe('AND([type = "a"])'))
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "1:17: error: found ')', expected ','" in info.value.details()
        assert client.health() == "SERVING"


def test_malformed_events_are_rejected_and_the_service_goes_on(cg1: Running) -> None:
    with BaseClient(f"127.0.0.1:{cg1.port}") as client:
        stream = client.subscribe('[type = "a"]', "s1")
        assert next(stream).ready
        good = [json.dumps(to_cloudevent(e)) for e in trace_of("a1@1 a2@2")]
        from adapters.wire import base_pb2

        messages = [base_pb2.PublishRequest(cloudevents=[good[0], "{not json"]),
                    base_pb2.PublishRequest(cloudevents=[json.dumps({"specversion": "1.0"}),
                                                         good[1]])]
        reply = client.stub.Publish(iter(messages))
        assert (reply.accepted, reply.rejected) == (2, 2)
        assert "event 2: not JSON" in reply.errors[0]
        assert "missing required attribute" in reply.errors[1]
        client.unsubscribe("s1")
        assert [json.loads(m.constituents[0])["id"] for m in stream] == ["a1", "a2"]


def test_a_subscriber_that_disconnects_is_cleaned_up(cg1: Running) -> None:
    with BaseClient(f"127.0.0.1:{cg1.port}") as client:
        call = client.subscribe('[type = "a"]', "leaving")
        assert next(call).ready
        assert cg1.service.subscriptions == ["leaving"]
        call.cancel()
        assert wait_until(lambda: cg1.service.subscriptions == [])
        client.publish(trace_of("a1@1"))  # nobody to deliver to: no error
        assert client.health() == "SERVING"


def test_publish_is_back_pressured_and_a_stalled_subscriber_is_dropped(cg1: Running) -> None:
    """Queues hold 2 notifications: a subscriber that reads slows the publisher down and gets
    everything; one that stops reading is waited for at most the stall timeout, then dropped
    (RESOURCE_EXHAUSTED) once its queue is full. (The events are large so that gRPC's own
    flow-control window fills first.)"""
    pad = "x" * 4096
    events = [Event(f"a{i}", "s", "a", i + 1, i, {"pad": pad}) for i in range(2000)]
    with BaseClient(f"127.0.0.1:{cg1.port}") as client:
        stalled = client.subscribe('[type = "a"]', "stalled")
        assert next(stalled).ready
        reader = client.subscribe('[type = "a"]', "reader")
        assert next(reader).ready
        got: list[str] = []
        thread = threading.Thread(target=lambda: got.extend(
            json.loads(m.constituents[0])["id"] for m in reader))
        thread.start()
        reply = client.publish(events)
        assert reply.accepted == 2000
        assert cg1.service.subscriptions == ["reader"]
        client.unsubscribe("reader")
        thread.join(timeout=10)
        assert got == [e.id for e in events]
        with pytest.raises(grpc.RpcError) as info:
            list(stalled)
        assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert info.value.details().startswith(
            "subscriber too slow: 2 notifications queued and none read for 0.5 s")


def test_a_subscriber_idle_for_lack_of_notifications_is_not_taken_for_stalled(
        cg1: Running) -> None:
    """A subscriber that had nothing to read for longer than the stall timeout, then gets a
    burst far larger than its queue from one event (300 pairs), is waited for like any
    reader, not dropped."""
    with BaseClient(f"127.0.0.1:{cg1.port}") as client:
        reader = client.subscribe('AND([type = "a"], [type = "b"])', "idle")
        assert next(reader).ready
        got: list[list[str]] = []
        thread = threading.Thread(target=lambda: got.extend(
            [json.loads(c)["id"] for c in m.constituents] for m in reader))
        thread.start()
        assert client.publish(trace_of(" ".join(f"a{i}@{i + 1}" for i in range(300)))).accepted
        time.sleep(1.0)  # twice the fixture's stall timeout, with nothing to read
        assert client.publish(trace_of("b1@1000")).accepted == 1
        client.unsubscribe("idle")
        thread.join(timeout=10)
        assert got == [[f"a{i}", "b1"] for i in range(300)]


def test_the_async_adapter_interface(cg1: Running) -> None:
    """DESIGN §5: capabilities (the record the service declares, equal to the preset),
    render, subscribe (async), parse_notification, health — against a real gRPC service."""
    import asyncio

    from adapters.backends.native import NativeQueryError
    from adapters.client import ServiceAdapter
    from eva.parser import parse
    from transforms.capability import CG1
    from transforms.dialects.base import Scope
    from transforms.planner import plan

    doc = parse('class A = type == "a"\nclass B = type == "b"\n'
                "profile P = ((all_dup(A), all_dup(B))_inf)_all_pairs\n")

    async def scenario() -> None:
        adapter = ServiceAdapter(f"127.0.0.1:{cg1.port}", "cg1")
        try:
            assert await adapter.health() == "SERVING"
            assert await adapter.capabilities() == CG1
            root = plan(doc.profiles[0], doc, CG1).root
            assert isinstance(root, Remote)
            native = adapter.render(root, doc)
            assert native == 'AND([type = "a"], [type = "b"])'
            stream = adapter.subscribe(native)
            first = asyncio.ensure_future(stream.__anext__())
            for _ in range(500):  # the loop must run for the subscription to be sent
                if cg1.service.subscriptions:
                    break
                await asyncio.sleep(0.02)
            assert len(cg1.service.subscriptions) == 1
            await asyncio.to_thread(BaseClient(f"127.0.0.1:{cg1.port}").publish,
                                    trace_of("a1@1 b1@2"))
            message = await asyncio.wait_for(first, 10)
            assert [e.id for e in adapter.detection(message).constituents] == ["a1", "b1"]
            scope = Scope(doc, None, [], {})
            assert adapter.parse_notification(message, root, scope).visible == {"a1", "b1"}
            await stream.aclose()
            with pytest.raises(NativeQueryError, match="expected"):
                await adapter.subscribe("AND(").__anext__()
        finally:
            await adapter.close()

    asyncio.run(scenario())
    assert wait_until(lambda: cg1.service.subscriptions == [])


def test_progress_markers_follow_each_numbered_messages_detections(cg1: Running) -> None:
    """A Publish message with a batch number ends with a progress marker on every subscription
    that asked (after that message's detections, with the subscription's clock); a message
    without one, or a subscription that did not ask, gets none."""
    from adapters.wire import base_pb2

    def message(events: str, batch: int = 0, advance: int = 0) -> object:
        return base_pb2.PublishRequest(
            cloudevents=[json.dumps(to_cloudevent(e)) for e in trace_of(events)] if events
            else [], batch=batch, advance_to_us=advance)

    with BaseClient(f"127.0.0.1:{cg1.port}") as client:
        streams = {name: client.subscribe(query, name, progress=name != "plain")
                   for name, query in [("pairs", 'AND([type = "a"], [type = "b"])'),
                                       ("a", '[type = "a"]'), ("plain", '[type = "a"]')]}
        assert all(next(s).ready for s in streams.values())
        reply = client.stub.Publish(iter([message("a1@1 b1@2", batch=7), message("a2@3"),
                                          message("", batch=9, advance=10)]))
        assert reply.accepted == 3
        for name in streams:
            client.unsubscribe(name)
        seen = {name: [f"progress {m.progress_batch} at {m.progress_us}" if m.progress_batch
                       else "+".join(json.loads(c)["id"] for c in m.constituents)
                       for m in stream] for name, stream in streams.items()}
    assert seen == {"pairs": ["a1+b1", "progress 7 at 2", "a2+b1", "progress 9 at 10"],
                    "a": ["a1", "progress 7 at 2", "a2", "progress 9 at 10"],
                    "plain": ["a1", "a2"]}


def test_packed_notifications_carry_a_messages_detections_its_marker_and_references(
        cg1: Running) -> None:
    """Packed: one notification per message that caused detections or is numbered, with its
    detections and (if asked) its marker. With a publisher: a constituent from a message that
    publisher keeps is its (batch, index) — the index counts a malformed entry too; one from an
    unnumbered message, one the publisher no longer keeps (PublishRequest.keep, in events), and
    one sent by another publisher or after the publisher's call ended are JSON. An unpacked
    subscription beside them is served as before."""
    from adapters.wire import base_pb2

    def message(events: str, batch: int = 0, keep: int = 2, publisher: str = "p") -> object:
        return base_pb2.PublishRequest(
            cloudevents=["not json", *(json.dumps(to_cloudevent(e)) for e in trace_of(events))],
            batch=batch, publisher=publisher, keep=keep)

    def shown(m: Any) -> list[Any]:
        packs = [(d.time_us, list(d.refs), [json.loads(c)["id"] for c in d.constituents])
                 for d in m.detections]
        return [*packs, f"progress {m.progress_batch}"] if m.progress_batch else packs

    pairs = 'AND([type = "a"], [type = "b"])'
    with BaseClient(f"127.0.0.1:{cg1.port}") as client:
        streams = {"refs": client.subscribe(pairs, "refs", True, packed=True, publisher="p"),
                   "quiet": client.subscribe('[type = "b"]', "quiet", packed=True),
                   "plain": client.subscribe(pairs, "plain", True)}
        assert all(next(s).ready for s in streams.values())
        reply = client.stub.Publish(iter([
            message("a1@1 b1@2", batch=5), message("a2@3"), message("b3@4", batch=6),
            message("a4@5", batch=7, keep=1)]))
        assert (reply.accepted, reply.rejected) == (5, 4)
        client.stub.Publish(iter([message("b5@6", batch=8, publisher="q")]))
        for name in streams:
            client.unsubscribe(name)
        seen = {name: [shown(m) if name != "plain" else
                       f"progress {m.progress_batch}" if m.progress_batch else
                       "+".join(json.loads(c)["id"] for c in m.constituents) for m in stream]
                for name, stream in streams.items()}
    assert seen == {  # keep counts entries: message 6 (two) is enough for keep=2, so 5 goes
        "refs": [[(2, [5, 1, 5, 2], []), "progress 5"],
                 [(3, [0, 0, 5, 2], ["a2"])],
                 [(4, [0, 0, 6, 1], ["a1"]), (4, [0, 0, 6, 1], ["a2"]), "progress 6"],
                 [(5, [7, 1, 0, 0], ["b1"]), (5, [7, 1, 0, 0], ["b3"]), "progress 7"],
                 [(6, [], ["a1", "b5"]), (6, [], ["a2", "b5"]), (6, [], ["a4", "b5"]),
                  "progress 8"]],
        "quiet": [[(2, [], ["b1"])], [(4, [], ["b3"])], [(6, [], ["b5"])]],
        "plain": ["a1+b1", "progress 5", "a2+b1", "a1+b3", "a2+b3", "progress 6", "a4+b1",
                  "a4+b3", "progress 7", "a1+b5", "a2+b5", "a4+b5", "progress 8"]}


def test_a_pack_is_split_at_its_bound_and_the_marker_comes_with_the_last_part(
        cg1: Running, monkeypatch: pytest.MonkeyPatch) -> None:
    """A message whose detections outnumber PACK_DETECTIONS goes out in several packs, in
    order, the marker with the last."""
    from adapters.backends import service
    from adapters.wire import base_pb2

    monkeypatch.setattr(service, "PACK_DETECTIONS", 2)
    with BaseClient(f"127.0.0.1:{cg1.port}") as client:
        stream = client.subscribe('[type = "a"]', "a", True, packed=True)
        assert next(stream).ready
        client.stub.Publish(iter([base_pb2.PublishRequest(cloudevents=[
            json.dumps(to_cloudevent(e)) for e in trace_of("a1@1 a2@2 a3@3 a4@4 a5@5")],
            batch=3)]))
        client.unsubscribe("a")
        got = [([json.loads(d.constituents[0])["id"] for d in m.detections], m.progress_batch)
               for m in stream]
    assert got == [(["a1", "a2"], 0), (["a3", "a4"], 0), (["a5"], 3)]


def test_a_peers_duplicate_memory_forgets_as_the_engine_alone_does() -> None:
    """A base service steps a subscription's clock to just before each event (the gap's
    clock-driven work, here P's absences) and then pushes it; the peer engine's duplicate
    memory rotated by those instants, one push earlier than the same events pushed to an
    engine alone: the copies z@31 and w@33 were admitted at the service and refused by the
    engine (issue 26). It rotates by the instants processed as of the last push now, and the
    two agree."""
    from adapters.client import evaluate as through
    from eva.engine import Engine, EngineConfig
    from eva.parser import parse

    text = ('class A = type == "a"\nclass B = type == "b"\n'
            "profile P = ((all_dup(A); all_dup(((not B)_2us)_all_pairs))_2us)_all_pairs\n"
            "profile Q = A\n")
    trace = [Event(ident, "s", kind, t, seq) for seq, (ident, kind, t) in enumerate(
        [("y", "a", 15), ("z", "a", 16), ("w", "b", 21), ("w", "a", 26), ("z", "a", 31),
         ("w", "a", 33)])]
    engine = Engine(EngineConfig(tick=1))
    engine.add_document(parse(text))
    alone = [n.occ.events for e in trace for n in engine.push(e)] + [
        n.occ.events for n in engine.close(33)]
    assert ("z",) not in alone[2:] and ("w",) not in alone  # copies: refused
    running = serve("cg5", "127.0.0.1:0", tick=1)
    try:
        got = through(remote_transport(f"127.0.0.1:{running.port}", "cg5"), text, trace, 33)
    finally:
        running.stop()
    assert [tuple(d.extra["events"]) for d in got] == alone
