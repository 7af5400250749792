"""Clients cannot harm each other (issue 29, item 1): the mediator in this process
(mediator.server.serve: the real gRPC server, door, pipeline and a SQLite store), clients
added as an operator adds them, each route by which one client changed another's accepted
events tried — and refused, with Alice's events accepted and her composites delivered."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from typer.testing import CliRunner

from eva.events import format_time
from mediator.cli import app
from mediator.client import MediatorClient, MediatorError
from mediator.config import load
from mediator.security import add_client
from mediator.server import Running, serve
from mediator.store.sqlite import SqliteStore
from tests.helpers import Reader

SECOND = 1_000_000
HOUR = 3600 * SECOND


def now_us() -> int:
    return time.time_ns() // 1000


def event(source: str, ident: str, t: int) -> str:
    return json.dumps({"specversion": "1.0", "id": ident, "source": source, "type": "reading",
                       "time": format_time(t)})


class Mediator:
    """A mediator with three clients: the operator ``ops``, and ``alice`` and ``bob`` with the
    default grants (their own names)."""

    def __init__(self, directory: Path) -> None:
        path = directory / "mediator.toml"
        path.write_text('listen = "127.0.0.1:0"\nlog_level = "WARNING"\nlateness = "1s"\n')
        self.store = SqliteStore(directory / "m.db")
        tokens = {name: add_client(self.store, name, operator=name == "ops")
                  for name in ("ops", "alice", "bob")}
        self.running: Running = serve(load(path, environ={}), store=self.store)
        address = f"127.0.0.1:{self.running.port}"
        self.clients = {name: MediatorClient(address, token) for name, token in tokens.items()}

    def close(self) -> None:
        for client in self.clients.values():
            client.close()
        self.running.stop(1.0)
        self.store.close()


@pytest.fixture
def mediator(tmp_path: Path) -> Iterator[Mediator]:
    running = Mediator(tmp_path)
    try:
        yield running
    finally:
        running.close()


def alice_is_unharmed(mediator: Mediator, reader: Reader, ident: str) -> None:
    """Alice's real event is accepted, and her composite of it delivered."""
    alice = mediator.clients["alice"]
    t = now_us()
    reply = alice.publish([event("alice/plant", ident, t)])
    assert (reply.accepted, reply.dead_letters) == (1, ()), reply
    mediator.clients["ops"].publish([], advance_to=t)
    got = reader.wait_for(1, 30)
    assert [n.cloudevent["data"]["constituents"] for n in got] == [[ident]]


def subscribed(mediator: Mediator) -> Reader:
    alice = mediator.clients["alice"]
    alice.add_profile('class R = type == "reading" and source == "alice/plant"\n'
                      "profile Each = R\n", name="each")
    return Reader(alice.subscribe(name="each"))


def test_another_client_cannot_take_a_source_and_id_first(mediator: Mediator) -> None:
    """Bob publishes an event with Alice's source and id first: refused `forbidden` (sources
    are granted), so Alice's real event is not a `duplicate` of it."""
    reader = subscribed(mediator)
    reply = mediator.clients["bob"].publish([event("alice/plant", "X", now_us())])
    assert reply.accepted == 0
    assert [d.reason.split(":")[0] for d in reply.dead_letters] == ["forbidden"]
    assert "may not publish under source 'alice/plant'" in reply.dead_letters[0].reason
    assert "'bob' 'bob/*'" in reply.dead_letters[0].reason
    alice_is_unharmed(mediator, reader, "X")


def test_an_event_far_ahead_of_the_clock_does_not_make_another_clients_events_late(
        mediator: Mediator) -> None:
    """Bob publishes at now + 23 h (within `future`): taken, and held until its time comes —
    the watermark counts no later than the clock, so Alice's event at now is not `late`."""
    reader = subscribed(mediator)
    reply = mediator.clients["bob"].publish([event("bob/x", "ahead", now_us() + 23 * HOUR)])
    assert reply.accepted == 1
    alice_is_unharmed(mediator, reader, "A1")


def test_advance_to_us_is_an_operators_right(mediator: Mediator) -> None:
    """Bob's advance to now + 23 h is PERMISSION_DENIED (none of its message's events taken);
    Alice's event after it is accepted."""
    reader = subscribed(mediator)
    with pytest.raises(MediatorError) as refused:
        mediator.clients["bob"].publish([event("bob/x", "b1", now_us())],
                                        advance_to=now_us() + 23 * HOUR)
    assert refused.value.code == grpc.StatusCode.PERMISSION_DENIED
    assert "advance_to_us is an operator's" in refused.value.message
    assert mediator.store.event_head() == 0
    alice_is_unharmed(mediator, reader, "A2")


def test_a_client_publishes_under_its_own_name_by_default_and_what_it_is_granted(
        tmp_path: Path) -> None:
    """`clients add NAME` grants NAME and NAME/*; `--sources` grants patterns instead (spaces
    or commas between them); a pattern that is not one is refused with one line."""
    store = ["--store", f"sqlite:///{tmp_path / 'm.db'}"]
    runner = CliRunner()
    assert runner.invoke(app, ["clients", "add", "alice", *store]).exit_code == 0
    granted = runner.invoke(app, ["clients", "add", "plant", "--sources",
                                  "urn:plant:*, sensors/?", "--sources", "x", *store])
    assert granted.exit_code == 0, granted.output
    bad = runner.invoke(app, ["clients", "add", "eve", "--sources", "a\tb\x00", *store])
    assert bad.exit_code == 1 and "Traceback" not in bad.output
    assert "a source pattern is 1 to 200 printable ASCII" in bad.output
    listed = json.loads(runner.invoke(app, ["clients", "list", "--format", "json", *store]
                                      ).stdout)
    assert {c["name"]: c["sources"] for c in listed} == {
        "alice": ["alice", "alice/*"], "plant": ["urn:plant:*", "sensors/?", "x"]}
    from mediator.security import may_publish
    from mediator.store.base import ClientRecord
    plant = ClientRecord("plant", "", 0, sources=("urn:plant:*", "sensors/?"))
    assert may_publish(plant.granted, "urn:plant:7") and may_publish(plant.granted, "sensors/1")
    assert not may_publish(plant.granted, "sensors/10") and not may_publish(
        ClientRecord("alice", "", 0).granted, "alice2")
