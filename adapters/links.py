"""Links: the mediator's connection to one service, shared by every plan subscribed there.

A base service evaluates each event it is published for *all* of its subscriptions, so the
mediator publishes each event to a service once, whatever number of profiles use it: a
:class:`Link` holds the service's native subscriptions (handles) and publishes batches to all of
them at once; what comes back is sorted by handle. :class:`InProcessLink` runs the service's
evaluator in this process (the embedded mode, and the property tests);
:mod:`adapters.remote_link` reaches a running base service over gRPC; :class:`SubscriptionLink`
steps one subscription of any transport per handle (``replay --via``, whose transport is given).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from typing import Protocol

from adapters.backends.native import Exhausted, Language, Query
from adapters.client import Connect, Subscription, in_process
from adapters.client import _Evaluation as Evaluation
from eva.events import Event
from transforms.dialects.base import Detection
from transforms.federated import ServiceInfo

Handle = str
"""A native subscription at a link."""


class Link(Protocol):
    """One connected service."""

    info: ServiceInfo

    def subscribe(self, text: str, name: str = "") -> Handle:
        """Register a native query (``NativeQueryError`` when the service refuses it); it sees
        the events published after this call. ``name``: the handle's durable name, which an
        autonomous service's link uses (the same query subscribed again under it after a
        restart is the same registration); a fed link names its handles itself."""
        ...

    def unsubscribe(self, handle: Handle) -> None: ...

    def publish(self, events: Sequence[Event], until: int | None = None
                ) -> dict[Handle, list[Detection]]:
        """Evaluate ``events`` (in key order; the caller has kept those the service observes
        and added the ticks its queries need) at every subscription, then — with ``until`` —
        run the clock to it. Returns, per handle, everything detected: when it returns, the
        service has reported every instant before the newest event's (and up to ``until``)."""
        ...

    def close(self) -> None: ...

    def status(self) -> str:
        """"SERVING", or "CONNECTING" while the service is out of reach (a remote link
        reconnects by itself; its calls wait for it)."""
        ...


class SubscriptionLink:
    """A service reached one subscription per handle (:data:`adapters.client.Connect`: its
    evaluator in this process, or a running service one query at a time — what ``replay --via``
    is given), each stepped as a base service steps its subscriptions: an event it refuses is
    left out; the clock is advanced to just before each new instant, so what an instant
    completes is reported before the next one's events."""

    def __init__(self, info: ServiceInfo, connect: Connect) -> None:
        self.info = info
        self.connect = connect
        self._subs: dict[Handle, Subscription] = {}
        self._ids = itertools.count(1)
        self._newest: int | None = None
        self._ended: list[tuple[Handle, str]] = []  # since the last publish returned
        self.on_refused: Callable[[Handle, str], None] = raise_ended
        """Told, once a publish is done, of each handle whose evaluation passed the service's
        work or store limit (``RESOURCE_EXHAUSTED: …``): it answers nothing from then on, as
        a base service ends such a subscription (the pipeline suspends its holders)."""

    def subscribe(self, text: str, name: str = "") -> Handle:
        return self._add(self.connect(text))

    def _add(self, subscription: Subscription) -> Handle:
        handle = f"{self.info.name}-{next(self._ids)}"
        self._subs[handle] = subscription
        if isinstance(subscription, Evaluation):
            subscription.on_ended = lambda why: self._ended.append((handle, why))
        return handle

    def unsubscribe(self, handle: Handle) -> None:
        subscription = self._subs.pop(handle, None)
        if subscription is not None:
            # Its end, with the clock where the link's is (a remote one closes its stream).
            subscription.close(self._newest if self._newest is not None else 0)

    def publish(self, events: Sequence[Event], until: int | None = None
                ) -> dict[Handle, list[Detection]]:
        out: dict[Handle, list[Detection]] = {h: [] for h in self._subs}
        for event in events:
            if self._newest is not None and event.time > self._newest:
                for handle, sub in self._subs.items():
                    out[handle].extend(sub.advance(event.time - 1))
            for handle, sub in self._subs.items():
                out[handle].extend(sub.push(event))  # a refused event is left out there
            self._newest = event.time if self._newest is None else max(self._newest, event.time)
        if until is not None:
            for handle, sub in self._subs.items():
                out[handle].extend(sub.advance(until))
            self._newest = until if self._newest is None else max(self._newest, until)
        while self._ended:
            handle, why = self._ended.pop(0)
            self.on_refused(handle, f"RESOURCE_EXHAUSTED: {why}")
        return out

    def close(self) -> None:
        for handle in list(self._subs):
            self.unsubscribe(handle)

    def status(self) -> str:
        return "SERVING"  # each subscription answers or raises (in this process: always there)


def raise_ended(handle: Handle, why: str) -> None:
    """What a link does with an ended handle when nobody is told (``replay --native``/``--via``): the run
    stops with the service's words rather than go on without that query's answers."""
    raise Exhausted(f"the service ended query {handle}: {why}")


class InProcessLink(SubscriptionLink):
    """The service's evaluators in this process (the embedded mode, and the tests).

    A query is parsed once however many handles subscribe its text, for as long as one does:
    a parsed query is immutable — each handle's evaluator holds its own state — and the
    mediator's subscriptions often render the same text (a class of one type, say), whose
    parsing was most of a subscription's cost at the service (SQL: ~0.4 ms)."""

    def __init__(self, info: ServiceInfo, language: Language) -> None:
        super().__init__(info, in_process(language))
        self.language = language
        self._parsed: dict[str, tuple[Query, int]] = {}
        """Native text → its parsed query and the number of handles subscribed to it."""
        self._texts: dict[Handle, str] = {}

    def subscribe(self, text: str, name: str = "") -> Handle:
        query, users = self._parsed.get(text) or (self.language.parse(text), 0)
        handle = self._add(Evaluation(query))
        self._parsed[text] = (query, users + 1)
        self._texts[handle] = text
        return handle

    def unsubscribe(self, handle: Handle) -> None:
        super().unsubscribe(handle)
        text = self._texts.pop(handle, None)
        if text is not None:
            query, users = self._parsed.pop(text)
            if users > 1:
                self._parsed[text] = (query, users - 1)
