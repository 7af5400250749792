"""A base service's evaluators are bounded per event and in what they keep (issue 28: the
work limit): a native query whose results multiply — nested Snoop conjunctions in the
unrestricted context, an SQL self-join of many aliases, nested XChange conjunctions — ends with
``Exhausted`` instead of taking the service's CPU and memory; the service ends that
subscription with RESOURCE_EXHAUSTED naming the limit and goes on for the others; a session's
registration ends the same way and its session is told (``SessionMessage.ended``), durably."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from adapters.backends import native
from adapters.backends.native import Exhausted
from adapters.backends.registry import language
from adapters.backends.service import Running, serve
from adapters.client import BaseClient
from adapters.session import Session
from adapters.wire import base_pb2
from eva.events import Event
from tests.test_sessions import Inbox, kept_messages, publish, stub_of

NESTED = {  # results multiply at every level, nothing bounds them but the limits
    "cg2": "((a AND b) AND (a AND b)) AND ((a AND b) AND (a AND b))",
    "cg3": ("SELECT w.id, x.id, y.id, z.id FROM a AS w JOIN b AS x ON x.time >= w.time "
            "JOIN a AS y ON y.time >= x.time JOIN b AS z ON z.time >= y.time"),
    "cg4": "and{and{a, b}, and{a, b}, and{a, b}}",
}
BENIGN = {"cg2": "a ; b CONTEXT chronicle", "cg3": "SELECT x.id FROM b AS x",
          "cg4": "andthen[a, b] within 2us"}


def alternating(count: int, start: int = 1, tag: str = "") -> list[Event]:
    return [Event(f"{tag}{'ab'[i % 2]}{i}", "s", "ab"[i % 2], start + i, i) for i in range(count)]


def pushed_until_exhausted(group: str, text: str, events: list[Event]) -> tuple[int, str]:
    """How many events the evaluator took before it ended, and why ('' if it never did)."""
    evaluator = language(group).parse(text).evaluator()
    for n, event in enumerate(events):
        try:
            evaluator.push(event)
        except Exhausted as exc:
            return n, str(exc)
    return len(events), ""


@pytest.mark.parametrize("group", sorted(NESTED))
def test_a_query_whose_results_multiply_ends_at_the_work_limit(group: str) -> None:
    taken, why = pushed_until_exhausted(group, NESTED[group], alternating(400))
    assert why.startswith("work_limit"), (taken, why)
    assert f"{native.WORK_LIMIT:,}" in why
    # A tenth of the limit: it ends earlier — the bound is what the evaluator counts, not time.
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(native, "WORK_LIMIT", native.WORK_LIMIT // 10)
        earlier, why = pushed_until_exhausted(group, NESTED[group], alternating(400))
    assert why.startswith("work_limit") and earlier < taken


@pytest.mark.parametrize("group", sorted(NESTED))
def test_a_query_within_the_limits_answers_as_without_them(group: str) -> None:
    """The meter only counts: below the limits the detections are the same as with limits
    too large to matter."""
    events = alternating(6)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(native, "WORK_LIMIT", 10**12)
        patch.setattr(native, "STORE_LIMIT", 10**12)
        unbounded = native.run(language(group).parse(NESTED[group]), events)
    bounded = native.run(language(group).parse(NESTED[group]), events)
    assert [d.text for d in bounded] == [d.text for d in unbounded] and bounded


def test_a_query_that_keeps_everything_ends_at_the_store_limit(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(native, "STORE_LIMIT", 50)
    only_a = [Event(f"a{i}", "s", "a", i + 1, i) for i in range(100)]  # never a terminator
    taken, why = pushed_until_exhausted("cg2", "a ; b", only_a)
    assert why.startswith("store_limit") and taken == 50, (taken, why)


@pytest.fixture
def snoop() -> Iterator[Running]:
    running = serve("cg2", "127.0.0.1:0")
    yield running
    running.stop()


def test_the_service_ends_only_the_exhausted_subscription(snoop: Running) -> None:
    """RESOURCE_EXHAUSTED naming the limit for the query that multiplies; the other
    subscription gets all its detections, every event is accepted, health answers."""
    events = alternating(400)
    with BaseClient(f"127.0.0.1:{snoop.port}") as client:
        hostile = client.subscribe(NESTED["cg2"])
        benign = client.subscribe(BENIGN["cg2"])
        assert next(hostile).ready and next(benign).ready
        ended: list[grpc.RpcError] = []
        found: list[str] = []

        def read_hostile() -> None:
            try:
                for _ in hostile:
                    pass
            except grpc.RpcError as exc:
                ended.append(exc)

        def read_benign() -> None:
            for message in benign:
                found.append(message.text)
                if len(found) == 200:
                    return

        readers = [threading.Thread(target=read_hostile), threading.Thread(target=read_benign)]
        for reader in readers:
            reader.start()
        reply = client.publish(events)
        assert (reply.accepted, reply.rejected) == (400, 0)
        for reader in readers:
            reader.join(30)
        benign.cancel()
        assert ended and ended[0].code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert (ended[0].details() or "").startswith("work_limit")
        assert found[0] == "{a0, b1}@2" and found[-1] == "{a398, b399}@400"
        assert client.health() == "SERVING"


def test_a_sessions_registration_ends_at_the_limit_and_the_session_is_told(
        tmp_path: Path) -> None:
    """The registration's detections before the event that exhausted it, then its end in the
    same message (RESOURCE_EXHAUSTED, the limit named), durably: the client's ``on_refused``
    hears it once, a restart regenerates the same messages, and the other registration goes
    on."""
    running = serve("cg2", "127.0.0.1:0", data=tmp_path)
    refused: list[tuple[str, str]] = []
    told = threading.Event()

    def on_refused(ident: str, why: str) -> None:
        refused.append((ident, why))
        told.set()

    inbox = Inbox()
    address = f"127.0.0.1:{running.port}"
    session = Session(address, "m", "cg2", on_message=inbox, on_refused=on_refused)
    try:
        session.register("hostile", NESTED["cg2"])
        session.register("benign", BENIGN["cg2"])
        channel, stub = stub_of(address)
        with channel:
            for start in range(0, 400, 50):
                publish(stub, alternating(400)[start:start + 50])
        assert told.wait(10)
        inbox.wait(lambda: len(inbox.found("benign")) == 200)
        assert refused[0][0] == "hostile" and len(refused) == 1
        assert refused[0][1].startswith("RESOURCE_EXHAUSTED: work_limit")
        ended = [m for m in inbox.numbered() if any(i == "hostile" for i, _ in m.detections)]
        assert ended, "the detections made before the limit are delivered"
    finally:
        session.close()

    before = kept_messages(running.port, "m")
    assert sum(len(base_pb2.SessionMessage.FromString(m).ended) for m in before) == 1
    running.stop()
    again = serve("cg2", "127.0.0.1:0", data=tmp_path)
    try:
        assert kept_messages(again.port, "m") == before
        channel, stub = stub_of(f"127.0.0.1:{again.port}")
        with channel:
            publish(stub, alternating(2, start=1000, tag="later-"))
            deadline = time.monotonic() + 10
            call = stub.Open(base_pb2.OpenRequest(session="m", resume_after=len(before)))
            message = next(m for m in call if m.seq or time.monotonic() > deadline)
            call.cancel()
        assert {d.subscription_id for d in message.detections} == {"benign"}
    finally:
        again.stop()


def test_the_command_lines_defaults_are_the_evaluators() -> None:
    """``evamed base-service --work-limit/--store-limit`` default to the library's limits (the
    command line does not import the adapters before a command runs)."""
    import inspect

    from mediator.cli.services import base_service

    defaults = {name: p.default for name, p in inspect.signature(base_service).parameters.items()}
    assert (defaults["work_limit"], defaults["store_limit"]) == (native.WORK_LIMIT,
                                                                 native.STORE_LIMIT)
