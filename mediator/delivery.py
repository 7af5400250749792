"""Delivery: a Subscribe stream reads its subscription's notification log from the resume
position, sends, waits for the pipeline to append more, and reads on (DESIGN §5: delivery =
the log). Nothing is sent that is not in the log first, so a client that reconnects with its
last token gets exactly what followed it, in order.

* **Tokens** are opaque-looking (base64url of ``<subscription>:<registered>:<position>``): a
  client keeps and returns them, it never builds one. A token of another subscription, or one that is not a
  token, is INVALID_ARGUMENT; a position the log no longer keeps, or one past its head, is
  OUT_OF_RANGE — both with a message that says which and what to do.
* **Wakes**: the pipeline thread calls :meth:`Dispatcher.on_append` after each append; it wakes
  the subscription's streams on the event loop (``call_soon_threadsafe``), so a stream waits
  without polling and wakes within one loop turn.
* **Retention**: on append, a log is trimmed to the newest ``retention`` entries once it holds
  a tenth more (so a log keeps between ``retention`` and 1.1 × ``retention``, and a trim is one
  store call per tenth of the retention appended).
* **Rate**: every client has a token bucket of ``rate`` notifications per second (a second's
  worth of burst) shared by its streams, except a stream half the retention or more behind its
  log's head (the pace must not push a reader past what is kept); a client over it is paced,
  never dropped — what it has
  not received stays in the log.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from mediator.metrics import Metrics
from mediator.notification_log import decode
from mediator.store.base import LoggedNotification, Store, SubscriptionRecord
from mediator.wire import mediator_pb2

log = logging.getLogger("evamed.delivery")

READ_BATCH = 500
"""Notifications read from the log at once (a stream sends them one by one)."""

Key = tuple[str, str]
"""(owner, subscription name)."""


class TokenError(ValueError):
    """A resume token that is not a token of this subscription (INVALID_ARGUMENT)."""


class Closing(Exception):
    """The mediator is shutting down: the stream ends (UNAVAILABLE) and its client resumes
    elsewhere or later with its last token."""


class Suspended(Exception):
    """The subscription was suspended at a limit (the message says why): its stream ends once
    what its log holds is delivered."""


class Revoked(Exception):
    """The stream's client was revoked while it streamed: it ends (UNAUTHENTICATED)."""


def resume_token(record: SubscriptionRecord, position: int) -> str:
    """The token of a position in the log of ``record``'s subscription: its name, when it was
    registered (a subscription removed and registered again under the name has a new log, and
    the old tokens are not its) and the position."""
    text = f"{record.name}:{record.created_us}:{position}"
    return base64.urlsafe_b64encode(text.encode()).rstrip(b"=").decode("ascii")


def token_position(token: str, record: SubscriptionRecord) -> int:
    """The log position a resume token of ``record``'s subscription names (TokenError if it
    is not one of its tokens)."""
    try:
        text = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError, ValueError):
        text = ""
    parts = text.rsplit(":", 2)
    if len(parts) != 3 or not all(p.isascii() and p.isdigit() and len(p) <= 19 for p in parts[1:]):
        raise TokenError(f"the resume token {_shown(token)} is not a resume token (expected the "
                         "resume_token of a notification, as received)")
    name, created, number = parts
    if name != record.name:
        raise TokenError(f"the resume token is one of subscription {name!r}, not of "
                         f"{record.name!r} (a token resumes only the subscription it came from)")
    if int(created) != record.created_us:
        raise TokenError(f"the resume token is one of an earlier subscription named {name!r}, "
                         "removed since (this one was registered again and has a new log): "
                         "subscribe without a token")
    return int(number)


def _shown(token: str) -> str:
    return repr(token if len(token) <= 40 else token[:39] + "…")


class RateLimit:
    """A token bucket per client: ``rate`` per second, a burst of a second's worth (at least
    one); ``rate`` 0: no limit. A caller over the rate waits for its turn (reserving it first,
    so concurrent streams of one client share the rate fairly)."""

    def __init__(self, rate: float) -> None:
        self.rate = rate
        self.burst = max(1.0, rate)
        self._buckets: dict[str, tuple[float, float]] = {}  # client → (tokens, when)

    async def take(self, client: str) -> None:
        if self.rate <= 0:
            return
        now = time.monotonic()
        tokens, then = self._buckets.get(client, (self.burst, now))
        tokens = min(self.burst, tokens + (now - then) * self.rate) - 1
        self._buckets[client] = (tokens, now)
        if tokens < 0:
            await asyncio.sleep(-tokens / self.rate)


@dataclass
class _Log:
    """What the dispatcher knows of one subscription's log in this process."""

    head: int = 0         # the newest position appended (as far as known)
    delivered: int = 0    # the newest position sent to any of its streams
    trimmed_at: int = -1  # the head at the last trim (-1: not trimmed since start)


class Dispatcher:
    """Streams of the subscriptions' logs to their subscribers, woken by the pipeline."""

    def __init__(self, store: Store, metrics: Metrics, retention: int, rate: float) -> None:
        self.store = store
        self.metrics = metrics
        self.retention = retention
        self.slack = max(1, retention // 10)
        self.unpaced = max(1, retention // 2)
        """A stream this far behind its log's head is not paced (``limits.rate``): what the
        server holds back must never be what the retention trims."""
        self.limit = RateLimit(rate)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._waiters: dict[Key, set[asyncio.Event]] = {}
        self._logs: dict[Key, _Log] = {}
        self._closing = False

    def attach(self, loop: asyncio.AbstractEventLoop) -> None:
        """The event loop the streams run on (before the pipeline starts appending)."""
        self._loop = loop

    # ---------------------------------------------------------------- the pipeline's side

    def on_append(self, owner: str, name: str, head: int) -> None:
        """Called by the pipeline thread after appending to a log: trim it to the retention if
        due, then wake its streams. Never raises (a failed trim is logged and tried again at
        the next append)."""
        state = self._logs.get((owner, name))
        trimmed_at = -1 if state is None else state.trimmed_at
        if trimmed_at < 0 or head - trimmed_at >= self.slack:
            try:
                self.store.trim_notifications(owner, name, self.retention)
                trimmed_at = head
            except Exception:
                log.exception("trimming the log of %s/%s failed", owner, name)
        loop = self._loop
        if loop is not None and not loop.is_closed():
            # RuntimeError: the loop closed meanwhile; nobody is waiting any more
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(self._appended, owner, name, head, trimmed_at)

    def _appended(self, owner: str, name: str, head: int, trimmed_at: int) -> None:
        key = (owner, name)
        state = self._logs.setdefault(key, _Log())
        state.head = max(state.head, head)
        state.trimmed_at = max(state.trimmed_at, trimmed_at)
        self._lag(key, state)
        self.wake(owner, name)

    # ---------------------------------------------------------------- the service's side

    def wake(self, owner: str, name: str) -> None:
        """Wake the streams of a subscription (new entries, or it was removed)."""
        for event in self._waiters.get((owner, name), ()):
            event.set()

    def forget(self, owner: str, name: str) -> None:
        """The subscription was removed: its streams end, its metrics go."""
        self._logs.pop((owner, name), None)
        self.metrics.forget(owner, name)
        self.wake(owner, name)

    def close(self) -> None:
        """Shutting down: every stream ends with :class:`Closing` at its next turn."""
        self._closing = True
        for events in self._waiters.values():
            for event in events:
                event.set()

    async def stream(self, record: SubscriptionRecord, after: int,
                     suspended: Callable[[], str | None] = lambda: None
                     ) -> AsyncIterator[Any]:
        """The subscription's log after position ``after``, as Notification messages, forever:
        ends when the subscription is removed; raises RetentionError when the reader fell
        behind what the log keeps, :class:`Closing` at shutdown, :class:`Suspended` once the
        log is delivered and ``suspended()`` says why the subscription was (the pipeline wakes
        its streams when it suspends one)."""
        owner, name = key = (record.owner, record.name)
        wake = asyncio.Event()
        self._waiters.setdefault(key, set()).add(wake)
        state = self._logs.setdefault(key, _Log())
        # A client resuming after ``after`` has everything up to it: after a restart, an
        # up-to-date client shows no lag before the next notification.
        state.delivered = max(state.delivered, after)
        self._lag(key, state)
        try:
            while True:
                if self._closing:
                    raise Closing("the mediator is shutting down; resume with the last token")
                wake.clear()  # before reading: an append after the read wakes the wait below
                batch = await asyncio.to_thread(self.store.read_notifications, owner, name,
                                                after, READ_BATCH)
                if batch:
                    # Authenticated once, at the call: a revocation must end the stream too.
                    client = await asyncio.to_thread(self.store.client, owner)
                    if client is None or client.revoked:
                        raise Revoked(f"client {owner!r} was revoked")
                if not batch:
                    if await asyncio.to_thread(self.store.subscription, owner, name) is None:
                        return  # unsubscribed
                    why = suspended()
                    if why is not None:
                        raise Suspended(why)
                    await wake.wait()
                    continue
                for item in batch:
                    if state.head - item.position < self.unpaced:
                        await self.limit.take(owner)
                    # else: far behind the head — the pace yields, or the server's own pacing
                    # would push a reader that keeps reading past the retention (issue 29: a
                    # burst of 125,000 failed OUT_OF_RANGE at 1,000/s behind 100,000 kept)
                    after = item.position
                    # counted as it is handed to gRPC (before the yield: a client may hold it
                    # before this generator runs again)
                    self.metrics.delivered.inc()
                    state.delivered = max(state.delivered, after)
                    state.head = max(state.head, after)
                    self._lag(key, state)
                    yield notification(record, item)
        finally:
            waiting = self._waiters.get(key)
            if waiting is not None:
                waiting.discard(wake)
                if not waiting:
                    del self._waiters[key]

    def _lag(self, key: Key, state: _Log) -> None:
        self.metrics.lag.labels(*key).set(max(0, state.head - state.delivered))


def notification(record: SubscriptionRecord, item: LoggedNotification) -> Any:
    """The Notification message of a log entry (mediator/notification_log.py), with its resume
    token."""
    name = record.name
    token = resume_token(record, item.position)
    try:
        entry = decode(item.payload)
    except ValueError:
        # A payload this code cannot read (written by another version): deliver what there is
        # rather than stall the stream behind it.
        log.error("notification %s of %s: payload is not the expected JSON", item.position, name)
        return mediator_pb2.Notification(
            cloudevent=item.payload.decode("utf-8", "replace"), id=item.composite_id,
            subscription=name, resume_token=token)
    return mediator_pb2.Notification(
        cloudevent=entry.cloudevent, id=item.composite_id, profile=entry.profile,
        subscription=name, sources=entry.sources, services=entry.services, types=entry.types,
        times_us=entry.times, resume_token=token)


__all__ = ["Closing", "Dispatcher", "RateLimit", "TokenError", "notification", "resume_token",
           "token_position"]
