"""Composites to MQTT: a legacy consumer subscribes at its broker and sees them (docs/sources.md).

:class:`MqttSink` publishes the composites of chosen profiles, each to the topic its template
names (``{profile}``, ``{partition}``), QoS 1, never retained, in the CloudEvents MQTT binding
(v1.0.2):

* **structured** (default, MQTT 5 and 3.1.1): the payload is the CloudEvent as JSON — exactly
  the line the notification log holds; on MQTT 5 the Content Type property is
  ``application/cloudevents+json; charset=utf-8``;
* **binary** (MQTT 5 only): the payload is the event's ``data`` (JSON), its ``datacontenttype``
  is the Content Type property, and every other attribute is a User Property under its own
  name (the binding's §3.1.3.1: names unchanged — ``ce_`` prefixes are Kafka's binding).

:meth:`MqttSink.send` returns once the broker has acknowledged every message (PUBACK); the
caller advances its position in the notification log only then, so a sink restarted (or a
broker lost mid-send) publishes again from there: at least once — a consumer drops repeats by
the CloudEvent ``id`` (a composite's is deterministic, :func:`eva.notify.composite_id`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any

import orjson
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from adapters.mqtt import BrokerSettings, Connection, stable_client_id
from eva.events import brief_repr

log = logging.getLogger("evamed.mqtt.sink")

MODES = ("structured", "binary")
STRUCTURED_TYPE = "application/cloudevents+json; charset=utf-8"
NO_PARTITION = "_"
"""``{partition}`` of a composite of a profile without ``per``."""
_ESCAPE = {"%": "%25", "/": "%2F", "+": "%2B", "#": "%23", "\0": "%00"}


def topic_level(value: object) -> str:
    """A value as one topic level: a string as it is, anything else as JSON, and ``% / + #``
    and NUL percent-encoded (a level may hold none of the last four)."""
    text = value if isinstance(value, str) else orjson.dumps(value).decode()
    return "".join(_ESCAPE.get(c, c) for c in text) or NO_PARTITION


@dataclass
class SinkCounts:
    sent: int = 0       # handed to the broker (QoS 1: resent until acknowledged)
    published: int = 0  # acknowledged by the broker
    skipped: int = 0    # of a profile the sink does not publish
    refused: int = 0    # not a composite CloudEvent (logged)


def check_sink(topic: str, mode: str, protocol: str) -> None:
    """ValueError unless ``topic`` is a template with ``{profile}`` and ``{partition}`` only and
    no wildcard, and ``mode`` is one of :data:`MODES` that ``protocol`` can carry."""
    if mode not in MODES:
        raise ValueError(f"found mode {mode!r}, expected one of {', '.join(MODES)}")
    if mode == "binary" and protocol != "5":
        raise ValueError("the binary mode needs MQTT 5 (its attributes travel as user "
                         f"properties, which MQTT {protocol} has not); use mode 'structured'")
    try:
        topic.format(profile="p", partition="q")
    except (KeyError, IndexError, ValueError) as exc:
        raise ValueError(f"found topic template {topic!r}, expected text with {{profile}} "
                         f"and {{partition}} only ({exc})") from None
    if "+" in topic or "#" in topic:
        raise ValueError(f"found topic template {topic!r}: a topic to publish to has no "
                         "wildcard ('+', '#')")


class MqttSink:
    """Publishes composite CloudEvents to a broker (see the module docstring).

    ``topic``: a template with ``{profile}`` and ``{partition}`` (each one topic level);
    ``profiles``: the profiles whose composites are published (None: all)."""

    def __init__(self, name: str, settings: BrokerSettings, *,
                 topic: str = "evamed/{profile}/{partition}", mode: str = "structured",
                 profiles: Collection[str] | None = None, mediator: str = "evamed",
                 timeout: float = 30.0) -> None:
        check_sink(topic, mode, settings.protocol)
        self.name = name
        self.topic = topic
        self.mode = mode
        self.profiles = None if profiles is None else frozenset(profiles)
        self.timeout = timeout
        self.counts = SinkCounts()
        self._acked: set[int] = set()
        self._changed = threading.Condition()
        self.connection = Connection(
            settings, settings.client_id or stable_client_id(mediator, f"sink:{name}"),
            persistent=False, on_publish=self._published)

    def start(self) -> None:
        self.connection.start()

    def close(self) -> None:
        self.connection.stop()

    def status(self) -> str:
        return "SERVING" if self.connection.connected else "CONNECTING"

    def send(self, cloudevents: Sequence[str]) -> int:
        """Publish each composite (a CloudEvent JSON line) of a chosen profile and wait for the
        broker's acknowledgements; returns how many were published. TimeoutError when the
        broker has not acknowledged them all within ``timeout`` (still connecting, say): what
        was not acknowledged is sent again by the next call given it — or by this connection
        once it is back (paho resends QoS-1 messages on a reconnect)."""
        pending: list[int] = []
        for line in cloudevents:
            message = self._message(line)
            if message is None:
                continue
            topic, payload, properties = message
            info = self.connection.client.publish(topic, payload, qos=1, retain=False,
                                                  properties=properties)
            pending.append(info.mid)
            self.counts.sent += 1
        deadline = time.monotonic() + self.timeout
        with self._changed:
            while not all(mid in self._acked for mid in pending):
                left = deadline - time.monotonic()
                if left <= 0:
                    done = sum(mid in self._acked for mid in pending)
                    raise TimeoutError(f"sink {self.name}: the broker acknowledged {done} of "
                                       f"{len(pending)} composites within {self.timeout} s")
                self._changed.wait(min(left, 0.5))
            self._acked.difference_update(pending)
        self.counts.published += len(pending)
        return len(pending)

    def _published(self, mid: int) -> None:
        with self._changed:
            self._acked.add(mid)
            self._changed.notify_all()

    def _message(self, line: str) -> tuple[str, bytes, Properties | None] | None:
        try:
            event = orjson.loads(line)
            data = event["data"]
            profile = data["profile"]
        except (orjson.JSONDecodeError, KeyError, TypeError) as exc:
            self.counts.refused += 1
            log.error("sink %s: not a composite CloudEvent (%s): %s", self.name, exc,
                      brief_repr(line))
            return None
        if self.profiles is not None and profile not in self.profiles:
            self.counts.skipped += 1
            return None
        topic = self.topic.format(profile=topic_level(profile),
                                  partition=topic_level(data.get("partition", NO_PARTITION)))
        if self.connection.settings.protocol != "5":
            return topic, line.encode(), None
        properties = Properties(PacketTypes.PUBLISH)  # type: ignore[no-untyped-call]
        if self.mode == "structured":
            properties.ContentType = STRUCTURED_TYPE
            return topic, line.encode(), properties
        properties.ContentType = event.get("datacontenttype", "application/json")
        properties.UserProperty = [(name, _canonical(value)) for name, value in event.items()
                                   if name not in ("data", "datacontenttype")]
        return topic, orjson.dumps(data), properties


def _canonical(value: Any) -> str:
    """An attribute's canonical string (CloudEvents' type system): strings as they are."""
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


__all__ = ["MODES", "MqttSink", "SinkCounts", "check_sink", "topic_level"]
