"""The adapter interface of DESIGN §5, for the mediator service: what it needs of a backend.

``capabilities()`` (the record the service declares), ``render(node)`` (a planned subtree as
native text), ``subscribe(native)`` (an async iterator of native notifications),
``parse_notification(native)`` (its constituents), ``health()``.

``ServiceAdapter`` talks to a base service over gRPC (asyncio). The embedded mode runs the
same base services in-process (``adapters.backends.service.serve`` on a loopback port), so there is one
code path for both.
"""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator
from typing import Any, Protocol

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from adapters.backends.native import Detection, native_text
from adapters.backends.registry import language
from adapters.client import detection, query_error
from adapters.wire import SERVICE_NAME, base_pb2, base_pb2_grpc
from eva import ast
from transforms.capability import Capability
from transforms.plan import Remote, Subscribe


class Adapter(Protocol):
    group: str

    async def capabilities(self) -> Capability: ...

    def render(self, node: Remote | Subscribe, doc: ast.Document,
               profile: ast.Profile | None = None, root_eoi: bool = False) -> str: ...

    def subscribe(self, native: str) -> AsyncGenerator[Any, None]: ...

    def parse_notification(self, native: Any) -> Detection: ...

    async def health(self) -> str: ...


def capability_from_json(record: dict[str, Any]) -> Capability:
    """The inverse of the service's Capabilities reply (sets travel as sorted lists)."""
    fields = dict(record)
    fields["operators"] = frozenset(fields["operators"])
    if fields.get("settings") is not None:
        fields["settings"] = frozenset(tuple(s) for s in fields["settings"])
    return Capability(**fields)


class ServiceAdapter:
    """A base service reached over gRPC."""

    def __init__(self, address: str, group: str, timeout: float = 10.0) -> None:
        self.address = address
        self.group = group
        self.timeout = timeout
        self._channel = grpc.aio.insecure_channel(address)
        self._stub = base_pb2_grpc.BaseServiceStub(self._channel)
        self._language = language(group)

    async def close(self) -> None:
        await self._channel.close()

    async def capabilities(self) -> Capability:
        reply = await self._stub.Capabilities(base_pb2.CapabilitiesRequest(), timeout=self.timeout)
        if reply.group != self.group:
            raise ConnectionError(f"the service at {self.address} serves {reply.group}, "
                                  f"not {self.group}")
        return capability_from_json(json.loads(reply.capability_json))

    def render(self, node: Remote | Subscribe, doc: ast.Document,
               profile: ast.Profile | None = None, root_eoi: bool = False) -> str:
        expr = node.target if isinstance(node, Remote) else ast.Prim(node.name)
        return native_text(self._language, expr, doc, profile, root_eoi)

    async def subscribe(self, native: str) -> AsyncGenerator[Any, None]:
        """Native notifications as they come; a rejected query raises NativeQueryError."""
        call = self._stub.Subscribe(base_pb2.SubscribeRequest(query=native))
        try:
            async for message in call:
                if message.ready:
                    continue
                yield message
        except grpc.aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.INVALID_ARGUMENT:
                raise query_error(exc, self._language.name, native) from None
            raise
        finally:
            call.cancel()

    def parse_notification(self, native: Any) -> Detection:
        return detection(native)

    async def health(self) -> str:
        stub = health_pb2_grpc.HealthStub(self._channel)
        reply = await stub.Check(health_pb2.HealthCheckRequest(service=SERVICE_NAME),
                                 timeout=self.timeout)
        return str(health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status))
