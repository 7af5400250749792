"""The public client (mediator/client.py) and the commands that use it (mediator/cli/profile.py,
subscribe.py, publish.py, services.py, clients.py, explain.py --server).

Two halves: the client's reconnect-and-resume logic against a scripted stub (every way a
stream can break, in milliseconds), then the client and the CLI against a real mediator
(mediator.server.serve) in this process — including a restart on the same port while a
subscription is being read: nothing lost, nothing twice.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest
from typer.testing import CliRunner

from mediator.cli import app
from mediator.client import MediatorClient, MediatorError, Notification
from mediator.wire import mediator_pb2
from tests.helpers import Reader

EVAMED = str(Path(sys.executable).with_name("evamed"))
runner = CliRunner()

# ------------------------------------------------------------------ a scripted stub


class Broken(grpc.RpcError):  # type: ignore[misc]  # grpc is untyped
    """What a gRPC call raises when it fails."""

    def __init__(self, code: grpc.StatusCode, details: str = "") -> None:
        self._code, self._details = code, details

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details

    def trailing_metadata(self) -> tuple[()]:
        return ()


class Call:
    """A Subscribe stream: its messages, then the end or an error."""

    def __init__(self, messages: list[Any], error: grpc.RpcError | None) -> None:
        self.messages, self.error = messages, error
        self.cancelled = False

    def __iter__(self) -> Iterator[Any]:
        return self

    def __next__(self) -> Any:
        if self.messages:
            return self.messages.pop(0)
        if self.error is not None:
            raise self.error
        raise StopIteration

    def cancel(self) -> None:
        self.cancelled = True


@dataclass
class Script:
    """The Subscribe calls the stub answers, in order: a list of messages (after the ready one)
    ending in an error or the stream's end, or an error instead of the stream."""

    calls: list[tuple[list[str], grpc.RpcError | None] | grpc.RpcError]
    requests: list[Any] = field(default_factory=list)

    def Subscribe(self, request: Any, metadata: Any = None) -> Call:
        self.requests.append(mediator_pb2.SubscribeRequest.FromString(request.SerializeToString()))
        step = self.calls.pop(0)
        if isinstance(step, grpc.RpcError):
            return Call([], step)
        ids, error = step
        ready = mediator_pb2.Notification(subscription="S", ready=True)
        return Call([ready, *(_note(i) for i in ids)], error)


def _note(ident: str) -> Any:
    """A notification whose resume token is its id (the stub's log position)."""
    return mediator_pb2.Notification(cloudevent=json.dumps({"id": ident}), id=ident, profile="P",
                                     subscription="S", sources=["s"], services=["mediator"],
                                     resume_token=f"after-{ident}")


def scripted(script: Script, **options: Any) -> MediatorClient:
    client = MediatorClient("test:1", "evm_x", backoff=(0.001, 0.002), **options)
    client._stub = script
    return client


UNAVAILABLE = Broken(grpc.StatusCode.UNAVAILABLE, "Socket closed")


def test_a_broken_stream_is_resumed_after_the_last_yielded_notification() -> None:
    script = Script([(["a", "b"], UNAVAILABLE), UNAVAILABLE,
                     (["c"], Broken(grpc.StatusCode.CANCELLED, "Received RST_STREAM")),
                     (["d"], None)])
    waits: list[str] = []
    with scripted(script) as client:
        got = [n.id for n in client.subscribe(profile_text="profile P = A",
                                              on_reconnect=lambda why, _: waits.append(why))]
    assert got == ["a", "b", "c", "d"]  # the last stream ended cleanly: unsubscribed
    first, *again = script.requests
    assert (first.profile_text, first.name, first.resume_token) == ("profile P = A", "", "")
    # reopened by the name the ready message gave, after the last notification yielded
    assert [(r.profile_text, r.name, r.resume_token) for r in again] == [
        ("", "S", "after-b"), ("", "S", "after-b"), ("", "S", "after-c")]
    assert waits == ["UNAVAILABLE"]  # the broken streams reconnect at once; the refusal waits


def test_an_id_already_yielded_is_dropped_and_still_moves_the_token() -> None:
    script = Script([(["a", "b"], UNAVAILABLE), (["b", "c", "a"], UNAVAILABLE), (["d"], None)])
    with scripted(script) as client:
        got = [n.id for n in client.subscribe(name="S", resume_token="t0")]
    assert got == ["a", "b", "c", "d"]
    assert [r.resume_token for r in script.requests] == ["t0", "after-b", "after-a"]


def test_the_repeat_memory_keeps_the_newest_window_of_ids() -> None:
    script = Script([(["a", "b", "c"], UNAVAILABLE), (["a", "c"], None)])
    with scripted(script, dedupe_window=2) as client:
        got = [n.id for n in client.subscribe(name="S")]
    assert got == ["a", "b", "c", "a"]  # "a" left the window of two; "c" had not


@pytest.mark.parametrize("code", [grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND,
                                  grpc.StatusCode.OUT_OF_RANGE, grpc.StatusCode.UNAUTHENTICATED,
                                  grpc.StatusCode.PERMISSION_DENIED,
                                  grpc.StatusCode.RESOURCE_EXHAUSTED])
def test_a_permanent_error_ends_the_subscription_at_once(code: grpc.StatusCode) -> None:
    script = Script([(["a"], UNAVAILABLE), Broken(code, "no such thing"),
                     (["never"], None)])
    with scripted(script) as client:
        notes = client.subscribe(name="S")
        assert next(notes).id == "a"
        with pytest.raises(MediatorError) as info:
            next(notes)
    assert info.value.code == code
    assert len(script.requests) == 2


def test_gives_up_after_reconnect_for_seconds() -> None:
    script = Script([UNAVAILABLE] * 10_000)
    started = time.monotonic()
    with scripted(script, reconnect_for=0.2) as client, pytest.raises(MediatorError) as info:
        next(client.subscribe(name="S"))
    assert 0.2 <= time.monotonic() - started < 5
    assert info.value.code == grpc.StatusCode.UNAVAILABLE
    assert str(info.value) == "cannot reach the mediator at test:1: Socket closed"


def test_closing_the_iterator_cancels_the_stream() -> None:
    script = Script([(["a", "b"], None)])
    calls: list[Call] = []
    subscribe = script.Subscribe

    def recording(request: Any, metadata: Any = None) -> Call:
        calls.append(subscribe(request, metadata))
        return calls[-1]

    with scripted(script) as client:
        client._stub = type("Stub", (), {"Subscribe": staticmethod(recording)})()
        notes = client.subscribe(name="S")
        assert next(notes).id == "a"
        notes.close()
    assert calls[0].cancelled


def test_subscribe_needs_a_document_or_a_name() -> None:
    with MediatorClient("test:1", "evm_x") as client, pytest.raises(ValueError, match="name"):
        next(client.subscribe())


# ------------------------------------------------------------------ against a real mediator

PROFILE = 'class A = type == "a"\nprofile P = A\n'
END = 1_767_312_000_000_000  # 2026-01-02: a watermark past every test event (not in the future)


def events(first: int, count: int, kind: str = "a") -> list[str]:
    """CloudEvents JSON lines, one a second from 2026-01-01 (ids e<first> …)."""
    return [json.dumps({"specversion": "1.0", "id": f"e{i}", "source": "test", "type": kind,
                        "time": f"2026-01-01T{i // 3600:02d}:{i // 60 % 60:02d}:{i % 60:02d}Z"})
            for i in range(first, first + count)]


class Mediator:
    """A real mediator (mediator.server.serve, the real pipeline) on a fixed port with its
    SQLite store in ``directory``: it can be stopped and started again on the same port."""

    def __init__(self, directory: Path) -> None:
        from mediator.config import Config, Limits
        from tests.servers import free_port

        # No lateness: each event's composite is decided by the next event (these tests are
        # about the client; the reorder buffer's are in test_pipeline.py and test_service.py).
        self.config = Config(listen=f"127.0.0.1:{free_port()}",
                             store=f"sqlite:///{directory / 'm.db'}", limits=Limits(rate=0),
                             composer="inprocess", lateness=0)
        self.address = self.config.listen
        self.running: Any = None
        self.start()

    def start(self) -> None:
        from mediator.server import serve

        self.running = serve(self.config)

    def stop(self) -> None:
        if self.running is not None:
            self.running.stop(0.2)
            self.running = None

    def token(self, name: str) -> str:
        from mediator.security import add_client

        # The clients here publish under any source and advance the clock: an operator's
        # rights (docs/operations.md, "Secure").
        return add_client(self.running.served.store, name, operator=True)

    def client(self, name: str, **options: Any) -> MediatorClient:
        return MediatorClient(self.address, self.token(name), **options)


@pytest.fixture
def mediator(tmp_path: Path) -> Iterator[Mediator]:
    running = Mediator(tmp_path)
    yield running
    running.stop()


def constituents(notes: list[Notification]) -> list[str]:
    """The (first) constituent of each composite: the event of a one-class profile."""
    return [n.cloudevent["data"]["constituents"][0] for n in notes]


def registered(client: MediatorClient, name: str) -> None:
    """Wait until a subscription opened in another thread is registered (events published
    before would be before its start)."""
    deadline = time.monotonic() + 10
    while name not in [p.name for p in client.profiles()]:
        assert time.monotonic() < deadline, f"{name} was not registered in 10 s"
        time.sleep(0.01)


def test_subscribe_delivers_each_composite_with_its_sources_and_services(
        mediator: Mediator) -> None:
    with mediator.client("alice") as client:
        reader = Reader(client.subscribe(PROFILE))
        registered(client, "P")
        result = client.publish(events(0, 4) + events(4, 2, kind="b") + ["{not json"],
                                batch=2, advance_to=END)
        assert (result.accepted, result.dead_lettered) == (6, 1)
        (dead,) = result.dead_letters
        assert dead.index == 6 and dead.reason.startswith("malformed: ")
        assert constituents(reader.wait_for(4)) == ["e0", "e1", "e2", "e3"]
    first = reader.got[0]
    assert (first.profile, first.subscription, first.sources, first.services) == (
        "P", "P", ("test",), ("mediator",))
    assert (first.types, first.times_us) == (("a",), (END - 86_400_000_000,))  # e0 at 00:00:00
    assert first.cloudevent["type"] == "eva.composite" and first.id == first.cloudevent["id"]


def test_the_subscription_survives_a_restart_on_the_same_port_without_repeats(
        mediator: Mediator) -> None:
    """The mediator stops (streams end UNAVAILABLE) and starts again on the same port with the
    same store: the iterator reconnects, resumes after its last notification and yields the
    rest — each composite once, in order."""
    with mediator.client("alice", backoff=(0.05, 0.5)) as client:
        client.add_profile(PROFILE)
        reader = Reader(client.subscribe(name="P"))
        client.publish(events(0, 5))
        reader.wait_for(4)  # the 5th waits for a later instant (or a watermark)
        mediator.stop()
        time.sleep(0.5)  # the client retries against a closed port meanwhile
        mediator.start()
        client.publish(events(5, 5), advance_to=END)
        assert constituents(reader.wait_for(10)) == [f"e{i}" for i in range(10)]
        time.sleep(0.3)  # nothing more comes
        assert len(reader.got) == 10 and len({n.id for n in reader.got}) == 10


def test_resume_token_starts_after_that_notification(mediator: Mediator) -> None:
    with mediator.client("alice") as client:
        client.add_profile(PROFILE)
        client.publish(events(0, 5), advance_to=END)
        first = Reader(client.subscribe(name="P"))
        first.wait_for(5)
        token = first.got[1].resume_token
        again = client.subscribe(name="P", resume_token=token)
        assert [next(again).id for _ in range(3)] == [n.id for n in first.got[2:]]
        again.close()


def test_refusals_are_one_line_errors_with_their_code(mediator: Mediator) -> None:
    with mediator.client("alice", reconnect_for=1) as client:
        with pytest.raises(MediatorError) as bad:
            client.add_profile('class A = type == "a"\nprofile Q = (A;\n')
        assert bad.value.code == grpc.StatusCode.INVALID_ARGUMENT
        assert str(bad.value).startswith("line 2, column 16: found end of input, expected ")
        with pytest.raises(MediatorError) as unknown:
            next(client.subscribe(name="nobody"))
        assert unknown.value.code == grpc.StatusCode.NOT_FOUND
        client.add_profile(PROFILE)
        with pytest.raises(MediatorError) as token:
            next(client.subscribe(name="P", resume_token="not-a-token"))
        assert token.value.code == grpc.StatusCode.INVALID_ARGUMENT
    with MediatorClient("127.0.0.1:1", "evm_x", timeout=0.3) as nowhere, \
            pytest.raises(MediatorError) as unreachable:
        nowhere.services()
    assert str(unreachable.value) == ("cannot reach the mediator at 127.0.0.1:1: no connection "
                                      "within 0.3 s")
    with MediatorClient(mediator.address, "evm_wrong") as stranger, \
            pytest.raises(MediatorError) as refused:
        stranger.profiles()
    assert refused.value.code == grpc.StatusCode.UNAUTHENTICATED
    assert str(refused.value).startswith(f"the mediator at {mediator.address} refused the token")


def test_add_profiles_splits_a_thousand_per_call_and_answers_each(mediator: Mediator) -> None:
    """1,001 documents: two calls; the first 100 registered (limits.profiles), the rest each
    refused with the limit — and a registered subscription is live."""
    texts = [PROFILE.replace("profile P", f"profile P{i}") for i in range(1001)]
    with mediator.client("alice") as client:
        results = client.add_profiles([(text, None) for text in texts[:-1]] + [texts[-1]])
        assert len(results) == 1001
        added = [r for r in results if not isinstance(r, MediatorError)]
        assert [a.name for a in added] == [f"P{i}" for i in range(100)]
        refused = results[100:]
        assert all(isinstance(r, MediatorError) and r.code == grpc.StatusCode.RESOURCE_EXHAUSTED
                   and r.reason == "TOO_MANY_PROFILES" for r in refused)
        assert len(client.profiles()) == 100
        reader = Reader(client.subscribe(name="P7"))
        client.publish(events(0, 2), advance_to=END)
        assert constituents(reader.wait_for(2)) == ["e0", "e1"]
        bad = client.add_profiles(['class A = type == "a"\nprofile Q = (A;\n'])
        assert isinstance(bad[0], MediatorError)
        assert str(bad[0]).startswith("line 2, column 16: found end of input, expected ")
        with pytest.raises(TypeError, match="not one text"):
            client.add_profiles(PROFILE)


def test_add_profiles_splits_by_size_under_the_mediators_message_limit(
        mediator: Mediator) -> None:
    """Five documents of 900 KB — each within the 1 MiB a document may have, 4.5 MB
    together, over the 4 MiB a message may — are sent in calls under it, all registered."""
    with mediator.client("alice") as client:
        texts = [PROFILE.replace("profile P", f"profile Big{i}") + "#" * 900_000 + "\n"
                 for i in range(5)]
        results = client.add_profiles(texts)
        assert [getattr(r, "name", r) for r in results] == [f"Big{i}" for i in range(5)]


def test_profiles_are_private_to_their_client(mediator: Mediator) -> None:
    with mediator.client("alice") as alice, mediator.client("bob") as bob:
        added = alice.add_profile(PROFILE, name="mine")
        assert (added.name, added.profiles, added.owner) == ("mine", ("P",), "alice")
        assert [p.name for p in alice.profiles()] == ["mine"]
        assert alice.profile("mine").text == PROFILE
        assert bob.profiles() == []
        with pytest.raises(MediatorError) as read:
            bob.profile("mine")
        assert read.value.code == grpc.StatusCode.NOT_FOUND
        assert bob.unsubscribe("mine") is False
        assert "equivalent" in alice.explain(name="mine").text
        assert alice.services() == []  # no service configured: everything at the mediator
        assert alice.unsubscribe("mine") is True
        assert alice.profiles() == []


def test_a_stream_ends_when_its_subscription_is_removed(mediator: Mediator) -> None:
    with mediator.client("alice") as client:
        client.add_profile(PROFILE)
        reader = Reader(client.subscribe(name="P"))
        time.sleep(0.2)
        client.unsubscribe("P")
        reader.thread.join(10)
        assert not reader.thread.is_alive() and reader.error is None


# ------------------------------------------------------------------ the commands


def test_clients_add_prints_the_token_once_and_list_and_revoke_manage_them(
        tmp_path: Path) -> None:
    store = ["--store", f"sqlite:///{tmp_path / 'm.db'}"]
    added = runner.invoke(app, ["clients", "add", "alice", *store])
    assert added.exit_code == 0, added.output
    token = added.stdout.strip()
    assert token.startswith("evm_") and "shown only now" in added.stderr
    listed = runner.invoke(app, ["clients", "list", "--format", "json", *store])
    assert [(c["name"], c["revoked"]) for c in json.loads(listed.stdout)] == [("alice", False)]
    assert token not in listed.stdout
    again = runner.invoke(app, ["clients", "add", "alice", *store])
    assert again.exit_code == 1 and "already exists" in again.stderr
    assert runner.invoke(app, ["clients", "revoke", "alice", *store]).exit_code == 0
    twice = runner.invoke(app, ["clients", "revoke", "alice", *store])
    assert twice.exit_code == 1 and "no active client 'alice'" in twice.stderr
    both = runner.invoke(app, ["clients", "list", *store, "--config", "m.toml"])
    assert both.exit_code == 2 and "exclude each other" in both.stderr


def test_the_profile_commands_manage_a_clients_subscriptions(
        mediator: Mediator, tmp_path: Path) -> None:
    env = {"EVAMED_SERVER": mediator.address, "EVAMED_TOKEN": mediator.token("alice")}
    (tmp_path / "p.eva").write_text(PROFILE)
    added = runner.invoke(app, ["profile", "add", str(tmp_path / "p.eva"), "--name", "mine"],
                          env=env)
    assert added.exit_code == 0, added.output
    assert added.stdout.splitlines() == ["added mine: P", "  P: equivalent, mediator"]
    listed = runner.invoke(app, ["profile", "list", "--format", "json"], env=env)
    assert [p["name"] for p in json.loads(listed.stdout)] == ["mine"]
    shown = runner.invoke(app, ["profile", "show", "mine"], env=env)
    assert shown.exit_code == 0 and shown.stdout.endswith(PROFILE)
    explained = runner.invoke(app, ["explain", "--server", mediator.address, "--name", "mine"],
                              env=env)
    assert explained.exit_code == 0 and "equivalent" in explained.stdout
    services = runner.invoke(app, ["services", "list", "--format", "json"], env=env)
    assert services.exit_code == 0 and json.loads(services.stdout) == []
    assert runner.invoke(app, ["profile", "rm", "mine"], env=env).stdout == "removed mine\n"
    gone = runner.invoke(app, ["profile", "rm", "mine"], env=env)
    assert gone.exit_code == 1 and "no subscription 'mine'" in gone.stderr


def test_profile_add_takes_several_documents_and_says_which_were_refused(
        mediator: Mediator, tmp_path: Path) -> None:
    env = {"EVAMED_SERVER": mediator.address, "EVAMED_TOKEN": mediator.token("alice")}
    files = []
    for name, text in (("a", PROFILE), ("bad", 'class A = type == "a"\nprofile Q = (A;\n'),
                       ("b", PROFILE.replace("profile P", "profile R"))):
        files.append(tmp_path / f"{name}.eva")
        files[-1].write_text(text)
    result = runner.invoke(app, ["profile", "add", *map(str, files)], env=env)
    assert result.exit_code == 1
    assert result.stdout.splitlines() == ["added P: P", "  P: equivalent, mediator",
                                          "added R: R", "  R: equivalent, mediator"]
    assert result.stderr.splitlines()[0].startswith(
        f"refused {files[1]}: line 2, column 16: found end of input, expected ")
    assert result.stderr.splitlines()[-1] == ("error: 1 of 3 documents refused (the others "
                                              "were added)")
    named = runner.invoke(app, ["profile", "add", *map(str, files), "--name", "x"], env=env)
    assert named.exit_code == 2 and "--name names one subscription" in named.stderr
    again = runner.invoke(app, ["profile", "add", str(files[1]), str(files[1])], env=env)
    assert again.exit_code == 1
    assert again.stderr.splitlines()[-1] == "error: all 2 documents refused"


def test_a_refusal_is_one_line_with_exit_1_and_never_a_traceback(
        mediator: Mediator, tmp_path: Path) -> None:
    env = {"EVAMED_SERVER": mediator.address, "EVAMED_TOKEN": mediator.token("alice")}
    bad = tmp_path / "bad.eva"
    bad.write_text('class A = type == "a"\nprofile Q = (A;\n')
    result = runner.invoke(app, ["profile", "add", str(bad)], env=env)
    assert result.exit_code == 1
    assert result.stderr.startswith(f"error: {bad}: line 2, column 16: found end of input, "
                                    "expected "), result.stderr
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
    for args, message in [
            (["profile", "show", "nobody"], "error: you have no subscription named 'nobody'"),
            (["profile", "list", "--token", "evm_wrong"],
             f"error: the mediator at {mediator.address} refused the token")]:
        result = runner.invoke(app, args, env=env)
        assert result.exit_code == 1 and result.stderr.startswith(message), result.stderr
    untokened = runner.invoke(app, ["profile", "list"], env={"EVAMED_TOKEN": ""})
    assert untokened.exit_code == 2 and "no token for 127.0.0.1:50060: give --token" in untokened.stderr


def test_publish_prints_the_counts_and_each_dead_letter_by_line(
        mediator: Mediator, tmp_path: Path) -> None:
    env = {"EVAMED_SERVER": mediator.address, "EVAMED_TOKEN": mediator.token("alice")}
    lines = events(0, 3)
    (tmp_path / "e.jsonl").write_text("\n".join([lines[0], "", lines[1], "{oops", lines[0],
                                                 lines[2]]) + "\n")
    result = runner.invoke(app, ["publish", str(tmp_path / "e.jsonl"), "--batch", "2"], env=env)
    assert result.exit_code == 0, result.output
    assert result.stdout == "accepted 3, dead-lettered 2\n"
    assert "line 4: malformed: " in result.stderr
    assert "line 5 (id e0): duplicate: " in result.stderr
    missing = runner.invoke(app, ["publish", str(tmp_path / "none.jsonl")], env=env)
    assert missing.exit_code == 2 and "cannot read" in missing.stderr


def test_subscribe_tails_json_lines_and_ctrl_c_prints_the_resume_token(
        mediator: Mediator, tmp_path: Path) -> None:
    env = {**os.environ, "EVAMED_SERVER": mediator.address, "EVAMED_TOKEN": mediator.token("a")}
    (tmp_path / "p.eva").write_text(PROFILE)
    proc = subprocess.Popen([EVAMED, "subscribe", "--file", str(tmp_path / "p.eva")], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        with MediatorClient(mediator.address, env["EVAMED_TOKEN"]) as client:
            registered(client, "P")
            client.publish(events(0, 3), advance_to=END)
        got = [json.loads(proc.stdout.readline()) for _ in range(3)]
        assert [g["cloudevent"]["data"]["constituents"] for g in got] == [["e0"], ["e1"], ["e2"]]
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, stderr
    assert stderr.strip() == (f"stopped; resume with: evamed subscribe P --resume "
                              f"{got[-1]['resume_token']}")


def test_subscribe_as_a_table_resumes_after_the_token_given(
        mediator: Mediator, tmp_path: Path) -> None:
    env = {**os.environ, "EVAMED_SERVER": mediator.address, "EVAMED_TOKEN": mediator.token("a"),
           "COLUMNS": "120"}
    with MediatorClient(mediator.address, env["EVAMED_TOKEN"]) as client:
        client.add_profile(PROFILE)
        client.publish(events(0, 3), advance_to=END)
        notes = client.subscribe(name="P")
        first = next(notes)
        notes.close()
    lines, code = tail(env, ["P", "--format", "table", "--resume", first.resume_token], 3)
    rows = [line.split() for line in lines]
    assert rows[0] == ["time", "profile", "id", "sources", "services"]
    assert [r[:2] for r in rows[1:]] == [["2026-01-01T00:00:01Z", "P"],
                                         ["2026-01-01T00:00:02Z", "P"]]
    assert code == 0


def tail(env: dict[str, str], args: list[str], count: int) -> tuple[list[str], int]:
    """``evamed subscribe ARGS``: its first ``count`` lines, then Ctrl-C; and its exit code."""
    proc = subprocess.Popen([EVAMED, "subscribe", *args], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        lines = [proc.stdout.readline().strip() for _ in range(count)]
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
    return lines, proc.returncode


def test_subscribe_compact_and_expanded_shows_the_contributing_events(
        mediator: Mediator) -> None:
    """--format compact --expand: a line per composite with each contributing event's type,
    source and time, as the mediator logged them."""
    env = {**os.environ, "EVAMED_SERVER": mediator.address, "EVAMED_TOKEN": mediator.token("a")}
    with MediatorClient(mediator.address, env["EVAMED_TOKEN"]) as client:
        client.add_profile(PROFILE)
        client.publish(events(0, 2), advance_to=END)
    for shape, want in (("compact", "2026-01-01T00:00:01Z P (a@test 2026-01-01T00:00:01Z) "
                                    "via mediator"),
                        ("json", '"events": [{"id": "e1", "type": "a", "source": "test", '
                                 '"time": "2026-01-01T00:00:01Z"}]')):
        lines, _ = tail(env, ["P", "--format", shape, "--expand"], 2)
        assert want in lines[1], lines
