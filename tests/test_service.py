"""The mediator's gRPC API (issue 13, items 2, 3, 6, 8): authentication, errors with
google.rpc details, limits, delivery from the log with resume tokens, ownership, health,
reflection and metrics — an in-process server over a real SQLite store.

The pipeline is mostly a double (:class:`Pipeline`), so that what these tests prove is the
service's part: the double appends to the notification logs exactly as the pipeline does
(``store.append_notifications`` then ``on_append``). One test runs the paper's day through the
API and the real pipeline; the pipeline itself is tested in tests/test_pipeline.py.
"""

from __future__ import annotations

import json
import logging
import shutil
import signal
import subprocess
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.rpc import error_details_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from grpc_status import rpc_status
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from adapters.federation import PushRefused
from adapters.undecodable import Throttle
from eva import ast
from eva.parser import parse
from mediator import logs
from mediator.client import MediatorClient, MediatorError
from mediator.config import Config, Limits, Tls
from mediator.delivery import RateLimit, TokenError, resume_token, token_position
from mediator.security import add_client, revoke_client
from mediator.server import Running, serve
from mediator.store.base import Store, SubscriptionRecord
from mediator.store.sqlite import SqliteStore
from mediator.wire import SERVICE_NAME, mediator_pb2, mediator_pb2_grpc
from tests.helpers import SENTINEL, Reader, logistics_day
from tests.servers import free_port
from tests.test_service_e2e import Process, cli
from transforms.plans import Plan

PROFILE = ('class A = type == "a"\nclass B = type == "b"\n'
           "profile P = ((all_dup(A); all_dup(B))_10s)_all_pairs\n")
TIMEOUT = 10


class Pipeline:
    """A double of mediator.pipeline.Pipeline: registers what it is given, appends what a test
    emits as the pipeline would, and refuses a profile named ``Refused``."""

    def __init__(self, store: Store, links: Any, *, tick: int, composer: str, metrics: Any,
                 on_append: Callable[[str, str, int], None], **options: Any) -> None:
        self.store = store
        self.on_append = on_append
        self.live: dict[tuple[str, str], SubscriptionRecord] = {}
        self.wakes = 0
        self.advanced: list[int] = []
        self.failed: dict[tuple[str, str], str] = {}  # what failure() says
        self.limited: dict[tuple[str, str], str] = {}  # what suspended() says
        self.error: BaseException | None = None

    def start(self) -> None: ...
    def stop(self, timeout: float = 5.0) -> None: ...

    def add(self, record: SubscriptionRecord, doc: ast.Document | None = None,
            summary: Callable[[list[Plan]], str] | None = None) -> list[Plan]:
        doc = doc if doc is not None else parse(record.text)
        if any(p.name == "Refused" for p in doc.profiles):
            raise PushRefused("the service refused the query Refused")
        if summary is not None:  # stored once planned, as the pipeline does
            record = replace(record, plans=summary([]))
            self.store.put_subscription(record)
        self.live[(record.owner, record.name)] = record
        return []

    def record(self, owner: str, name: str) -> SubscriptionRecord | None:
        return self.live.get((owner, name))

    def remove(self, owner: str, name: str) -> bool:
        return self.live.pop((owner, name), None) is not None

    def wake(self) -> None:
        self.wakes += 1

    def handed(self, head: int, lines: list[str], events: list[Any]) -> None:
        """The door's decoded events: the double reads nothing."""

    def advance(self, time: int) -> None:
        self.advanced.append(time)

    def failure(self, owner: str, name: str) -> str | None:
        return self.failed.get((owner, name))

    def suspended(self, owner: str, name: str) -> str | None:
        return self.limited.get((owner, name))

    def explain(self, doc: ast.Document) -> tuple[str, str]:
        return f"{len(doc.profiles)} profiles", "[]"

    def newest(self) -> int | None:
        return None

    def services(self) -> list[Any]:
        return []

    def inputs(self) -> list[Any]:
        return []

    def placement(self, owner: str, name: str) -> dict[str, str]:
        return {}

    def emit(self, owner: str, name: str, ids: Sequence[str]) -> None:
        """Composites appended to a subscription's log, as the pipeline appends them."""
        items = [(i, json.dumps({"cloudevent": json.dumps({"id": i}), "id": i, "profile": "P",
                                 "subscription": name, "sources": ["s"],
                                 "services": ["mediator"]}).encode()) for i in ids]
        appended = self.store.append_notifications(owner, name, items)
        if appended:
            self.on_append(owner, name, appended[-1].position)


class Mediator:
    """A mediator in this process on a free port, and a client's view of it."""

    def __init__(self, path: Path, *, real: bool = False, **config: Any) -> None:
        """``real``: with the real pipeline (else the double)."""
        self.store = SqliteStore(path)
        limits = config.pop("limits", Limits(rate=0))
        config.setdefault("composer", "inprocess")  # not a Spark test: no JVM
        self.config = Config(listen="127.0.0.1:0", limits=limits, **config)
        self.running: Running = serve(self.config, store=self.store,
                                      pipeline=None if real else Pipeline)
        self.pipeline: Pipeline = self.running.served.pipeline  # type: ignore[assignment]
        self.channel = grpc.insecure_channel(f"127.0.0.1:{self.running.port}")
        self.stub = mediator_pb2_grpc.MediatorServiceStub(self.channel)

    def client(self, name: str) -> list[tuple[str, str]]:
        """A new client's call metadata."""
        # An operator's rights: the tests publish under any source and advance the clock.
        return [("authorization", f"Bearer {add_client(self.store, name, operator=True)}")]

    def close(self) -> None:
        self.channel.close()
        self.running.stop(0.5)
        self.store.close()


@pytest.fixture
def mediator(tmp_path: Path) -> Iterator[Mediator]:
    running = Mediator(tmp_path / "m.db")
    yield running
    running.close()


def refusal(call: Callable[[], Any]) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as caught:
        result = call()
        if hasattr(result, "__next__"):
            list(result)
    return caught.value


def details(error: grpc.RpcError) -> tuple[list[Any], list[Any]]:
    """The BadRequest violations and the ErrorInfos of a refusal."""
    status = rpc_status.from_call(error)
    violations, infos = [], []
    for any_detail in status.details if status is not None else ():
        bad, info = error_details_pb2.BadRequest(), error_details_pb2.ErrorInfo()
        if any_detail.Unpack(bad):
            violations.extend(bad.field_violations)
        elif any_detail.Unpack(info):
            infos.append(info)
    return violations, infos


def subscribe(m: Mediator, md: list[tuple[str, str]], count: int, **request: str) -> list[Any]:
    """The ready message, then ``count`` notifications of a Subscribe stream."""
    stream = m.stub.Subscribe(mediator_pb2.SubscribeRequest(**request), metadata=md,
                              timeout=TIMEOUT)
    try:
        return [next(stream) for _ in range(count + 1)]
    finally:
        stream.cancel()


# ------------------------------------------------------------------ authentication


def test_every_call_needs_a_valid_bearer_token(mediator: Mediator) -> None:
    good = mediator.client("alice")
    calls = {
        "none": [],
        "not bearer": [("authorization", "Basic dXNlcjpwdw==")],
        "unknown": [("authorization", "Bearer evm_not-a-token-anyone-was-given")],
    }
    for what, md in calls.items():
        error = refusal(partial(mediator.stub.ListProfiles, mediator_pb2.ListProfilesRequest(),
                                metadata=md, timeout=TIMEOUT))
        assert error.code() == grpc.StatusCode.UNAUTHENTICATED, what
        assert "evm_" not in (error.details() or ""), "a token is never echoed"
        error = refusal(partial(mediator.stub.Subscribe, mediator_pb2.SubscribeRequest(
            profile_text=PROFILE), metadata=md, timeout=TIMEOUT))
        assert error.code() == grpc.StatusCode.UNAUTHENTICATED, what
    assert mediator.stub.ListProfiles(mediator_pb2.ListProfilesRequest(), metadata=good,
                                      timeout=TIMEOUT).profiles == []
    assert revoke_client(mediator.store, "alice")
    error = refusal(lambda: mediator.stub.ListProfiles(mediator_pb2.ListProfilesRequest(),
                                                       metadata=good, timeout=TIMEOUT))
    assert error.code() == grpc.StatusCode.UNAUTHENTICATED


def test_refused_tokens_are_logged_once_a_minute_per_client(
        mediator: Mediator, caplog: pytest.LogCaptureFixture) -> None:
    """A client retrying with a bad token cannot fill the log: one line, the rest counted."""
    md = [("authorization", "Bearer evm_not-a-token-anyone-was-given")]
    with caplog.at_level(logging.INFO, logger="evamed.server"):
        for _ in range(20):
            error = refusal(partial(mediator.stub.ListProfiles, mediator_pb2.ListProfilesRequest(),
                                    metadata=md, timeout=TIMEOUT))
            assert error.code() == grpc.StatusCode.UNAUTHENTICATED
    lines = [r.getMessage() for r in caplog.records if "refused a call" in r.getMessage()]
    assert len(lines) == 1, lines
    assert "unknown or revoked token" in lines[0] and "evm_" not in lines[0]


def test_health_and_reflection_need_no_token_and_reflection_lists_the_api(
        mediator: Mediator) -> None:
    health = health_pb2_grpc.HealthStub(mediator.channel)
    answer = health.Check(health_pb2.HealthCheckRequest(service=SERVICE_NAME), timeout=TIMEOUT)
    assert answer.status == health_pb2.HealthCheckResponse.SERVING
    reflect = reflection_pb2_grpc.ServerReflectionStub(mediator.channel)
    replies = reflect.ServerReflectionInfo(
        iter([reflection_pb2.ServerReflectionRequest(list_services="")]), timeout=TIMEOUT)
    names = {s.name for r in replies for s in r.list_services_response.service}
    assert SERVICE_NAME in names and "grpc.health.v1.Health" in names


def test_logs_never_show_a_token(caplog: pytest.LogCaptureFixture) -> None:
    record = logging.LogRecord("evamed", logging.INFO, __file__, 1,
                               "client sent %s with header %s", ("evm_abcDEF123-_x",
                                                                 "Bearer s3cret"), None)
    assert logs.Redact().filter(record)
    assert record.getMessage() == ("client sent [redacted] with header Bearer [redacted]")
    assert logs.redact("store redis://:pa55@db:6379/0 and redis://u:p@h/1") == (
        "store redis://:[redacted]@db:6379/0 and redis://u:[redacted]@h/1")
    assert json.loads(logs.JsonFormatter().format(record))["message"] == record.getMessage()


def openssl(*args: str, cwd: Path) -> None:
    tool = shutil.which("openssl")
    if tool is None:
        pytest.fail("openssl is not installed (the TLS test makes its certificates with it)")
    subprocess.run([tool, *args], cwd=cwd, check=True, capture_output=True)


def certificates(folder: Path) -> None:
    """ca.pem; server.pem/.key for 127.0.0.1 and client.pem/.key, both signed by the CA."""
    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=test-ca",
            "-keyout", "ca.key", "-out", "ca.pem", cwd=folder)
    for name, extension in (("server", "subjectAltName=IP:127.0.0.1"),
                            ("client", "extendedKeyUsage=clientAuth")):
        openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={name}", "-keyout",
                f"{name}.key", "-out", f"{name}.csr", cwd=folder)
        (folder / f"{name}.ext").write_text(extension + "\n")
        openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
                "-CAcreateserial", "-days", "1", "-extfile", f"{name}.ext", "-out", f"{name}.pem",
                cwd=folder)


def test_tls_with_client_certificates(tmp_path: Path) -> None:
    certificates(tmp_path)
    store = SqliteStore(tmp_path / "m.db")
    tls = Tls(str(tmp_path / "server.pem"), str(tmp_path / "server.key"),
              str(tmp_path / "ca.pem"))
    running = serve(Config(listen="127.0.0.1:0", tls=tls), store=store, pipeline=Pipeline)
    try:
        md = [("authorization", f"Bearer {add_client(store, 'alice', operator=True)}")]
        address = f"127.0.0.1:{running.port}"
        ca = (tmp_path / "ca.pem").read_bytes()

        def list_profiles(channel: grpc.Channel) -> Any:
            with channel:
                return mediator_pb2_grpc.MediatorServiceStub(channel).ListProfiles(
                    mediator_pb2.ListProfilesRequest(), metadata=md, timeout=3)

        mutual = grpc.ssl_channel_credentials(ca, (tmp_path / "client.key").read_bytes(),
                                              (tmp_path / "client.pem").read_bytes())
        assert list_profiles(grpc.secure_channel(address, mutual)).profiles == []
        for refused in (grpc.secure_channel(address, grpc.ssl_channel_credentials(ca)),
                        grpc.insecure_channel(address)):
            error = refusal(partial(list_profiles, refused))
            assert error.code() == grpc.StatusCode.UNAVAILABLE
    finally:
        running.stop(0.5)
        store.close()
    with pytest.raises(OSError, match=r"tls.cert: cannot read .*nothing.pem"):
        serve(Config(listen="127.0.0.1:0", tls=replace(tls, cert=str(tmp_path / "nothing.pem"))))


# ------------------------------------------------------------------ profiles and limits


GARBAGE = b"\x0a\xff\xff"
"""Not a protobuf message: field 1 with a length that runs past the end."""


def test_bytes_that_are_not_a_request_are_refused_and_logged_once_without_a_traceback(
        mediator: Mediator, caplog: pytest.LogCaptureFixture) -> None:
    """Issue 28, item 3: every method — the API's, health's, reflection's; unary and streaming,
    a stream's first message or a later one — answers bytes that do not decode
    INVALID_ARGUMENT naming the message expected (it was UNKNOWN, "Unexpected DecodeError"),
    and the log says so once per client a minute, in one line (it was a traceback a call)."""
    caplog.set_level(logging.INFO)
    md = mediator.client("alice")
    same = bytes  # the bytes as they are: a generic call with no serializer of its own
    valid = mediator_pb2.PublishRequest(cloudevents=[json.dumps(
        {"specversion": "1.0", "id": "e1", "source": "s", "type": "a",
         "time": "2026-03-02T00:00:00Z"})]).SerializeToString()
    services = [(mediator_pb2.DESCRIPTOR.services_by_name["MediatorService"], md),
                (health_pb2.DESCRIPTOR.services_by_name["Health"], []),
                (reflection_pb2.DESCRIPTOR.services_by_name["ServerReflection"], [])]
    calls = []
    for service, metadata in services:
        for method in service.methods:
            path = f"/{service.full_name}/{method.name}"
            kind = ("stream" if method.client_streaming else "unary") + "_" + (
                "stream" if method.server_streaming else "unary")
            call = getattr(mediator.channel, kind)(path, request_serializer=same,
                                                   response_deserializer=same)
            messages = [valid, GARBAGE] if method.name == "Publish" else [GARBAGE]  # Publish:
            # the garbage is the stream's second message
            calls.append((path, method.input_type.full_name, kind, call, messages, metadata))
    assert sum(c[0].startswith("/eva.mediator.v1.") for c in calls) == 12
    for _ in range(3):
        for path, expected, kind, call, messages, metadata in calls:
            with pytest.raises(grpc.RpcError) as refused:
                given = iter(messages) if kind.startswith("stream") else messages[0]
                answer = call(given, metadata=metadata, timeout=TIMEOUT)
                if kind.endswith("stream"):
                    list(answer)
            error = refused.value
            assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, (path, error)
            assert f"the request is not a valid {expected}: its bytes do not decode" in (
                error.details() or ""), (path, error.details())
    assert mediator.store.event_head() == 1  # the valid message before the garbage was taken
    assert "Traceback" not in caplog.text and "Unexpected" not in caplog.text, caplog.text
    assert not [r for r in caplog.records if r.exc_info]
    lines = [r.getMessage() for r in caplog.records if "is not a valid" in r.getMessage()]
    assert [line.split(" sent ")[0] for line in lines] == ["client alice", "ipv4:127.0.0.1"], lines
    assert all("\n" not in line for line in lines)


def test_a_client_s_undecodable_requests_are_logged_once_a_minute_with_the_count() -> None:
    now = [0.0]
    throttle = Throttle(period=60.0, clock=lambda: now[0])
    assert throttle.due("client a") == 0  # logged
    assert [throttle.due("client a") for _ in range(5)] == [None] * 5  # counted, not logged
    assert throttle.due("client b") == 0  # another client: logged
    now[0] = 59.9
    assert throttle.due("client a") is None
    now[0] = 60.0
    assert throttle.due("client a") == 6  # logged, with how many were not
    assert throttle.due("client a") is None


def test_a_profile_that_does_not_parse_names_line_and_column(mediator: Mediator) -> None:
    md = mediator.client("alice")
    text = 'class A = type == "a"\nprofile P = ((all_dup(A); all_dup(A))_10s\n'
    for call in (lambda: mediator.stub.Subscribe(mediator_pb2.SubscribeRequest(
                     profile_text=text), metadata=md, timeout=TIMEOUT),
                 lambda: mediator.stub.AddProfile(mediator_pb2.AddProfileRequest(
                     profile_text=text), metadata=md, timeout=TIMEOUT)):
        error = refusal(call)
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
        (violation,), _ = details(error)
        assert violation.field == "profile"
        assert violation.description.startswith("line 2, column "), violation.description
        assert "expected" in violation.description
    assert mediator.store.subscriptions("alice") == []


def test_limits_are_refused_with_their_reasons(tmp_path: Path) -> None:
    m = Mediator(tmp_path / "m.db", limits=Limits(profiles=2, depth=1, time_frame=60_000_000,
                                                  profile_bytes=400, rate=0))
    try:
        md = m.client("alice")

        def add(text: str, name: str = "") -> Any:
            return m.stub.AddProfile(mediator_pb2.AddProfileRequest(profile_text=text, name=name),
                                     metadata=md, timeout=TIMEOUT)

        cases = {
            "PROFILE_TOO_DEEP": 'class A = type == "a"\nprofile P = ((all_dup(((all_dup(A); '
                                'all_dup(A))_1s)_all_pairs); all_dup(A))_1s)_all_pairs\n',
            "TIME_FRAME_TOO_LONG": PROFILE.replace("_10s", "_2min"),
            "PROFILE_TOO_LARGE": PROFILE + "#" * 400 + "\n",
        }
        for expected, text in cases.items():
            error = refusal(partial(add, text))
            assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, expected
            _, infos = details(error)
            assert [i.reason for i in infos] == [expected], error.details()
        unbounded = refusal(lambda: add(PROFILE.replace("_10s", "_inf")))
        assert "unbounded" in (unbounded.details() or "")
        add(PROFILE, "one")
        add(PROFILE, "two")
        error = refusal(lambda: add(PROFILE, "three"))
        assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert [i.reason for i in details(error)[1]] == ["TOO_MANY_PROFILES"]
        assert "2" in (error.details() or "")
    finally:
        m.close()


def test_add_profiles_answers_each_document_as_add_profile_would(tmp_path: Path) -> None:
    """AddProfiles: one result per document, in order; a refusal is AddProfile's (code,
    message, details) and does not stop the documents after it; a large document goes
    through the reading processes as AddProfile's does; the per-client limit counts the
    documents registered earlier in the same call."""
    m = Mediator(tmp_path / "m.db", limits=Limits(profiles=4, depth=1, profile_bytes=6000,
                                                  rate=0), real=True)
    try:
        md = m.client("alice")

        def add(text: str, name: str = "") -> Any:
            return m.stub.AddProfile(mediator_pb2.AddProfileRequest(profile_text=text, name=name),
                                     metadata=md, timeout=TIMEOUT)

        bad = 'class A = type == "a"\nprofile Q = (A;\n'
        deep = ('class A = type == "a"\nprofile D = ((all_dup(((all_dup(A); all_dup(A))_1s)'
                '_all_pairs); all_dup(A))_1s)_all_pairs\n')
        huge = PROFILE + "#" * 6000 + "\n"
        large = PROFILE.replace("profile P", "profile L") + "#" * 4500 + "\n"  # > 4096 bytes
        other = PROFILE.replace("_10s", "_5s")
        documents = [(PROFILE, ""), (bad, ""), (deep, ""), (huge, ""), (large, ""),
                     (PROFILE, ""), (other, "P"), (other, "second"), (other, "third"),
                     (other, "fifth")]
        reply = m.stub.AddProfiles(mediator_pb2.AddProfilesRequest(profiles=[
            mediator_pb2.AddProfileRequest(profile_text=t, name=n) for t, n in documents]),
            metadata=md, timeout=TIMEOUT)
        kinds = [r.WhichOneof("result") for r in reply.results]
        assert kinds == ["profile", "refused", "refused", "refused", "profile", "profile",
                         "refused", "profile", "profile", "refused"]
        names = [r.profile.name for r in reply.results if r.HasField("profile")]
        assert names == ["P", "L", "P", "second", "third"]  # the 2nd P: registered before
        assert [p.name for p in m.store.subscriptions("alice")] == ["L", "P", "second", "third"]

        def as_refused(error: grpc.RpcError) -> tuple[int, str, list[Any]]:
            status = rpc_status.from_call(error)
            assert status is not None
            return status.code, status.message, list(status.details)

        for index, text in ((1, bad), (2, deep), (3, huge)):
            refused = reply.results[index].refused
            assert (refused.code, refused.message, list(refused.details)) == as_refused(
                refusal(partial(add, text))), index
        codes = [grpc.StatusCode.INVALID_ARGUMENT] * 3 + [grpc.StatusCode.ALREADY_EXISTS,
                                                          grpc.StatusCode.RESOURCE_EXHAUSTED]
        assert [r.refused.code for r in reply.results if r.HasField("refused")] == [
            code.value[0] for code in codes]
        assert reply.results[9].refused.message.startswith("you have 4 subscriptions, the "
                                                           "limit per client is 4")
    finally:
        m.close()


def test_add_profiles_answers_a_store_fault_per_document_and_hops_end_on_time(
        mediator: Mediator, monkeypatch: pytest.MonkeyPatch) -> None:
    """A store that fails for one document: a large one (read in a reading process) is
    refused UNAVAILABLE and the next is registered; a small one refuses the rest of its hop
    untried (each would wait out the store). Hops that end after each document (HOP_SECONDS
    0) still answer every document, in order."""
    import mediator.service as service
    from mediator.store.base import StoreError

    md = mediator.client("alice")
    read = mediator.store.subscription

    def failing(owner: str, name: str) -> Any:
        if name.startswith("down"):
            raise StoreError("the store does not answer")
        return read(owner, name)

    monkeypatch.setattr(mediator.store, "subscription", failing)

    def batch(*documents: tuple[str, str]) -> list[Any]:
        reply = mediator.stub.AddProfiles(mediator_pb2.AddProfilesRequest(profiles=[
            mediator_pb2.AddProfileRequest(profile_text=t, name=n) for t, n in documents]),
            metadata=md, timeout=TIMEOUT)
        return [r.profile.name if r.HasField("profile") else r.refused.code
                for r in reply.results]

    unavailable = grpc.StatusCode.UNAVAILABLE.value[0]
    large = PROFILE + "#" * 5000 + "\n"
    assert batch((PROFILE, "p"), (large, "down1"), (PROFILE, "q")) == ["p", unavailable, "q"]
    assert batch((PROFILE, "r"), (PROFILE, "down2"), (PROFILE, "s")) == [
        "r", unavailable, unavailable]
    monkeypatch.setattr(service, "HOP_SECONDS", 0.0)
    names = [f"t{i}" for i in range(7)]
    assert batch(*((PROFILE, n) for n in names)) == names


def test_add_profiles_refuses_more_than_a_thousand_documents_and_registers_none(
        mediator: Mediator) -> None:
    from mediator.client import MAX_BATCH as CLIENT_BATCH
    from mediator.service import MAX_BATCH

    assert CLIENT_BATCH == MAX_BATCH  # the client splits where the mediator refuses
    md = mediator.client("alice")
    error = refusal(lambda: mediator.stub.AddProfiles(mediator_pb2.AddProfilesRequest(
        profiles=[mediator_pb2.AddProfileRequest(profile_text=PROFILE, name=f"p{i}")
                  for i in range(MAX_BATCH + 1)]), metadata=md, timeout=TIMEOUT))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert [i.reason for i in details(error)[1]] == ["TOO_MANY_DOCUMENTS"]
    assert "1,001 profile documents in one call, the limit is 1,000" in (error.details() or "")
    assert mediator.store.subscriptions("alice") == []


def test_a_document_that_reads_longer_than_read_time_is_refused_with_its_reason(
        tmp_path: Path) -> None:
    """limits.read_time (issue 28, item 2): a document the worker has not read by then is
    RESOURCE_EXHAUSTED, PROFILE_TOO_SLOW; the next document is read as usual."""
    m = Mediator(tmp_path / "m.db", limits=Limits(rate=0, read_time=200_000))
    try:
        md = m.client("alice")
        slow = "class C = " + "(" * 200_000 + "x == 1" + ")" * 200_000 + "\nprofile P = C\n"
        error = refusal(lambda: m.stub.AddProfile(mediator_pb2.AddProfileRequest(
            profile_text=slow), metadata=md, timeout=TIMEOUT))
        assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        (info,) = details(error)[1]
        assert (info.reason, info.metadata["limit"]) == ("PROFILE_TOO_SLOW", "200ms")
        assert "took longer than 200ms, the limit (limits.read_time)" in (error.details() or "")
        assert m.stub.AddProfile(mediator_pb2.AddProfileRequest(profile_text=PROFILE),
                                 metadata=md, timeout=TIMEOUT).name == "P"
    finally:
        m.close()


def test_names_same_text_resumes_other_text_already_exists_unknown_not_found(
        mediator: Mediator) -> None:
    md = mediator.client("alice")
    first = subscribe(mediator, md, 0, profile_text=PROFILE)
    assert first[0].ready and first[0].subscription == "P"  # the first profile's name
    again = subscribe(mediator, md, 0, profile_text=PROFILE)
    assert again[0].ready and len(mediator.store.subscriptions("alice")) == 1
    error = refusal(lambda: mediator.stub.AddProfile(mediator_pb2.AddProfileRequest(
        profile_text=PROFILE.replace("10s", "20s")), metadata=md, timeout=TIMEOUT))
    assert error.code() == grpc.StatusCode.ALREADY_EXISTS
    error = refusal(lambda: mediator.stub.Subscribe(mediator_pb2.SubscribeRequest(
        name="nobody"), metadata=md, timeout=TIMEOUT))
    assert error.code() == grpc.StatusCode.NOT_FOUND
    info = mediator.stub.GetProfile(mediator_pb2.GetProfileRequest(name="P"), metadata=md,
                                    timeout=TIMEOUT)
    assert (info.name, info.text, info.owner) == ("P", PROFILE, "alice")


def test_a_profile_the_pipeline_refuses_is_not_kept(mediator: Mediator) -> None:
    md = mediator.client("alice")
    error = refusal(lambda: mediator.stub.AddProfile(mediator_pb2.AddProfileRequest(
        profile_text=PROFILE.replace("profile P", "profile Refused")), metadata=md,
        timeout=TIMEOUT))
    assert error.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "refused" in (error.details() or "")
    assert mediator.store.subscriptions("alice") == []


def test_a_subscription_that_is_not_evaluated_says_why_and_refuses_a_stream(
        mediator: Mediator) -> None:
    """Issue 24.4: a subscription that could not be restored, or whose service now refuses
    its query, shows why in GetProfile and ListProfiles, and Subscribe to it fails with
    FAILED_PRECONDITION saying the same — not a silently empty stream."""
    md = mediator.client("alice")
    mediator.stub.AddProfile(mediator_pb2.AddProfileRequest(profile_text=PROFILE, name="s"),
                             metadata=md, timeout=TIMEOUT)
    why = "service sql refuses its query q-1: the query nests too deeply"
    mediator.pipeline.failed[("alice", "s")] = why
    info = mediator.stub.GetProfile(mediator_pb2.GetProfileRequest(name="s"), metadata=md,
                                    timeout=TIMEOUT)
    assert info.status == why
    listed = mediator.stub.ListProfiles(mediator_pb2.ListProfilesRequest(), metadata=md,
                                        timeout=TIMEOUT)
    assert [p.status for p in listed.profiles] == [why]
    error = refusal(lambda: mediator.stub.Subscribe(mediator_pb2.SubscribeRequest(name="s"),
                                                    metadata=md, timeout=TIMEOUT))
    assert error.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert why in (error.details() or "")


def test_a_client_sees_only_its_own_profiles(mediator: Mediator) -> None:
    alice, bob = mediator.client("alice"), mediator.client("bob")
    mediator.stub.AddProfile(mediator_pb2.AddProfileRequest(profile_text=PROFILE), metadata=alice,
                             timeout=TIMEOUT)
    mediator.pipeline.emit("alice", "P", ["c1"])
    assert mediator.stub.ListProfiles(mediator_pb2.ListProfilesRequest(), metadata=bob,
                                      timeout=TIMEOUT).profiles == []
    for call in (lambda: mediator.stub.GetProfile(mediator_pb2.GetProfileRequest(name="P"),
                                                  metadata=bob, timeout=TIMEOUT),
                 lambda: mediator.stub.Subscribe(mediator_pb2.SubscribeRequest(name="P"),
                                                 metadata=bob, timeout=TIMEOUT),
                 lambda: mediator.stub.Explain(mediator_pb2.ExplainRequest(name="P"),
                                               metadata=bob, timeout=TIMEOUT)):
        error = refusal(call)
        assert error.code() == grpc.StatusCode.NOT_FOUND  # as for a name nobody registered
        assert "alice" not in (error.details() or "")
    assert not mediator.stub.Unsubscribe(mediator_pb2.UnsubscribeRequest(name="P"), metadata=bob,
                                         timeout=TIMEOUT).found
    # bob may use the same name for his own: names are per client
    mediator.stub.AddProfile(mediator_pb2.AddProfileRequest(profile_text=PROFILE + "\n"),
                             metadata=bob, timeout=TIMEOUT)
    mine = mediator.stub.ListProfiles(mediator_pb2.ListProfilesRequest(), metadata=alice,
                                      timeout=TIMEOUT).profiles
    assert [(p.name, p.owner, p.text, p.log_head) for p in mine] == [("P", "alice", PROFILE, 1)]
    assert mediator.stub.Unsubscribe(mediator_pb2.UnsubscribeRequest(name="P"), metadata=alice,
                                     timeout=TIMEOUT).found
    assert mediator.store.subscription("bob", "P") is not None
    assert ("alice", "P") not in mediator.pipeline.live


# ------------------------------------------------------------------ delivery


def test_resume_from_a_token_gets_exactly_what_followed_in_order(mediator: Mediator) -> None:
    md = mediator.client("alice")
    mediator.stub.AddProfile(mediator_pb2.AddProfileRequest(profile_text=PROFILE), metadata=md,
                             timeout=TIMEOUT)
    mediator.pipeline.emit("alice", "P", [f"c{i}" for i in range(5)])
    first = subscribe(mediator, md, 3, name="P")
    assert [n.id for n in first[1:]] == ["c0", "c1", "c2"]
    assert first[1].sources == ["s"] and first[1].services == ["mediator"]
    assert json.loads(first[1].cloudevent) == {"id": "c0"}
    token = first[-1].resume_token
    mediator.pipeline.emit("alice", "P", ["c5", "c6", "c1"])  # c1 again: the log skips it

    # live: a stream waiting at the head is woken by the next append
    stream = mediator.stub.Subscribe(mediator_pb2.SubscribeRequest(name="P", resume_token=token),
                                     metadata=md, timeout=TIMEOUT)
    got = [next(stream) for _ in range(5)]
    later = threading.Timer(0.3, mediator.pipeline.emit, ("alice", "P", ["c7"]))
    later.start()
    got.append(next(stream))
    stream.cancel()
    assert got[0].ready
    assert [n.id for n in got[1:]] == ["c3", "c4", "c5", "c6", "c7"]
    record = mediator.store.subscription("alice", "P")
    assert record is not None
    positions = [token_position(n.resume_token, record) for n in got[1:]]
    assert positions == [4, 5, 6, 7, 8]


def test_a_revoked_client_s_open_stream_ends_before_its_next_notification(
        mediator: Mediator) -> None:
    md = mediator.client("alice")
    mediator.stub.AddProfile(mediator_pb2.AddProfileRequest(profile_text=PROFILE), metadata=md,
                             timeout=TIMEOUT)
    stream = mediator.stub.Subscribe(mediator_pb2.SubscribeRequest(name="P"), metadata=md,
                                     timeout=TIMEOUT)
    assert next(stream).ready
    mediator.pipeline.emit("alice", "P", ["c0"])
    assert next(stream).id == "c0"
    assert revoke_client(mediator.store, "alice")
    mediator.pipeline.emit("alice", "P", ["c1"])
    with pytest.raises(grpc.RpcError) as ended:
        next(stream)
    assert ended.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert "revoked" in (ended.value.details() or "")


def test_tokens_of_another_subscription_or_past_retention_are_refused_clearly(
        tmp_path: Path) -> None:
    m = Mediator(tmp_path / "m.db", retention=10)
    try:
        md = m.client("alice")
        for name in ("P", "Q"):
            m.stub.AddProfile(mediator_pb2.AddProfileRequest(profile_text=PROFILE, name=name),
                              metadata=md, timeout=TIMEOUT)
        m.pipeline.emit("alice", "P", ["c1", "c2"])
        token = subscribe(m, md, 1, name="P")[-1].resume_token
        error = refusal(lambda: m.stub.Subscribe(mediator_pb2.SubscribeRequest(
            name="Q", resume_token=token), metadata=md, timeout=TIMEOUT))
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "subscription 'P', not of 'Q'" in (error.details() or "")
        error = refusal(lambda: m.stub.Subscribe(mediator_pb2.SubscribeRequest(
            name="P", resume_token="garbage!"), metadata=md, timeout=TIMEOUT))
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
        m.pipeline.emit("alice", "P", [f"d{i}" for i in range(30)])  # trims to the newest 10+
        error = refusal(lambda: m.stub.Subscribe(mediator_pb2.SubscribeRequest(
            name="P", resume_token=token), metadata=md, timeout=TIMEOUT))
        assert error.code() == grpc.StatusCode.OUT_OF_RANGE
        assert "older than the oldest" in (error.details() or "")
        first, head = m.store.notification_bounds("alice", "P")
        assert head == 32 and 10 <= head - first + 1 <= 11
        # without a token: from the oldest kept
        assert [n.id for n in subscribe(m, md, 2, name="P")[1:]] == [
            f"d{first - 3 + i}" for i in range(2)]
        record = m.store.subscription("alice", "P")
        assert record is not None
        error = refusal(lambda: m.stub.Subscribe(mediator_pb2.SubscribeRequest(
            name="P", resume_token=resume_token(record, 99)), metadata=md, timeout=TIMEOUT))
        assert error.code() == grpc.StatusCode.OUT_OF_RANGE
        # removed and registered again: a new log, the old tokens are not its
        m.stub.Unsubscribe(mediator_pb2.UnsubscribeRequest(name="P"), metadata=md, timeout=TIMEOUT)
        m.pipeline.emit("alice", "P", ["gone"])  # nothing: its log went with it
        time.sleep(0.002)  # a new registration time
        m.stub.AddProfile(mediator_pb2.AddProfileRequest(profile_text=PROFILE, name="P"),
                          metadata=md, timeout=TIMEOUT)
        error = refusal(lambda: m.stub.Subscribe(mediator_pb2.SubscribeRequest(
            name="P", resume_token=resume_token(record, 1)), metadata=md, timeout=TIMEOUT))
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "earlier subscription named 'P'" in (error.details() or "")
    finally:
        m.close()


def test_an_unsubscribed_stream_ends(mediator: Mediator) -> None:
    md = mediator.client("alice")
    stream = mediator.stub.Subscribe(mediator_pb2.SubscribeRequest(profile_text=PROFILE),
                                     metadata=md, timeout=TIMEOUT)
    assert next(stream).ready
    assert mediator.stub.Unsubscribe(mediator_pb2.UnsubscribeRequest(name="P"), metadata=md,
                                     timeout=TIMEOUT).found
    assert list(stream) == []  # ended with OK


def test_token_round_trip_and_shape() -> None:
    for name in ("P", "a:b:c", "ünï", "7"):
        record = SubscriptionRecord("alice", name, PROFILE, 1_700_000_000_000_000, 0, None)
        token = resume_token(record, 42)
        assert name not in token and token_position(token, record) == 42
    for garbage in ("", "!!", resume_token(record, 1)[:-3]):
        with pytest.raises(TokenError, match="not a resume token"):
            token_position(garbage, record)


def test_rate_limit_paces_a_client_and_keeps_clients_apart() -> None:
    import asyncio

    async def take(limit: RateLimit, client: str, n: int) -> float:
        start = time.monotonic()
        for _ in range(n):
            await limit.take(client)
        return time.monotonic() - start

    limit = RateLimit(20.0)
    assert asyncio.run(take(limit, "a", 20)) < 0.1  # a second's burst
    assert asyncio.run(take(limit, "a", 5)) >= 0.2  # then 20 a second
    assert asyncio.run(take(limit, "b", 10)) < 0.1  # another client has its own bucket


# ------------------------------------------------------------------ events in


def event(ident: str, t: int, source: str = "s", kind: str = "a") -> str:
    return json.dumps({"specversion": "1.0", "id": ident, "source": source, "type": kind,
                       "time": f"2026-01-01T00:00:{t:02d}Z"})


def publish(m: Mediator, md: list[tuple[str, str]], *batches: list[str], advance: int = 0) -> Any:
    requests = [mediator_pb2.PublishRequest(cloudevents=b) for b in batches]
    if advance:
        requests.append(mediator_pb2.PublishRequest(advance_to_us=advance))
    return m.stub.Publish(iter(requests), metadata=md, timeout=TIMEOUT)


def test_publish_accepts_in_order_and_dead_letters_with_reasons(tmp_path: Path) -> None:
    """With no lateness allowed (``lateness = "0s"``) events are taken in time order, those of
    one instant in any order: e3, older than e2, is late."""
    mediator = Mediator(tmp_path / "m.db", lateness=0)
    try:
        _publish_in_order(mediator)
    finally:
        mediator.close()


def _publish_in_order(mediator: Mediator) -> None:
    md = mediator.client("source")
    reply = publish(mediator, md,
                    [event("e1", 1), "{not json", event("e2", 2), event("e1", 3)],
                    [event("e3", 1), event("e4", 2, source="t"), event("e2", 5, source="t")],
                    advance=1_767_225_610_000_000)  # 00:00:10
    assert (reply.accepted, reply.dead_lettered) == (4, 3)
    assert [(d.index, d.id, d.reason.split(":")[0]) for d in reply.dead_letters] == [
        (1, "", "malformed"), (3, "e1", "duplicate"), (4, "e3", "late")]
    assert "line 1" in reply.dead_letters[0].reason or "JSON" in reply.dead_letters[0].reason
    logged = mediator.store.read_events(0)
    assert [json.loads(e.line)["id"] for e in logged] == ["e1", "e2", "e4", "e2"]
    assert mediator.pipeline.wakes == 2 and mediator.pipeline.advanced == [1_767_225_610_000_000]
    late = publish(mediator, md, [event("e9", 10), event("e1", 30)])
    assert [d.reason.split(":")[0] for d in late.dead_letters] == ["late", "duplicate"]


def test_a_failed_handoff_to_the_pipeline_is_not_a_failed_write(
        mediator: Mediator, monkeypatch: pytest.MonkeyPatch) -> None:
    """The door hands the appended events to the pipeline once they are durable: if that
    fails, they were still taken (the pipeline reads them from the log), and a resend is a
    duplicate — not accepted twice."""
    def broken(head: int, lines: list[str], events: list[Any]) -> None:
        raise RuntimeError("handoff")

    monkeypatch.setattr(mediator.running.served.service.door, "appended", broken)
    md = mediator.client("source")
    batch = [event("h1", 1), event("h2", 2)]
    reply = publish(mediator, md, batch)
    assert (reply.accepted, reply.dead_lettered) == (2, 0)
    again = publish(mediator, md, batch)
    assert again.accepted == 0 and [d.reason.split(":")[0] for d in again.dead_letters] == [
        "duplicate", "duplicate"]
    assert [json.loads(e.line)["id"] for e in mediator.store.read_events(0)][-2:] == [
        "h1", "h2"]


def test_an_event_far_in_the_future_is_refused_so_it_cannot_make_every_later_one_late(
        mediator: Mediator) -> None:
    """One event dated 9999 (or an advance to it), taken, would make every later event of every
    client late: it is a `future` dead letter (the advance refused), and the stream goes on."""
    md = mediator.client("source")
    typo = json.dumps({"specversion": "1.0", "id": "typo", "source": "s", "type": "a",
                       "time": "9999-01-01T00:00:00Z"})
    reply = publish(mediator, md, [event("e1", 1), typo, event("e2", 2)])
    assert reply.accepted == 2
    assert [(d.id, d.reason.split(":")[0]) for d in reply.dead_letters] == [("typo", "future")]
    assert "ahead of the mediator's clock" in reply.dead_letters[0].reason
    with pytest.raises(grpc.RpcError) as refused:
        publish(mediator, md, [], advance=253_370_764_800_000_000)  # 9999-01-01
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "ahead of the mediator's clock" in (refused.value.details() or "")
    assert publish(mediator, md, [event("e3", 3)]).accepted == 1


def test_events_within_the_lateness_are_accepted_and_kept_as_dead_letters_beyond(
        mediator: Mediator) -> None:
    """The default lateness (2 s): an event up to 2 s older than the newest accepted is taken
    (the event log keeps arrival order; the pipeline reads it in time order), an older one is
    late — and every refusal is in the dead-letter log with its reason, lane and client."""
    md = mediator.client("source")
    reply = publish(mediator, md, [event("e5", 5), event("e3", 3), event("e4", 4),
                                   event("e2", 2), event("e5", 6)])
    assert reply.accepted == 3
    assert [(d.id, d.reason.split(":")[0]) for d in reply.dead_letters] == [
        ("e2", "late"), ("e5", "duplicate")]
    assert "minus the allowed lateness 2s" in reply.dead_letters[0].reason
    assert [json.loads(e.line)["id"] for e in mediator.store.read_events(0)] == ["e5", "e3", "e4"]
    kept = mediator.store.read_dead_letters(0)
    assert [(r.reason, r.source, r.client, r.event_id, r.where) for r in kept] == [
        ("late", "publish", "source", "e2", "event 3"),
        ("duplicate", "publish", "source", "e5", "event 4")]
    assert json.loads(kept[0].raw)["id"] == "e2" and kept[0].size == len(kept[0].raw)


def test_the_duplicate_memory_survives_a_restart(tmp_path: Path) -> None:
    m = Mediator(tmp_path / "m.db", lateness=0)
    md = m.client("source")
    publish(m, md, [event("e1", 1)])
    m.close()
    m = Mediator(tmp_path / "m.db", lateness=0)
    try:
        reply = publish(m, md, [event("e1", 2), event("e0", 0), event("e2", 2)],
                        advance=1_767_225_605_000_000)  # 00:00:05
        assert [d.reason.split(":")[0] for d in reply.dead_letters] == ["duplicate", "late"]
        assert reply.accepted == 1
    finally:
        m.close()
    m = Mediator(tmp_path / "m.db", lateness=0)
    try:  # the advance too: nothing at or before it is taken after a restart either
        reply = publish(m, md, [event("e4", 4), event("e6", 6)])
        assert [(d.id, d.reason.split(":")[0]) for d in reply.dead_letters] == [("e4", "late")]
        assert "at or before the advance to 2026-01-01T00:00:05Z" in reply.dead_letters[0].reason
    finally:
        m.close()


def test_metrics_endpoint_serves_the_counters(tmp_path: Path) -> None:
    m = Mediator(tmp_path / "m.db", metrics_port=free_port())
    try:
        md = m.client("alice")
        publish(m, md, [event("e1", 1), event("e2", 2, source="t"), "nope", event("e2", 3, "t")])
        m.stub.AddProfile(mediator_pb2.AddProfileRequest(profile_text=PROFILE), metadata=md,
                          timeout=TIMEOUT)
        m.pipeline.emit("alice", "P", ["c1", "c2", "c3"])

        def scrape() -> dict[str, float]:
            text = urllib.request.urlopen(f"http://127.0.0.1:{m.running.metrics_port}/metrics",
                                          timeout=TIMEOUT).read().decode()
            return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
                    for line in text.splitlines() if line.startswith("evamed_")}

        lag = 'evamed_subscription_lag{owner="alice",subscription="P"}'
        deadline = time.monotonic() + TIMEOUT
        while scrape().get(lag) != 3 and time.monotonic() < deadline:  # the wake is async
            time.sleep(0.01)
        assert scrape()[lag] == 3  # nobody has read the log yet
        subscribe(m, md, 3, name="P")
        samples = scrape()
        # Labelled by where the events came in, never by what they carry (a bounded set).
        assert samples['evamed_events_in_total{source="publish"}'] == 2
        assert samples['evamed_dead_letters_total{reason="malformed",source="publish"}'] == 1
        assert samples['evamed_dead_letters_total{reason="duplicate",source="publish"}'] == 1
        assert samples[lag] == 0
        assert samples["evamed_notifications_delivered_total"] == 3
        for name in ("evamed_composites_out_total", "evamed_composer_batch_seconds_count",
                     'evamed_state_size{part="held"}'):
            assert name in samples
    finally:
        m.close()


# ------------------------------------------------------------------ with the real pipeline


def publish_day(m: Mediator, md: list[tuple[str, str]], lines: list[str]) -> Any:
    return m.stub.Publish(iter([mediator_pb2.PublishRequest(cloudevents=lines[i:i + 100])
                                for i in range(0, len(lines), 100)]), metadata=md, timeout=60)


def test_the_paper_day_through_the_api_equals_replay(tmp_path: Path) -> None:
    """P1–P7 subscribed, the logistics day published: the stream delivers exactly what the
    engine reports for the day, in its order (the real pipeline, every profile at the
    mediator)."""
    text, events, expected = logistics_day()
    m = Mediator(tmp_path / "m.db", real=True)
    try:
        md = m.client("alice")
        stream = m.stub.Subscribe(mediator_pb2.SubscribeRequest(profile_text=text, name="day"),
                                  metadata=md, timeout=60)
        assert next(stream).ready
        lines = [json.dumps(e) for e in [*events, SENTINEL]]
        reply = publish_day(m, md, lines)
        assert (reply.accepted, reply.dead_lettered) == (len(lines), 0)
        got = [next(stream).cloudevent for _ in expected]
        stream.cancel()
        assert got == expected
        info = m.stub.GetProfile(mediator_pb2.GetProfileRequest(name="day"), metadata=md)
        assert info.plans[0] == "P1: decompose, mediator" and info.log_head == len(expected)
    finally:
        m.close()


def test_a_restarted_mediator_resumes_a_token_with_exactly_what_followed(tmp_path: Path) -> None:
    """Half the day, ten composites read, a restart (the pipeline replays the log, the
    composites already logged are skipped by id), the half published again (duplicates) and
    the rest: the token gets exactly the day's other composites."""
    text, events, expected = logistics_day()
    lines = [json.dumps(e) for e in [*events, SENTINEL]]
    half = len(lines) // 2
    m = Mediator(tmp_path / "m.db", real=True)
    md = m.client("alice")
    stream = m.stub.Subscribe(mediator_pb2.SubscribeRequest(profile_text=text, name="day"),
                              metadata=md, timeout=60)
    assert next(stream).ready
    publish_day(m, md, lines[:half])
    first = [next(stream) for _ in range(10)]
    stream.cancel()
    m.close()
    m = Mediator(tmp_path / "m.db", real=True)
    try:
        again = publish_day(m, md, lines[:half])
        assert (again.accepted, again.dead_lettered) == (0, half)
        publish_day(m, md, lines[half:])
        stream = m.stub.Subscribe(mediator_pb2.SubscribeRequest(
            name="day", resume_token=first[-1].resume_token), metadata=md, timeout=60)
        assert next(stream).ready
        rest = [next(stream) for _ in expected[10:]]
        stream.cancel()
        assert [n.cloudevent for n in first + rest] == expected
    finally:
        m.close()


# ------------------------------------------------------------------ shutdown


def test_health_goes_not_serving_when_the_mediator_stops(tmp_path: Path) -> None:
    m = Mediator(tmp_path / "m.db")
    md = m.client("alice")
    health = health_pb2_grpc.HealthStub(m.channel)
    watch = health.Watch(health_pb2.HealthCheckRequest(service=""), timeout=TIMEOUT)
    assert next(watch).status == health_pb2.HealthCheckResponse.SERVING
    stream = m.stub.Subscribe(mediator_pb2.SubscribeRequest(profile_text=PROFILE), metadata=md,
                              timeout=TIMEOUT)
    assert next(stream).ready
    started = time.monotonic()
    stopping = threading.Thread(target=m.running.stop, args=(1.0,))
    stopping.start()
    assert next(watch).status == health_pb2.HealthCheckResponse.NOT_SERVING
    error = refusal(lambda: next(stream))
    assert error.code() == grpc.StatusCode.UNAVAILABLE  # the client resumes with its token
    stopping.join()
    assert time.monotonic() - started < 5
    m.channel.close()
    m.store.close()


def _signalled(process: Process, *gaps: float) -> tuple[int, float]:
    """Send SIGTERM, then once more after each of ``gaps`` seconds; the exit status and the
    seconds from the last signal to the exit."""
    assert process.proc is not None
    process.proc.send_signal(signal.SIGTERM)
    for gap in gaps:
        time.sleep(gap)
        process.proc.send_signal(signal.SIGTERM)
    sent = time.monotonic()
    status = process.proc.wait(timeout=30)
    return status, time.monotonic() - sent


@pytest.mark.xdist_group("service")
def test_sigterm_stops_within_seconds_while_a_base_service_is_down(tmp_path: Path) -> None:
    """``evamed serve`` over a real base service that is SIGKILLed, an event for it published:
    the pipeline waits on the service (its link reconnects without end), yet SIGTERM stops the
    mediator within a few seconds with status 0; a second signal ends it at once. The event log
    kept what was accepted: with the service back, a restart evaluates it."""
    service = Process("base-service", "--group", "cg2", "--listen", "127.0.0.1:0")
    mediator: Process | None = None
    try:
        config = tmp_path / "mediator.toml"
        config.write_text(f'listen = "127.0.0.1:{free_port()}"\n'
                          f'store = "sqlite:///{tmp_path / "m.db"}"\nlog_level = "INFO"\n'
                          'composer = "inprocess"\n'
                          f'[[services]]\nname = "traffic"\ngroup = "cg2"\n'
                          f'address = "{service.address}"\ntypes = ["traffic.*"]\n'
                          'mode = "fed"\n')
        token = cli("clients", "add", "alice", "--operator", "--config", str(config)).strip()
        mediator = Process("serve", "--config", str(config))

        def publish_pair(jam: int) -> None:
            """A jam, and an event later than the allowed lateness (2 s by default): the
            watermark passes the jam's instant."""
            sent = [event(f"j{jam}", jam, kind="traffic.jam"),
                    event(f"f{jam}", jam + 3, kind="traffic.x")]
            with MediatorClient(mediator.address, token) as client:
                assert client.publish(sent).accepted == 2

        with MediatorClient(mediator.address, token) as client:
            assert client.add_profile('class J = type == "traffic.jam"\nprofile P = J\n'
                                      ).plans == ("P: equivalent, traffic",)
        service.kill()
        publish_pair(1)
        time.sleep(0.3)  # the pipeline waits on the service
        status, seconds = _signalled(mediator)
        assert (status, seconds < 5) == (0, True), seconds

        service.start()  # on its port
        mediator.start()
        service.kill()
        publish_pair(5)
        time.sleep(0.3)
        status, seconds = _signalled(mediator, 0.3)
        assert (status, seconds < 1.5) == (128 + signal.SIGTERM, True), seconds

        service.start()
        mediator.start()
        with MediatorClient(mediator.address, token) as client:
            notes = Reader(client.subscribe(name="P")).wait_for(2)
            time.sleep(0.3)  # nothing more comes
            assert [n.cloudevent["data"]["constituents"] for n in notes] == [["j1"], ["j5"]]
    finally:
        for process in (mediator, service):
            if process is not None:
                process.stop()


# ------------------------------------------------------------------ fuzz


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mediator]:
    m = Mediator(tmp_path_factory.mktemp("fuzz") / "m.db")
    yield m
    m.close()


_KEYS = st.sampled_from(["specversion", "id", "source", "type", "time", "data", "subject"])
_VALUES = st.one_of(st.text(max_size=12), st.integers(), st.none(), st.booleans(),
                    st.sampled_from(["1.0", "2026-01-01T00:00:00Z", "9999-99-99T00:00:00Z"]))
_LINES = st.one_of(st.text(max_size=60),
                   st.dictionaries(_KEYS, _VALUES, max_size=7).map(json.dumps),
                   st.integers(0, 59).map(lambda t: event(f"f{t}", t)))


@settings(max_examples=60, deadline=None)
@given(batches=st.lists(st.lists(_LINES, max_size=8), min_size=1, max_size=3))
def test_publish_of_any_text_counts_every_line_and_never_fails(shared: Mediator,
                                                               batches: list[list[str]]) -> None:
    md = shared.client(f"p{time.monotonic_ns()}")
    reply = publish(shared, md, *batches)
    assert reply.accepted + reply.dead_lettered == sum(len(b) for b in batches)
    assert len(reply.dead_letters) == min(reply.dead_lettered, 100)


_FRAGMENTS = st.sampled_from(['class A = type == "a"\n', "profile P = A\n", "profile", "(", ")",
                              "all_dup(", "; ", ", ", "_5s", ")_all_pairs", "\n", "A", "every 1s",
                              "class T = every 2s\n", "not ", "[2]", "per data.x ", '"', "€"])


@settings(max_examples=60, deadline=None)
@given(text=st.one_of(st.text(max_size=80), st.lists(_FRAGMENTS, max_size=14).map("".join)))
def test_subscribe_with_any_text_is_ok_or_invalid_argument(shared: Mediator, text: str) -> None:
    assume(text)  # empty: a subscription by name (NOT_FOUND), not a document
    md = shared.client(f"s{time.monotonic_ns()}")
    stream = shared.stub.Subscribe(mediator_pb2.SubscribeRequest(profile_text=text, name="x"),
                                   metadata=md, timeout=TIMEOUT)
    try:
        assert next(stream).ready
    except grpc.RpcError as error:
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, (text, error.details())
    finally:
        stream.cancel()


@settings(max_examples=40, deadline=None)
@given(texts=st.lists(st.one_of(st.text(max_size=80), st.lists(_FRAGMENTS, max_size=14).map(
    "".join)), min_size=1, max_size=6))
def test_add_profiles_with_any_texts_answers_each_ok_or_invalid_argument(
        shared: Mediator, texts: list[str]) -> None:
    md = shared.client(f"b{time.monotonic_ns()}")
    reply = shared.stub.AddProfiles(mediator_pb2.AddProfilesRequest(profiles=[
        mediator_pb2.AddProfileRequest(profile_text=text) for text in texts]), metadata=md,
        timeout=TIMEOUT)
    assert len(reply.results) == len(texts)
    for text, result in zip(texts, reply.results, strict=True):
        if result.HasField("refused"):  # a name used twice is ALREADY_EXISTS or the same one
            assert result.refused.code in (grpc.StatusCode.INVALID_ARGUMENT.value[0],
                                           grpc.StatusCode.ALREADY_EXISTS.value[0]), (
                text, result.refused.message)
        else:  # registered now, or before in this call with the same text
            assert result.profile.text == text



def test_a_subscription_suspended_at_a_limit_says_so_and_refuses_a_stream_as_exhausted(
        mediator: Mediator) -> None:
    """Issue 28 item 4: a subscription the pipeline suspended at the composite limit shows
    why in GetProfile, and Subscribe to it is RESOURCE_EXHAUSTED naming the limit (ErrorInfo
    COMPOSITE_LIMIT with the configured value)."""
    md = mediator.client("alice")
    mediator.stub.AddProfile(mediator_pb2.AddProfileRequest(profile_text=PROFILE, name="s"),
                             metadata=md, timeout=TIMEOUT)
    why = ("suspended: profile 'P' reached its limit of 10,000 composites per step "
           "(composite_limit) at 2026-03-02T10:00:00Z: 3 operators made no more")
    mediator.pipeline.failed[("alice", "s")] = why
    mediator.pipeline.limited[("alice", "s")] = "composite_limit"
    info = mediator.stub.GetProfile(mediator_pb2.GetProfileRequest(name="s"), metadata=md,
                                    timeout=TIMEOUT)
    assert info.status == why
    error = refusal(lambda: mediator.stub.Subscribe(mediator_pb2.SubscribeRequest(name="s"),
                                                    metadata=md, timeout=TIMEOUT))
    assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert why in (error.details() or "") and "(limits.composites)" in (error.details() or "")
    found = MediatorError.from_rpc(error, "here")
    assert found.reason == "COMPOSITE_LIMIT"
