"""The mediator's side of a base service: one client module for every way of reaching one.

* :class:`Subscription` — one native query's evaluation, event by event, as the plan runner's
  federation drives it (:mod:`adapters.federation`): :func:`in_process` (the service's
  evaluator in this process, reporting as it goes) or :func:`remote_transport` (a running
  service over gRPC, live too: its progress markers say when a step is answered).
* :class:`BaseClient` — the synchronous gRPC client (subscribe, publish, health, capabilities).
* :class:`Adapter` / :class:`ServiceAdapter` — the asyncio interface of DESIGN §5 that the
  mediator service uses: ``capabilities()``, ``render(node)`` and ``parse_notification`` (the
  group's dialect, :mod:`transforms.dialects`), ``subscribe(native)`` (an async iterator of
  native notifications), ``health()``. (The mediator's pipeline reaches services through
  links instead: :mod:`adapters.links`, :mod:`adapters.remote_link`.)
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import AsyncGenerator, Callable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import grpc
import orjson
from google.rpc import error_details_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_status import rpc_status

from adapters.backends.native import EventRejected, Exhausted, Language, NativeQueryError, Query
from adapters.backends.registry import language
from adapters.wire import SERVICE_NAME, base_pb2, base_pb2_grpc
from eva import ast
from eva.events import Event, from_json_line, to_cloudevent
from transforms.capability import Capability
from transforms.dialects import dialect
from transforms.dialects.base import Detection, Reading, Scope
from transforms.federated import ServiceInfo
from transforms.plans import Remote, Subscribe

if TYPE_CHECKING:  # adapters.links builds on this module
    from adapters.links import Link

BATCH_BYTES = 1024 * 1024
"""A Publish message is sent once its events reach this size (well under the service's limit)."""

_POSITION = re.compile(r"line (\d+), column (\d+): (.*)", re.DOTALL)


def detection(message: Any, constituents: Sequence[Event] | None = None) -> Detection:
    """A native notification (or a packed ``Detection``) as a detection; ``constituents``: its
    events found otherwise (by reference) rather than read from its CloudEvents JSON."""
    if constituents is None:
        constituents = [from_json_line(c) for c in message.constituents]
    extra = json.loads(message.extra_json) if message.extra_json else {}
    return Detection(message.time_us, tuple(constituents), message.text, extra)


_AS_JSON = (orjson.OPT_PASSTHROUGH_DATETIME | orjson.OPT_PASSTHROUGH_DATACLASS
            | orjson.OPT_PASSTHROUGH_SUBCLASS)
"""What json does not write, orjson refuses too (to hand it to json)."""


def cloudevent_json(event: Event) -> str:
    """An event as CloudEvents JSON, as json would write it (orjson, which is several times
    faster, where it agrees: json writes NaN and infinities, which orjson turns into null, and
    takes what orjson refuses — integers beyond 64 bits, non-string keys, lone surrogates)."""
    obj = to_cloudevent(event)
    try:
        text = orjson.dumps(obj, option=_AS_JSON)
    except TypeError:  # orjson.JSONEncodeError
        return json.dumps(obj)
    if b"null" in text and _not_finite(obj):  # each NaN or infinity became a null
        return json.dumps(obj)
    return text.decode()


def _not_finite(obj: Any) -> bool:
    """Whether ``obj`` holds a float NaN or infinity (without recursing: nesting is bounded by
    the events' own limit, not Python's stack)."""
    stack = [obj]
    while stack:
        value = stack.pop()
        if isinstance(value, dict):
            stack.extend(value.values())
        elif isinstance(value, list | tuple):
            stack.extend(value)
        elif isinstance(value, float) and not math.isfinite(value):
            return True
    return False


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


def capability_from_json(record: dict[str, Any]) -> Capability:
    """The inverse of the service's Capabilities reply (sets travel as sorted lists)."""
    fields = dict(record)
    fields["operators"] = frozenset(fields["operators"])
    if fields.get("settings") is not None:
        fields["settings"] = frozenset(tuple(s) for s in fields["settings"])
    return Capability(**fields)


def _check_group(address: str, served: str, group: str) -> None:
    """A service of another group would not understand the queries: refused."""
    if served != group:
        raise ConnectionError(f"the service at {address} serves {served}, not {group}")


_HEALTH = health_pb2.HealthCheckRequest(service=SERVICE_NAME)


def _serving_status(reply: Any) -> str:
    return str(health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status))


def publish_requests(events: Iterable[Event], advance_to: int | None, limit: int,
                     batch: int = 256, clock: int | None = None) -> Iterator[Any]:
    """The Publish messages for ``events`` in order, up to ``batch`` events (and
    ``BATCH_BYTES``) per message, then the clock run to ``advance_to``. The service steps a gap
    between events itself, but moves its clock at most ``limit`` (its ``max_advance_us``; 0: no
    limit) per ``advance_to_us``: a longer final advance is sent as steps, counted from
    ``clock`` (the service's clock before these events, if known) or the newest event."""
    return (request for _, request in publish_messages(events, advance_to, limit, batch, clock))


def publish_messages(events: Iterable[Event], advance_to: int | None, limit: int,
                     batch: int = 256, clock: int | None = None
                     ) -> Iterator[tuple[list[Event], Any]]:
    """:func:`publish_requests`, each message with the events it carries (in its order)."""
    pending: list[Event] = []
    texts: list[str] = []
    size = 0
    for e in events:
        text = cloudevent_json(e)
        length = len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))
        if texts and size + length > BATCH_BYTES:
            yield pending, base_pb2.PublishRequest(cloudevents=texts)
            pending, texts, size = [], [], 0
        pending.append(e)
        texts.append(text)
        size += length
        if len(texts) >= batch:
            yield pending, base_pb2.PublishRequest(cloudevents=texts)
            pending, texts, size = [], [], 0
        clock = e.time if clock is None else max(clock, e.time)
    if advance_to is not None and clock is not None and advance_to - clock > limit > 0:
        if texts:
            yield pending, base_pb2.PublishRequest(cloudevents=texts)
            pending, texts = [], []
        while advance_to - clock > limit:
            clock += limit
            yield [], base_pb2.PublishRequest(advance_to_us=clock)
    if texts or advance_to is not None:
        yield pending, base_pb2.PublishRequest(cloudevents=texts, advance_to_us=advance_to or 0)


# ------------------------------------------------------------------ subscriptions, event by event


class Subscription(Protocol):
    """One native query's evaluation at a base service, driven event by event."""

    live: bool
    """The detections of an event come back from its ``push`` (so the service's progress is
    known); otherwise they all come from ``close``."""

    def push(self, event: Event) -> list[Detection]:
        """The next event of the service's input (in order): what it completes."""
        ...

    def advance(self, time: int) -> list[Detection]:
        """No event at or before ``time`` will come: what that completes."""
        ...

    def close(self, until: int) -> list[Detection]:
        """End of input, the clock run to ``until``: what remains."""
        ...


Connect = Callable[[str], Subscription]
"""Subscribe native query text (NativeQueryError if the service refuses it)."""


Rejected = Callable[[Event, EventRejected], None]
"""Told of each event an evaluator refuses (a dead letter for the caller to write)."""


def limit_end(error: grpc.RpcError) -> bool:
    """Whether a base service ended a query because it passed its work or store limit
    (adapters/backends/native.py) — not gRPC's own RESOURCE_EXHAUSTED (a message too large, a
    quota), nor a service that went away."""
    return bool(error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
                and (error.details() or "").startswith(("work_limit", "store_limit")))


class _Evaluation:
    """The service's evaluator in this process: an event the evaluator refuses is left out and
    the run goes on, as a base service does — and ``rejected`` is told (a base service counts
    it in its reply; left unsaid, ``replay --native`` lost events without a word)."""

    live = True

    def __init__(self, query: Query, rejected: Rejected | None = None) -> None:
        self.evaluator = query.evaluator()
        self.rejected = rejected
        self.ended = ""
        """Why the evaluation ended (its work or store limit, ``native.Exhausted``): from then
        on it answers nothing, as a base service ends such a subscription."""
        self.on_ended: Callable[[str], None] | None = None
        """Told instead of raising (a link that ends the handle and goes on); None: the
        ``Exhausted`` is raised to the caller (``replay --native``)."""

    def push(self, event: Event) -> list[Detection]:
        if self.ended:
            return []
        try:
            return self.evaluator.push(event)
        except EventRejected as exc:
            if self.rejected is not None:
                self.rejected(event, exc)
            return []
        except Exhausted as exc:
            self._end(exc)
            return []

    def advance(self, time: int) -> list[Detection]:
        if self.ended:
            return []
        try:
            return self.evaluator.advance(time)
        except Exhausted as exc:
            self._end(exc)
            return []

    def close(self, until: int) -> list[Detection]:
        return self.advance(until)

    def _end(self, exc: Exhausted) -> None:
        self.ended = str(exc)
        if self.on_ended is None:
            raise exc
        self.on_ended(self.ended)


def in_process(lang: Language, rejected: Rejected | None = None) -> Connect:
    """The service's evaluator in this process (what ``replay --native`` runs); ``rejected``
    is told of each event it refuses."""
    return lambda text: _Evaluation(lang.parse(text), rejected)


def evaluate(connect: Connect, text: str, events: Iterable[Event], until: int) -> list[Detection]:
    """A whole trace through one subscription: its every detection, in order."""
    subscription = connect(text)
    out = [d for e in events for d in subscription.push(e)]
    return out + subscription.close(until)


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
        return _serving_status(health_pb2_grpc.HealthStub(self.channel).Check(
            _HEALTH, timeout=self.timeout))

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

    def subscribe(self, query: str, subscription_id: str = "", progress: bool = False,
                  packed: bool = False, publisher: str = "") -> Any:
        """The stream of native notifications (an iterator that is also a gRPC call: ``cancel()``
        ends it); the first message says the query is registered. ``progress``: progress
        markers too (``progress_batch`` set) after each numbered Publish message; ``packed``,
        ``publisher``: packed detections, constituents by reference (``SubscribeRequest``)."""
        request = base_pb2.SubscribeRequest(query=query, subscription_id=subscription_id,
                                            progress=progress, packed=packed,
                                            publisher=publisher)
        return self.stub.Subscribe(request)

    def unsubscribe(self, subscription_id: str) -> bool:
        request = base_pb2.UnsubscribeRequest(subscription_id=subscription_id)
        return bool(self.stub.Unsubscribe(request, timeout=self.timeout).found)

    def publish(self, events: Iterable[Event], advance_to: int | None = None,
                batch: int = 256) -> Any:
        """Publish in order, up to ``batch`` events (and ``BATCH_BYTES``) per message; then let
        the clock run to ``advance_to`` (:func:`publish_requests`)."""
        return self.stub.Publish(publish_requests(events, advance_to, self.max_advance(), batch))


class _Remote:
    """A query at a running service over a :class:`~adapters.remote_link.RemoteLink` of its own:
    each step is one round trip, answered once the service's progress marker says it has
    reported everything the step caused."""

    live = True

    def __init__(self, link: Link, text: str) -> None:
        self.link = link
        try:
            self.handle = link.subscribe(text)
        except BaseException:
            link.close()
            raise

    def push(self, event: Event) -> list[Detection]:
        return self.link.publish([event]).get(self.handle, [])

    def advance(self, time: int) -> list[Detection]:
        return self.link.publish([], until=time).get(self.handle, [])

    def close(self, until: int) -> list[Detection]:
        try:
            return self.advance(until)
        finally:
            self.link.close()


def remote_transport(address: str, group: str, timeout: float = 10.0) -> Connect:
    """Native queries evaluated at the running base service at ``address``, live; one whose
    group is not ``group`` is refused (its language would not understand). A service out of
    reach for ``timeout`` seconds ends the run (ConnectionError)."""
    from adapters.remote_link import RemoteLink  # it builds on this module

    with BaseClient(address, timeout) as client:
        client.wait_ready()
        caps = client.capabilities()
    _check_group(address, caps["group"], group)
    info = ServiceInfo(address, group, capability_from_json(caps["capability"]))
    return lambda text: _Remote(RemoteLink(info, address, timeout=timeout, patience=timeout), text)


# ------------------------------------------------------------------ the asyncio adapter (DESIGN §5)


class Adapter(Protocol):
    group: str

    async def capabilities(self) -> Capability: ...

    def render(self, node: Remote | Subscribe, doc: ast.Document,
               profile: ast.Profile | None = None, root_eoi: bool = False) -> str: ...

    def subscribe(self, native: str) -> AsyncGenerator[Any, None]: ...

    def parse_notification(self, native: Any, node: Remote, scope: Scope) -> Reading: ...

    async def health(self) -> str: ...


class ServiceAdapter:
    """A base service reached over gRPC (asyncio)."""

    def __init__(self, address: str, group: str, timeout: float = 10.0) -> None:
        self.address = address
        self.group = group
        self.timeout = timeout
        self._channel = grpc.aio.insecure_channel(address)
        self._stub = base_pb2_grpc.BaseServiceStub(self._channel)
        self._language = language(group)
        self._dialect = dialect(group)

    async def close(self) -> None:
        await self._channel.close()

    async def capabilities(self) -> Capability:
        reply = await self._stub.Capabilities(base_pb2.CapabilitiesRequest(), timeout=self.timeout)
        _check_group(self.address, reply.group, self.group)
        return capability_from_json(json.loads(reply.capability_json))

    def render(self, node: Remote | Subscribe, doc: ast.Document,
               profile: ast.Profile | None = None, root_eoi: bool = False) -> str:
        expr = node.target if isinstance(node, Remote) else ast.Prim(node.name)
        return self._dialect.render(expr, doc, profile, root_eoi)

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

    def detection(self, native: Any) -> Detection:
        """A notification message as a detection (its constituents as events)."""
        return detection(native)

    def parse_notification(self, native: Any, node: Remote, scope: Scope) -> Reading:
        """A notification for ``node`` in EVA terms, by the group's dialect."""
        return self._dialect.parse_notification(detection(native), node, scope)

    async def health(self) -> str:
        stub = health_pb2_grpc.HealthStub(self._channel)
        return _serving_status(await stub.Check(_HEALTH, timeout=self.timeout))
