"""The mediator's side of a base service: a small gRPC client and the replay transport."""

from __future__ import annotations

import json
import re
import threading
import uuid
from collections.abc import Iterable, Iterator
from typing import Any

import grpc
from google.rpc import error_details_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_status import rpc_status

from adapters.backends.native import Detection, NativeQueryError
from adapters.wire import SERVICE_NAME, base_pb2, base_pb2_grpc
from eva.events import Event, from_cloudevent, to_cloudevent

BATCH_BYTES = 1024 * 1024
"""A Publish message is sent once its events reach this size (well under the service's limit)."""

_POSITION = re.compile(r"line (\d+), column (\d+): (.*)", re.DOTALL)


def detection(message: Any) -> Detection:
    constituents = tuple(from_cloudevent(json.loads(c)) for c in message.constituents)
    extra = json.loads(message.extra_json) if message.extra_json else {}
    return Detection(message.time_us, constituents, message.text, extra)


def query_error(exc: grpc.RpcError, language: str, query: str) -> NativeQueryError:
    """The error an INVALID_ARGUMENT from Subscribe stands for, placed in the caller's own copy
    of the query (so the line is shown whole): the position and message come from the
    ``BadRequest`` violation of field ``query``; without one, the status message as it is."""
    try:
        status = rpc_status.from_call(exc)
    except ValueError:  # details that disagree with the status: use the message
        status = None
    for detail in status.details if status is not None else ():
        if not detail.Is(error_details_pb2.BadRequest.DESCRIPTOR):
            continue
        bad = error_details_pb2.BadRequest()
        detail.Unpack(bad)
        for violation in bad.field_violations:
            found = _POSITION.fullmatch(violation.description)
            if violation.field == "query" and found:
                line, column, message = found.groups()
                return NativeQueryError(language, message, int(line), int(column), query)
    return NativeQueryError(language, exc.details() or "rejected")


class BaseClient:
    def __init__(self, address: str, timeout: float = 10.0) -> None:
        self.address = address
        self.channel = grpc.insecure_channel(address)
        self.stub = base_pb2_grpc.BaseServiceStub(self.channel)
        self.timeout = timeout
        self._max_advance: int | None = None

    def close(self) -> None:
        self.channel.close()

    def __enter__(self) -> BaseClient:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def wait_ready(self) -> None:
        try:
            grpc.channel_ready_future(self.channel).result(timeout=self.timeout)
        except grpc.FutureTimeoutError:
            raise ConnectionError(f"no base service at {self.address}") from None

    def health(self) -> str:
        stub = health_pb2_grpc.HealthStub(self.channel)
        reply = stub.Check(health_pb2.HealthCheckRequest(service=SERVICE_NAME), timeout=self.timeout)
        return str(health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status))

    def capabilities(self) -> dict[str, Any]:
        reply = self.stub.Capabilities(base_pb2.CapabilitiesRequest(), timeout=self.timeout)
        self._max_advance = reply.max_advance_us
        return {"group": reply.group, "language": reply.language,
                "capability": json.loads(reply.capability_json),
                "limits": {"max_advance_us": reply.max_advance_us,
                           "max_query_bytes": reply.max_query_bytes,
                           "max_message_bytes": reply.max_message_bytes}}

    def max_advance(self) -> int:
        """How far one request may move the service clock (0: no limit)."""
        if self._max_advance is None:
            self.capabilities()
        assert self._max_advance is not None
        return self._max_advance

    def subscribe(self, query: str, subscription_id: str = "") -> Any:
        """The stream of native notifications (an iterator that is also a gRPC call: ``cancel()``
        ends it); the first message says the query is registered."""
        request = base_pb2.SubscribeRequest(query=query, subscription_id=subscription_id)
        return self.stub.Subscribe(request)

    def unsubscribe(self, subscription_id: str) -> bool:
        request = base_pb2.UnsubscribeRequest(subscription_id=subscription_id)
        return bool(self.stub.Unsubscribe(request, timeout=self.timeout).found)

    def publish(self, events: Iterable[Event], advance_to: int | None = None,
                batch: int = 256) -> Any:
        """Publish in order, up to ``batch`` events (and ``BATCH_BYTES``) per message; then let
        the clock run to ``advance_to``. The service steps a gap between events itself, but
        moves its clock at most ``max_advance()`` per ``advance_to_us``: a longer final advance
        is sent as steps."""
        limit = self.max_advance()

        def messages() -> Iterator[Any]:
            pending: list[str] = []
            size = 0
            clock: int | None = None

            def steps(until: int) -> Iterator[Any]:
                nonlocal clock
                while clock is not None and limit and until - clock > limit:
                    clock += limit
                    yield base_pb2.PublishRequest(advance_to_us=clock)

            for e in events:
                text = json.dumps(to_cloudevent(e))
                if pending and size + len(text) > BATCH_BYTES:
                    yield base_pb2.PublishRequest(cloudevents=pending)
                    pending, size = [], 0
                pending.append(text)
                size += len(text)
                if len(pending) >= batch:
                    yield base_pb2.PublishRequest(cloudevents=pending)
                    pending, size = [], 0
                clock = e.time if clock is None else max(clock, e.time)
            if advance_to is not None and clock is not None and advance_to - clock > limit > 0:
                if pending:
                    yield base_pb2.PublishRequest(cloudevents=pending)
                    pending = []
                yield from steps(advance_to)
            if pending or advance_to is not None:
                yield base_pb2.PublishRequest(cloudevents=pending, advance_to_us=advance_to or 0)

        return self.stub.Publish(messages())


def remote_transport(address: str, group: str) -> Any:
    """Evaluate native queries at a running base service: subscribe, publish the trace, let the
    clock run to the end, unsubscribe once everything is queued, collect the notifications.
    A service whose group is not ``group`` is refused (its language would not understand)."""
    client = BaseClient(address)
    client.wait_ready()
    caps = client.capabilities()
    served, name = caps["group"], caps["language"]
    if served != group:
        raise ConnectionError(f"the service at {address} serves {served}, not {group}")

    def evaluate(text: str, events: list[Event], until: int) -> list[Detection]:
        sub_id = uuid.uuid4().hex
        stream = client.subscribe(text, sub_id)
        try:
            first = next(stream)
        except grpc.RpcError as exc:
            if exc.code() == grpc.StatusCode.INVALID_ARGUMENT:
                raise query_error(exc, name, text) from None
            raise
        assert first.ready
        out: list[Detection] = []
        failure: list[BaseException] = []

        def drain() -> None:
            try:
                out.extend(detection(m) for m in stream)
            except grpc.RpcError as exc:  # pragma: no cover - reported below
                failure.append(exc)

        reader = threading.Thread(target=drain, daemon=True)
        reader.start()
        client.publish(events, advance_to=until)
        client.unsubscribe(sub_id)
        reader.join()
        if failure:
            raise ConnectionError(f"subscription at {address} failed: {failure[0]}")
        return out

    return evaluate
