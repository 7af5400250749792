"""The mediator's Python client (public): subscribe to profiles, publish events, manage profiles.

>>> from mediator.client import MediatorClient
>>> with MediatorClient("127.0.0.1:50060", token) as client:          # doctest: +SKIP
...     for note in client.subscribe(profile_text=open("p.eva").read()):
...         print(note.profile, note.cloudevent["id"], note.sources)

Every call carries ``authorization: Bearer <token>`` (a token from ``evamed clients add``).
A refused call raises :class:`MediatorError`: the status code, and a one-line message that
says what was wrong — for a profile that does not parse, ``line L, column C: expected …``.

**Exactly once at the client.** :meth:`MediatorClient.subscribe` is an iterator that outlives
the connection: when the stream breaks (the mediator restarted, the network dropped) it
reconnects with exponential back-off and jitter (tenacity) and resumes after the last
notification it yielded, by its resume token; so nothing is lost. Nothing is yielded twice
either: the mediator resends nothing before the token, and the client also drops an id it has
already yielded (a composite the mediator appended again after losing the tail of its log).
That memory is bounded: the ids of the newest ``dedupe_window`` notifications yielded (10,000
by default, about 1 MB) — a repeat comes from a replay of the newest part of a log, never from
further back than what a store may lose between two durable writes, so a window longer than
that is enough (docs/operations.md, The Python client). Errors that retrying cannot mend (a bad
profile, an unknown subscription, a token older than the log's retention, a refused bearer
token, a limit) end the iteration with :class:`MediatorError` at once.
"""

from __future__ import annotations

import json
import logging
from collections import deque
from collections.abc import Callable, Generator, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from google.rpc import error_details_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_status import rpc_status
from tenacity import (
    RetryCallState,
    Retrying,
    retry_if_exception,
    stop_after_delay,
    stop_never,
    wait_exponential,
    wait_random,
)

from eva.events import Event, to_cloudevent
from mediator.wire import mediator_pb2, mediator_pb2_grpc

log = logging.getLogger(__name__)

BATCH_BYTES = 1024 * 1024
"""A Publish message is sent once its events reach this size (well under gRPC's 4 MB)."""

MAX_BATCH = 1000
"""Profile documents an AddProfiles call carries at most (the mediator refuses more)."""
CHUNK_BYTES = 3 * 1024 * 1024
"""An AddProfiles call's documents at most, in bytes (the mediator takes messages of 4 MiB)."""

_CODES = {code.value[0]: code for code in grpc.StatusCode}

RETRIED = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.ABORTED,
                     grpc.StatusCode.CANCELLED, grpc.StatusCode.INTERNAL})
"""What a subscription reconnects after: the server is down or going down (UNAVAILABLE), the
stream was reset under it (CANCELLED by the server, INTERNAL "RST_STREAM"), or it asked to be
retried (ABORTED). Every other code — INVALID_ARGUMENT, NOT_FOUND, OUT_OF_RANGE,
UNAUTHENTICATED, PERMISSION_DENIED, RESOURCE_EXHAUSTED, … — is the same on every retry."""

_CHANNEL_OPTIONS = [
    # gRPC's own reconnect back-off grows to 2 minutes; while it waits every call fails at
    # once, so a restarted mediator would not be seen for that long. Ours is the back-off.
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 2000),
    ("grpc.max_receive_message_length", 16 * 1024 * 1024),
]


# ------------------------------------------------------------------ what the calls return


@dataclass(frozen=True)
class Notification:
    """One composite of a subscription, as delivered."""

    cloudevent: dict[str, Any]   # the composite, CloudEvents 1.0 (structured mode)
    id: str                      # deterministic: the same composite always has the same id
    profile: str                 # the profile that detected it
    subscription: str
    sources: tuple[str, ...]     # the sources of its contributing events, in constituent order
    services: tuple[str, ...]    # the services they came through ("mediator": its own feed)
    resume_token: str            # pass to subscribe(resume_token=…) to continue after it
    types: tuple[str, ...] = ()  # the contributing events' types, in constituent order
    times_us: tuple[int, ...] = ()  # and times (µs since the epoch; 0: no longer known)


@dataclass(frozen=True)
class DeadLetter:
    index: int    # the event's position in the publish call (0-based, over every batch)
    id: str       # its id when it had one
    reason: str


@dataclass(frozen=True)
class PublishResult:
    accepted: int
    dead_lettered: int
    dead_letters: tuple[DeadLetter, ...]  # the first 100, with their reasons


@dataclass(frozen=True)
class KeptLetter:
    """A letter of the dead-letter log (docs/operations.md, "Dead letters")."""

    position: int        # its id: what ``republish`` takes
    time_us: int         # when it was refused
    reason: str          # eva.admission.Reason
    source: str          # publish, a [[sources]] name, mediator (the event log's reader), a service
    client: str          # who published it ("": a broker, the mediator, a service)
    where: str           # a broker's topic or stream, the index in a Publish call, a log position
    id: str              # the event's id when it had one
    detail: str          # why
    raw: bytes           # the input as it came (at most the mediator's dead_letters.raw_bytes)
    size: int            # its whole size
    kind: str            # cloudevent, payload (a broker's) or report (a service's)
    republished_us: int  # when it was published again (0: never)


@dataclass(frozen=True)
class ProfileInfo:
    """A registered subscription: the profile document and where its log stands."""

    name: str
    text: str                    # the document as written
    profiles: tuple[str, ...]    # the profile names it defines
    owner: str
    created_us: int
    log_first: int               # the oldest position kept in its log (0: empty)
    log_head: int                # the newest position appended (0: none)
    plans: tuple[str, ...]       # per profile: "NAME: kind, services …"
    status: str = ""             # why it is not evaluated (suspended at a limit, …); "": it is


@dataclass(frozen=True)
class ServiceStatus:
    """A service the mediator is connected to, and what it covers."""

    name: str
    group: str                   # cg0 … cg5
    language: str
    address: str                 # "embedded": run in the mediator's process
    sources: tuple[str, ...]     # coverage: source patterns (fnmatch)
    types: tuple[str, ...]       # coverage: type patterns (fnmatch)
    status: str                  # SERVING, NOT_SERVING, CONNECTING (LOST: session dropped)
    subscriptions: int           # native queries subscribed there
    mode: str = ""               # autonomous, fed, or source (a broker the mediator reads)


@dataclass(frozen=True)
class InputStatus:
    """An input of the mediator's pipeline: its own feed ("mediator") or an autonomous service."""

    name: str
    watermark_us: int            # every instant up to it reported (0: nothing yet)
    idle: bool                   # stood still for its idle timeout: holds nothing back
    position: int                # the last log position the pipeline has read
    head: int                    # the log's newest position


@dataclass(frozen=True)
class SubscriptionStatus:
    name: str
    profiles: tuple[str, ...]
    log_first: int               # the oldest position kept (0: empty)
    log_head: int                # the newest appended (0: none)
    lag: int                     # not yet sent to a subscriber (-1: not known since the start)
    composers: dict[str, str]    # profile → "inprocess" or "spark"


@dataclass(frozen=True)
class MediatorStatus:
    """What ``evamed status`` shows: the counts are since the mediator started."""

    version: str
    health: str                  # SERVING, NOT_SERVING (error says why)
    error: str
    composer: str
    started_us: int
    event_log_head: int
    inputs: tuple[InputStatus, ...]
    services: tuple[ServiceStatus, ...]  # the services, then the brokers' sources
    subscriptions: tuple[SubscriptionStatus, ...]  # the caller's
    subscriptions_total: int     # every client's
    events_in: dict[str, int]    # by CloudEvents source
    dead_letters: dict[str, int]  # by reason
    composites_out: int


@dataclass(frozen=True)
class Explanation:
    text: str                    # as `evamed explain` prints it
    json: Any                    # the same, parsed


class MediatorError(Exception):
    """A call the mediator refused, or one that could not reach it.

    ``str(error)`` is one line: the status message, or for a bad profile the field
    violation's description (``line L, column C: expected …``)."""

    def __init__(self, code: grpc.StatusCode, message: str, *,
                 violations: tuple[tuple[str, str], ...] = (), reason: str = "") -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.violations = violations   # (field, description) of a BadRequest detail
        self.reason = reason           # an ErrorInfo's reason (which limit, …)

    @classmethod
    def from_rpc(cls, exc: grpc.RpcError, address: str) -> MediatorError:
        """The error a failed call stands for, with the details of its ``google.rpc.Status``."""
        try:
            status = rpc_status.from_call(exc)
        except ValueError:  # details that disagree with the status: the message as it is
            status = None
        return cls._of(exc.code(), exc.details() or "",
                       status.details if status is not None else (), address)

    @classmethod
    def from_refused(cls, refused: Any, address: str) -> MediatorError:
        """The error of one document AddProfiles refused (proto ``Refused``)."""
        code = _CODES.get(refused.code, grpc.StatusCode.UNKNOWN)
        return cls._of(code, refused.message, refused.details, address)

    @classmethod
    def _of(cls, code: grpc.StatusCode, details: str, packed: Iterable[Any],
            address: str) -> MediatorError:
        violations: list[tuple[str, str]] = []
        reason = ""
        for detail in packed:
            if detail.Is(error_details_pb2.BadRequest.DESCRIPTOR):
                bad = error_details_pb2.BadRequest()
                detail.Unpack(bad)
                violations += [(v.field, v.description) for v in bad.field_violations]
            elif detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
                info = error_details_pb2.ErrorInfo()
                detail.Unpack(info)
                reason = info.reason
        if violations:
            message = "; ".join(description for _, description in violations)
        elif code == grpc.StatusCode.UNAVAILABLE and reason == "STORE_UNAVAILABLE":
            message = f"the mediator at {address} cannot reach its store: {details}"
        elif code == grpc.StatusCode.UNAVAILABLE:
            message = f"cannot reach the mediator at {address}: {details}"
        elif code == grpc.StatusCode.UNAUTHENTICATED:
            message = f"the mediator at {address} refused the token: {details}"
        elif code == grpc.StatusCode.DEADLINE_EXCEEDED:
            message = f"the mediator at {address} did not answer in time ({details})"
        else:
            message = details or code.name
        return cls(code, " ".join(message.split()), violations=tuple(violations), reason=reason)


def _chunks(requests: list[Any]) -> Iterator[list[Any]]:
    """The AddProfiles calls for ``requests``: at most MAX_BATCH documents and CHUNK_BYTES
    each (a document larger than that alone: the mediator takes a message of 4 MiB, a
    document of 1 MiB by default)."""
    chunk: list[Any] = []
    size = 0
    for request in requests:
        bytes_ = request.ByteSize()
        if chunk and (len(chunk) >= MAX_BATCH or size + bytes_ > CHUNK_BYTES):
            yield chunk
            chunk, size = [], 0
        chunk.append(request)
        size += bytes_
    if chunk:
        yield chunk


def _retried(exc: BaseException) -> bool:
    return isinstance(exc, grpc.RpcError) and exc.code() in RETRIED


def _notification(message: Any) -> Notification:
    return Notification(json.loads(message.cloudevent), message.id, message.profile,
                        message.subscription, tuple(message.sources), tuple(message.services),
                        message.resume_token, tuple(message.types), tuple(message.times_us))


def _profile_info(message: Any) -> ProfileInfo:
    return ProfileInfo(message.name, message.text, tuple(message.profiles), message.owner,
                       message.created_us, message.log_first, message.log_head,
                       tuple(message.plans), message.status)


def _line(item: str | bytes | dict[str, Any] | Event) -> str:
    """One event as a CloudEvents JSON line, as the mediator's Publish takes it."""
    if isinstance(item, Event):
        return json.dumps(to_cloudevent(item))
    if isinstance(item, dict):
        return json.dumps(item)
    if isinstance(item, bytes):
        # Bytes that are not UTF-8 travel escaped (\xff): not JSON, so the mediator
        # dead-letters the line instead of accepting an altered event.
        return item.decode("utf-8", errors="backslashreplace").strip()
    return item.strip()


# ------------------------------------------------------------------ the client


class MediatorClient:
    """A connection to a running mediator (``evamed serve``), synchronous.

    ``address``: host:port. ``token``: the bearer token of ``evamed clients add`` (None:
    ``EVAMED_TOKEN``, else the one ``evamed clients add NAME --save`` saved for ``address``;
    ValueError if there is none). ``tls_ca``:
    the PEM file of the CA that signed the server's certificate (TLS; without it the channel is
    plaintext); ``tls_cert``/``tls_key``: this client's certificate when the server asks for
    one. ``timeout``: seconds for each call except the subscription stream.
    ``reconnect_for``: how long :meth:`subscribe` keeps reconnecting after the mediator went
    away before it gives up (None: for ever; the default outlasts the restart of a mediator
    with the Spark composer, which serves once its jobs have run a first micro-batch: half a
    minute, minutes on a loaded machine); ``backoff``: the first and the longest wait
    between attempts, in seconds (exponential, with up to ``backoff[0]`` of jitter).
    """

    def __init__(self, address: str, token: str | None = None, *,
                 tls_ca: str | Path | None = None, tls_cert: str | Path | None = None,
                 tls_key: str | Path | None = None, timeout: float = 10.0,
                 reconnect_for: float | None = 300.0, backoff: tuple[float, float] = (0.1, 5.0),
                 dedupe_window: int = 10_000) -> None:
        self.address = address
        self.timeout = timeout
        self.reconnect_for = reconnect_for
        self.backoff = backoff
        self.dedupe_window = dedupe_window
        if token is None:
            token = saved_token(address)
        self._metadata = (("authorization", f"Bearer {token}"),)
        self._tls = not (tls_ca is None and tls_cert is None)
        self._contacted = False
        if not self._tls:
            self._channel = grpc.insecure_channel(address, options=_CHANNEL_OPTIONS)
        else:
            credentials = grpc.ssl_channel_credentials(
                root_certificates=_read(tls_ca), private_key=_read(tls_key),
                certificate_chain=_read(tls_cert))
            self._channel = grpc.secure_channel(address, credentials, options=_CHANNEL_OPTIONS)
        self._stub = mediator_pb2_grpc.MediatorServiceStub(self._channel)
        self._health = health_pb2_grpc.HealthStub(self._channel)

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> MediatorClient:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def _call(self, method: str, request: Any, timeout: float | None = None) -> Any:
        """A unary call. It waits for the connection (up to ``timeout``) instead of failing at
        once while gRPC reconnects, so a call just after the mediator restarted succeeds.
        ``timeout``: this call's deadline, when it may take longer than the client's."""
        self._first_contact()
        try:
            return getattr(self._stub, method)(request, metadata=self._metadata,
                                               timeout=timeout or self.timeout,
                                               wait_for_ready=True)
        except grpc.RpcError as exc:
            if (exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED
                    and not self._connected(min(1.0, self.timeout))):
                raise self._unreachable() from None
            raise MediatorError.from_rpc(exc, self.address) from None

    def _connected(self, seconds: float) -> bool:
        """Whether the mediator answers within ``seconds`` — asked with the standard health
        check (open, cheap), not grpc.channel_ready_future, whose polling thread can outlive
        the channel and fail in the background after ``close()``."""
        try:
            self._health.Check(health_pb2.HealthCheckRequest(), timeout=seconds,
                               wait_for_ready=True)
        except grpc.RpcError as exc:
            return bool(exc.code() != grpc.StatusCode.DEADLINE_EXCEEDED)
        return True

    def _unreachable(self) -> MediatorError:
        mismatch = self._tls_mismatch()
        if mismatch is not None:
            return mismatch
        return MediatorError(grpc.StatusCode.UNAVAILABLE, f"cannot reach the mediator at "
                             f"{self.address}: no connection within {self.timeout:g} s")

    def _first_contact(self) -> None:
        """Before the first call: one health check that does not wait for the connection. If
        it cannot connect, a plaintext client facing a TLS server (or the reverse) is told so
        at once — gRPC would otherwise retry the handshake until the deadline and report "no
        connection". Anything else (the mediator restarting) is left to the call's own wait."""
        if self._contacted:
            return
        self._contacted = True
        try:
            self._health.Check(health_pb2.HealthCheckRequest(), timeout=min(self.timeout, 5.0))
        except grpc.RpcError as exc:
            if exc.code() == grpc.StatusCode.UNAVAILABLE:
                mismatch = self._tls_mismatch()
                if mismatch is not None:
                    raise mismatch from None

    def _tls_mismatch(self) -> MediatorError | None:
        """Whether the server at ``address`` speaks TLS when this client does not, or the
        reverse: the error that says so, or None (it does not answer at all, or it agrees)."""
        speaks = speaks_tls(self.address)
        if speaks is None or speaks == self._tls:
            return None
        if speaks:
            return MediatorError(grpc.StatusCode.UNAVAILABLE, (
                f"the mediator at {self.address} requires TLS: give the CA file that signed "
                "its certificate (--tls-ca FILE or EVAMED_TLS_CA; MediatorClient(tls_ca=…))"),
                reason="TLS_REQUIRED")
        return MediatorError(grpc.StatusCode.UNAVAILABLE, (
            f"the mediator at {self.address} speaks plaintext, not TLS: drop --tls-ca "
            "(EVAMED_TLS_CA; MediatorClient(tls_ca=…)), or configure its [tls]"),
            reason="TLS_NOT_SPOKEN")

    # -- subscriptions

    def subscribe(self, profile_text: str | None = None, name: str | None = None,
                  resume_token: str | None = None, *,
                  on_reconnect: Callable[[str, float], None] | None = None
                  ) -> Generator[Notification, None, None]:
        """Register ``profile_text`` (or name a subscription registered before) and yield its
        composites as they come, until the subscription is removed (:meth:`unsubscribe`, by
        this or another connection of the client): stop iterating (or ``close()`` the
        iterator) to end sooner.

        ``name``: the subscription's name (default: the document's first profile). With
        ``resume_token`` the stream starts after that notification; without one, at the oldest
        the log keeps. The subscription stays registered when the iterator ends (cancel it
        with :meth:`unsubscribe`). ``on_reconnect(reason, wait_seconds)`` is called before each
        wait to reconnect. Raises :class:`MediatorError` when the mediator refuses (a bad
        profile, an unknown name, a token older than the log's retention) or has been away
        longer than ``reconnect_for``.
        """
        if not profile_text and not name:
            raise ValueError("subscribe needs profile_text or name")
        self._first_contact()
        request = mediator_pb2.SubscribeRequest(profile_text=profile_text or "", name=name or "",
                                                resume_token=resume_token or "")
        seen: set[str] = set()
        order: deque[str] = deque()
        while True:
            call = self._open(request, on_reconnect)
            try:
                for message in call:
                    note = _notification(message)
                    if note.id in seen:
                        log.debug("dropped %s: already delivered", note.id)
                    else:
                        seen.add(note.id)
                        order.append(note.id)
                        if len(order) > self.dedupe_window:
                            seen.discard(order.popleft())
                        yield note
                    # Resume after what was yielded (or dropped as a repeat: it was yielded).
                    request.resume_token = note.resume_token
                return  # the stream ended without an error: the subscription was removed
            except grpc.RpcError as exc:
                if exc.code() not in RETRIED:
                    raise MediatorError.from_rpc(exc, self.address) from None
                log.info("subscription %s: stream broke (%s); reconnecting", request.name,
                         exc.code().name)
            finally:
                call.cancel()

    def _open(self, request: Any, on_reconnect: Callable[[str, float], None] | None) -> Any:
        """A stream whose ``ready`` message has come: the subscription is planned and
        subscribed at the services. Retried with back-off while the mediator is away. Once
        registered, a subscription is reopened by name: its document is stored."""

        def before_sleep(state: RetryCallState) -> None:
            exc = state.outcome.exception() if state.outcome is not None else None
            wait = state.next_action.sleep if state.next_action is not None else 0.0
            reason = exc.code().name if isinstance(exc, grpc.RpcError) else str(exc)
            log.info("subscription %s: %s; reconnecting in %.1f s", request.name or "(new)",
                        reason, wait)
            if on_reconnect is not None:
                on_reconnect(reason, wait)

        first, longest = self.backoff
        retrying = Retrying(
            retry=retry_if_exception(_retried), reraise=True, before_sleep=before_sleep,
            wait=wait_exponential(multiplier=first, max=longest) + wait_random(0, first),
            stop=stop_never if self.reconnect_for is None else stop_after_delay(self.reconnect_for))
        try:
            for attempt in retrying:
                with attempt:
                    call = self._stub.Subscribe(request, metadata=self._metadata)
                    ready = next(call, None)
                    if ready is None or not ready.ready:
                        raise MediatorError(grpc.StatusCode.INTERNAL, f"the mediator at "
                                            f"{self.address} did not confirm the subscription")
                    request.name, request.profile_text = ready.subscription, ""
                    return call
        except grpc.RpcError as exc:
            raise MediatorError.from_rpc(exc, self.address) from None
        raise AssertionError("unreachable: tenacity returns or raises")

    def add_profile(self, profile_text: str, name: str | None = None) -> ProfileInfo:
        """Register a profile document without streaming (planned and subscribed at the
        services now; :meth:`subscribe` by name later reads its log from the start)."""
        return _profile_info(self._call("AddProfile", mediator_pb2.AddProfileRequest(
            profile_text=profile_text, name=name or "")))

    def add_profiles(self, documents: Iterable[str | tuple[str, str | None]]
                     ) -> list[ProfileInfo | MediatorError]:
        """Register many profile documents (each a text, or a text and its name) in calls of
        at most 1,000 documents and 3 MiB: each one's subscription, or the error AddProfile
        would have raised for it, in order. One refused document does not stop the others; a
        failure of a call itself (the mediator unreachable, the token refused) raises — the
        documents of the calls before it stay registered, and calling again with the same
        documents answers those as registered."""
        if isinstance(documents, str):
            raise TypeError("add_profiles takes documents (texts, or (text, name) pairs), not "
                            "one text: use add_profile")
        requests = [mediator_pb2.AddProfileRequest(profile_text=d, name="")
                    if isinstance(d, str) else
                    mediator_pb2.AddProfileRequest(profile_text=d[0], name=d[1] or "")
                    for d in documents]
        results: list[ProfileInfo | MediatorError] = []
        for chunk in _chunks(requests):
            # A document takes a millisecond or so, the worst small one 50 ms to read.
            reply = self._call("AddProfiles", mediator_pb2.AddProfilesRequest(profiles=chunk),
                               timeout=self.timeout + 0.1 * len(chunk))
            results += [_profile_info(r.profile) if r.HasField("profile")
                        else MediatorError.from_refused(r.refused, self.address)
                        for r in reply.results]
        return results

    def profiles(self) -> list[ProfileInfo]:
        """This client's subscriptions (a client sees only its own)."""
        reply = self._call("ListProfiles", mediator_pb2.ListProfilesRequest())
        return [_profile_info(p) for p in reply.profiles]

    def profile(self, name: str) -> ProfileInfo:
        """One of this client's subscriptions; MediatorError NOT_FOUND if there is none."""
        return _profile_info(self._call("GetProfile", mediator_pb2.GetProfileRequest(name=name)))

    def unsubscribe(self, name: str) -> bool:
        """Cancel a subscription (its plans unsubscribed at the services, its log removed);
        False if this client had none of that name."""
        reply = self._call("Unsubscribe", mediator_pb2.UnsubscribeRequest(name=name))
        return bool(reply.found)

    def explain(self, profile_text: str | None = None, name: str | None = None) -> Explanation:
        """How a document (or a registered subscription) is planned over the connected
        services: which service evaluates which subtree, and why."""
        if not profile_text and not name:
            raise ValueError("explain needs profile_text or name")
        reply = self._call("Explain", mediator_pb2.ExplainRequest(
            profile_text=profile_text or "", name=name or ""))
        return Explanation(reply.text, json.loads(reply.json) if reply.json else None)

    def services(self) -> list[ServiceStatus]:
        """The services the mediator is connected to, their coverage and state."""
        reply = self._call("ListServices", mediator_pb2.ListServicesRequest())
        return [_service_status(s) for s in reply.services]

    def status(self) -> MediatorStatus:
        """The mediator's state as an operator checks it (``evamed status``)."""
        r = self._call("Status", mediator_pb2.StatusRequest())
        return MediatorStatus(
            r.version, r.health, r.error, r.composer, r.started_us, r.event_log_head,
            tuple(InputStatus(i.name, i.watermark_us, i.idle, i.position, i.head)
                  for i in r.inputs),
            tuple(_service_status(s) for s in r.services),
            tuple(SubscriptionStatus(s.name, tuple(s.profiles), s.log_first, s.log_head, s.lag,
                                     dict(s.composers)) for s in r.subscriptions),
            r.subscriptions_total, {c.name: c.count for c in r.events_in},
            {c.name: c.count for c in r.dead_letters}, r.composites_out)

    # -- events in

    def publish(self, events_or_lines: Iterable[str | bytes | dict[str, Any] | Event],
                batch: int = 500, *, advance_to: int | None = None) -> PublishResult:
        """Publish events in order, in one call: up to ``batch`` events (and 1 MB) per
        message. An item is a CloudEvents JSON line (str or bytes), a CloudEvent dict or an
        :class:`eva.events.Event`. ``advance_to`` (µs, an operator's right: PERMISSION_DENIED
        for another client): afterwards, no event at or before that time will come (a
        watermark: what waits on an absence is decided).

        An event is accepted once it is durably in the mediator's event log; a malformed,
        duplicate or late one is dead-lettered with its reason (``DeadLetter.index`` counts
        the items given, from 0). The call is not retried: a repeat would be dead-lettered as
        duplicates; on MediatorError, publish again from the first event the mediator had
        not accepted."""
        if batch < 1:
            raise ValueError(f"batch is 1 or more, got {batch}")

        def messages() -> Iterator[Any]:
            pending: list[str] = []
            size = 0
            for item in events_or_lines:
                line = _line(item)
                if pending and (len(pending) >= batch or size + len(line) > BATCH_BYTES):
                    yield mediator_pb2.PublishRequest(cloudevents=pending)
                    pending, size = [], 0
                pending.append(line)
                size += len(line)
            if pending or advance_to is not None:
                yield mediator_pb2.PublishRequest(cloudevents=pending,
                                                  advance_to_us=advance_to or 0)

        # Connected first (up to ``timeout``): the call itself has no deadline, a large file
        # takes what it takes.
        self._first_contact()
        if not self._connected(self.timeout):
            raise self._unreachable()
        try:
            reply = self._stub.Publish(messages(), metadata=self._metadata, wait_for_ready=True)
        except grpc.RpcError as exc:
            raise MediatorError.from_rpc(exc, self.address) from None
        return _published(reply)

    # -- dead letters

    def dead_letters(self, *, reason: str = "", source: str = "", client: str = "",
                     after: int = 0, last: int = 0, follow: bool = False) -> Iterator[KeptLetter]:
        """The dead letters you may see — your publishes', or every one for an operator
        (``client``: only that client's) — oldest first: those after position ``after``, or the
        newest ``last``; of ``reason`` and ``source`` where given. With ``follow`` the iterator
        goes on with each letter as the mediator keeps it (until closed)."""
        request = mediator_pb2.ListDeadLettersRequest(after=after, last=last, reason=reason,
                                                      source=source, client=client,
                                                      follow=follow)
        try:
            for item in self._stub.ListDeadLetters(request, metadata=self._metadata,
                                                   timeout=None if follow else self.timeout,
                                                   wait_for_ready=True):
                yield KeptLetter(item.position, item.time_us, item.reason, item.source,
                                 item.client, item.where, item.id, item.detail, bytes(item.raw),
                                 item.size, item.kind, item.republished_us)
        except grpc.RpcError as exc:
            raise MediatorError.from_rpc(exc, self.address) from None

    def republish(self, position: int, replacement: bytes | str | None = None) -> PublishResult:
        """Publish dead letter ``position`` again, as it was or replaced by a corrected input (a
        CloudEvent, or a broker's payload its source maps): the reply as :meth:`publish`'s."""
        data = replacement.encode() if isinstance(replacement, str) else replacement or b""
        return _published(self._call("RepublishDeadLetter", mediator_pb2.RepublishRequest(
            position=position, replacement=data)))


def _published(reply: Any) -> PublishResult:
    return PublishResult(reply.accepted, reply.dead_lettered,
                         tuple(DeadLetter(d.index, d.id, d.reason) for d in reply.dead_letters))


def _service_status(s: Any) -> ServiceStatus:
    return ServiceStatus(s.name, s.group, s.language, s.address, tuple(s.sources),
                         tuple(s.types), s.status, s.subscriptions, s.mode)


def _read(path: str | Path | None) -> bytes | None:
    return None if path is None else Path(path).read_bytes()


def saved_token(address: str) -> str:
    """A token for the mediator at ``address`` when none is given: ``EVAMED_TOKEN``, else the
    one ``evamed clients add NAME --save`` saved (mediator/credentials.py). ValueError if
    neither gives one."""
    import os

    from mediator import credentials

    token = os.environ.get("EVAMED_TOKEN") or credentials.token_for(address)
    if not token:
        raise ValueError(f"no token for {address}: pass one, set EVAMED_TOKEN, or save one with "
                         f"`evamed clients add NAME --save` (it saves to {credentials.path()})")
    return token


def speaks_tls(address: str, seconds: float = 2.0) -> bool | None:
    """Whether the server at host:port completes a TLS handshake (True), answers but not with
    TLS (False), or cannot be reached (None). The certificate is not checked: only whether TLS
    is spoken, to say which way a client is wrong."""
    import socket
    import ssl

    host, _, port = address.rpartition(":")
    host = host.strip("[]") or "127.0.0.1"
    if not port.isdigit():
        return None
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    context.set_alpn_protocols(["h2"])
    try:
        with socket.create_connection((host, int(port)), timeout=seconds) as raw:
            try:
                with context.wrap_socket(raw, server_hostname=host or None):
                    return True
            except (ssl.SSLError, ConnectionError, TimeoutError):
                return False
    except OSError:
        return None


__all__ = ["DeadLetter", "Explanation", "InputStatus", "KeptLetter", "MediatorClient",
           "MediatorError", "MediatorStatus", "Notification", "ProfileInfo", "PublishResult",
           "ServiceStatus", "SubscriptionStatus", "saved_token", "speaks_tls"]
