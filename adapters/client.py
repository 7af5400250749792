"""The mediator's side of a base service: a small gRPC client and the replay transport."""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Iterable, Iterator
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from adapters.native import Detection, NativeQueryError
from adapters.wire import SERVICE_NAME, base_pb2, base_pb2_grpc
from mediator.eva.events import Event, from_cloudevent, to_cloudevent


def detection(message: Any) -> Detection:
    constituents = tuple(from_cloudevent(json.loads(c)) for c in message.constituents)
    extra = json.loads(message.extra_json) if message.extra_json else {}
    return Detection(message.time_us, constituents, message.text, extra)


class BaseClient:
    def __init__(self, address: str, timeout: float = 10.0) -> None:
        self.address = address
        self.channel = grpc.insecure_channel(address)
        self.stub = base_pb2_grpc.BaseServiceStub(self.channel)
        self.timeout = timeout

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
        return {"group": reply.group, "language": reply.language,
                "capability": json.loads(reply.capability_json)}

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
        """Publish in order, ``batch`` events per message; then let the clock run."""

        def messages() -> Iterator[Any]:
            pending: list[str] = []
            for e in events:
                pending.append(json.dumps(to_cloudevent(e)))
                if len(pending) == batch:
                    yield base_pb2.PublishRequest(cloudevents=pending)
                    pending = []
            if pending or advance_to is not None:
                yield base_pb2.PublishRequest(cloudevents=pending, advance_to_us=advance_to or 0)

        return self.stub.Publish(messages())


def remote_transport(address: str, group: str) -> Any:
    """Evaluate native queries at a running base service: subscribe, publish the trace, let the
    clock run to the end, unsubscribe once everything is queued, collect the notifications.
    A service whose group is not ``group`` is refused (its language would not understand)."""
    client = BaseClient(address)
    client.wait_ready()
    served = client.capabilities()["group"]
    if served != group:
        raise ConnectionError(f"the service at {address} serves {served}, not {group}")

    def evaluate(text: str, events: list[Event], until: int) -> list[Detection]:
        sub_id = uuid.uuid4().hex
        stream = client.subscribe(text, sub_id)
        try:
            first = next(stream)
        except grpc.RpcError as exc:
            if exc.code() == grpc.StatusCode.INVALID_ARGUMENT:
                raise NativeQueryError(group, exc.details() or "rejected") from None
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
