"""An autonomous service as a :class:`~adapters.links.Link`: the mediator's durable session there.

An autonomous service has producers of its own (DESIGN §1): the mediator publishes nothing to
it, it only registers queries in its **session** at the service (eva.base.v1 ``Open``,
``Register``; :mod:`adapters.session`) and reads what the session sends — messages numbered
in order, each with the detections one of the service's Publish messages caused (constituents
in full, with their arrival numbers at the service) and the service's progress (watermark,
origin), and heartbeats while it is idle. The session is durable: the service keeps what the
mediator has not acknowledged, so a restart of the mediator (or a dropped connection) resumes
after the newest message the mediator logged.

A handle is the registration's durable name (made by the federation,
:func:`adapters.federation.handle_name`): the same query subscribed again after a restart is
the same registration, whose evaluation went on meanwhile. ``publish`` is refused: nothing is
published to an autonomous service.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from adapters.links import Handle
from eva.events import Event
from transforms.dialects.base import Detection
from transforms.federated import ServiceInfo

log = logging.getLogger("evamed.link")


class Message(Protocol):
    """A session's message (:class:`adapters.session.Message`)."""

    @property
    def seq(self) -> int:
        """Its number (1, 2, …); 0: a heartbeat, with progress only."""
        ...

    @property
    def detections(self) -> Sequence[tuple[str, Detection]]:
        """(registration, detection), in the service's order."""
        ...

    @property
    def watermark(self) -> int | None: ...

    @property
    def origin(self) -> int | None: ...


OnMessage = Callable[[Message], None]
OnLost = Callable[[str], None]


class AutonomousLink:
    """The link to the autonomous service ``info`` at ``address``, through the session
    ``session`` (a name unique to this mediator and service). :meth:`start` opens the session
    (after the message ``resume_after``) and hands every message to ``on_message``, in order,
    in the session's thread; ``on_lost`` is told when the service has dropped the session (its
    retention exceeded, or closed for too long): the link then opens it anew and registers
    every query again, and what the service dropped is lost (said in the log)."""

    def __init__(self, info: ServiceInfo, address: str, session: str, *,
                 heartbeat: float = 0.2, timeout: float = 10.0) -> None:
        if not info.autonomous:
            raise ValueError(f"service {info.name!r} is not autonomous: it is fed by the "
                             "mediator through adapters.remote_link")
        self.info = info
        self.address = address
        self.name = session
        self.heartbeat = heartbeat
        self.timeout = timeout
        self._lock = threading.Lock()
        self._queries: dict[Handle, str] = {}
        self._session: Any = None
        self._on_message: OnMessage | None = None
        self._on_lost: OnLost | None = None
        self.on_refused: Callable[[Handle, str], None] = lambda handle, why: None
        """Told when the service refuses a query registered while it was out of reach (the
        pipeline marks the subscriptions holding it failed)."""

    def start(self, on_message: OnMessage, on_lost: OnLost, resume_after: int) -> None:
        """Open the session in the background (calls wait for it)."""
        self._on_message, self._on_lost = on_message, on_lost
        self._session = self._open(resume_after)

    def _open(self, resume_after: int) -> Any:
        from adapters.session import Session

        assert self._on_message is not None
        return Session(self.address, self.name, self.info.group, on_message=self._on_message,
                       on_lost=self._lost, on_refused=self._refused, resume_after=resume_after,
                       heartbeat=self.heartbeat, timeout=self.timeout)

    def _refused(self, handle: Handle, why: str) -> None:
        # Without the link's lock: the session calls this holding its own (re-registering after
        # a reconnect), while the pipeline holds this one to call the session — the two orders
        # would deadlock. A dict's pop is atomic.
        self._queries.pop(handle, None)
        self.on_refused(handle, why)

    def _lost(self, reason: str) -> None:
        if "superseded" in reason:
            log.error("base service %r (%s) at %s: another stream took the mediator's session %s "
                      "over (a second mediator on the same store?): this one reads it no more",
                      self.info.name, self.info.group, self.address, self.name)
            return
        log.error("base service %r (%s) at %s dropped the mediator's session %s: %s; opening "
                  "it anew and registering its %d queries again (what it dropped is lost)",
                  self.info.name, self.info.group, self.address, self.name, reason,
                  len(self._queries))
        if self._on_lost is not None:
            self._on_lost(reason)
        threading.Thread(target=self._reopen, daemon=True,
                         name=f"evamed-reopen-{self.info.name}").start()

    def _reopen(self) -> None:
        with self._lock:
            old, self._session = self._session, self._open(0)
            if old is not None:
                old.close()
            for handle, text in self._queries.items():
                try:
                    self._session.register(handle, text)
                except Exception as exc:  # said once; the query's answers stop
                    log.error("base service %r: registering %s again failed: %s",
                              self.info.name, handle, exc)

    # ---------------------------------------------------------------- the Link protocol

    def subscribe(self, text: str, name: str = "") -> Handle:
        if not name:
            raise ValueError("a query at an autonomous service needs a durable name")
        from adapters.session import Ended

        with self._lock:
            if self._session is None:
                raise ConnectionError(f"the link to {self.info.name!r} is not started")
            # NativeQueryError if the service refuses it now; one out of reach is not waited
            # for: the query is registered when it is back (a refusal then: on_refused).
            try:
                self._session.register(name, text, wait=False)
            except Ended as ended:  # at its limit before: the handle answers nothing
                why = str(ended)
            else:
                self._queries[name] = text
                return name
        self.on_refused(name, why)
        return name

    def unsubscribe(self, handle: Handle) -> None:
        with self._lock:
            if self._queries.pop(handle, None) is not None and self._session is not None:
                self._session.deregister(handle)

    def publish(self, events: Sequence[Event], until: int | None = None
                ) -> dict[Handle, list[Detection]]:
        raise RuntimeError(f"service {self.info.name!r} is autonomous: its producers publish "
                           "to it, never the mediator")

    def ack(self, number: int) -> None:
        """The mediator has logged every message up to ``number``: the service may forget
        them."""
        session = self._session
        if session is not None:
            session.ack(number)

    def status(self) -> str:
        session = self._session
        return "CONNECTING" if session is None else str(session.status())

    def close(self) -> None:
        session, self._session = self._session, None
        if session is not None:
            session.close()


__all__ = ["AutonomousLink", "Message", "OnLost", "OnMessage"]
