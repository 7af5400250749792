"""Requests whose bytes are not a valid protobuf message: INVALID_ARGUMENT, one log line per client a
minute, never a traceback (issue 28, item 3).

grpc.aio decodes a request with its method's deserializer before the handler runs (a unary
request) or while the handler iterates (a stream of requests); what the deserializer raises, it
answered UNKNOWN ("Unexpected DecodeError") and logged with a full traceback — for every such
call, a cheap way to flood a server's log. :class:`RefuseUndecodable`, a server interceptor,
gives every method a deserializer that returns an :class:`Undecodable` instead of raising, and
refuses the call when one arrives: INVALID_ARGUMENT saying which message did not decode, and one
WARNING line per client a minute at most (how many more came in between is told with the next
line). Health and reflection included.
"""

from __future__ import annotations

import inspect
import logging
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import grpc

log = logging.getLogger("evamed.requests")

PERIOD = 60.0
"""Seconds between two log lines about one client's undecodable requests."""
CLIENTS = 10_000
"""Clients remembered at once (then forgotten all together: memory stays flat)."""


@dataclass(frozen=True)
class Undecodable:
    """What a method's deserializer made of bytes that are not its message."""

    message: str
    """The message type expected (``eva.mediator.v1.AddProfileRequest``)."""
    error: str
    """What protobuf said, on one line."""


def peer_host(context: grpc.aio.ServicerContext) -> str:
    """The client's address without its port (``ipv4:127.0.0.1``): each call of a client
    comes from another port."""
    peer = str(context.peer() or "unknown peer")
    kind, _, address = peer.partition(":")
    if kind in ("ipv4", "ipv6") and ":" in address:
        return f"{kind}:{address.rpartition(':')[0]}"
    return peer


class Throttle:
    """Whether a line about a key is due: at most one a ``period`` per key."""

    def __init__(self, period: float = PERIOD, keys: int = CLIENTS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.period = period
        self.keys = keys
        self.clock = clock
        self._last: dict[str, float] = {}
        self._quiet: dict[str, int] = {}

    def due(self, key: str) -> int | None:
        """None if a line about ``key`` was logged within the period (this one is counted);
        otherwise how many were not logged since the last line, and this one is logged."""
        now = self.clock()
        last = self._last.get(key)
        if last is not None and now - last < self.period:
            self._quiet[key] = self._quiet.get(key, 0) + 1
            return None
        if len(self._last) >= self.keys:
            self._last.clear()
            self._quiet.clear()
        self._last[key] = now
        return self._quiet.pop(key, 0)


class RefuseUndecodable(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """See the module. ``who(context)`` names the client for the log (default: its address;
    an interceptor placed after authentication can name the authenticated client)."""

    def __init__(self, who: Callable[[grpc.aio.ServicerContext], str] = peer_host,
                 throttle: Throttle | None = None) -> None:
        self.who = who
        self.throttle = throttle if throttle is not None else Throttle()

    async def intercept_service(self, continuation: Callable[[Any], Awaitable[Any]],
                                details: Any) -> Any:
        handler = await continuation(details)
        if handler is None or handler.request_deserializer is None:
            return handler
        return self._guarded(handler, details.method)

    def _guarded(self, handler: Any, method: str) -> Any:
        """The handler with a deserializer that does not raise, and a behaviour that refuses
        what it could not decode."""
        decode = handler.request_deserializer
        expected = _message_name(decode, method)

        def tolerant(data: bytes) -> Any:
            try:
                return decode(data)
            except Exception as exc:  # protobuf's DecodeError, or anything it may raise
                said = _PREFIX.sub("", " ".join(str(exc).split()))
                return Undecodable(expected, said[:200] or type(exc).__name__)

        refuse = self._refuse
        field = next(f for f in ("unary_unary", "unary_stream", "stream_unary", "stream_stream")
                     if getattr(handler, f) is not None)
        behaviour = getattr(handler, field)

        async def checked(requests: AsyncIterator[Any], context: grpc.aio.ServicerContext
                          ) -> AsyncIterator[Any]:
            async for request in requests:
                if isinstance(request, Undecodable):
                    await refuse(context, method, request)
                yield request

        async def given(request: Any, context: grpc.aio.ServicerContext) -> Any:
            """What the behaviour is given: a request checked, or a stream of requests that
            checks each as it is read."""
            if field.startswith("stream"):
                return checked(request, context)
            if isinstance(request, Undecodable):
                await refuse(context, method, request)
            return request

        # A streaming behaviour is an async generator, or a coroutine that writes with
        # context.write (grpc's health Watch): grpc tells them apart, so the wrapper is the same.
        async def answers(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            async for message in behaviour(await given(request, context), context):
                yield message

        async def answer(request: Any, context: grpc.aio.ServicerContext) -> Any:
            return await behaviour(await given(request, context), context)

        wrapped = answers if inspect.isasyncgenfunction(behaviour) else answer
        return handler._replace(request_deserializer=tolerant, **{field: wrapped})

    async def _refuse(self, context: grpc.aio.ServicerContext, method: str,
                      request: Undecodable) -> None:
        """Log (when due) and abort the call INVALID_ARGUMENT."""
        who = self.who(context)
        quiet = self.throttle.due(who)
        if quiet is not None:
            log.warning("%s sent a request to %s that is not a valid %s (%s): refused with "
                        "INVALID_ARGUMENT%s; no further such line about this client for %.0f s",
                        who, method, request.message, request.error,
                        f" ({quiet} more since the last such line)" if quiet else "",
                        self.throttle.period)
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                            f"the request is not a valid {request.message}: its bytes do not "
                            f"decode as that protobuf message ({request.error})")


_PREFIX = re.compile(r"^Error parsing message(?: with type '[^']*')?:? ?")
"""What protobuf's DecodeError says before what was wrong (the type, given already)."""


def _message_name(decode: Callable[[bytes], Any], method: str) -> str:
    """The full name of the message ``decode`` reads (``FromString`` of a generated class),
    else the method's request."""
    owner = getattr(decode, "__self__", None)
    descriptor = getattr(owner, "DESCRIPTOR", None)
    name = getattr(descriptor, "full_name", None)
    return str(name) if name else f"request of {method}"


__all__ = ["RefuseUndecodable", "Throttle", "Undecodable", "peer_host"]
