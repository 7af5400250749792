"""Redis Streams as an event source of the mediator: a CG-0 service (docs/sources.md, "Redis
Streams").

A :class:`RedisSource` is two things. As a :class:`~adapters.links.Link` it is an
:class:`~adapters.links.InProcessLink` over the primitive-filter language (CG-0), covering the
types and sources its mapping produces: the mediator plans a profile's primitive classes onto it
as onto any service. As an ingestion source it reads its streams in a thread of its own and hands
the events, as CloudEvents lines, to the ``ingest(lines, ack)`` callback the mediator gives
it; the mediator appends them durably to its event log (the path
``Publish`` takes: malformed, duplicate and late events dead-lettered there) and then calls
``ack``.

Delivery (at least once into the mediator, duplicates dropped there):

* one consumer group per source (``group``) and a stable consumer name (``consumer``); the
  group is created at the stream's end, MKSTREAM, when missing (BUSYGROUP: it exists);
* ``XREADGROUP … >`` blocks at most ``block`` seconds, so :meth:`RedisSource.stop` is prompt;
* ``XACK`` only once ``ack`` was called — the events are in the mediator's log; an entry read
  but not acknowledged stays in the group's pending list;
* on every (re)connection, first the consumer's own pending entries (its previous
  incarnation's, or those whose acknowledgement was lost with the connection), then — then and
  every ``claim_idle`` seconds — ``XAUTOCLAIM`` of the entries another consumer left pending
  longer than ``claim_idle`` (it crashed); they are taken in again. An entry keeps its event id
  on every delivery — the stream and the entry id (``sensors/1700000000000-0``) unless the
  mapping names an id field — so what the mediator had already accepted is dropped as a
  duplicate;
* an entry that cannot be mapped goes to the dead-letter callback (stream, entry id, reason)
  and is acknowledged at once: a poison entry must not block the group, nor come back forever;
* a connection error reconnects with exponential back-off and jitter (tenacity).

Mapping (:mod:`adapters.mapping`, shared with the MQTT source): a stream's name is the topic
the rules match (``/`` separates levels, so ``plant/+line/temp`` matches the stream
``plant/a/temp``); the payload is the entry's fields as a JSON object (a value that is JSON is
taken as JSON, any other as a string) or, with ``payload_field``, that one field's bytes (as an
MQTT payload); an event without a time field takes the entry id's milliseconds (when Redis added
it: the same on every delivery). An entry with the ``cloudevent_field`` (default ``ce``) holds a
whole structured CloudEvent instead, taken as it is.
"""

from __future__ import annotations

import contextlib
import heapq
import json
import logging
import socket
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry
from tenacity import RetryCallState, Retrying, retry_if_exception, wait_random_exponential

from adapters.backends.registry import language
from adapters.links import InProcessLink
from adapters.mapping import (
    KEPT,
    Mapped,
    MappingConfigError,
    Packet,
    SourceDeadLetter,
    parse_mapping,
)
from adapters.mapping import Mapping as EventMapping
from eva.admission import Reason, too_large
from eva.events import EventError, brief_repr, from_json_line
from transforms.capability import CG0
from transforms.federated import Coverage, ServiceInfo

log = logging.getLogger("evamed.redis_source")

Ack = Callable[[], None]
Ingest = Callable[[list[str], Ack], None]
"""The mediator's side: append ``lines`` durably to the event log (dead-lettering what it
refuses), then call ``ack`` — at once or later, from any thread. If it raises (and does not
call ``ack``), the source reconnects and takes the entries in again."""
DeadLetter = Callable[[SourceDeadLetter], None]

DEFAULT_SOURCE = "redis://{broker}/{topic}"
"""A rule's ``source`` when it names none: the source name and the stream."""
BACKOFF_MAX = 2.0
"""Seconds between reconnection attempts at most (exponential from 50 ms, with jitter)."""
MAX_IN_FLIGHT = 10_000
"""Entries handed to ``ingest`` and not yet acknowledged at most: the reader waits beyond."""
LAG_EVERY = 2.0
"""Seconds between measurements of the group's lag (``Counts.lag``)."""
KEYS = {"name", "kind", "url", "streams", "rules", "payload_field", "cloudevent_field", "group", "consumer",
         "start", "count", "block", "claim_idle", "sources", "types"}
"""The keys of a Redis source's table (mediator/config.py lists them in its documentation)."""


def _where(url: str) -> str:
    """Where a Redis URL points, for a log line: never its password."""
    try:
        parts = urlsplit(url)
        if parts.scheme == "unix":
            return parts.path
        return f"{parts.hostname}:{parts.port or 6379}{parts.path or '/0'}"
    except ValueError:
        return "an unreadable URL"


@dataclass(frozen=True)
class RedisSourceConfig:
    """One Redis Streams source (``[[sources]]`` with ``kind = "redis"``; :func:`parse_config`).

    ``start``: where a group created by the source begins — ``$`` (entries added from then on)
    or ``0`` (the whole stream). ``coverage``: declared; None: what the rules produce, or every
    event when there are no rules (a CloudEvent field may carry anything)."""

    name: str
    url: str
    streams: tuple[str, ...]
    mapping: EventMapping | None = None
    payload_field: str = ""
    cloudevent_field: str = "ce"
    group: str = "evamed"
    consumer: str = field(default_factory=lambda: f"evamed-{socket.gethostname()}")
    start: str = "$"
    count: int = 500
    block: float = 1.0
    claim_idle: float = 60.0
    coverage: Coverage | None = None
    max_bytes: int | None = None
    """The largest entry taken (its fields' bytes); a larger one is dead-lettered
    ``too_large``. Set by the mediator from ``max_event_bytes``."""

    def info(self) -> ServiceInfo:
        if self.coverage is not None:
            coverage = self.coverage
        elif self.mapping is not None:
            coverage = self.mapping.coverage()
        else:
            coverage = Coverage()
        return ServiceInfo(self.name, "cg0", CG0, coverage)


def parse_config(name: str, raw: Mapping[str, Any]) -> RedisSourceConfig:
    """A source from its configuration table (its ``name`` is ``name``)::

        kind = "redis"
        url = "redis://127.0.0.1:6379/0"
        streams = ["plant/a/temp", "plant/b/temp"]
        group = "evamed"                  # the consumer group
        consumer = "evamed-host1"         # stable across restarts (default: evamed-<host>)
        start = "$"                       # or "0": where a group the source creates begins
        claim_idle = 60.0                 # seconds before another consumer's pending entries
        payload_field = ""                # "": the fields as a JSON object
        cloudevent_field = "ce"           # a field holding a whole CloudEvent ("" : none)
        [[sources.rules]]                 # as for MQTT (adapters.mapping.parse_mapping)
        topic = "plant/+line/temp"
        type = "plant.temp"

    MappingConfigError names the source, the key, what was found and what is expected."""
    where = f"source {name!r}"
    unknown = sorted(set(raw) - KEYS)
    if unknown:
        raise MappingConfigError(f"{where}: unknown key(s) {', '.join(unknown)}; a Redis source "
                                 f"has {', '.join(sorted(KEYS))}")
    if raw.get("kind", "redis") != "redis":
        raise MappingConfigError(f"{where}: kind is {brief_repr(raw.get('kind'))}, expected "
                                 "'redis' for a Redis Streams source")
    url = raw.get("url")
    if not isinstance(url, str) or not url.startswith(("redis://", "rediss://", "unix://")):
        # The scheme only: a URL may carry a password (issue 29).
        found = (f"a URL of scheme {brief_repr(url.partition('://')[0][:20])}"
                 if isinstance(url, str) and "://" in url else
                 "not a URL" if isinstance(url, str) else brief_repr(url))
        raise MappingConfigError(f"{where}: url is {found}, expected "
                                 "'redis://host:port/db' (or rediss://, unix://)")
    streams = raw.get("streams")
    if (not isinstance(streams, list) or not streams
            or not all(isinstance(s, str) and s for s in streams)
            or len(set(streams)) != len(streams)):
        raise MappingConfigError(f"{where}: streams is {brief_repr(streams)}, expected a list "
                                 "of distinct stream names")
    rules = raw.get("rules")
    mapping = None
    if rules is not None:
        if isinstance(rules, list):  # the rules of a Redis source name their stream's source
            rules = [{"source": DEFAULT_SOURCE, **r} if isinstance(r, Mapping) else r
                     for r in rules]
        mapping = parse_mapping(name, rules)
    coverage = None
    if "sources" in raw or "types" in raw:
        coverage = Coverage(_patterns(where, "sources", raw.get("sources", ["*"])),
                            _patterns(where, "types", raw.get("types", ["*"])))
    return RedisSourceConfig(
        name, url, tuple(streams), mapping,
        payload_field=_text(where, raw, "payload_field", ""),
        cloudevent_field=_text(where, raw, "cloudevent_field", "ce"),
        group=_text(where, raw, "group", "evamed", empty=False),
        consumer=_text(where, raw, "consumer", f"evamed-{socket.gethostname()}", empty=False),
        start=_choice(where, raw, "start", "$", ("$", "0")),
        count=int(_number(where, raw, "count", 500, 1, 100_000)),
        block=_number(where, raw, "block", 1.0, 0.01, 60.0),
        claim_idle=_number(where, raw, "claim_idle", 60.0, 0.1, 86_400.0),
        coverage=coverage)


def _text(where: str, raw: Mapping[str, Any], key: str, default: str, empty: bool = True) -> str:
    value = raw.get(key, default)
    if not isinstance(value, str) or (not empty and not value):
        raise MappingConfigError(f"{where}: {key} is {brief_repr(value)}, expected a "
                                 f"{'' if empty else 'non-empty '}string")
    return value


def _choice(where: str, raw: Mapping[str, Any], key: str, default: str,
            options: tuple[str, ...]) -> str:
    value = raw.get(key, default)
    if value not in options:
        raise MappingConfigError(f"{where}: {key} is {brief_repr(value)}, expected one of "
                                 f"{', '.join(repr(o) for o in options)}")
    return str(value)


def _number(where: str, raw: Mapping[str, Any], key: str, default: float, low: float,
            high: float) -> float:
    value = raw.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
        raise MappingConfigError(f"{where}: {key} is {brief_repr(value)}, expected a number "
                                 f"from {low:g} to {high:g}")
    return float(value)


def _patterns(where: str, key: str, value: object) -> tuple[str, ...]:
    if not isinstance(value, list) or not value or not all(isinstance(p, str) and p
                                                             for p in value):
        raise MappingConfigError(f"{where}: {key} is {brief_repr(value)}, expected a list of "
                                 "fnmatch patterns such as ['plant.*']")
    return tuple(value)


# ------------------------------------------------------------------ entries → events

Entry = tuple[str, str, dict[bytes, bytes]]
"""A stream entry as read: the stream, the entry id, its fields ({} once deleted)."""


def entry_event(config: RedisSourceConfig, stream: str, entry_id: str,
                fields: Mapping[bytes, bytes]) -> Mapped | SourceDeadLetter:
    """The event of a stream entry, or its dead letter (whose detail names the entry id)."""
    out = _entry_event(config, stream, entry_id, fields)
    if isinstance(out, SourceDeadLetter):
        return SourceDeadLetter(out.broker, out.topic, out.reason,
                                f"entry {entry_id}: {out.detail}", out.payload)
    return out


def _entry_event(config: RedisSourceConfig, stream: str, entry_id: str,
                 fields: Mapping[bytes, bytes]) -> Mapped | SourceDeadLetter:
    def dead(reason: str, detail: str, payload: bytes = b"", kind: str = "payload"
             ) -> SourceDeadLetter:
        return SourceDeadLetter(config.name, stream, reason, detail, payload[:KEPT],
                                len(payload), kind)

    if not fields:
        return dead(Reason.DELETED, "the entry was deleted from the stream (XDEL, or trimmed) "
                    "before it was taken in")
    size = sum(len(k) + len(v) for k, v in fields.items())
    refused = too_large(size, config.max_bytes, "the entry")
    if refused is not None:
        return dead(refused.reason, refused.detail, _preview(fields))
    whole = config.cloudevent_field.encode()
    if config.cloudevent_field and whole in fields:
        raw = fields[whole]
        try:
            event = from_json_line(raw)
            line = raw.decode("utf-8")
        except (EventError, UnicodeDecodeError) as exc:
            return dead(Reason.MALFORMED, f"field {config.cloudevent_field!r} is not a "
                        f"CloudEvent: {exc}", raw, "cloudevent")
        if "\n" in line or "\r" in line:  # one event per line in the log
            line = json.dumps(json.loads(line), separators=(",", ":"))
        return Mapped(line, event)
    if config.mapping is None:
        return dead(Reason.PAYLOAD, f"the entry has no field {config.cloudevent_field!r} (a "
                    "whole CloudEvent) and the source has no rules", _preview(fields))
    if config.payload_field:
        payload = fields.get(config.payload_field.encode())
        if payload is None:
            return dead(Reason.PAYLOAD, f"the entry has no field {config.payload_field!r} "
                        f"(the payload); it has {', '.join(_names(fields))}", _preview(fields))
    else:
        try:
            payload = _fields_json(fields)
        except UnicodeDecodeError as exc:
            return dead(Reason.PAYLOAD, str(exc), _preview(fields))
    ms = int(entry_id.split("-", 1)[0])
    packet = Packet(stream, payload, arrival_us=ms * 1000, ident=f"{stream}/{entry_id}")
    mapped = config.mapping.map(packet)
    if mapped is None:
        patterns = ", ".join(repr(r.pattern.text) for r in config.mapping.rules)
        return dead(Reason.TOPIC, f"no rule's topic matches the stream (rules: {patterns})",
                    payload)
    return mapped


def _fields_json(fields: Mapping[bytes, bytes]) -> bytes:
    """The fields as a JSON object: a value that is JSON as that value, any other as a string.
    UnicodeDecodeError names a field that is not UTF-8."""
    obj: dict[str, Any] = {}
    for key, value in fields.items():
        name = _utf8(key, "a field name")
        text = _utf8(value, f"field {name!r}")
        try:
            obj[name] = json.loads(text, parse_constant=_no_constant)
        except ValueError:
            obj[name] = text
    return json.dumps(obj, separators=(",", ":")).encode()


def _utf8(raw: bytes, what: str) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UnicodeDecodeError(exc.encoding, exc.object, exc.start, exc.end,
                                 f"{what} is not UTF-8 (byte {exc.start + 1}); name a "
                                 "payload_field to take binary data") from None


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _names(fields: Mapping[bytes, bytes]) -> list[str]:
    return [repr(k.decode("utf-8", "replace")) for k in fields]


def _preview(fields: Mapping[bytes, bytes]) -> bytes:
    """The entry's fields as the payload the mapping sees: a JSON object when they are UTF-8
    (a dead letter republished is mapped from it), else ``name=value`` pairs."""
    try:
        return _fields_json(fields)
    except UnicodeDecodeError:
        return b" ".join(k + b"=" + v for k, v in fields.items())[:KEPT]


# ------------------------------------------------------------------ the source


@dataclass
class Counts:
    """What the source did since it started (tests, logs)."""

    read: int = 0          # entries read (new, own pending and claimed)
    lag: int = 0           # entries of its streams not yet acknowledged: not delivered to
                           # the group yet, or pending (XINFO GROUPS; measured every LAG_EVERY)
    ingested: int = 0      # events handed to ingest
    acked: int = 0         # entries acknowledged (ingested and dead-lettered)
    dead_lettered: int = 0
    claimed: int = 0       # entries taken over from another consumer (XAUTOCLAIM)
    recovered: int = 0     # own pending entries read again after a (re)connection
    connections: int = 0


def _log_dead_letter(letter: SourceDeadLetter) -> None:
    log.warning("dead letter: %s", letter)


class _Stopped(Exception):
    """The source is stopping: leave the session."""


Taken = tuple[int, str, str, str]
"""An entry mapped to an event: (time, line, stream, entry id)."""


class Merge:
    """The entries of several streams, handed over in time order across reads (a backlog is
    read ``count`` entries per stream at a time, and one stream's may be hours older than
    another's). A stream whose last read was full (``count`` entries) may hold more: an entry
    is handed over once no such stream can still hold an older one — its time is at most the
    newest time read from every stream still behind. Read the laggard next (:meth:`next`):
    the stream behind with the oldest newest time. A stream whose read was short is caught
    up; what it gets later is new (and the reorder buffer downstream takes what is within the
    lateness)."""

    def __init__(self, streams: Iterable[str] = ()) -> None:
        self._heap: list[tuple[int, int, Taken]] = []
        self._arrivals = 0
        self.newest: dict[str, int] = {}
        self.behind: set[str] = set(streams)
        """Streams that may hold more than was read: at first, every one (nothing is handed
        over before each was read once)."""

    def __len__(self) -> int:
        return len(self._heap)

    def add(self, stream: str, taken: list[Taken], full: bool) -> None:
        """One read of ``stream``: its mapped entries (in its order) and whether it was full."""
        for item in taken:
            heapq.heappush(self._heap, (item[0], self._arrivals, item))
            self._arrivals += 1
            if item[0] > self.newest.get(stream, -(2**62)):
                self.newest[stream] = item[0]
        if full:
            self.behind.add(stream)
        else:
            self.behind.discard(stream)

    def due(self) -> list[Taken]:
        """What can be handed over now, in time order (arrival order within an instant)."""
        bound = min((self.newest.get(s, -(2**62)) for s in self.behind), default=None)
        out: list[Taken] = []
        while self._heap and (bound is None or self._heap[0][0] <= bound):
            out.append(heapq.heappop(self._heap)[2])
        return out

    def next(self) -> str | None:
        """The stream to read next without waiting (None: none is behind: read them all)."""
        if not self.behind:
            return None
        return min(self.behind, key=lambda s: (self.newest.get(s, -(2**62)), s))


class RedisSource(InProcessLink):
    """A Redis Streams source (the module's docstring). ``dead_letter``: where an entry the
    mapping refuses goes (default: a warning in the log) before it is acknowledged."""

    def __init__(self, config: RedisSourceConfig, ingest: Ingest, *,
                 dead_letter: DeadLetter = _log_dead_letter) -> None:
        super().__init__(config.info(), language("cg0"))
        self.config = config
        self.ingest = ingest
        self.dead_letter = dead_letter
        self.counts = Counts()
        self._stopping = threading.Event()
        self._connected = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name=f"redis-source-{config.name}")
        self._lock = threading.Condition()
        self._acks: list[tuple[str, str]] = []   # (stream, entry id) acknowledged, to XACK
        self._flight: set[tuple[str, str]] = set()  # handed to ingest, not yet XACKed
        self._claimed_at = 0.0
        self._measured_at = 0.0
        self._merge = Merge()

    # -- lifecycle

    def start(self) -> None:
        """Read the streams in a thread of its own, handing events to ``ingest``."""
        self._thread.start()

    def close(self, timeout: float = 5.0) -> None:
        """:meth:`stop`, and the link closed."""
        self.stop(timeout)
        super().close()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop reading (within ``block`` seconds; acknowledgements given by then are sent); the
        link still evaluates (the mediator drains its pipeline after this). What was handed to
        ``ingest`` and not acknowledged stays pending: the next start (or another consumer)
        takes it in again."""
        self._stopping.set()
        with self._lock:
            self._lock.notify_all()
        if self._thread.is_alive():
            self._thread.join(timeout)
            if self._thread.is_alive():
                log.warning("Redis source %s: the reader did not stop within %g s",
                            self.info.name, timeout)

    def status(self) -> str:
        return "SERVING" if self._connected.is_set() else "CONNECTING"

    # -- the reader thread

    def _run(self) -> None:
        while not self._stopping.is_set():
            retrying = Retrying(retry=retry_if_exception(lambda e: not isinstance(e, _Stopped)),
                                wait=wait_random_exponential(multiplier=0.05, max=BACKOFF_MAX),
                                stop=self._stop, sleep=self._pause, before_sleep=self._failed,
                                reraise=True)
            client: redis.Redis | None = None
            try:
                client = retrying(self._open)
                self._read(client)
            except _Stopped:
                pass
            except Exception as exc:  # a lost connection: reconnect, with back-off
                if not self._stopping.is_set():
                    log.warning("Redis source %s: %s; reconnecting", self.info.name, _what(exc))
            finally:
                self._connected.clear()
                if client is not None:
                    self._last_flush(client)
                    client.close()

    def _stop(self, state: RetryCallState) -> bool:
        return self._stopping.is_set()

    def _pause(self, seconds: float) -> None:
        self._stopping.wait(seconds)  # stop() cuts the back-off short

    def _failed(self, state: RetryCallState) -> None:
        if state.attempt_number == 1 or state.attempt_number % 20 == 0:  # not every second
            error = state.outcome.exception() if state.outcome is not None else None
            log.warning("Redis source %s: attempt %d to connect to %s failed (%s); trying "
                        "again", self.info.name, state.attempt_number, _where(self.config.url),
                        _what(error))

    def _open(self) -> redis.Redis:
        """One attempt: a connection, the groups, the acknowledgements still owed, then the
        consumer's own pending entries and the idle ones of others taken in."""
        config = self.config
        # No retries inside redis-py: a lost reply must be seen here (the entries it carried
        # are pending at this consumer and are read again below).
        client = redis.Redis.from_url(config.url, retry=Retry(NoBackoff(), 0),
                                      socket_connect_timeout=5.0,
                                      socket_timeout=config.block + 10.0)
        try:
            client.ping()
            for stream in config.streams:
                try:
                    client.xgroup_create(stream, config.group, id=config.start, mkstream=True)
                except redis.ResponseError as exc:
                    if not str(exc).startswith("BUSYGROUP"):
                        raise
            self.counts.connections += 1
            self._connected.set()
            self._flush(client)
            self._claim(client)
        except BaseException:
            self._connected.clear()
            client.close()
            raise
        return client

    def _read(self, client: redis.Redis) -> None:
        """New entries (``>``), merged across the streams in time order (:class:`Merge`): while
        a stream is behind, the laggard is read without waiting; once all are caught up, all
        are read, waiting at most ``block``."""
        config = self.config
        block = max(1, int(config.block * 1000))
        # A new connection: what the last one's merge held is pending at this consumer, read
        # again first (with what an earlier incarnation left), then each stream from there.
        merge = self._merge = Merge(config.streams)
        by_stream: dict[str, list[Taken]] = {}
        for item in self._map(client, self._recover(client)):
            by_stream.setdefault(item[2], []).append(item)
        for stream, taken in by_stream.items():
            merge.add(stream, taken, True)
        while not self._stopping.is_set():
            self._flush(client)
            now = time.monotonic()
            if now - self._claimed_at >= config.claim_idle:
                self._claim(client)
            if now - self._measured_at >= LAG_EVERY:
                self._measure(client)
            self._room()
            laggard = merge.next()
            streams = {laggard: ">"} if laggard is not None else {
                stream: ">" for stream in config.streams}
            reply = client.xreadgroup(config.group, config.consumer, streams,  # type: ignore[arg-type]
                                      count=config.count,
                                      block=None if laggard is not None else block)
            entries = _entries(reply)
            self.counts.read += len(entries)
            by_stream = {stream: [] for stream in streams}
            counted = dict.fromkeys(streams, 0)
            for item in self._map(client, entries):
                by_stream[item[2]].append(item)
            for stream, _, _ in entries:
                counted[stream] += 1
            for stream, taken in by_stream.items():
                merge.add(stream, taken, counted[stream] >= config.count)
            self._hand(client, merge.due())

    def _measure(self, client: redis.Redis) -> None:
        """The group's lag over the streams: entries not delivered yet plus those pending
        (Redis 7's XINFO GROUPS ``lag``; an older server: pending only)."""
        self._measured_at = time.monotonic()
        total = 0
        with contextlib.suppress(redis.RedisError):
            for stream in self.config.streams:
                for group in client.xinfo_groups(stream):
                    name = group.get("name")
                    if isinstance(name, bytes | str) and _text_of(name) == self.config.group:
                        total += int(group.get("lag") or 0) + int(group.get("pending") or 0)
            self.counts.lag = total

    def _recover(self, client: redis.Redis) -> list[Entry]:
        """The entries pending at this consumer (read by an earlier incarnation or before the
        connection was lost, never acknowledged), from the first, of every stream."""
        found: list[Entry] = []
        for stream in self.config.streams:
            after = "0"
            while not self._stopping.is_set():
                reply = client.xreadgroup(self.config.group, self.config.consumer,
                                          {stream: after}, count=self.config.count)
                entries = _entries(reply)
                if not entries:
                    break
                after = entries[-1][1]
                fresh = self._not_in_flight(entries)
                self.counts.recovered += len(fresh)
                self.counts.read += len(fresh)
                found += fresh
        return found

    def _claim(self, client: redis.Redis) -> None:
        """XAUTOCLAIM: the entries pending longer than ``claim_idle`` at any consumer (one that
        crashed — or this one, when an acknowledgement is overdue) become this one's and are
        taken in. Entries deleted meanwhile are dead letters (Redis drops them from the list)."""
        config = self.config
        idle = int(config.claim_idle * 1000)
        for stream in config.streams:
            cursor = "0-0"
            while not self._stopping.is_set():
                reply = client.xautoclaim(stream, config.group, config.consumer, idle,
                                          start_id=cursor, count=config.count)
                cursor = _text_of(reply[0])
                entries = [(stream, _text_of(i), f) for i, f in reply[1] if i is not None]
                fresh = self._not_in_flight(entries)
                deleted = reply[2] if len(reply) > 2 else []  # Redis 7: gone from the stream
                gone: list[Entry] = [(stream, _text_of(i), {}) for i in deleted]
                self.counts.claimed += len(fresh) + len(gone)
                self.counts.read += len(fresh) + len(gone)
                self._take(client, [*fresh, *gone])
                if cursor == "0-0":
                    break
        self._claimed_at = time.monotonic()

    def _not_in_flight(self, entries: list[Entry]) -> list[Entry]:
        with self._lock:
            return [e for e in entries if (e[0], e[1]) not in self._flight]

    def _take(self, client: redis.Redis, entries: list[Entry]) -> None:
        """Map the entries; dead letters recorded and acknowledged, the events handed to
        ``ingest`` in time order (each stream's own order kept within an instant)."""
        mapped = self._map(client, entries)
        mapped.sort(key=lambda m: m[0])  # stable: each stream's order kept
        self._hand(client, mapped)

    def _map(self, client: redis.Redis, entries: list[Entry]) -> list[Taken]:
        """The entries' events, in their order; a dead letter recorded and acknowledged."""
        mapped: list[Taken] = []
        dead: list[tuple[str, str]] = []
        for stream, entry_id, fields in entries:
            out = entry_event(self.config, stream, entry_id, fields)
            if isinstance(out, SourceDeadLetter):
                self.dead_letter(out)
                dead.append((stream, entry_id))
            else:
                mapped.append((out.event.time, out.line, stream, entry_id))
        if dead:
            self.counts.dead_lettered += len(dead)
            self._xack(client, dead)
        return mapped

    def _hand(self, client: redis.Redis, mapped: list[Taken]) -> None:
        """Events to ``ingest``, in the order given; XACKed once it acknowledges."""
        if not mapped:
            return
        keys = [(stream, entry_id) for _, _, stream, entry_id in mapped]
        with self._lock:
            self._flight.update(keys)
        done = threading.Event()

        def ack() -> None:
            with self._lock:
                if not done.is_set():
                    done.set()
                    self._acks.extend(keys)
                    self._lock.notify_all()

        try:
            self.ingest([line for _, line, _, _ in mapped], ack)
        except BaseException:
            with self._lock:  # not taken: read again from the pending list after reconnecting
                self._flight.difference_update(keys)
            raise
        self.counts.ingested += len(mapped)
        self._flush(client)

    def _room(self) -> None:
        """Wait while too many entries are handed to ingest and not acknowledged."""
        with self._lock:
            while (len(self._flight) - len(self._acks) >= MAX_IN_FLIGHT
                   and not self._stopping.is_set()):
                self._lock.wait(0.1)
        if self._stopping.is_set():
            raise _Stopped

    def _flush(self, client: redis.Redis) -> None:
        """XACK what ``ingest`` acknowledged (kept for the next try if Redis is unreachable)."""
        with self._lock:
            owed = list(self._acks)
        if owed:
            self._xack(client, owed)
            with self._lock:
                del self._acks[:len(owed)]
                self._flight.difference_update(owed)

    def _xack(self, client: redis.Redis, keys: Iterable[tuple[str, str]]) -> None:
        by_stream: dict[str, list[str]] = {}
        for stream, entry_id in keys:
            by_stream.setdefault(stream, []).append(entry_id)
        for stream, ids in by_stream.items():
            client.xack(stream, self.config.group, *ids)
            self.counts.acked += len(ids)

    def _last_flush(self, client: redis.Redis) -> None:
        # What is not acknowledged stays pending: taken in again (a duplicate) next time.
        with contextlib.suppress(redis.RedisError):
            self._flush(client)


def _entries(reply: Any) -> list[Entry]:
    """XREADGROUP's answer (``[[stream, [(id, fields), …]], …]``) as (stream, id, fields)."""
    return [(_text_of(stream), _text_of(entry_id), fields or {})
            for stream, entries in reply or () for entry_id, fields in entries
            if entry_id is not None]


def _text_of(value: bytes | str) -> str:
    return value.decode("utf-8") if isinstance(value, bytes) else value


def _what(exc: BaseException | None) -> str:
    return f"{type(exc).__name__}: {exc}" if exc is not None else "no error"


__all__ = ["DEFAULT_SOURCE", "Counts", "Merge", "RedisSource", "RedisSourceConfig", "entry_event",
           "parse_config"]
