"""The mediator's API, ``eva.mediator.v1.MediatorService`` on ``grpc.aio`` (DESIGN §5;
proto/eva/mediator/v1/mediator.proto; docs/operations.md).

Every call arrives authenticated: the interceptor of :mod:`mediator.server` checked the bearer
token and put the client's name in :data:`CLIENT`. A client sees only its own subscriptions —
another client's name is NOT_FOUND, exactly as a name nobody registered, so names do not leak.

Errors are status codes with ``google.rpc.Status`` details, never a traceback: a profile that
does not parse is INVALID_ARGUMENT with a ``BadRequest`` violation of field ``profile``
(``line L, column C: message``); a limit is RESOURCE_EXHAUSTED (how many profiles) or
INVALID_ARGUMENT (a profile's size, nesting, time frame) with an ``ErrorInfo`` reason. A
handler raises :class:`Refusal`; :func:`_answering` turns it into the status, and anything
unexpected into INTERNAL with the exception's type (logged with its traceback).

A profile document is read — parsed and checked — in a worker process, never on the server's
event loop, which goes on answering every other client meanwhile (mediator/reading.py); one
that takes longer than ``limits.read_time`` is RESOURCE_EXHAUSTED (``PROFILE_TOO_SLOW``).

Publish (events in) goes through the door (mediator/door.py): each line checked by the rules
of eva/admission.py — size, malformed, misrouted, duplicate, late, future — the accepted
appended to the event log in one durable write per message, every refusal kept in the
dead-letter log, then the pipeline woken. One message at a time decides and appends (a lock).
The brokers' sources (mediator/brokers.py) take the same path, under the same lock:
:meth:`MediatorService.ingest`. ``ListDeadLetters`` and ``RepublishDeadLetter``
(mediator/dead_letter_calls.py) read the dead-letter log and publish a letter again.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from functools import wraps
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import grpc
from google.rpc import error_details_pb2, status_pb2
from grpc_status import rpc_status

from adapters.remote_link import EMBEDDED
from eva import ast
from eva.events import Event, brief_repr
from eva.parser import ProfileError, parse
from eva.units import format_span
from mediator.config import PUBLISH_LANE, RESERVED_SERVICE, Config, Limits
from mediator.dead_letters import DeadLetterLog
from mediator.delivery import (
    Closing,
    Dispatcher,
    Revoked,
    Suspended,
    TokenError,
    token_position,
)
from mediator.door import Door, LogWriteError, Tally, wall_clock
from mediator.metrics import Metrics
from mediator.reading import FILENAME, ReaderBug, ReaderFailed, Readers, ReadersBusy, ReadTimeout
from mediator.store.base import (
    ClientRecord,
    RetentionError,
    Store,
    StoreError,
    SubscriptionRecord,
)
from mediator.wire import mediator_pb2, mediator_pb2_grpc
from transforms.plans import Plan, Remote, Subscribe, nodes

if TYPE_CHECKING:
    from mediator.brokers import Brokers
    from mediator.inputs import State
    from mediator.pipeline import ServiceStatus

log = logging.getLogger("evamed.service")

CLIENT: contextvars.ContextVar[str] = contextvars.ContextVar("evamed_client")
"""The authenticated client's name, set by the server's interceptor for each call."""

MAX_DEAD_LETTERS = 100
"""Dead letters a PublishReply lists (its count is always complete)."""
MAX_BATCH = 1000
"""Documents in one AddProfiles call at most: the call answers each, and a caller with more
sends several calls (the per-client limit, ``limits.profiles``, still bounds what stays)."""
HOP_SECONDS = 0.2
"""AddProfiles registers consecutive small documents in one hop off the loop, ended once this
long has passed (what is left goes in the next): a hop holds the registry, so other clients'
registrations wait at most about this long (a few documents of the worst small shape,
:data:`SMALL_DOCUMENT`, or one that subscribes at a slow remote service), while a hop of
typical documents — 150 or so in 0.2 s — saves each one's round trip and hop, more than half
of a registration's CPU (docs/performance.md, "Registering profiles")."""
SMALL_DOCUMENT = 4096
"""A profile document of at most this many bytes is read in the registration's own worker
thread, not in a reading process (mediator/reading.py): its worst shape (brackets nested 2,000
deep) reads in about 50 ms — the GIL is handed back to the loop every 5 ms meanwhile — while
the round trip to a process costs more than reading a typical document (≈ 0.3 ms against
0.08 ms)."""
MAX_NAME = 200
"""Characters of a subscription name (it appears in tokens, keys and tables)."""
ERROR_DOMAIN = "evamed"


class Pipeline(Protocol):
    """What the service asks of the pipeline (mediator/pipeline.py)."""

    def add(self, record: SubscriptionRecord, doc: ast.Document | None = None,
            summary: Callable[[list[Plan]], str] | None = None) -> list[Plan]: ...
    def record(self, owner: str, name: str) -> SubscriptionRecord | None: ...
    def remove(self, owner: str, name: str) -> bool: ...
    def wake(self) -> None: ...
    def handed(self, head: int, lines: list[str], events: list[Event]) -> None: ...
    def advance(self, time: int) -> None: ...
    def explain(self, doc: ast.Document) -> tuple[str, str]: ...
    def newest(self) -> int | None: ...
    def services(self) -> list[ServiceStatus]: ...
    def failure(self, owner: str, name: str) -> str | None: ...
    def suspended(self, owner: str, name: str) -> str | None: ...
    def inputs(self) -> list[tuple[str, State, int, int]]: ...
    def placement(self, owner: str, name: str) -> dict[str, str]: ...
    @property
    def error(self) -> BaseException | None: ...


Owned = tuple[SubscriptionRecord, tuple[int, int]]
"""A client's subscription record with its notification log's bounds (first kept, head)."""


class Refusal(Exception):
    """A call refused with a status (code, message, details)."""

    def __init__(self, code: grpc.StatusCode, message: str, *details: Any) -> None:
        message = cut(message)
        super().__init__(message)
        status = status_pb2.Status(code=code.value[0], message=message)
        for detail in details:
            status.details.add().Pack(detail)
        self.proto = status  # (AddProfiles answers a document with it: Refused)
        self.status = rpc_status.to_status(status)


MAX_MESSAGE = 1000
"""Characters of a status message (and of a violation's description) at most: both travel in
gRPC's trailing metadata (8 KB by default, the details base64-encoded), and a longer one
reached the client as RESOURCE_EXHAUSTED instead of the status meant (issue 29)."""
MAX_SHOWN = 160
"""Characters of a name a message quotes (as the base services cut theirs)."""


def cut(text: str, limit: int = MAX_MESSAGE) -> str:
    """``text`` at most ``limit`` characters, saying how much was left out."""
    if len(text) <= limit:
        return text
    return text[:limit - 40] + f"… ({len(text) - limit + 40:,} characters not shown)"


def shown(name: str) -> str:
    """A name as a message quotes it: at most MAX_SHOWN characters."""
    return name if len(name) <= MAX_SHOWN else name[:MAX_SHOWN - 1] + "…"


def violation(description: str) -> Any:
    """A ``BadRequest`` naming field ``profile``."""
    return error_details_pb2.BadRequest(field_violations=[
        error_details_pb2.BadRequest.FieldViolation(field="profile",
                                                    description=cut(description))])


def reason(name: str, limit: object, found: object) -> Any:
    return error_details_pb2.ErrorInfo(reason=name, domain=ERROR_DOMAIN,
                                       metadata={"limit": str(limit), "found": str(found)})


Handler = TypeVar("Handler", bound=Callable[..., Awaitable[Any]])


def _answering(method: Handler) -> Handler:
    """A unary handler whose Refusal becomes its status, and any other exception INTERNAL."""

    @wraps(method)
    async def run(self: Any, request: Any, context: grpc.aio.ServicerContext) -> Any:
        try:
            return await method(self, request, context)
        except Refusal as refusal:
            await context.abort_with_status(refusal.status)
        except grpc.aio.AbortError:
            raise
        except Exception as exc:
            await context.abort_with_status(_internal(method.__name__, exc))
    return run  # type: ignore[return-value]


def _internal(call: str, exc: Exception) -> grpc.Status:
    return _internal_refusal(call, exc).status


def _internal_refusal(call: str, exc: Exception) -> Refusal:
    if isinstance(exc, StoreError):  # a fault of the store, not of the call: retry later
        log.warning("%s: %s", call, exc)
        return _store_refusal(exc)
    log.exception("%s failed", call)
    return Refusal(grpc.StatusCode.INTERNAL, f"{call} failed: {type(exc).__name__}: "
                   f"{str(exc)[:200]}")


def store_unavailable(exc: StoreError) -> grpc.Status:
    """UNAVAILABLE for a store that does not answer, with ErrorInfo ``STORE_UNAVAILABLE`` (the
    client says the mediator answered, its store did not)."""
    return _store_refusal(exc).status


def _store_refusal(exc: StoreError) -> Refusal:
    return Refusal(grpc.StatusCode.UNAVAILABLE, f"{exc}; try again once it answers",
                   error_details_pb2.ErrorInfo(reason="STORE_UNAVAILABLE", domain=ERROR_DOMAIN))


def _log_registered(owner: str, owned: Owned, plans: list[Plan] | None) -> None:
    if plans is not None:  # (None: registered before with the same text)
        log.info("%s registered %s: %s", owner, owned[0].name,
                 ", ".join(p.profile.name for p in plans))


def _refused(refusal: Refusal) -> Any:
    """A document's refusal, as AddProfiles answers it."""
    status = refusal.proto
    return mediator_pb2.AddProfileResult(refused=mediator_pb2.Refused(
        code=status.code, message=status.message, details=status.details))


def _reply_letters(tally: Tally) -> list[Any]:
    """The first MAX_DEAD_LETTERS refusals of a call, as the reply lists them."""
    return [mediator_pb2.DeadLetter(index=index, id=ident,
                                    reason=f"{refused.reason}: {refused.detail}")
            for index, ident, refused in tally.refused[:MAX_DEAD_LETTERS]]


class MediatorService(mediator_pb2_grpc.MediatorServiceServicer):  # type: ignore[misc]
    def __init__(self, store: Store, pipeline: Pipeline, config: Config, metrics: Metrics,
                 dispatcher: Dispatcher, brokers: Brokers | None = None,
                 letters: DeadLetterLog | None = None) -> None:
        self.store = store
        self.brokers = brokers  # the sources are asked for what each subscription needs
        self.pipeline = pipeline
        self.config = config
        self.limits = config.limits
        self.metrics = metrics
        self.dispatcher = dispatcher
        self.letters = letters or DeadLetterLog(store, metrics, config.dead_letters)
        self.door = Door(store, config, metrics, self.letters,
                         [s.info() for s in config.services if s.autonomous])
        self.door.appended = pipeline.handed  # the feed takes the door's decoded events
        self._registry = asyncio.Lock()  # one registration at a time (names, limits)
        self.readers = Readers(config.limits.read_time / 1e6)  # documents read off the loop
        self.started_us = wall_clock()

    async def restore(self) -> None:
        """Seed the door's duplicate memory, newest time and advance from the store (what was
        accepted before a restart is still recognised)."""
        await asyncio.to_thread(self.door.restore)

    # ---------------------------------------------------------------- subscriptions

    async def Subscribe(self, request: Any, context: grpc.aio.ServicerContext
                        ) -> AsyncIterator[Any]:
        try:
            owner = CLIENT.get()
            if request.profile_text:
                record, bounds = await self._register(owner, request.profile_text, request.name)
            else:
                record, bounds = await self._own(owner, request.name)
            after = self._resume_at(record, request.resume_token, bounds)
            failed = self.pipeline.failure(owner, record.name)
            refused = self._suspension(owner, record.name)
            if refused is not None:
                raise refused
            if failed:
                raise Refusal(grpc.StatusCode.FAILED_PRECONDITION,
                              f"subscription {_brief_name(record.name)} is not evaluated: "
                              f"{failed}; remove it (Unsubscribe) and register it again once "
                              "that is mended")
            yield mediator_pb2.Notification(subscription=record.name, ready=True)
            log.info("%s subscribed to %s from position %d", owner, record.name, after)
            # A suspension while it streams ends it, with the same status, once the log is sent.
            async for message in self.dispatcher.stream(
                    record, after, lambda: self.pipeline.suspended(owner, record.name)):
                yield message
        except Refusal as refusal:
            await context.abort_with_status(refusal.status)
        except Suspended:
            refused = self._suspension(owner, record.name)
            assert refused is not None  # (a suspension is never lifted but by a removal)
            await context.abort_with_status(refused.status)
        except RetentionError as exc:
            await context.abort(grpc.StatusCode.OUT_OF_RANGE, f"{exc}; the client fell behind "
                                "the log's retention")
        except Closing as exc:
            await context.abort(grpc.StatusCode.UNAVAILABLE, str(exc))
        except Revoked as exc:
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, str(exc))
        except grpc.aio.AbortError:
            raise
        except Exception as exc:
            await context.abort_with_status(_internal("Subscribe", exc))

    def _suspension(self, owner: str, name: str) -> Refusal | None:
        """RESOURCE_EXHAUSTED naming the limit a subscription was suspended at (None: it was
        not): its output (or state) reached it, so the client's profile is the cause."""
        limit = self.pipeline.suspended(owner, name)
        failed = self.pipeline.failure(owner, name)
        if limit is None or failed is None:
            return None
        return Refusal(grpc.StatusCode.RESOURCE_EXHAUSTED,
                       f"subscription {_brief_name(name)} is {failed} (the limit: "
                       f"{self._limit_of(limit)})",
                       reason(limit.upper(), self._limit_of(limit), "reached"))

    def _limit_of(self, reason_: str) -> str:
        """The configured value of a limit a subscription was suspended at, for ErrorInfo."""
        if reason_ == "composite_limit":
            return f"{self.limits.composites} composites per step (limits.composites)"
        if reason_ == "service_limit":
            return "a base service's work or store limit (its message says which)"
        return "the engine's state cap (stored occurrences per profile)"

    @_answering
    async def AddProfile(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        return self._info(*await self._register(CLIENT.get(), request.profile_text,
                                                   request.name))

    @_answering
    async def AddProfiles(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        owner = CLIENT.get()
        if len(request.profiles) > MAX_BATCH:
            raise Refusal(grpc.StatusCode.INVALID_ARGUMENT,
                          f"{len(request.profiles):,} profile documents in one call, the limit "
                          f"is {MAX_BATCH:,}: send them in several calls (none was registered)",
                          reason("TOO_MANY_DOCUMENTS", MAX_BATCH, len(request.profiles)))
        results: list[Any] = []
        hop: list[tuple[str, str]] = []  # small documents waiting for their hop

        async def flush() -> None:
            while hop:
                # Shielded as AddProfile's registration is: a hop is done whole or not begun.
                # It ends after HOP_SECONDS: the rest go in the next one.
                done = await asyncio.shield(self._create_hop(owner, hop[:]))
                results.extend(done)
                del hop[:len(done)]

        for item in request.profiles:
            try:
                small = self._check_size(item.profile_text) <= SMALL_DOCUMENT
            except Refusal as refusal:
                await flush()
                results.append(_refused(refusal))
                continue
            if small:
                hop.append((item.profile_text, item.name))
                continue
            await flush()  # a large one is read in a reading process, as AddProfile does
            try:
                results.append(mediator_pb2.AddProfileResult(profile=self._info(
                    *await self._register(owner, item.profile_text, item.name))))
            except Refusal as refusal:
                results.append(_refused(refusal))
            except Exception as exc:  # the store's fault: this document's answer
                results.append(_refused(_internal_refusal("AddProfiles", exc)))
        await flush()
        return mediator_pb2.AddProfilesReply(results=results)

    async def _create_hop(self, owner: str, hop: list[tuple[str, str]]) -> list[Any]:
        """Small documents (text, name) of ``owner`` registered in one hop off the loop, as
        :meth:`_create` registers one: each one's result, in order."""
        async with self._registry:
            done = await asyncio.to_thread(self._create_all_now, owner, hop)
        results = []
        for one in done:
            if isinstance(one, Refusal):
                results.append(_refused(one))
                continue
            owned, plans = one
            _log_registered(owner, owned, plans)
            results.append(mediator_pb2.AddProfileResult(profile=self._info(*owned)))
        return results

    def _create_all_now(self, owner: str, hop: list[tuple[str, str]]
                        ) -> list[tuple[Owned, list[Plan] | None] | Refusal]:
        """The documents of a hop, in order, until :data:`HOP_SECONDS` have passed (at least
        one): each one's record and plans, or its refusal. A store that fails refuses the
        rest of the hop with the same UNAVAILABLE, untried — each would wait out the
        store's timeout while holding the registry."""
        done: list[tuple[Owned, list[Plan] | None] | Refusal] = []
        until = time.monotonic() + HOP_SECONDS
        for text, name in hop:
            try:
                done.append(self._create_now(owner, name, text, None))
            except Refusal as refusal:
                done.append(refusal)
            except StoreError as exc:
                down = _internal_refusal("AddProfiles", exc)
                done += [down] * (len(hop) - len(done))
                break
            except Exception as exc:  # this document's fault: the next go on
                done.append(_internal_refusal("AddProfiles", exc))
            if time.monotonic() > until:
                break
        return done

    @_answering
    async def Unsubscribe(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        owner = CLIENT.get()
        async with self._registry:
            if await asyncio.to_thread(self.store.subscription, owner, request.name) is None:
                return mediator_pb2.UnsubscribeReply(found=False)
            await asyncio.to_thread(self.pipeline.remove, owner, request.name)
            found = await asyncio.to_thread(self.store.delete_subscription, owner, request.name)
            if self.brokers is not None:
                await asyncio.to_thread(self.brokers.removed, (owner, request.name))
        self.dispatcher.forget(owner, request.name)
        log.info("%s unsubscribed %s", owner, request.name)
        return mediator_pb2.UnsubscribeReply(found=found)

    @_answering
    async def ListProfiles(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        owned = await asyncio.to_thread(self._listed, CLIENT.get())
        return mediator_pb2.ListProfilesReply(profiles=[self._info(*o) for o in owned])

    def _listed(self, owner: str) -> list[Owned]:
        return [(r, self.store.notification_bounds(owner, r.name))
                for r in sorted(self.store.subscriptions(owner), key=lambda r: r.name)]

    @_answering
    async def GetProfile(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        return self._info(*await self._own(CLIENT.get(), request.name))

    def _info(self, record: SubscriptionRecord, bounds: tuple[int, int]) -> Any:
        info = _profile_info(record, bounds)
        info.status = self.pipeline.failure(record.owner, record.name) or ""
        return info

    @_answering
    async def Explain(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        if request.profile_text:
            doc = await self._parse(request.profile_text)
        else:
            doc = await self._parse((await self._own(CLIENT.get(), request.name))[0].text)
        try:
            text, as_json = await asyncio.to_thread(self.pipeline.explain, doc)
        except ValueError as exc:
            raise _planning_refusal(exc) from None
        if self.brokers is not None and (brokers := self.brokers.explain(doc)):
            text = f"{text.rstrip()}\n{brokers}\n"
        return mediator_pb2.ExplainReply(text=text, json=as_json)

    @_answering
    async def ListServices(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        return mediator_pb2.ListServicesReply(services=await asyncio.to_thread(self._services))

    def _services(self) -> list[Any]:
        """The services, then the brokers' sources (mode "source")."""
        addresses = {s.name: s.address for s in self.config.services}
        services = [_service_info(s, addresses.get(s.info.name, EMBEDDED))
                    for s in self.pipeline.services()]
        if self.brokers is not None:
            sources = self.brokers.addresses()
            services += [mediator_pb2.ServiceInfo(
                name=name, group="cg0", language="", address=sources[name],
                status=source.status(), mode="source")
                for name, source in self.brokers.sources.items()]
        return services

    @_answering
    async def Status(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        return await asyncio.to_thread(self._status, CLIENT.get())

    def _status(self, owner: str) -> Any:
        """What ``evamed status`` shows (proto: StatusReply). The counts are the metrics'
        (since this process started); the lag is the delivery's."""
        error = self.pipeline.error
        lag = _samples(self.metrics.lag, ("owner", "subscription"))
        subscriptions = []
        for record, (first, head) in self._listed(owner):
            summaries = json.loads(record.plans) if record.plans else []
            subscriptions.append(mediator_pb2.SubscriptionStatus(
                name=record.name, profiles=[s["profile"] for s in summaries],
                log_first=first if first <= head else 0, log_head=head,
                lag=int(lag.get((owner, record.name), -1)),
                composers=self.pipeline.placement(owner, record.name)))
        inputs = [mediator_pb2.InputStatus(name=name, watermark_us=state.watermark or 0,
                                           idle=state.idle, position=position, head=head)
                  for name, state, position, head in self.pipeline.inputs()]
        return mediator_pb2.StatusReply(
            version=_version(), health="NOT_SERVING" if error is not None else "SERVING",
            error="" if error is None else f"the pipeline stopped: {error}",
            composer=self.config.composer, started_us=self.started_us,
            event_log_head=self.store.event_head(), inputs=inputs, services=self._services(),
            subscriptions=subscriptions, subscriptions_total=len(self.store.subscriptions()),
            events_in=_counts(self.metrics.events_in, "source"),
            dead_letters=_counts(self.metrics.dead_letters, "reason"),
            composites_out=int(sum(_samples(self.metrics.composites_out, ()).values())))

    async def _own(self, owner: str, name: str) -> Owned:
        if not name:
            raise Refusal(grpc.StatusCode.INVALID_ARGUMENT,
                          "name a subscription, or give a profile document (profile_text)")
        return await asyncio.to_thread(self._own_now, owner, name)

    def _own_now(self, owner: str, name: str) -> Owned:
        record = self.store.subscription(owner, name)
        if record is None:  # another client's name reads exactly as one nobody registered
            raise Refusal(grpc.StatusCode.NOT_FOUND, f"you have no subscription named {name!r}")
        return record, self.store.notification_bounds(owner, name)

    async def _register(self, owner: str, text: str, name: str) -> Owned:
        """The subscription ``name`` (default: the document's first profile) of ``owner`` for
        the document ``text``: registered and planned now, or the one registered before with
        the same text; ALREADY_EXISTS with another text."""
        doc: ast.Document | None = None
        if self._check_size(text) > SMALL_DOCUMENT:
            doc = await self._parse(text)
            name = self._named(doc, name)
        # Shielded: a caller that goes away mid-registration leaves it complete (as AddProfile
        # would have), never planned at the services without its record or the reverse.
        return await asyncio.shield(self._create(owner, name, text, doc))

    def _named(self, doc: ast.Document, name: str) -> str:
        """The subscription's name (given, or the first profile's) once the document passes
        the checks of its shape; a Refusal otherwise."""
        if not doc.profiles:
            raise Refusal(grpc.StatusCode.INVALID_ARGUMENT, "the document defines no profile "
                          "(expected at least one `profile NAME = …`)",
                          violation("line 1, column 1: the document defines no profile"))
        name = name or doc.profiles[0].name
        _check_name(name)
        self._check_shape(doc)
        return name

    async def _create(self, owner: str, name: str, text: str, doc: ast.Document | None
                      ) -> Owned:
        async with self._registry:
            # One hop off the loop for the whole registration: a hop costs more than a store
            # call (docs/performance.md, "Registering profiles").
            owned, plans = await asyncio.to_thread(self._create_now, owner, name, text, doc)
        _log_registered(owner, owned, plans)
        return owned

    def _create_now(self, owner: str, name: str, text: str, doc: ast.Document | None
                    ) -> tuple[Owned, list[Plan] | None]:
        """:meth:`_create` in a worker thread: the record with its log's bounds, and its plans
        (None: it was registered before with the same text). ``doc`` None: a small document,
        read here (:data:`SMALL_DOCUMENT`)."""
        if doc is None:
            doc = self._parse_here(text)
            name = self._named(doc, name)
        existing = self.store.subscription(owner, name)
        if existing is not None:
            if existing.text == text:
                return (existing, self.store.notification_bounds(owner, name)), None
            raise Refusal(grpc.StatusCode.ALREADY_EXISTS,
                          f"you have a subscription named {name!r} with another profile "
                          "document; unsubscribe it first, or choose another name")
        count = self.store.count_subscriptions(owner)
        if count >= self.limits.profiles:
            raise Refusal(grpc.StatusCode.RESOURCE_EXHAUSTED,
                          f"you have {count} subscription{'' if count == 1 else 's'}, the limit "
                          "per client is "
                          f"{self.limits.profiles} (limits.profiles); unsubscribe one first",
                          reason("TOO_MANY_PROFILES", self.limits.profiles, count))
        record = SubscriptionRecord(owner, name, text, time.time_ns() // 1000,
                                    start_position=self.store.event_head(),
                                    start_time=self._newest_time())
        try:
            # Stored by the pipeline once planned, with where it starts and its plans: one
            # write per registration.
            plans = self.pipeline.add(record, doc, summary=_plans_json)
        except Exception as exc:
            self.store.delete_subscription(owner, name)
            raise _planning_refusal(exc) from None
        if self.brokers is not None:
            self.brokers.added((owner, name), doc)
        # (suspended already, it is no longer live: read back)
        record = (self.pipeline.record(owner, name) or self.store.subscription(owner, name)
                  or record)
        return (record, self.store.notification_bounds(owner, name)), plans

    def _parse_here(self, text: str) -> ast.Document:
        """The document of a small ``text`` (:data:`SMALL_DOCUMENT`; its size checked by the
        caller), read in the calling thread; a Refusal says why it cannot be read, as
        :meth:`_parse` does."""
        try:
            return parse(text, FILENAME)
        except (ProfileError, RecursionError) as exc:
            raise _read_refusal(exc) from None
        except Exception as exc:  # a parser bug must still answer as a bad profile, not a crash
            log.exception("profile not understood")
            raise _read_refusal(ReaderBug(type(exc).__name__, "")) from None

    def _check_size(self, text: str) -> int:
        size = len(text.encode("utf-8", "surrogatepass"))
        if size > self.limits.profile_bytes:
            raise Refusal(grpc.StatusCode.INVALID_ARGUMENT,
                          f"the profile document is {size:,} bytes, the limit is "
                          f"{self.limits.profile_bytes:,} (limits.profile_bytes)",
                          reason("PROFILE_TOO_LARGE", self.limits.profile_bytes, size))
        return size

    async def _parse(self, text: str) -> ast.Document:
        """The document of ``text``, read in a worker process (mediator/reading.py) so that
        the loop goes on answering other clients; a Refusal says why it cannot be read."""
        size = self._check_size(text)
        try:
            return await self.readers.read(text)
        except (ProfileError, RecursionError) as exc:
            raise _read_refusal(exc) from None
        except (ReadTimeout, ReadersBusy, ReaderFailed) as exc:
            raise _reading_refusal(exc, self.limits.read_time, size) from None
        except ReaderBug as exc:  # a parser bug must still answer as a bad profile, not a crash
            log.error("profile not understood: %s", exc.trace)
            raise _read_refusal(exc) from None

    def _check_shape(self, doc: ast.Document) -> None:
        check_shape(doc, self.limits)

    def _resume_at(self, record: SubscriptionRecord, token: str, bounds: tuple[int, int]) -> int:
        """The position to send after: the token's, or (none) before the oldest kept entry
        (``bounds``: the log's, first kept and head)."""
        first, head = bounds
        if not token:
            return max(0, first - 1)
        try:
            position = token_position(token, record)
        except TokenError as exc:
            raise Refusal(grpc.StatusCode.INVALID_ARGUMENT, str(exc)) from None
        if position > head:
            raise Refusal(grpc.StatusCode.OUT_OF_RANGE,
                          f"the resume token names position {position}, past the log's newest, "
                          f"{head} (a token of an earlier subscription of this name, removed "
                          "since? subscribe without a token)")
        if first and position < first - 1:
            raise Refusal(grpc.StatusCode.OUT_OF_RANGE,
                          f"the resume token names position {position}, older than the oldest "
                          f"the log keeps, {first} (retention: the newest "
                          f"{self.config.retention:,}); what followed it was trimmed — "
                          "subscribe without a token to start at the oldest kept")
        return position

    def _newest_time(self) -> int | None:
        newest = self.pipeline.newest()
        mine = self.door.newest
        if newest is None or (mine is not None and mine > newest):
            return mine
        return newest

    # ---------------------------------------------------------------- dead letters

    async def ListDeadLetters(self, request: Any, context: grpc.aio.ServicerContext
                              ) -> AsyncIterator[Any]:
        from mediator.dead_letter_calls import list_letters

        try:
            async for item in list_letters(self, request, CLIENT.get()):
                yield item
        except Refusal as refusal:
            await context.abort_with_status(refusal.status)
        except grpc.aio.AbortError:
            raise
        except Exception as exc:
            await context.abort_with_status(_internal("ListDeadLetters", exc))

    @_answering
    async def RepublishDeadLetter(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        from mediator.dead_letter_calls import republish

        try:
            return await asyncio.shield(republish(self, request, CLIENT.get()))
        except LogWriteError as exc:
            raise Refusal(grpc.StatusCode.UNAVAILABLE, f"{exc}; try again") from None

    # ---------------------------------------------------------------- events in

    async def Publish(self, request_iterator: AsyncIterator[Any],
                      context: grpc.aio.ServicerContext) -> Any:
        tally = Tally()
        client = CLIENT.get("")
        try:
            record = await asyncio.to_thread(self.store.client, client)
            if record is None:  # removed from the store since the call was authenticated
                raise Refusal(grpc.StatusCode.UNAUTHENTICATED, "the client is not known")
            async for request in request_iterator:
                # Shielded: a publisher that goes away mid-message does not leave the memory
                # of ids ahead of the log (the message is decided and appended, or neither).
                await asyncio.shield(self._message(request, tally, record))
        except Refusal as refusal:
            await context.abort_with_status(refusal.status)
        except StoreError as exc:
            await context.abort_with_status(_internal("Publish", exc))
        return mediator_pb2.PublishReply(accepted=tally.accepted, dead_lettered=tally.dead,
                                         dead_letters=_reply_letters(tally))

    async def _message(self, request: Any, tally: Tally, record: ClientRecord,
                       lane: str = PUBLISH_LANE) -> None:
        if request.advance_to_us and not record.operator:
            # One watermark for the own feed: an advance says no event at or before it comes
            # from anyone, so one client's would make every other's events late.
            raise Refusal(grpc.StatusCode.PERMISSION_DENIED,
                          f"advance_to_us is an operator's (client {record.name!r} is not one: "
                          "evamed clients add NAME --operator); none of this message's events "
                          f"was taken, {tally.accepted} before it were")
        async with self.door.order:
            try:
                await self._accept(request.cloudevents, tally, lane, record.name,
                                   record.granted)
            except LogWriteError as exc:
                raise Refusal(grpc.StatusCode.UNAVAILABLE,
                              f"{exc}; none of this message's {exc.count} events was accepted, "
                              f"{tally.accepted} before it were: publish from there again"
                              ) from None
            if request.advance_to_us:
                mark = request.advance_to_us
                refused = self.door.check_advance(mark)
                if refused:
                    raise Refusal(grpc.StatusCode.INVALID_ARGUMENT, refused)
                await asyncio.to_thread(self.door.advance, mark)
                await asyncio.to_thread(self.pipeline.advance, mark)

    async def ingest(self, source: str, lines: list[str]) -> int:
        """A broker source's events (mediator/brokers.py), taken as Publish takes a message's,
        in the source's lane: how many were accepted. LogWriteError when they could not be
        appended: the source does not acknowledge them, and its broker sends them again."""
        tally = Tally()
        async with self.door.order:
            await self._accept(lines, tally, source, "", None)
        return tally.accepted

    async def _accept(self, lines: Iterable[str], tally: Tally, lane: str,
                      client: str, granted: Sequence[str] | None) -> None:
        """The door's batch (under its lock): judged, the accepted appended durably, then the
        pipeline woken (``granted``: the sources the client may publish under; None: a
        broker's batch). LogWriteError if the write failed."""
        before = tally.accepted
        await self.door.take(lines, tally, self.store.append_events, lane=lane, client=client,
                             granted=granted)
        if tally.accepted > before:
            self.pipeline.wake()


def check_shape(doc: ast.Document, limits: Limits) -> None:
    """The per-profile limits: nesting depth and the longest time frame (Refusal naming the
    limit)."""
    for p in doc.profiles:
        where = f"line {p.line}, column {p.column}"
        levels = ast.depth(p.expr)
        if levels > limits.depth:
            raise Refusal(grpc.StatusCode.INVALID_ARGUMENT,
                          f"profile {shown(p.name)} nests {levels} operators, the limit is "
                          f"{limits.depth} (limits.depth)",
                          violation(f"{where}: nests {levels} operators, at most "
                                    f"{limits.depth}"),
                          reason("PROFILE_TOO_DEEP", limits.depth, levels))
        frame = limits.time_frame
        if frame is None:
            continue
        longest = _longest_frame(p.expr)
        if longest is None or longest > frame:
            found = ("an unbounded time frame (_inf)" if longest is None
                     else f"a time frame of {format_span(longest)}")
            limit = (f"expected time frames of at most {format_span(frame)} "
                     "(limits.time_frame)")
            raise Refusal(grpc.StatusCode.INVALID_ARGUMENT,
                          f"profile {shown(p.name)} has {found}; {limit}",
                          violation(f"{where}: profile {shown(p.name)} has {found}; {limit}"),
                          reason("TIME_FRAME_TOO_LONG", format_span(frame),
                                 format_span(longest)))


def _profile_info(record: SubscriptionRecord, bounds: tuple[int, int]) -> Any:
    first, head = bounds
    summaries = json.loads(record.plans) if record.plans else []
    return mediator_pb2.ProfileInfo(
        name=record.name, text=record.text, owner=record.owner,
        profiles=[s["profile"] for s in summaries], created_us=record.created_us,
        log_first=first if first <= head else 0, log_head=head,
        plans=[f"{s['profile']}: {s['kind']}, {', '.join(s['services'])}" for s in summaries])


def _brief_name(name: str) -> str:
    return repr(name if len(name) <= 80 else name[:79] + "…")



def _read_refusal(exc: ProfileError | RecursionError | ReaderBug) -> Refusal:
    """INVALID_ARGUMENT for a document that cannot be read, with the position."""
    if isinstance(exc, ProfileError):
        return Refusal(grpc.StatusCode.INVALID_ARGUMENT, str(exc), violation(
            f"line {exc.line}, column {exc.column}: {exc.message}"))
    if isinstance(exc, RecursionError):
        return Refusal(grpc.StatusCode.INVALID_ARGUMENT, "the profile nests too deeply to be "
                       "read", violation("line 1, column 1: nests too deeply"))
    return Refusal(grpc.StatusCode.INVALID_ARGUMENT, f"the profile could not be read "
                   f"({exc.kind})", violation(f"line 1, column 1: could not be read ({exc.kind})"))


def _check_name(name: str) -> None:
    if len(name) > MAX_NAME or not name.isprintable() or name != name.strip():
        raise Refusal(grpc.StatusCode.INVALID_ARGUMENT,
                      f"found the subscription name {brief_repr(name)}, expected at most "
                      f"{MAX_NAME} printable characters without surrounding spaces")


def _longest_frame(expr: ast.Expr) -> int | None:
    """The longest span of an operator in ``expr`` (None: an unbounded one; 0: none)."""
    longest = 0
    for node in ast.walk(expr):
        if isinstance(node, (ast.Conjunction, ast.Sequence, ast.Negation)):
            if node.span is None:
                return None
            longest = max(longest, node.span)
    return longest


def _reading_refusal(exc: Exception, limit: int, size: int) -> Refusal:
    """Why a profile document was not read (mediator/reading.py), as a status."""
    if isinstance(exc, ReadTimeout):
        return Refusal(grpc.StatusCode.RESOURCE_EXHAUSTED,
                       f"reading the profile document ({size:,} bytes) took longer than "
                       f"{format_span(limit)}, the limit (limits.read_time): simplify or split it",
                       reason("PROFILE_TOO_SLOW", format_span(limit), f"over {format_span(limit)}"))
    if isinstance(exc, ReadersBusy):
        return Refusal(grpc.StatusCode.RESOURCE_EXHAUSTED,
                       f"every reader of profile documents stayed busy with other documents "
                       f"for {format_span(limit)} (limits.read_time): try again later",
                       reason("READERS_BUSY", format_span(limit), f"waited {format_span(limit)}"))
    log.warning("reading a profile document of %d bytes: %s", size, exc)
    return Refusal(grpc.StatusCode.RESOURCE_EXHAUSTED,
                   f"the process reading the profile document ({size:,} bytes) stopped before "
                   "it was read (out of memory?): simplify or split it",
                   reason("PROFILE_TOO_SLOW", format_span(limit), "the reader stopped"))


def _planning_refusal(exc: Exception) -> Refusal:
    """Why a profile could not be planned and subscribed, as a status."""
    from adapters.federation import PushRefused
    from mediator.pipeline import Stopping

    if isinstance(exc, Stopping):
        return Refusal(grpc.StatusCode.UNAVAILABLE, str(exc))
    if isinstance(exc, PushRefused):
        return Refusal(grpc.StatusCode.FAILED_PRECONDITION, f"the profile could not be "
                       f"subscribed: {exc}")
    if isinstance(exc, ValueError):
        return Refusal(grpc.StatusCode.INVALID_ARGUMENT, f"the profile cannot be planned: {exc}",
                       violation(f"line 1, column 1: {exc}"))
    if isinstance(exc, ConnectionError):
        return Refusal(grpc.StatusCode.UNAVAILABLE, f"a service the profile needs is out of "
                       f"reach: {exc}")
    log.error("planning failed", exc_info=exc)
    return Refusal(grpc.StatusCode.INTERNAL, f"planning failed: {type(exc).__name__}: "
                   f"{str(exc)[:200]}")


def _plans_json(plans: list[Plan]) -> str:
    """A subscription record's ``plans``: each plan's summary."""
    return json.dumps([_plan_summary(p) for p in plans], ensure_ascii=False)


def _plan_summary(p: Plan) -> dict[str, Any]:
    """What ProfileInfo.plans shows of a plan: its kind and the services it uses."""
    leaves = [n for n in [*nodes(p.root), *p.observed] if isinstance(n, (Remote, Subscribe))
              and not (isinstance(n, Subscribe) and n.clock)]
    services = [s or RESERVED_SERVICE for n in leaves
                for s in (n.sources if isinstance(n, Subscribe) else (n.service,))]
    if len(leaves) < len([n for n in nodes(p.root) if isinstance(n, (Remote, Subscribe))]):
        services.append(RESERVED_SERVICE)  # a time class: the mediator's clock
    return {"profile": p.profile.name, "kind": str(p.kind),
            "services": list(dict.fromkeys(services))}


def _samples(metric: Any, labels: tuple[str, ...]) -> dict[Any, float]:
    """A metric's current values by their labels' values (a tuple; one label: the value; no
    label: ``()``), its ``_total`` samples for a counter."""
    out: dict[Any, float] = {}
    for family in metric.collect():
        for sample in family.samples:
            if sample.name.endswith("_created"):
                continue
            key = tuple(sample.labels[k] for k in labels)
            out[key if len(labels) != 1 else key[0]] = sample.value
    return out


def _counts(metric: Any, label: str) -> list[Any]:
    """A counter summed by one of its labels, as (value, count) pairs, largest first."""
    labels = tuple(metric._labelnames)
    found: dict[str, float] = {}
    for key, count in _samples(metric, labels).items():
        value = key if len(labels) == 1 else key[labels.index(label)]
        found[value] = found.get(value, 0.0) + count
    return [mediator_pb2.Count(name=str(name), count=int(count))
            for name, count in sorted(found.items(), key=lambda item: (-item[1], str(item[0])))
            if count]


@functools.cache
def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    from eva.native import engine_kind

    try:
        number = version("evamed")
    except PackageNotFoundError:
        number = "(not installed)"
    return f"evamed {number} ({engine_kind()})"


@functools.cache
def _language_name(group: str) -> str:
    from adapters.backends.registry import language

    return language(group).name


def _service_info(service: ServiceStatus, address: str) -> Any:
    info = service.info
    return mediator_pb2.ServiceInfo(
        name=info.name, group=info.group, language=_language_name(info.group), address=address,
        sources=list(info.coverage.sources), types=list(info.coverage.types),
        status=service.status, subscriptions=service.handles,
        mode="autonomous" if info.autonomous else "fed")


__all__ = ["CLIENT", "LogWriteError", "MediatorService", "Pipeline", "Refusal", "check_shape",
           "reason", "violation"]
