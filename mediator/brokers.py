"""Brokers in the running mediator: the configured ``[[sources]]`` and ``[[sinks]]``
(docs/sources.md, "In the mediator").

* **Sources** (:class:`~adapters.mqtt_source.MqttSource`, :class:`~adapters.redis_source.
  RedisSource`) are links of the pipeline — the planner gives them the primitive classes
  their coverage covers — and ingestion sources: what they take in goes through ``accept``,
  Publish's own path (decode, duplicate, late, durable append, pipeline woken), and only then
  is it acknowledged to the broker. A broker filters by topic, and is asked for the topics of
  **every** class of a live subscription it can feed (:meth:`Brokers.added`), wherever the
  planner put the class: two brokers (or a broker and a service) covering the same type each
  get their messages in, and the class is evaluated once, at the link it was planned on, over
  the event log that holds them all.
* **Sinks** (:class:`SinkFeed`) follow the notification logs of their subscriptions (woken by
  the pipeline's ``on_append``) and publish each new composite to their broker: at least once
  — a sink's position in each log is kept in the store's meta only after the broker
  acknowledged what precedes it, so a restart resends at most what was in flight.
"""

from __future__ import annotations

import json
import logging
import secrets
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import replace
from urllib.parse import urlsplit

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from adapters.links import Link
from adapters.mapping import Mapped, Packet, Selection, SourceDeadLetter
from adapters.mqtt_sink import MqttSink
from adapters.mqtt_source import Ack, MqttSource
from adapters.redis_source import RedisSource
from eva import ast
from eva.admission import Reason
from eva.classes import resolve
from eva.parser import parse
from mediator.config import Config, MqttSourceConfig, SinkConfig
from mediator.dead_letters import DeadLetterLog, Letter
from mediator.metrics import Metrics
from mediator.notification_log import decode
from mediator.store.base import RetentionError, Store, SubscriptionRecord
from transforms.federated import covers

log = logging.getLogger("evamed.brokers")

Accept = Callable[[str, list[str]], None]
"""``accept(source, lines)``: Publish's accept path for one batch of a source (blocking, from
the source's thread); raises if the lines could not be appended."""
Key = tuple[str, str]
"""A subscription: (owner, name)."""

MEDIATOR_ID = "mediator.id"
"""Store meta: this mediator's name at its brokers (the MQTT client ids derive from it), made
once and kept, so that a restart finds its persistent sessions."""
FILTERS = "source.{name}.filters"
"""Store meta: the topic filters an MQTT source last asked its broker for (JSON), given back at
the next start so that those no query wants any more are unsubscribed."""
POSITION = "sink.{sink}.{owner}/{name}"
"""Store meta: ``<registered>:<position>`` — what a sink has published of a subscription's log."""
SINK_READ = 500
"""Notifications a sink reads and publishes at once."""
SINK_TIMEOUT = 10.0
"""Seconds a sink waits for its broker's acknowledgements before it tries again."""
SINK_RETRY = 1.0
"""Seconds between a sink's tries while its broker is away."""

Source = MqttSource | RedisSource


def mediator_id(store: Store) -> str:
    """This mediator's name at its brokers and services (MQTT client ids, session names
    derive from it), made once and kept in the store, so that a restart finds its persistent
    sessions."""
    found = store.get_meta(MEDIATOR_ID)
    if found is None:
        found = f"evamed-{secrets.token_hex(6)}"
        store.set_meta(MEDIATOR_ID, found)
    return found


class Brokers:
    """The configuration's sources and sinks, built (not yet connected) over ``store``."""

    def __init__(self, config: Config, store: Store, metrics: Metrics,
                 letters: DeadLetterLog | None = None) -> None:
        self.store = store
        self.metrics = metrics
        self.letters = letters or DeadLetterLog(store, metrics, config.dead_letters)
        self._accept: Accept | None = None
        mediator = mediator_id(store) if config.sources or config.sinks else "evamed"
        rules = config.admission()
        self.sources: dict[str, Source] = {}
        for c in config.sources:
            largest = rules.max_bytes_of(c.name)
            if isinstance(c, MqttSourceConfig):
                known = json.loads(store.get_meta(FILTERS.format(name=c.name)) or "[]")
                self.sources[c.name] = MqttSource(
                    c.name, c.mapping, c.broker, self._ingest(c.name),
                    mediator=mediator, dead_letter=self._dead_letter,
                    qos=c.qos, known_filters=known, remember=self._remember(c.name),
                    coverage=c.coverage, max_bytes=largest)
            else:
                self.sources[c.name] = RedisSource(replace(c, max_bytes=largest),
                                                   self._ingest(c.name),
                                                   dead_letter=self._dead_letter)
        self.sinks = [SinkFeed(c, store, mediator, metrics) for c in config.sinks]
        metrics.sinks.update(c.name for c in config.sinks)
        if self.sources or self.sinks:
            metrics.registry.register(BrokerMetrics(self))

    @property
    def links(self) -> dict[str, Link]:
        return dict(self.sources)

    def addresses(self) -> dict[str, str]:
        """Where each source reads (no credentials), for ListServices."""
        out: dict[str, str] = {}
        for name, source in self.sources.items():
            if isinstance(source, MqttSource):
                out[name] = source.settings.address
            else:
                url = urlsplit(source.config.url)
                out[name] = f"{url.scheme}://{url.hostname or ''}" + (
                    f":{url.port}" if url.port else "") + url.path
        return out

    # ---------------------------------------------------------------- lifecycle

    def start(self, accept: Accept, subscriptions: Iterable[SubscriptionRecord]) -> None:
        """Take events in through ``accept`` from now on: the stored ``subscriptions``' topics
        asked of the brokers, the sources connected, the sinks started."""
        self._accept = accept
        for record in subscriptions if self._mqtt() else ():
            try:
                self.added((record.owner, record.name), parse(record.text, "profile"))
            except Exception as exc:  # the pipeline says why it could not restore it
                log.debug("subscription %s/%s: no broker topics (%s)", record.owner,
                          record.name, exc)
        for source in self.sources.values():
            source.start()
        for sink in self.sinks:
            sink.start()

    def stop(self) -> None:
        """Stop taking events in (the links still evaluate: the pipeline drains after this).
        What a source took is in the event log, or left unacknowledged at its broker."""
        stopping = [threading.Thread(target=source.stop, daemon=True,
                                     name=f"evamed-stop-{name}")
                    for name, source in self.sources.items()]
        for thread in stopping:
            thread.start()
        for thread in stopping:
            thread.join(15)
        self._accept = None

    def close(self) -> None:
        """Stop the sinks (the links are closed with the others)."""
        for sink in self.sinks:
            sink.close()

    # ---------------------------------------------------------------- subscriptions

    def added(self, key: Key, doc: ast.Document) -> None:
        """Ask every MQTT broker for the topics of the document's classes it can feed (that its
        coverage covers), wherever they are planned."""
        wanted: dict[MqttSource, list[str]] = {}
        for source, _, chosen in self._selections(doc):
            wanted.setdefault(source, []).extend(chosen.filters)
        for source, filters in wanted.items():
            source.want("/".join(key), filters)

    def removed(self, key: Key) -> None:
        for source in self._mqtt():
            source.want("/".join(key), ())

    def on_append(self, owner: str, name: str, head: int) -> None:
        """The pipeline appended to a notification log: wake the sinks that publish it."""
        for sink in self.sinks:
            sink.on_append(owner, name)

    def explain(self, doc: ast.Document) -> str:
        """For each MQTT broker and each class of ``doc`` it can feed: what the broker filters
        (topics) and what the mediator filters (the whole class, on what arrives)."""
        lines = [f"  {source.info.name}, class {name}: the broker filters topics "
                 f"{', '.join(chosen.filters) or 'none (no rule produces what it requires)'} "
                 f"({chosen.why}); the mediator evaluates the whole class on what arrives"
                 for source, name, chosen in self._selections(doc)]
        return "\n".join(["Brokers:", *lines]) if lines else ""

    def _mqtt(self) -> list[MqttSource]:
        """The MQTT sources (Redis filters nothing: every entry of its streams comes in)."""
        return [s for s in self.sources.values() if isinstance(s, MqttSource)]

    def _selections(self, doc: ast.Document) -> Iterator[tuple[MqttSource, str, Selection]]:
        """(source, class name, its topic filters) for each class of ``doc``'s profiles an MQTT
        source covers."""
        classes = doc.class_map()
        used = sorted({n.name for p in doc.profiles for n in ast.walk(p.expr)
                       if isinstance(n, ast.Prim)})
        for source in self._mqtt():
            for name in used:
                cls = classes[name]
                if not isinstance(cls.body, ast.Every) and covers(source.info, cls, classes):
                    yield source, name, source.mapping.select(resolve(cls.body, classes))

    # ---------------------------------------------------------------- the sources' callbacks

    def _ingest(self, source: str) -> Callable[[list[str], Ack], None]:
        def ingest(lines: list[str], ack: Ack) -> None:
            accept = self._accept
            if accept is None:
                raise ConnectionError("the mediator is not taking events in (starting or "
                                      "stopping)")
            accept(source, lines)  # raises if not appended: the broker keeps them
            ack()
        return ingest

    def _dead_letter(self, letter: SourceDeadLetter) -> None:
        """A message a source's mapping refused: kept in the dead-letter log (its payload
        with it, to be mapped again by ``evamed dead-letters republish``)."""
        self.letters.record([Letter(letter.reason, letter.broker, letter.detail,
                                    letter.payload, where=letter.topic, kind=letter.kind)])

    def remap(self, name: str, topic: str, payload: bytes, letter: int) -> str | SourceDeadLetter:
        """A dead letter's payload (its position ``letter``) mapped again by source ``name``'s
        rules, on the topic (or stream) it came on: the CloudEvent line, or why not. Its time
        is now unless a rule reads one; its id the payload's, else ``republished-<letter>``."""
        source = self.sources[name]
        mapping = source.mapping if isinstance(source, MqttSource) else source.config.mapping
        if mapping is None:
            return SourceDeadLetter(name, topic, Reason.PAYLOAD, "the source has no rules to map "
                                    "a payload: give a whole CloudEvent")
        out = mapping.map(Packet(topic, payload, arrival_us=time.time_ns() // 1000,
                                 ident=f"republished-{letter}"))
        if out is None:
            return SourceDeadLetter(name, topic, Reason.TOPIC, "no rule's topic matches "
                                    f"{topic!r}")
        return out.line if isinstance(out, Mapped) else out

    def _remember(self, name: str) -> Callable[[list[str]], None]:
        def remember(filters: list[str]) -> None:
            try:
                self.store.set_meta(FILTERS.format(name=name), json.dumps(filters))
            except Exception as exc:  # only the cleanup of stale topics at the next start
                log.warning("source %s: its topic filters could not be kept: %s", name, exc)
        return remember


class BrokerMetrics:
    """The sources' and sinks' own series, read from their counts when scraped
    (docs/operations.md, Monitor): labelled by the configured name only."""

    def __init__(self, brokers: Brokers) -> None:
        self.brokers = brokers

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        received = CounterMetricFamily(
            "evamed_source_messages", "Messages (MQTT) or stream entries (Redis) a source "
            "received from its broker.", labels=["source"])
        unmatched = CounterMetricFamily(
            "evamed_source_unmatched", "Messages no rule of the source's mapping matched (a "
            "broker filter wider than the rules, an ignored retained message).",
            labels=["source"])
        connected = GaugeMetricFamily(
            "evamed_source_connected", "1 while the source is connected to its broker.",
            labels=["source"])
        lag = GaugeMetricFamily(
            "evamed_source_lag", "Messages the source has not brought into the event log yet: "
            "Redis — entries of its streams not yet delivered to its group or pending; MQTT — "
            "messages received and not yet acknowledged (the broker's queue is not visible).",
            labels=["source"])
        for name, source in self.brokers.sources.items():
            if isinstance(source, MqttSource):
                received.add_metric([name], source.counts.received)
                unmatched.add_metric([name], source.counts.unmatched)
                lag.add_metric([name], source.lag)
            else:
                received.add_metric([name], source.counts.read)
                unmatched.add_metric([name], 0)
                lag.add_metric([name], source.counts.lag)
            connected.add_metric([name], 1 if source.status() == "SERVING" else 0)
        yield from (received, unmatched, connected, lag)
        published = CounterMetricFamily(
            "evamed_sink_published", "Composites a sink sent to its broker.", labels=["sink"])
        acknowledged = CounterMetricFamily(
            "evamed_sink_acknowledged", "Composites a sink's broker acknowledged (QoS 1): "
            "delivered.", labels=["sink"])
        retries = CounterMetricFamily(
            "evamed_sink_retries", "Times a sink tried a subscription's composites again (its "
            "broker away or slow to acknowledge).", labels=["sink"])
        sink_connected = GaugeMetricFamily(
            "evamed_sink_connected", "1 while the sink is connected to its broker.",
            labels=["sink"])
        for feed in self.brokers.sinks:
            name = feed.config.name
            published.add_metric([name], feed.sink.counts.sent)
            acknowledged.add_metric([name], feed.sink.counts.published)
            retries.add_metric([name], feed.retries)
            sink_connected.add_metric([name], 1 if feed.sink.status() == "SERVING" else 0)
        yield from (published, acknowledged, retries, sink_connected)


class SinkFeed:
    """One sink: its broker connection and a thread that publishes, for each chosen
    subscription, what its log holds past the sink's position (module docstring)."""

    def __init__(self, config: SinkConfig, store: Store, mediator: str,
                 metrics: Metrics | None = None) -> None:
        self.config = config
        self.store = store
        self.metrics = metrics
        self.retries = 0
        self.sink = MqttSink(config.name, config.broker, topic=config.topic, mode=config.mode,
                             mediator=mediator, timeout=SINK_TIMEOUT)
        self._subscriptions = {p for p in config.profiles if "/" in p}
        self._profiles = {p for p in config.profiles if "/" not in p}
        self._due: set[Key] = set()
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name=f"evamed-sink-{config.name}")

    def follows(self, owner: str, name: str) -> bool:
        """Whether the sink publishes (some of) this subscription's composites."""
        return (not self.config.profiles or bool(self._profiles)
                or f"{owner}/{name}" in self._subscriptions)

    def on_append(self, owner: str, name: str) -> None:
        if self.follows(owner, name):
            with self._lock:
                self._due.add((owner, name))
            self._wake.set()

    def start(self) -> None:
        self.sink.start()
        with self._lock:  # what was appended while the sink was away
            self._due.update((r.owner, r.name) for r in self.store.subscriptions()
                             if self.follows(r.owner, r.name))
        self._wake.set()
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join(SINK_TIMEOUT + 1)
        self.sink.close()

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait()
            self._wake.clear()
            with self._lock:
                due, self._due = self._due, set()
            failed: set[Key] = set()
            for key in sorted(due):
                if self._stop.is_set():
                    return
                try:
                    self._forward(key)
                except Exception as exc:  # the broker away, or slow: try again
                    log.warning("sink %s: composites of %s/%s not published yet: %s",
                                self.config.name, *key, exc)
                    failed.add(key)
            if failed:
                self.retries += len(failed)
                with self._lock:
                    self._due |= failed
                self._stop.wait(SINK_RETRY)
                self._wake.set()

    def _forward(self, key: Key) -> None:
        """Publish what the log of ``key`` holds past the sink's position, moving the position
        after each acknowledged batch."""
        owner, name = key
        record = self.store.subscription(owner, name)
        if record is None:
            return  # removed
        meta = POSITION.format(sink=self.config.name, owner=owner, name=name)
        kept = (self.store.get_meta(meta) or "").split(":")
        after = int(kept[1]) if len(kept) == 2 and kept[0] == str(record.created_us) else 0
        while not self._stop.is_set():
            if not self.sink.connection.wait_connected(SINK_TIMEOUT):
                raise ConnectionError(f"broker {self.sink.connection.settings.address} out of "
                                      "reach")
            try:
                batch = self.store.read_notifications(owner, name, after, SINK_READ)
            except RetentionError:
                first, _ = self.store.notification_bounds(owner, name)
                log.warning("sink %s: %s/%s: positions %d to %d were trimmed (retention) "
                            "before they were published", self.config.name, owner, name,
                            after + 1, first - 1)
                after = first - 1
                continue
            if not batch:
                return
            lines = [line for item in batch if (line := self._chosen(key, item.payload))]
            began = time.monotonic()
            if lines:
                self.sink.send(lines)  # TimeoutError: not all acknowledged, sent again
            after = batch[-1].position
            self.store.set_meta(meta, f"{record.created_us}:{after}")
            if self.metrics is not None:
                self.metrics.sink_position.labels(self.config.name, owner, name).set(after)
            log.debug("sink %s: %d composites of %s/%s published in %.3f s",
                      self.config.name, len(lines), owner, name, time.monotonic() - began)

    def _chosen(self, key: Key, payload: bytes) -> str:
        """The composite CloudEvent of a log entry if the sink publishes it, else ""."""
        try:
            entry = decode(payload)
            line, profile = entry.cloudevent, entry.profile
        except ValueError:
            log.error("sink %s: a notification of %s/%s is not the expected JSON; skipped",
                      self.config.name, *key)
            return ""
        if (not self.config.profiles or profile in self._profiles
                or "/".join(key) in self._subscriptions):
            return line
        return ""


__all__ = ["Accept", "Brokers", "SinkFeed"]
