"""A base service as a gRPC server: ``evamed base-service --group G --listen ADDR``.

One process per language group (DESIGN §6) serving ``eva.base.v1.BaseService`` and the standard
``grpc.health.v1.Health``. Events are evaluated in the order they are published; every
subscription has its own evaluator of its native query and a bounded queue of notifications.

Robustness: a query the language rejects ends its Subscribe with INVALID_ARGUMENT and the
parser's message (line, column, what was expected); a malformed event is counted, reported
in the Publish reply and skipped; a subscriber that disconnects is removed by the RPC's
termination callback; ``Publish`` is back-pressured — the next event is read only once the
previous one's notifications are queued, and a queue is bounded, so a slow subscriber slows
publishing rather than growing memory. A subscriber that stays full for ``stall_timeout``
seconds is dropped (RESOURCE_EXHAUSTED) so that it cannot stall the others forever.
"""

from __future__ import annotations

import json
import logging
import queue
import threading
import uuid
from collections.abc import Iterator
from concurrent import futures
from dataclasses import asdict, dataclass, field
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from adapters.native import Detection, Evaluator, Language, NativeQueryError
from adapters.registry import language as language_of
from adapters.wire import SERVICE_NAME, base_pb2, base_pb2_grpc
from mediator.eva.events import EventError, from_json_line, to_cloudevent

log = logging.getLogger("evamed.base")

MAX_ERRORS = 100
_END = object()


@dataclass
class _Subscription:
    ident: str
    query: str
    evaluator: Evaluator
    outbox: queue.Queue[Any]
    dropped: str = ""
    lock: threading.Lock = field(default_factory=threading.Lock)


def notification(sub_id: str, d: Detection) -> Any:
    return base_pb2.NativeNotification(
        subscription_id=sub_id, text=d.text, time_us=d.time,
        constituents=[json.dumps(to_cloudevent(e)) for e in d.constituents],
        extra_json=json.dumps(d.extra) if d.extra else "")


class BaseService(base_pb2_grpc.BaseServiceServicer):  # type: ignore[misc]
    def __init__(self, group: str, lang: Language, queue_size: int = 1024,
                 stall_timeout: float = 30.0) -> None:
        self.group = group
        self.language = lang
        self.queue_size = queue_size
        self.stall_timeout = stall_timeout
        self._subs: dict[str, _Subscription] = {}
        self._lock = threading.Lock()  # one event at a time, in publish order
        self._seq = 0
        self.subscribed = threading.Event()  # set at each registration (tests wait on it)

    @property
    def subscriptions(self) -> list[str]:
        with self._lock:
            return list(self._subs)

    # ---------------------------------------------------------------- RPCs

    def Capabilities(self, request: Any, context: grpc.ServicerContext) -> Any:
        cap = asdict(self.language.capability)
        cap = {k: sorted(v) if isinstance(v, frozenset) else v for k, v in cap.items()}
        return base_pb2.CapabilitiesReply(group=self.group, language=self.language.name,
                                          capability_json=json.dumps(cap, default=list))

    def Subscribe(self, request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
        try:
            query = self.language.parse(request.query)
        except NativeQueryError as exc:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        sub_id = request.subscription_id or uuid.uuid4().hex
        sub = _Subscription(sub_id, request.query, query.evaluator(),
                            queue.Queue(maxsize=self.queue_size))
        with self._lock:
            if sub_id in self._subs:
                context.abort(grpc.StatusCode.ALREADY_EXISTS, f"subscription {sub_id!r} exists")
            self._subs[sub_id] = sub

        def gone() -> None:  # disconnect, cancel or normal end: the subscription goes away
            with self._lock:
                self._subs.pop(sub_id, None)

        context.add_callback(gone)
        self.subscribed.set()
        log.info("subscribed %s: %s", sub_id, request.query)
        yield base_pb2.NativeNotification(subscription_id=sub_id, ready=True)
        while True:
            try:
                item = sub.outbox.get(timeout=0.5)
            except queue.Empty:
                if not context.is_active():
                    return
                continue
            if item is _END:
                if sub.dropped:
                    context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, sub.dropped)
                return
            yield item

    def Unsubscribe(self, request: Any, context: grpc.ServicerContext) -> Any:
        with self._lock:
            sub = self._subs.pop(request.subscription_id, None)
        if sub is not None:
            sub.outbox.put(_END)  # after everything already queued
        return base_pb2.UnsubscribeReply(found=sub is not None)

    def Publish(self, request_iterator: Iterator[Any], context: grpc.ServicerContext) -> Any:
        accepted = rejected = 0
        errors: list[str] = []
        number = 0
        for request in request_iterator:
            with self._lock:
                for text in request.cloudevents:
                    number += 1
                    try:
                        event = from_json_line(text, seq=self._seq)
                    except EventError as exc:
                        rejected += 1
                        if len(errors) < MAX_ERRORS:
                            errors.append(f"event {number}: {exc}")
                        continue
                    self._seq += 1
                    accepted += 1
                    self._deliver(lambda ev, event=event: ev.push(event))
                if request.advance_to_us:
                    self._deliver(lambda ev, t=request.advance_to_us: ev.advance(t))
        return base_pb2.PublishReply(accepted=accepted, rejected=rejected, errors=errors)

    # ---------------------------------------------------------------- internals

    def _deliver(self, step: Any) -> None:
        for sub in list(self._subs.values()):
            try:
                detections = step(sub.evaluator)
            except Exception as exc:  # a bug in one evaluator must not take the service down
                log.exception("subscription %s failed", sub.ident)
                self._drop(sub, f"evaluation failed: {exc}")
                continue
            for d in detections:
                try:
                    sub.outbox.put(notification(sub.ident, d), timeout=self.stall_timeout)
                except queue.Full:
                    self._drop(sub, f"subscriber did not read for {self.stall_timeout}s "
                                    f"(queue of {self.queue_size} full)")
                    break

    def _drop(self, sub: _Subscription, reason: str) -> None:
        self._subs.pop(sub.ident, None)
        sub.dropped = reason
        while True:  # make room for the end marker; what was queued is lost with the subscriber
            try:
                sub.outbox.get_nowait()
            except queue.Empty:
                break
        sub.outbox.put(_END)


@dataclass
class Running:
    server: grpc.Server
    port: int
    service: BaseService


def serve(group: str, listen: str, tick: int = 1_000_000, max_workers: int = 16,
          queue_size: int = 1024, stall_timeout: float = 30.0) -> Running:
    """Start a base service (``listen`` may use port 0: any free port)."""
    lang = language_of(group, tick)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=max_workers))
    service = BaseService(group, lang, queue_size, stall_timeout)
    base_pb2_grpc.add_BaseServiceServicer_to_server(service, server)
    health_servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    port = server.add_insecure_port(listen)
    if port == 0:
        raise OSError(f"cannot listen on {listen}")
    server.start()
    for name in ("", SERVICE_NAME):
        health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    return Running(server, port, service)
