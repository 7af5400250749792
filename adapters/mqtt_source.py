"""An MQTT broker as a source of events and a CG-0 service of the mediator (docs/sources.md).

A broker filters single messages by topic and nothing more. :class:`MqttSource` is therefore two
things at once:

* a :class:`~adapters.links.Link` over the CG-0 filter language, evaluated in this process (an
  :class:`~adapters.links.InProcessLink`): the planner gives it the primitive classes its
  coverage covers (:meth:`adapters.mapping.Mapping.coverage`: the types its mapping produces,
  from any source), and the mediator evaluates each one's whole filter on the events of the
  event log, as for any service in this process;
* an **ingestion source**: for the native queries subscribed at the link it asks the broker for
  the topic filters its mapping derives from them (:meth:`adapters.mapping.Mapping.select`: a
  pinned ``type``, ``source``, ``subject`` or ``topic`` read back into the topic; what cannot be
  read back leaves the rule's whole pattern), maps every message that arrives into a CloudEvent
  and hands it to ``ingest(lines, ack)`` — the mediator appends it to its event log (the same
  checks as Publish: malformed, duplicate, late) and then calls ``ack``. Only then is a QoS-1
  message acknowledged to the broker (paho's ``manual_ack``): what the broker let go of is in the
  event log. A message the mapping refuses goes to ``dead_letter`` (topic and reason) and is
  acknowledged: the stream goes on.

The session is persistent (MQTT 5: clean start off, a session expiry; 3.1.1: clean session
off) under a client id stable per mediator and broker, so what is published while the mediator
is away waits at the broker; :meth:`close` leaves the broker's subscriptions in place for that
reason. After a reconnect every wanted filter is subscribed again (the broker may have lost the
session), and the broker resends what was not acknowledged — with its packet id, so a derived
event id is the same and the mediator drops the copy as a duplicate.

Threads: the connection's (paho's network loop: it only queues messages) and the ingest thread
(maps a batch, calls ``ingest``, waits for its ``ack``, acknowledges in arrival order — MQTT
asks for acknowledgements in the order the messages came).
"""

from __future__ import annotations

import itertools
import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import paho.mqtt.client as mqtt
from paho.mqtt.enums import MQTTErrorCode
from paho.mqtt.subscribeoptions import SubscribeOptions

from adapters.backends.boolean import Filter, FilterLanguage
from adapters.links import Handle, InProcessLink
from adapters.mapping import KEPT, Mapped, Mapping, Packet, Selection, SourceDeadLetter, disjoint
from adapters.mqtt import BrokerSettings, Connection, stable_client_id
from eva.admission import too_large
from transforms.capability import CG0
from transforms.federated import Coverage, ServiceInfo

log = logging.getLogger("evamed.mqtt.source")

Ack = Callable[[], None]
Ingest = Callable[[list[str], Ack], None]
"""``ingest(lines, ack)``: append the CloudEvent lines to the event log (dead-lettering what the
mediator refuses), then call ``ack`` — at once or later, from any thread. If the lines cannot be
appended it raises (and does not call ``ack``): the source reconnects, and the broker resends."""
DeadLetters = Callable[[SourceDeadLetter], None]

BATCH = 500
"""Messages mapped and handed to ``ingest`` at once (one durable append for them all)."""
QUEUE = 10_000
"""Messages waiting for the ingest thread before the network loop waits for it (back-pressure
on QoS 0; QoS 1 is bounded by the broker's in-flight window)."""
STUCK = 30.0
"""Seconds without an ``ack`` after which the wait is logged (and goes on)."""


@dataclass
class SourceCounts:
    received: int = 0       # messages the broker delivered
    ingested: int = 0       # events handed to ingest and acknowledged by it
    dead_lettered: int = 0  # messages the mapping refused
    unmatched: int = 0      # no rule's topic (a filter wider than the rules) or an ignored retained
    acks_skipped: int = 0   # owed to a connection since lost: the broker resends those
    ingest_failures: int = 0
    in_flight: int = 0      # taken from the broker, not yet acknowledged to it


def _log_dead_letter(letter: SourceDeadLetter) -> None:
    log.warning("dead letter: %s", letter)


class MqttSource(InProcessLink):
    """A broker's events, in; its primitive filters evaluated here (see the module docstring).

    ``known_filters``: the topic filters the broker's persistent session may still hold from an
    earlier run (what ``remember`` was last given); those no query wants any more are
    unsubscribed at the first connection. ``coverage``: the configuration's, if it states one
    (default: the mapping's). ``start()`` connects; subscribe the restored queries first, so
    that the first connection asks for all of them."""

    def __init__(self, name: str, mapping: Mapping, settings: BrokerSettings, ingest: Ingest, *,
                 mediator: str = "evamed", dead_letter: DeadLetters = _log_dead_letter,
                 qos: int = 1, batch: int = BATCH, known_filters: Sequence[str] = (),
                 remember: Callable[[list[str]], None] = lambda filters: None,
                 coverage: Coverage | None = None, max_bytes: int | None = None) -> None:
        if qos not in (0, 1):
            raise ValueError(f"found qos {qos}, expected 0 or 1 (QoS 2 is not offered)")
        super().__init__(ServiceInfo(name, "cg0", CG0, coverage or mapping.coverage()),
                         FilterLanguage())
        self.mapping = mapping
        self.settings = settings
        self.ingest = ingest
        self.dead_letter = dead_letter
        self.qos = qos
        self.batch = batch
        self.remember = remember
        self.max_bytes = max_bytes
        """The largest payload taken; a larger one is dead-lettered ``too_large``."""
        self.counts = SourceCounts()
        self._selections: dict[Handle, Selection] = {}
        self._wants: dict[str, tuple[str, ...]] = {}  # want(): filters asked for others
        self._wanted: list[str] = []
        self._known: set[str] = set(known_filters)  # may be subscribed at the broker
        self._lock = threading.Lock()
        self._closing = False
        self._queue: queue.Queue[tuple[int, int, mqtt.MQTTMessage] | None] = queue.Queue(QUEUE)
        self._stop = threading.Event()
        self._seq = itertools.count()
        self._refused_through = 0  # the last connection whose messages are left to the broker
        self.connection = Connection(
            settings, settings.client_id or stable_client_id(mediator, name), persistent=True,
            manual_ack=True, on_connect=self._resubscribe, on_message=self._arrived)
        self._worker = threading.Thread(target=self._drain, name=f"mqtt-ingest-{name}",
                                        daemon=True)

    # ---------------------------------------------------------------- lifecycle

    def start(self) -> None:
        self._worker.start()
        self.connection.start()

    def stop(self) -> None:
        """Stop taking messages and disconnect; the broker keeps the session and its
        subscriptions (for its expiry), so what is published meanwhile waits there. The link
        still evaluates (the mediator drains its pipeline after this); queries unsubscribed
        from now on ask nothing of the broker."""
        with self._lock:
            self._closing = True
        self._stop.set()
        self.connection.stop()
        self._queue.put(None)
        if self._worker.is_alive():
            self._worker.join(10)

    def close(self) -> None:
        """:meth:`stop`, and the link closed."""
        self.stop()
        super().close()

    def status(self) -> str:
        return "SERVING" if self.connection.connected else "CONNECTING"

    @property
    def lag(self) -> int:
        """Messages the broker delivered that are not in the event log yet: queued here, or
        handed to ``ingest`` and not acknowledged (the broker's own queue is not visible)."""
        return self._queue.qsize() + self.counts.in_flight

    # ---------------------------------------------------------------- queries → topic filters

    def subscribe(self, text: str, name: str = "") -> Handle:
        handle = super().subscribe(text)  # NativeQueryError: not a CG-0 filter
        self._selections[handle] = self.select(text)
        self._update()
        return handle

    def unsubscribe(self, handle: Handle) -> None:
        super().unsubscribe(handle)
        if self._selections.pop(handle, None) is not None:
            self._update()

    def select(self, text: str) -> Selection:
        """The topic filters the broker is asked for one native query, and why."""
        node = FilterLanguage().parse(text).node
        assert isinstance(node, Filter)  # the language takes nothing else
        return self.mapping.select(node.predicate)

    def explain(self, text: str) -> str:
        """What the broker filters and what the mediator filters, for one native query."""
        chosen = self.select(text)
        at_broker = ", ".join(chosen.filters) or "nothing (no rule produces what it requires)"
        return (f"{self.info.name}: the broker filters topics {at_broker} ({chosen.why}); the "
                f"mediator evaluates {text} on what arrives")

    def want(self, key: str, filters: Sequence[str]) -> None:
        """Ask the broker for ``filters`` on ``key``'s behalf too (empty: no longer): the topics
        of classes this broker can feed that are evaluated elsewhere — at another link whose
        coverage overlaps this one's, or at another service. The link evaluates nothing for
        them; their events go to the event log, and from there wherever they are planned."""
        if filters:
            self._wants[key] = tuple(filters)
        elif self._wants.pop(key, None) is None:
            return
        self._update()

    @property
    def topic_filters(self) -> list[str]:
        """What the broker is asked for (pairwise disjoint)."""
        return list(self._wanted)

    def _update(self) -> None:
        with self._lock:
            if self._closing:
                return  # the broker keeps the subscriptions while the mediator is away
            wanted = disjoint([*(f for s in self._selections.values() for f in s.filters),
                               *(f for fs in self._wants.values() for f in fs)])
            if wanted == self._wanted:
                return
            added = [f for f in wanted if f not in self._wanted]
            self._wanted = wanted
            if self.connection.connected:
                # New ones first: a message between the two requests may come twice (the
                # duplicate memory drops a copy with the same id) but none is missed.
                self._subscribe(added)
                self._unsubscribe_unwanted()
        self.remember(list(wanted))

    def _resubscribe(self, session_present: bool) -> None:
        """On every connection (the network thread): subscribe every wanted filter again (a
        broker that lost the session has none), unsubscribe those no query wants."""
        with self._lock:
            self._subscribe(self._wanted)
            self._unsubscribe_unwanted()

    def _subscribe(self, filters: list[str]) -> None:
        if not filters:
            return
        client = self.connection.client
        if self.settings.protocol == "5":
            # Retained messages only for a new subscription, not each time one is renewed.
            options = SubscribeOptions(qos=self.qos,
                                       retainHandling=SubscribeOptions.RETAIN_SEND_IF_NEW_SUB)
            rc, _ = client.subscribe([(f, options) for f in filters])
        else:
            rc, _ = client.subscribe([(f, self.qos) for f in filters])
        if rc is MQTTErrorCode.MQTT_ERR_SUCCESS:
            self._known.update(filters)
            log.info("%s: subscribing %s", self.info.name, ", ".join(filters))
        else:  # the connection is gone: the next one subscribes them
            log.info("%s: not subscribed now (%s): %s", self.info.name, mqtt.error_string(rc),
                     ", ".join(filters))

    def _unsubscribe_unwanted(self) -> None:
        stale = sorted(self._known - set(self._wanted))
        if not stale:
            return
        rc, _ = self.connection.client.unsubscribe(stale)
        if rc is MQTTErrorCode.MQTT_ERR_SUCCESS:
            self._known.difference_update(stale)
            log.info("%s: unsubscribing %s", self.info.name, ", ".join(stale))

    # ---------------------------------------------------------------- messages → event log

    def _arrived(self, message: mqtt.MQTTMessage) -> None:
        """The network thread: note the arrival and the connection, queue, return."""
        self._queue.put((self.connection.generation, time.time_ns() // 1000, message))

    def _drain(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            items = [item]
            while len(items) < self.batch:
                try:
                    more = self._queue.get_nowait()
                except queue.Empty:
                    break
                if more is None:
                    self._queue.put(None)  # stop after this batch
                    break
                items.append(more)
            try:
                self._take(items)
            except Exception:  # never let the thread die: what is not acknowledged comes again
                log.exception("%s: a batch of %d messages could not be taken", self.info.name,
                              len(items))

    def _take(self, items: list[tuple[int, int, mqtt.MQTTMessage]]) -> None:
        # After a batch the event log refused, the rest of that connection's messages are left
        # too: the broker resends them all, in their order, on the next connection (taken
        # now, they would enter the log before the refused ones).
        items = [item for item in items if item[0] > self._refused_through]
        lines: list[str] = []
        acks: list[tuple[int, int, int]] = []  # (generation, packet id, qos), in arrival order
        for generation, arrival, message in items:
            self.counts.received += 1
            payload = bytes(message.payload)
            refused = too_large(len(payload), self.max_bytes, "the payload")
            result = self.mapping.map(Packet(_topic(message), payload, message.qos,
                                             message.mid, bool(message.retain), arrival,
                                             next(self._seq))) if refused is None else (
                SourceDeadLetter(self.info.name, str(_topic(message)), refused.reason,
                                 refused.detail, payload[:KEPT], len(payload)))
            if isinstance(result, Mapped):
                lines.append(result.line)
            elif isinstance(result, SourceDeadLetter):
                self.counts.dead_lettered += 1
                self.dead_letter(result)
            else:
                self.counts.unmatched += 1
            if message.qos > 0:
                acks.append((generation, message.mid, message.qos))
        if not lines:
            self._acknowledge(acks)
            return
        done = threading.Event()
        self.counts.in_flight += len(items)

        def ack() -> None:
            self._acknowledge(acks)
            self.counts.ingested += len(lines)
            self.counts.in_flight -= len(items)
            done.set()

        try:
            self.ingest(lines, ack)
        except Exception:
            self.counts.in_flight -= len(items)
            self.counts.ingest_failures += 1
            self._refused_through = self.connection.generation
            log.exception("%s: %d events could not be appended; reconnecting so that the broker "
                          "resends them", self.info.name, len(lines))
            self._stop.wait(1.0)
            self.connection.client.disconnect()  # the connection thread reconnects
            return
        since = time.monotonic()
        while not done.wait(0.2):
            if self._stop.is_set():
                return
            if time.monotonic() - since > STUCK:
                log.warning("%s: %d events handed to ingest %.0f s ago, not yet acknowledged",
                            self.info.name, len(lines), STUCK)
                since = time.monotonic()

    def _acknowledge(self, acks: list[tuple[int, int, int]]) -> None:
        current = self.connection.generation
        for generation, mid, qos in acks:
            if generation == current:
                self.connection.client.ack(mid, qos)
            else:  # that connection is gone: the broker resends the message on this one
                self.counts.acks_skipped += 1


def _topic(message: mqtt.MQTTMessage) -> str | bytes:
    """The topic, or its bytes when they are not UTF-8 (the mapping dead-letters it; paho's
    ``topic`` property would raise)."""
    try:
        return message.topic
    except UnicodeDecodeError:
        return bytes(message._topic)
