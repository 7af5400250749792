"""A base service's evaluators are bounded per event and in what they keep (issue 28: the
work limit): a native query whose results multiply — nested boolean ANDs, nested Snoop
conjunctions in the unrestricted context, an SQL self-join of many aliases, nested XChange
conjunctions — ends with
``Exhausted`` instead of taking the service's CPU and memory; the service ends that
subscription with RESOURCE_EXHAUSTED naming the limit and goes on for the others; a session's
registration ends the same way and its session is told (``SessionMessage.ended``), durably."""

from __future__ import annotations

import json
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
    "cg1": 'AND(AND([type = "a"], [type = "b"]), AND([type = "a"], [type = "b"]))',
    "cg2": "((a AND b) AND (a AND b)) AND ((a AND b) AND (a AND b))",
    "cg3": ("SELECT w.id, x.id, y.id, z.id FROM a AS w JOIN b AS x ON x.time >= w.time "
            "JOIN a AS y ON y.time >= x.time JOIN b AS z ON z.time >= y.time"),
    "cg4": "and{and{a, b}, and{a, b}, and{a, b}}",
}
BENIGN = "a ; b CONTEXT chronicle"
"""A Snoop query that consumes what it pairs: as many detections as pairs of events."""


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


LONG_BENIGN = {  # every one is linear in what it keeps: 2,000 events stay far inside the limits
    "a filter (CG-0)": ("cg0", '[type = "a"]'),
    "a filter (CG-1)": ("cg1", '[type = "a"]'),
    "an OR over an AND (CG-1)": ("cg1", 'OR(AND([type = "a"], [type = "b"]), [type = "c"])'),
    "a Snoop sequence (chronicle)": ("cg2", "a ; b CONTEXT chronicle"),
    "a Snoop sequence (cumulative)": ("cg2", "a ; b CONTEXT cumulative"),
    "an SQL filter": ("cg3", "SELECT x.id FROM a AS x"),
    "an XChange filter": ("cg4", "a"),
    "an XChange or": ("cg4", "or{a, b}"),
    "an XChange conjunction": ("cg4", "and{a, b}"),
    "an XChange sequence within a span": ("cg4", "andthen[a, b] within 2us"),
}


@pytest.mark.parametrize("case", sorted(LONG_BENIGN))
def test_queries_whose_work_is_linear_run_long_within_the_limits(
        case: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """What is kept only where it is read, repeats dropped in linear time, consumed
    occurrences found without scanning: 1,900 events of one type and then 100 of another,
    with the store limit at 2,000 (a filter's matches are not kept; a conjunction keeps its
    operands' — CG-1's AND here: every ``a`` once)."""
    monkeypatch.setattr(native, "STORE_LIMIT", 2_000)
    group, text = LONG_BENIGN[case]
    events = [Event(f"a{i}", "s", "a", i + 1, i) for i in range(1_900)] + [
        Event(f"b{i}", "s", "b", 2_000 + i, 1_900 + i) for i in range(100)]
    taken, why = pushed_until_exhausted(group, text, events)
    assert (taken, why) == (len(events), "")


def test_matching_a_terms_children_is_paid_for() -> None:
    """XChange matches a term's children to an event's data injectively and unordered: six
    variables against nine fields are 60,480 assignments — paid for, so a wider term ends at
    the limit instead of running for minutes."""
    data = {f"f{i}": i for i in range(9)}
    wide = "a{{" + ", ".join(f"var V{i}" for i in range(8)) + "}}"
    event = Event("a1", "s", "a", 1, 0, data)
    taken, why = pushed_until_exhausted("cg4", wide, [event])
    assert (taken, why[:10]) == (0, "work_limit")


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
        benign = client.subscribe(BENIGN)
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
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The registration's detections before the event that exhausted it, then its end in the
    message of that event (RESOURCE_EXHAUSTED, the limit named), durably: the client's
    ``on_refused`` hears it once; a restart regenerates the same messages even with the limit
    raised (the end is stored, not evaluated again); the same query under the same id is
    refused from then on, another query is taken; the other registration goes on."""
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
        session.register("benign", BENIGN)
        channel, stub = stub_of(address)
        with channel:
            for start in range(0, 400, 50):
                publish(stub, alternating(400)[start:start + 50])
        assert told.wait(10)
        inbox.wait(lambda: len(inbox.found("benign")) == 200)
        assert refused[0][0] == "hostile" and len(refused) == 1
        assert refused[0][1].startswith("RESOURCE_EXHAUSTED: work_limit")
        assert inbox.found("hostile"), "the detections made before the limit are delivered"
    finally:
        session.close()

    before = kept_messages(running.port, "m")
    messages = [base_pb2.SessionMessage.FromString(m) for m in before]
    (end,) = [m for m in messages if m.ended]
    assert [(e.subscription_id, e.code) for e in end.ended] == [("hostile", "RESOURCE_EXHAUSTED")]
    assert max(m.seq for m in messages if any(
        d.subscription_id == "hostile" for d in m.detections)) <= end.seq
    running.stop()
    monkeypatch.setattr(native, "WORK_LIMIT", 10**9)  # the end is read, not evaluated again
    again = serve("cg2", "127.0.0.1:0", data=tmp_path)
    try:
        assert kept_messages(again.port, "m") == before
        channel, stub = stub_of(f"127.0.0.1:{again.port}")
        with channel:
            with pytest.raises(grpc.RpcError) as same:
                stub.Register(base_pb2.RegisterRequest(session="m", subscription_id="hostile",
                                                       query=NESTED["cg2"]))
            assert same.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert (same.value.details() or "").startswith("work_limit")
            stub.Register(base_pb2.RegisterRequest(session="m", subscription_id="hostile",
                                                   query="a ; b CONTEXT recent"))
            publish(stub, alternating(2, start=1000, tag="later-"))
            deadline = time.monotonic() + 10
            call = stub.Open(base_pb2.OpenRequest(session="m", resume_after=len(before)))
            message = next(m for m in call if m.seq or time.monotonic() > deadline)
            call.cancel()
        assert {d.subscription_id for d in message.detections} == {"benign", "hostile"}
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


def test_replay_native_stops_with_the_limit_named(tmp_path: Path) -> None:
    """`evamed replay --native` (nobody to suspend anything) stops at the limit: exit 2 and
    one line naming it, not a traceback, not output quietly cut short."""
    from typer.testing import CliRunner

    from eva.events import to_cloudevent
    from mediator.cli import app

    query, events = tmp_path / "q.snoop", tmp_path / "e.jsonl"
    query.write_text(NESTED["cg2"])
    events.write_text("".join(json.dumps(to_cloudevent(e)) + "\n"
                              for e in alternating(400, start=1_000_000)))
    result = CliRunner().invoke(app, ["replay", "--native", "cg2", "--query", str(query),
                                      "--events", str(events)])
    assert result.exit_code == 2, result.output
    assert "work_limit" in result.output and "Traceback" not in result.output


def test_a_link_nobody_listens_to_raises_what_ended(monkeypatch: pytest.MonkeyPatch) -> None:
    """A link whose handle ended, with no pipeline told (`replay --via`): the publish raises
    the service's words instead of answering without that query."""
    from adapters.links import InProcessLink
    from transforms.capability import PRESETS
    from transforms.federated import ServiceInfo

    link = InProcessLink(ServiceInfo("s", "cg2", PRESETS["cg2"]), language("cg2"))
    link.subscribe(NESTED["cg2"])
    with pytest.raises(Exhausted, match="work_limit"):
        link.publish(alternating(400))
    told: list[tuple[str, str]] = []
    link = InProcessLink(ServiceInfo("s", "cg2", PRESETS["cg2"]), language("cg2"))
    link.on_refused = lambda handle, why: told.append((handle, why))
    hostile, benign = link.subscribe(NESTED["cg2"]), link.subscribe(BENIGN)
    found = link.publish(alternating(400))
    assert [h for h, _ in told] == [hostile] and told[0][1].startswith("RESOURCE_EXHAUSTED")
    assert len(found[benign]) == 200 and link.publish(alternating(2, 5000, "x"))[hostile] == []
