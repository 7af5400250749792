"""A durable session at an autonomous base service: the mediator's synchronous client of
``eva.base.v1`` ``Open``/``Register``/``Deregister``/``Ack`` (docs/backends.md, "Durable
sessions").

An autonomous service has producers of its own; the mediator never sees its raw events. It
registers native queries in a session the service keeps for it and reads the session's
messages: each Publish message's detections (constituents in full, with their arrival
numbers), the service's watermark, the session's origin, and heartbeats. The service keeps the
session — registrations evaluated, messages kept until acknowledged — while no stream is open,
and with ``--data`` across its own restarts, so nothing is lost in between.

Threads (like :mod:`adapters.remote_link`): one runner connects in the background — a fresh
channel, the service's group checked, its support of sessions checked, the session opened
(created the first time; afterwards reopened without ``create``, so that a session the service
dropped is noticed; never created by a caller that resumes after messages it had), every
registration registered again (idempotent at the service) — and then
reads the stream, calling ``on_message`` in seq order, heartbeats too (seq 0), never twice for a
seq > 0; when the stream breaks it reconnects with back-off (tenacity, up to ``BACKOFF_MAX``)
for as long as the session lives and resumes after ``max(resume_after, delivered)``. A keeper
thread sends acknowledgements (the latest wins; :meth:`Session.ack` never waits on the network)
and watches the stream: one that has brought nothing — not even a heartbeat — for
``SILENCE_BEATS`` heartbeats (at least ``SILENCE_MIN`` seconds) is taken for a service out of
reach (stopped, or a half-open connection) and reconnected. A session the service dropped
(retention, timeout), does not know (restarted without ``--data``) or that another client took
over (a newer stream superseded this one) is lost: ``on_lost(reason)`` is called once and
:meth:`Session.status` says ``LOST``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import grpc
from tenacity import RetryCallState, Retrying, retry_if_exception_type, wait_random_exponential

from adapters.client import _check_group, detection, limit_end, query_error
from adapters.remote_link import BACKOFF_MAX
from adapters.wire import base_pb2, base_pb2_grpc
from eva.events import EventError, from_json_line
from transforms.dialects.base import Detection

log = logging.getLogger("evamed.session")

SILENCE_BEATS = 5
SILENCE_MIN = 2.0
"""A stream silent for ``SILENCE_BEATS`` heartbeats, and at least ``SILENCE_MIN`` seconds, while
the reader waits on it is taken for a service out of reach: it is cancelled and the session
reopened. (Time the caller spends in ``on_message`` does not count.)"""
CLOSE_SECONDS = 2.0
""":meth:`Session.close` returns within this long (or ``timeout``, if shorter)."""
_OPTIONS = [("grpc.initial_reconnect_backoff_ms", 100), ("grpc.min_reconnect_backoff_ms", 100),
            ("grpc.max_reconnect_backoff_ms", int(BACKOFF_MAX * 1000)),
            ("grpc.max_receive_message_length", 64 * 1024 * 1024)]
"""gRPC's own reconnection no slower than ours; a message of large constituents received
whole (the service splits a message at about 256 KiB of detections, but one detection may be
larger)."""
FIRST_CONNECTION = 3.0
"""Seconds a registration that need not wait (``register(wait=False)``) still waits for the
session's first connection: a service that is up is connected to in milliseconds."""
_LOST_CODES = frozenset({grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.NOT_FOUND,
                         grpc.StatusCode.ABORTED})
"""What ends a session for good: dropped by the service, unknown to it, superseded."""


class Ended(Exception):
    """The service refuses to register a query again that it ended at its work or store limit
    (the same query under the same id): ``str(exc)`` is ``RESOURCE_EXHAUSTED: reason``."""


@dataclass(frozen=True)
class Message:
    """One message of a session: the detections one Publish message caused at the service,
    by subscription id, in the service's order (registration order, then each evaluator's);
    seq 0: progress only (a heartbeat, or the stream's first message). The watermark: every
    detection up to it is in this message or an earlier one; the origin: where the session's
    trace starts (docs/backends.md)."""

    seq: int
    detections: tuple[tuple[str, Detection], ...]
    watermark: int | None
    origin: int | None


class _Lost(Exception):
    """The service is out of reach or the stream broke: reconnect."""


class _Gone(Exception):
    """The session cannot go on (its message says why): lost for good."""


def _ignore(reason: str) -> None:
    pass


@dataclass(eq=False)
class _Connection:
    channel: grpc.Channel
    stub: Any
    call: Any = None
    waiting: float | None = None
    """Since when the reader has been waiting for the next message (None: it is not)."""

    def close(self) -> None:
        if self.call is not None:
            self.call.cancel()
        self.channel.close()


class Session:
    """The session ``name`` at the base service at ``address`` (host:port), which must serve
    ``group``. It connects in the background at once; :meth:`register` waits for the
    connection (at most ``timeout`` seconds). ``on_message`` is called from one reader thread,
    in seq order; ``on_lost(reason)`` once if the session is lost. ``resume_after``: the
    messages up to it are not wanted (the caller had them before a restart). ``heartbeat``:
    seconds between the service's heartbeats on an idle stream."""

    def __init__(self, address: str, name: str, group: str, *,
                 on_message: Callable[[Message], None],
                 on_lost: Callable[[str], None] = _ignore,
                 on_refused: Callable[[str, str], None] = lambda ident, why: None,
                 resume_after: int = 0, heartbeat: float = 0.2, timeout: float = 10.0) -> None:
        self.address = address
        self.name = name
        self.group = group
        self.resume_after = resume_after
        self.heartbeat = heartbeat
        self.timeout = timeout
        self._on_message = on_message
        self._on_lost = on_lost
        self._on_refused = on_refused
        self._language = group  # the service's language, once connected (for query errors)
        self._lock = threading.Lock()  # the registrations and the connection
        self._changed = threading.Condition(self._lock)  # connected, lost or closed
        self._registrations: dict[str, str] = {}
        self._withdrawn: set[str] = set()  # deregistered while out of reach: at the next connection
        self._conn: _Connection | None = None  # open and ready: SERVING
        self._opening: _Connection | None = None
        self._created = False  # opened once: from then on reopened without create
        self._began = time.monotonic()
        self._lost: str | None = None
        self._closing = threading.Event()
        self._delivered = 0
        self._acked = 0  # the latest seq the caller acknowledged
        self._ack_sent = 0
        self._nudge = threading.Event()  # the keeper has an acknowledgement to send
        self._silence = max(SILENCE_BEATS * heartbeat, SILENCE_MIN)
        self._runner = threading.Thread(target=self._run, daemon=True,
                                        name=f"evamed-session-{name}")
        self._keeper = threading.Thread(target=self._keep, daemon=True,
                                        name=f"evamed-session-{name}-keeper")
        self._runner.start()
        self._keeper.start()

    # ---------------------------------------------------------------- the interface

    def register(self, subscription_id: str, query: str, wait: bool = True) -> None:
        """Register ``query`` as ``subscription_id``: it sees the events published after this
        returns. The same again: nothing happens. NativeQueryError when the service refuses
        the query; ValueError if the id is registered with another query; ConnectionError
        when the service is out of reach for ``timeout`` seconds or the session is lost.
        ``wait`` False: a service out of reach now is not waited for — the registration is
        made when the session connects, and a refusal then goes to ``on_refused(id, why)``
        (nothing on the caller's side waits on a service that is down)."""
        if not wait and not self._created and self._conn is None:
            # Still making the first connection (the mediator just started): worth a moment,
            # so that what is published right after this returns is seen.
            with self._changed:
                self._changed.wait_for(lambda: self._conn is not None or self._lost is not None
                                       or self._closing.is_set(),
                                       max(0.0, self._began + FIRST_CONNECTION - time.monotonic()))
        with self._lock:
            known = self._registrations.get(subscription_id)
            if known is None and not wait and self._conn is None and self._lost is None:
                self._registrations[subscription_id] = query  # made at the next connection
                self._withdrawn.discard(subscription_id)
                return
        if known == query:
            return
        if known is not None:
            raise ValueError(f"subscription {subscription_id!r} of session {self.name} is "
                             "registered with another query: deregister it first")
        deadline = time.monotonic() + self.timeout
        request = base_pb2.RegisterRequest(session=self.name, subscription_id=subscription_id,
                                           query=query)
        while True:
            conn = self._wait(deadline)
            with self._lock:
                if conn is not self._conn:
                    continue
                try:
                    conn.stub.Register(request, timeout=max(0.1, deadline - time.monotonic()))
                except grpc.RpcError as exc:
                    code = exc.code()
                    if code == grpc.StatusCode.INVALID_ARGUMENT:
                        raise query_error(exc, self._language, query) from None
                    if code == grpc.StatusCode.ALREADY_EXISTS:
                        raise ValueError(f"{self._where()}: {exc.details()}") from None
                    if code == grpc.StatusCode.RESOURCE_EXHAUSTED and limit_end(exc):
                        # The service ended this very query under this id at its limit
                        # before: it would again.
                        raise Ended(f"RESOURCE_EXHAUSTED: {exc.details()}") from None
                    if code in _LOST_CODES:
                        raise ConnectionError(f"{self._where()}: {exc.details()}") from None
                    failure = f"{code.name}: {exc.details()}"
                else:
                    self._registrations[subscription_id] = query
                    self._withdrawn.discard(subscription_id)
                    return
            if time.monotonic() >= deadline:
                raise ConnectionError(f"{self._where()}: registering {subscription_id!r} failed "
                                      f"for {self.timeout:g} s: {failure}")
            self._closing.wait(0.05)  # the reader will notice the broken stream and reconnect

    def deregister(self, subscription_id: str) -> None:
        """Stop evaluating ``subscription_id``. A service out of reach is told when it is
        back. Detections it made before may still arrive (in messages evaluated before)."""
        with self._lock:
            if self._registrations.pop(subscription_id, None) is None:
                return
            conn = self._conn
            if conn is None:
                self._withdrawn.add(subscription_id)
                return
            try:
                conn.stub.Deregister(base_pb2.DeregisterRequest(
                    session=self.name, subscription_id=subscription_id), timeout=self.timeout)
            except grpc.RpcError:
                self._withdrawn.add(subscription_id)

    def ack(self, seq: int) -> None:
        """The caller has everything up to ``seq`` (durably): the service may forget it. Sent
        in the background, the latest seq winning; never waits."""
        if seq > self._acked:
            self._acked = seq
            self._nudge.set()

    def status(self) -> str:
        if self._lost is not None:
            return "LOST"
        return "SERVING" if self._conn is not None else "CONNECTING"

    @property
    def delivered(self) -> int:
        """The highest seq handed to ``on_message``."""
        return self._delivered

    def close(self) -> None:
        """Stop: the last acknowledgement is sent if the service answers at once, the stream
        is cancelled, the threads end — within ``CLOSE_SECONDS`` (or ``timeout``) whatever the
        service does. The session stays at the service (until its session timeout)."""
        deadline = time.monotonic() + min(CLOSE_SECONDS, self.timeout)
        self._closing.set()
        self._nudge.set()
        conn = self._conn
        if conn is not None and self._acked > self._ack_sent:
            try:
                conn.stub.Ack(base_pb2.AckRequest(session=self.name, seq=self._acked),
                              timeout=max(0.05, min(1.0, deadline - time.monotonic()) / 2))
                self._ack_sent = self._acked
            except grpc.RpcError:
                pass  # resent after a restart of the mediator; the client skips repeats
        for c in (self._opening, self._conn):
            if c is not None:
                c.close()
        if self._lock.acquire(timeout=max(0.0, deadline - time.monotonic())):
            try:
                self._changed.notify_all()
            finally:
                self._lock.release()
        for thread in (self._runner, self._keeper):
            if thread is not threading.current_thread():
                thread.join(timeout=max(0.0, deadline - time.monotonic()))

    # ---------------------------------------------------------------- connecting

    def _where(self) -> str:
        return f"session {self.name} at the base service at {self.address}"

    def _wait(self, deadline: float) -> _Connection:
        """The open connection (ConnectionError if lost, closed, or none by ``deadline``)."""
        with self._changed:
            while True:
                if self._lost is not None:
                    raise ConnectionError(f"{self._where()} is lost: {self._lost}")
                if self._closing.is_set():
                    raise ConnectionError(f"{self._where()} was closed")
                if self._conn is not None:
                    return self._conn
                left = deadline - time.monotonic()
                if left <= 0:
                    raise ConnectionError(f"{self._where()}: unreachable for "
                                          f"{self.timeout:g} s")
                self._changed.wait(left)

    def _run(self) -> None:
        """Connect, read, reconnect — for as long as the session lives."""
        retrying = Retrying(retry=retry_if_exception_type(_Lost), reraise=True,
                            wait=wait_random_exponential(multiplier=0.05, max=BACKOFF_MAX),
                            stop=lambda _: self._closing.is_set(), sleep=self._pause,
                            before_sleep=self._retrying)
        while not self._closing.is_set():
            try:
                conn, first = retrying(self._open)
            except _Lost:
                return  # closing
            except _Gone as exc:
                self._lose(str(exc))
                return
            try:
                self._read(conn, first)
            except _Gone as exc:
                self._lose(str(exc))
                return
            except _Lost as exc:
                if not self._closing.is_set():
                    log.warning("%s: %s; reconnecting", self._where(), exc)
            finally:
                with self._lock:
                    if self._conn is conn:
                        self._conn = None
                conn.close()

    def _pause(self, seconds: float) -> None:
        self._closing.wait(seconds)  # close() cuts the back-off short

    def _retrying(self, state: RetryCallState) -> None:
        if state.attempt_number == 1 or state.attempt_number % 20 == 0:  # not every second
            error = state.outcome.exception() if state.outcome is not None else None
            log.warning("%s: attempt %d to connect failed (%s); trying again", self._where(),
                        state.attempt_number, error)

    def _open(self) -> tuple[_Connection, Any]:
        """One attempt: a channel, the group and sessions checked, the session opened, every
        registration registered again. _Lost: try again; _Gone: the session cannot go on."""
        channel = grpc.insecure_channel(self.address, options=_OPTIONS)
        conn = self._opening = _Connection(channel, base_pb2_grpc.BaseServiceStub(channel))
        try:
            self._wait_ready(channel)
            reply = conn.stub.Capabilities(base_pb2.CapabilitiesRequest(), timeout=self.timeout)
            try:
                _check_group(self.address, reply.group, self.group)
            except ConnectionError as exc:
                raise _Gone(str(exc)) from None
            if not reply.sessions:
                raise _Gone(f"the base service at {self.address} predates durable sessions "
                            "(eva.base.v1 Open): configure it with mode = \"fed\"")
            self._language = reply.language
            conn.call = conn.stub.Open(base_pb2.OpenRequest(
                session=self.name, resume_after=max(self.resume_after, self._delivered),
                heartbeat_ms=max(1, round(self.heartbeat * 1000)),
                # Created only by a caller that had none of it: one that resumes after messages
                # it had must find them (a service restarted without --data forgot them).
                create=not self._created and self.resume_after == 0))
            if self._closing.is_set():
                conn.call.cancel()
            first = self._first(conn.call)
            self._created = True
            with self._lock:
                self._reregister(conn)
                self._conn = conn
                self._changed.notify_all()
            return conn, first
        except grpc.RpcError as exc:
            conn.close()
            if exc.code() in _LOST_CODES:
                raise _Gone(exc.details()) from None
            raise _Lost(f"{exc.code().name}: {exc.details()}") from None
        except BaseException:
            conn.close()
            raise
        finally:
            self._opening = None

    def _wait_ready(self, channel: grpc.Channel) -> None:
        ready = grpc.channel_ready_future(channel)
        deadline = time.monotonic() + self.timeout
        while not self._closing.is_set() and time.monotonic() < deadline:
            try:
                ready.result(timeout=0.1)
                return
            except grpc.FutureTimeoutError:
                continue
        ready.cancel()
        raise _Lost(f"no answer within {self.timeout:g} s")

    def _first(self, call: Any) -> Any:
        """The stream's first message (ready), within ``timeout``."""
        timer = threading.Timer(self.timeout, call.cancel)
        timer.start()
        try:
            first = next(call)
        except StopIteration:
            raise _Lost("the stream ended at once") from None
        finally:
            timer.cancel()
        if not first.ready:
            raise _Lost("the stream did not start with ready")
        return first

    def _reregister(self, conn: _Connection) -> None:
        """After (re)opening: what was deregistered while out of reach, then every registration
        again (a no-op at a service that kept the session). A query the service now refuses
        is dropped with an error logged."""
        for ident in sorted(self._withdrawn):
            conn.stub.Deregister(base_pb2.DeregisterRequest(session=self.name,
                                                            subscription_id=ident),
                                 timeout=self.timeout)
        self._withdrawn.clear()
        for ident, query in list(self._registrations.items()):
            try:
                conn.stub.Register(base_pb2.RegisterRequest(
                    session=self.name, subscription_id=ident, query=query), timeout=self.timeout)
            except grpc.RpcError as exc:
                if exc.code() not in (grpc.StatusCode.INVALID_ARGUMENT,
                                      grpc.StatusCode.ALREADY_EXISTS) and not limit_end(exc):
                    raise
                log.error("%s: %s is no longer registered: %s", self._where(), ident,
                          exc.details())
                del self._registrations[ident]
                why = exc.details() or exc.code().name
                if exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED:
                    why = f"RESOURCE_EXHAUSTED: {why}"
                try:
                    self._on_refused(ident, why)
                except Exception:
                    log.exception("%s: on_refused failed", self._where())

    # ---------------------------------------------------------------- reading

    def _read(self, conn: _Connection, first: Any) -> None:
        """Hand every message of the stream to ``on_message`` until it breaks (_Lost) or the
        session ends (_Gone)."""
        self._deliver(first)
        try:
            while True:
                conn.waiting = time.monotonic()
                try:
                    message = next(conn.call)
                except StopIteration:
                    raise _Lost("the stream ended") from None
                conn.waiting = None
                if 0 < message.seq <= self._delivered:
                    continue  # had it before a reconnection
                self._deliver(message)
        except grpc.RpcError as exc:
            if self._closing.is_set():
                raise _Lost("closed") from None
            if exc.code() in _LOST_CODES:
                raise _Gone(exc.details()) from None
            raise _Lost(f"{exc.code().name}: {exc.details()}") from None
        finally:
            conn.waiting = None

    def _deliver(self, message: Any) -> None:
        try:
            found = tuple((d.subscription_id, detection(d, [
                from_json_line(c, seq=a) for c, a in zip(d.constituents, d.arrivals, strict=True)
            ])) for d in message.detections)
        except (EventError, ValueError) as exc:
            raise _Gone(f"the service sent a detection whose constituents cannot be read "
                        f"({exc})") from None
        out = Message(message.seq, found,
                      message.watermark_us if message.has_watermark else None,
                      message.origin_us if message.has_origin else None)
        try:
            self._on_message(out)
        except Exception as exc:
            # Not delivered: the stream is opened again after the last message that was, so
            # the service sends it again (a caller that logs a message before acknowledging
            # it, as the mediator does, must not have one skipped that it failed to log).
            log.exception("%s: on_message failed on message %d", self._where(), message.seq)
            raise _Lost(f"message {message.seq} could not be taken: {exc}") from None
        if message.seq > 0:
            self._delivered = message.seq
        for ended in message.ended:
            with self._lock:  # (not if deregistered meanwhile, or told before: a message again)
                known = self._registrations.pop(ended.subscription_id, None) is not None
            if known:
                self._told_ended(ended.subscription_id, ended.reason, ended.code)

    def _told_ended(self, ident: str, reason: str, code: str) -> None:
        """The service ended a registration (its evaluation passed a limit, or failed), or
        refuses to take again one it ended: it is not registered again, and ``on_refused``
        is told ``CODE: reason``."""
        log.error("%s: the service ended %s: %s: %s", self._where(), ident, code, reason)
        try:
            self._on_refused(ident, f"{code}: {reason}")
        except Exception:
            log.exception("%s: on_refused failed", self._where())

    def _lose(self, reason: str) -> None:
        with self._lock:
            if self._lost is not None or self._closing.is_set():
                return
            self._lost = reason
            self._changed.notify_all()
        log.error("%s is lost: %s", self._where(), reason)
        try:
            self._on_lost(reason)
        except Exception:
            log.exception("%s: on_lost failed", self._where())

    # ---------------------------------------------------------------- acknowledging, watching

    def _keep(self) -> None:
        """Send the latest acknowledgement; cancel a stream that has gone silent."""
        while not self._closing.is_set() and self._lost is None:
            self._nudge.wait(min(0.1, self._silence / 4))
            self._nudge.clear()
            conn = self._conn
            if conn is None:
                continue
            waiting = conn.waiting
            if waiting is not None and time.monotonic() - waiting > self._silence:
                log.warning("%s: nothing received for %.1f s (not even a heartbeat); "
                            "reconnecting", self._where(), self._silence)
                conn.waiting = None
                conn.call.cancel()
                continue
            wanted = self._acked
            if wanted > self._ack_sent:
                try:
                    conn.stub.Ack(base_pb2.AckRequest(session=self.name, seq=wanted),
                                  timeout=self.timeout)
                    self._ack_sent = max(self._ack_sent, wanted)
                except grpc.RpcError:
                    pass  # tried again with the next acknowledgement or connection


__all__ = ["Message", "Session"]
