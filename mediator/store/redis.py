"""The deployed store: Redis (``redis://host:port/db?prefix=evamed:``).

Keys, all under the prefix (default ``evamed:``; names are percent-encoded, so a ``:`` in a
client or subscription name cannot run into the next part):

* ``schema`` — the layout version (base.SCHEMA_VERSION); ``meta`` — a hash of settings.
* ``client:<name>`` — a hash per client record; ``clients`` — the set of names;
  ``tokens`` — a hash token hash → name (checked against the record, so a stale entry of a
  replaced token finds nothing).
* ``sub:<owner>:<name>`` — a hash per subscription record, plus ``head`` (the notification
  log's last position, never reset by trimming) and ``kept`` (the retention of the last trim);
  ``subs`` — the set of ``<owner>:<name>``; ``owned:<owner>`` — the set of the owner's
  ``<name>`` s (its count is the limit per client's, SCARD; a store written before these sets
  were kept gets them from ``subs`` when opened, once, as one script).
* ``events`` — the event log, a stream with ids ``<position>-0``; ``events:head`` its counter.
* ``link:<name>`` — an autonomous service's link log, a stream with ids ``<position>-0``
  (fields ``number``, ``payload``); ``link:<name>:head`` — a hash of its ``head`` position and
  the newest message ``number`` appended.
* ``composer`` — the composer log, a stream with ids ``<position>-0`` (fields ``line``,
  ``time``, ``source``, ``id``, ``type``, ``via``); ``composer:head`` its counter;
  ``composer:ids`` — a hash from ``[source, id]`` (and ``["", id]``: the newest of that id) to
  the position of the event's line, kept with the stream (trimmed with it).
* ``checkpoints`` — a hash of the kept checkpoints by number; ``checkpoints:number`` its
  counter.
* ``deadletters`` — the dead-letter log, a stream with ids ``<position>-0`` (fields
  ``reason``, ``source``, ``detail``, ``time``, ``client``, ``where``, ``id``, ``raw``,
  ``size``, ``kind``); ``deadletters:head`` its counter; ``deadletters:republished`` — a hash
  position → when it was published again.
* ``log:<owner>:<name>`` — the notification log, a stream with ids ``<position>-0``;
  ``ids:<owner>:<name>`` — the set of its composite ids (the dedupe; not trimmed with the log).

Appends are Lua scripts (atomic: the counter, the dedupe check and the XADDs run as one
command), trimming is XTRIM. Durability is the server's: with ``appendonly yes`` an
acknowledged append is in the AOF (docs/operations.md, Stores). The client is redis-py's,
thread-safe through its connection pool.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Sequence
from typing import Any, ParamSpec, TypeVar
from urllib.parse import parse_qs, quote, unquote, urlencode, urlsplit, urlunsplit

import redis
from redis.connection import URL_QUERY_ARGUMENT_PARSERS, parse_url

from mediator.logs import redact
from mediator.store.base import (
    SCHEMA_VERSION,
    ClientRecord,
    ComposerLine,
    DeadLetterRecord,
    LoggedEvent,
    LoggedMessage,
    LoggedNotification,
    StoreError,
    SubscriptionRecord,
    check_read,
    check_retention,
)

DEFAULT_PREFIX = "evamed:"
SCHEMES = ("redis", "rediss")

# KEYS: events:head, events. ARGV: the lines. Returns the new head.
_APPEND_EVENTS = """
local head = redis.call('INCRBY', KEYS[1], #ARGV)
local first = head - #ARGV
for i = 1, #ARGV do
  redis.call('XADD', KEYS[2], string.format('%d-0', first + i), 'line', ARGV[i])
end
return head
"""

# KEYS: link:<name>:head, link:<name>. ARGV: number, payload, number, payload, ... Appends the
# messages numbered after the newest appended; returns {head, newest number}.
_APPEND_LINK = """
local head = tonumber(redis.call('HGET', KEYS[1], 'head') or '0')
local number = tonumber(redis.call('HGET', KEYS[1], 'number') or '0')
for i = 1, #ARGV, 2 do
  local given = tonumber(ARGV[i])
  if given > number then
    head = head + 1
    number = given
    redis.call('XADD', KEYS[2], string.format('%d-0', head), 'number', ARGV[i], 'payload', ARGV[i + 1])
  end
end
redis.call('HSET', KEYS[1], 'head', head, 'number', number)
return {head, number}
"""

# KEYS: composer:head, composer, composer:ids. ARGV: per line 8 values — line, time, source,
# id, type, via, and the event's two hash fields ("" for a watermark line: no id). Returns the
# head. (The fields are written by Python: cjson would escape a "/" where json does not.)
_APPEND_COMPOSER = """
local n = #ARGV / 8
local head = redis.call('INCRBY', KEYS[1], n)
local first = head - n
for i = 0, n - 1 do
  local at = first + i + 1
  local a = i * 8
  redis.call('XADD', KEYS[2], string.format('%d-0', at), 'line', ARGV[a + 1], 'time', ARGV[a + 2],
             'source', ARGV[a + 3], 'id', ARGV[a + 4], 'type', ARGV[a + 5], 'via', ARGV[a + 6],
             'key', ARGV[a + 7], 'any', ARGV[a + 8])
  if ARGV[a + 4] ~= '' then
    redis.call('HSET', KEYS[3], ARGV[a + 7], at, ARGV[a + 8], at)
  end
end
return head
"""

# KEYS: composer, composer:ids. ARGV: the first position kept. Drops the lines before it and
# their hash fields (a field naming a newer line of the same id stays). Returns the count.
_TRIM_COMPOSER = """
local gone = redis.call('XRANGE', KEYS[1], '-', '(' .. ARGV[1] .. '-0')
for _, entry in ipairs(gone) do
  local fields = {}
  for j = 1, #entry[2], 2 do fields[entry[2][j]] = entry[2][j + 1] end
  if fields['id'] ~= '' then
    local at = string.match(entry[1], '^(%d+)')
    for _, f in ipairs({fields['key'], fields['any']}) do
      if redis.call('HGET', KEYS[2], f) == at then redis.call('HDEL', KEYS[2], f) end
    end
  end
end
redis.call('XTRIM', KEYS[1], 'MINID', ARGV[1] .. '-0')
return #gone
"""

# KEYS: deadletters:head, deadletters. ARGV: per letter 10 values (the record's fields).
# Returns the head.
_APPEND_DEAD = """
local n = #ARGV / 10
local head = redis.call('INCRBY', KEYS[1], n)
local first = head - n
for i = 0, n - 1 do
  local a = i * 10
  redis.call('XADD', KEYS[2], string.format('%d-0', first + i + 1), 'reason', ARGV[a + 1],
             'source', ARGV[a + 2], 'detail', ARGV[a + 3], 'time', ARGV[a + 4],
             'client', ARGV[a + 5], 'where', ARGV[a + 6], 'id', ARGV[a + 7], 'raw', ARGV[a + 8],
             'size', ARGV[a + 9], 'kind', ARGV[a + 10])
end
return head
"""

# KEYS: sub, log, ids. ARGV: id, payload, id, payload, ... Returns, per appended item, its index
# in the batch (from 0) and its position. A subscription that is not stored gets nothing.
_APPEND_NOTIFICATIONS = """
if redis.call('EXISTS', KEYS[1]) == 0 then return {} end
local head = tonumber(redis.call('HGET', KEYS[1], 'head') or '0')
local out = {}
for i = 1, #ARGV, 2 do
  if redis.call('SADD', KEYS[3], ARGV[i]) == 1 then
    head = head + 1
    redis.call('XADD', KEYS[2], string.format('%d-0', head), 'id', ARGV[i], 'payload', ARGV[i + 1])
    out[#out + 1] = (i - 1) / 2
    out[#out + 1] = head
  end
end
redis.call('HSET', KEYS[1], 'head', head)
return out
"""

# KEYS: sub, log. ARGV: keep. Returns how many entries were dropped.
_TRIM_NOTIFICATIONS = """
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
redis.call('HSET', KEYS[1], 'kept', ARGV[1])
return redis.call('XTRIM', KEYS[2], 'MAXLEN', ARGV[1])
"""

# KEYS: meta, subs. ARGV: the meta field marking it done, the prefix of the owned sets.
# Fills the per-owner sets from `subs` once, atomically (a put or delete running meanwhile
# waits). Members are <owner>:<name> percent-encoded, so the first ':' ends the owner.
_INDEX_OWNERS = """
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 1 then return 0 end
local members = redis.call('SMEMBERS', KEYS[2])
for _, member in ipairs(members) do
  local colon = string.find(member, ':', 1, true)
  redis.call('SADD', ARGV[2] .. string.sub(member, 1, colon - 1), string.sub(member, colon + 1))
end
redis.call('HSET', KEYS[1], ARGV[1], 1)
return #members
"""
OWNERS_INDEXED = "store.owners-indexed"
"""The ``meta`` field saying the ``owned:<owner>`` sets are complete."""

_P = ParamSpec("_P")
_R = TypeVar("_R")


def _failures(method: Callable[_P, _R]) -> Callable[_P, _R]:
    """A Redis failure (the server gone, a timeout) becomes a StoreError; redis-py has already
    retried a dropped connection."""
    @functools.wraps(method)
    def call(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        try:
            return method(*args, **kwargs)
        except redis.RedisError as exc:
            raise StoreError(f"the Redis store failed: {exc}") from None
    return call


def redis_options(url: str) -> tuple[str, str]:
    """(the connection URL for redis-py, the key prefix) of a store URL; ValueError naming what is
    wrong. Checked here so that a typo is a clear error, not a connection that fails later."""
    expected = "expected redis://[:password@]host[:port][/db][?prefix=evamed:]"
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        # Not the parser's words: they quote the URL's pieces, a password's among them.
        raise ValueError("bad Redis store URL: its host:port part is not host[:port] (a "
                         "password holding / ? # or @ must be percent-encoded, %2F for /); "
                         f"{expected}") from None
    if parts.scheme not in SCHEMES:
        raise ValueError(f"a Redis store URL starts with redis:// or rediss://, got "
                         f"{parts.scheme or 'no scheme'}; {expected}")
    if not parts.hostname:
        raise ValueError(f"the Redis store URL names no host; {expected}")
    if port == 0:
        raise ValueError(f"the Redis store URL has port 0; {expected}")
    db = parts.path.strip("/")
    if db and not (db.isascii() and db.isdigit()):
        raise ValueError(f"the Redis database is a number, got {db!r}; {expected}")
    try:
        query = parse_qs(parts.query, keep_blank_values=True, strict_parsing=bool(parts.query))
    except ValueError:
        raise ValueError(f"the Redis store URL's query {parts.query!r} is not name=value&...; "
                         f"{expected}") from None
    prefixes = query.pop("prefix", [DEFAULT_PREFIX])
    if len(prefixes) != 1 or not prefixes[0]:
        raise ValueError(f"the Redis store URL's key prefix is empty or given more than once; "
                         f"{expected}")
    unknown = sorted(set(query) - set(URL_QUERY_ARGUMENT_PARSERS))
    if unknown:
        raise ValueError(f"unknown Redis store URL parameter {', '.join(unknown)}; expected "
                         f"prefix or one of redis-py's: {', '.join(URL_QUERY_ARGUMENT_PARSERS)}")
    connection = urlunsplit(parts._replace(query=urlencode(query, doseq=True), fragment=""))
    try:
        parse_url(connection)  # type: ignore[no-untyped-call]  # redis-py reads the values
    except ValueError as exc:
        raise ValueError(f"bad Redis store URL ({redact(str(exc))}); {expected}") from None
    return connection, prefixes[0]


def _where(url: str) -> str:
    """host:port/db of a URL, for messages: never the password."""
    parts = urlsplit(url)
    return f"{parts.hostname}:{parts.port or 6379}/{parts.path.strip('/') or '0'}"


def _names(*names: str) -> str:
    return ":".join(quote(name, safe="") for name in names)


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _field(source: str, ident: str) -> str:
    """The composer log's hash field of an event."""
    return json.dumps([source, ident])


def _composer_line(position: int, fields: dict[bytes, bytes]) -> ComposerLine:
    via = json.loads(fields[b"via"])
    return ComposerLine(_text(fields[b"line"]), int(fields[b"time"]), _text(fields[b"source"]),
                        _text(fields[b"id"]), _text(fields[b"type"]),
                        tuple((str(s), str(h)) for s, h in via), position)


def _entries(reply: Any) -> list[tuple[int, dict[bytes, bytes]]]:
    """An XRANGE reply as (position, fields): the ids are ``<position>-0``."""
    return [(int(stream_id.split(b"-", 1)[0]), fields) for stream_id, fields in reply or []]


class RedisStore:
    """The :class:`~mediator.store.base.Store` in Redis."""

    def __init__(self, url: str) -> None:
        connection, self.prefix = redis_options(url)
        self.url = connection  # for a reader of its own: the Spark composer's (its password too)
        self.where = _where(connection)
        self._redis = redis.Redis.from_url(connection)
        try:
            self._redis.set(self._k("schema"), SCHEMA_VERSION, nx=True)
            version = int(self._redis.get(self._k("schema")) or SCHEMA_VERSION)
        except (redis.RedisError, ValueError) as exc:
            self._redis.close()
            raise StoreError(f"cannot open the Redis store at {self.where} "
                             f"(prefix {self.prefix!r}): {exc}") from None
        if version > SCHEMA_VERSION:
            self._redis.close()
            raise StoreError(f"the Redis store at {self.where} (prefix {self.prefix!r}) has schema "
                             f"version {version}; this evamed reads version {SCHEMA_VERSION}")
        self._append_events = self._redis.register_script(_APPEND_EVENTS)
        self._append_notifications = self._redis.register_script(_APPEND_NOTIFICATIONS)
        self._trim_notifications = self._redis.register_script(_TRIM_NOTIFICATIONS)
        self._append_link = self._redis.register_script(_APPEND_LINK)
        self._append_composer = self._redis.register_script(_APPEND_COMPOSER)
        self._trim_composer = self._redis.register_script(_TRIM_COMPOSER)
        self._append_dead = self._redis.register_script(_APPEND_DEAD)
        try:
            self._redis.register_script(_INDEX_OWNERS)(
                keys=[self._k("meta"), self._k("subs")], args=[OWNERS_INDEXED, self._k("owned:")])
        except redis.RedisError as exc:
            self._redis.close()
            raise StoreError(f"cannot open the Redis store at {self.where} "
                             f"(prefix {self.prefix!r}): {exc}") from None

    def _k(self, kind: str, *names: str) -> str:
        return self.prefix + kind + (":" + _names(*names) if names else "")

    # -- clients

    @_failures
    def put_client(self, record: ClientRecord) -> None:
        key = self._k("client", record.name)
        old = self._redis.hget(key, "token_hash")
        with self._redis.pipeline() as tx:  # MULTI/EXEC
            if old is not None and _text(old) != record.token_hash:
                tx.hdel(self._k("tokens"), old)
            tx.hset(key, mapping={"token_hash": record.token_hash,
                                  "created_us": record.created_us,
                                  "revoked": int(record.revoked),
                                  "operator": int(record.operator),
                                  "sources": json.dumps(list(record.sources))})
            tx.sadd(self._k("clients"), record.name)
            tx.hset(self._k("tokens"), record.token_hash, record.name)
            tx.execute()

    @_failures
    def client(self, name: str) -> ClientRecord | None:
        fields = self._redis.hgetall(self._k("client", name))
        if not fields:
            return None
        granted = fields.get(b"sources")
        return ClientRecord(name, _text(fields[b"token_hash"]), int(fields[b"created_us"]),
                            fields[b"revoked"] == b"1", fields.get(b"operator") == b"1",
                            tuple(json.loads(granted)) if granted else ())

    @_failures
    def client_by_token_hash(self, token_hash: str) -> ClientRecord | None:
        name = self._redis.hget(self._k("tokens"), token_hash)
        record = None if name is None else self.client(_text(name))
        return record if record is not None and record.token_hash == token_hash else None

    @_failures
    def clients(self) -> list[ClientRecord]:
        names = sorted(_text(name) for name in self._redis.smembers(self._k("clients")))
        return [record for name in names if (record := self.client(name)) is not None]

    # -- subscriptions

    @_failures
    def put_subscription(self, record: SubscriptionRecord) -> None:
        # HSET of the record's fields only: the log's head and retention stay
        with self._redis.pipeline() as tx:
            tx.hset(self._k("sub", record.owner, record.name), mapping={
                "text": record.text, "created_us": record.created_us,
                "start_position": record.start_position,
                "start_time": "" if record.start_time is None else record.start_time,
                "plans": record.plans, "links": record.links})
            tx.sadd(self._k("subs"), _names(record.owner, record.name))
            tx.sadd(self._k("owned", record.owner), _names(record.name))
            tx.execute()

    @_failures
    def subscription(self, owner: str, name: str) -> SubscriptionRecord | None:
        fields = self._redis.hgetall(self._k("sub", owner, name))
        if b"text" not in fields:
            return None
        start_time = fields[b"start_time"]
        return SubscriptionRecord(owner, name, _text(fields[b"text"]), int(fields[b"created_us"]),
                                  int(fields[b"start_position"]),
                                  int(start_time) if start_time else None, _text(fields[b"plans"]),
                                  _text(fields.get(b"links", b"")))

    @_failures
    def subscriptions(self, owner: str | None = None) -> list[SubscriptionRecord]:
        if owner is None:
            pairs = sorted(tuple(unquote(part) for part in _text(member).split(":"))
                           for member in self._redis.smembers(self._k("subs")))
        else:
            pairs = sorted((owner, unquote(_text(member)))
                           for member in self._redis.smembers(self._k("owned", owner)))
        return [record for who, name in pairs
                if (record := self.subscription(who, name)) is not None]

    @_failures
    def count_subscriptions(self, owner: str) -> int:
        return int(self._redis.scard(self._k("owned", owner)))

    @_failures
    def delete_subscription(self, owner: str, name: str) -> bool:
        with self._redis.pipeline() as tx:
            tx.delete(self._k("sub", owner, name))
            tx.delete(self._k("log", owner, name), self._k("ids", owner, name))
            tx.srem(self._k("subs"), _names(owner, name))
            tx.srem(self._k("owned", owner), _names(name))
            deleted, *_ = tx.execute()
        return bool(deleted)

    # -- the event log

    @_failures
    def append_events(self, lines: Sequence[str]) -> int:
        if not lines:
            return self.event_head()
        return int(self._append_events(keys=[self._k("events:head"), self._k("events")],
                                       args=list(lines)))

    @_failures
    def read_events(self, after: int, limit: int = 1000) -> list[LoggedEvent]:
        check_read(after, limit)
        entries = self._redis.xrange(self._k("events"), f"{after + 1}-0", "+", count=limit)
        return [LoggedEvent(position, _text(fields[b"line"])) for position, fields in _entries(entries)]

    @_failures
    def event_head(self) -> int:
        return int(self._redis.get(self._k("events:head")) or 0)

    @_failures
    def trim_events(self, before: int) -> int:
        # exact: redis-py's default (~) would keep whole macro-nodes
        return int(self._redis.xtrim(self._k("events"), minid=f"{max(before, 0)}-0",
                                     approximate=False))

    # -- link logs

    @_failures
    def append_link(self, link: str, items: Sequence[tuple[int, bytes]]) -> tuple[int, int]:
        args: list[int | bytes] = [part for item in items for part in item]
        head, number = self._append_link(keys=[self._k("link", link) + ":head",
                                               self._k("link", link)], args=args)
        return int(head), int(number)

    @_failures
    def read_link(self, link: str, after: int, limit: int = 1000) -> list[LoggedMessage]:
        check_read(after, limit)
        entries = self._redis.xrange(self._k("link", link), f"{after + 1}-0", "+", count=limit)
        return [LoggedMessage(position, int(fields[b"number"]), fields[b"payload"])
                for position, fields in _entries(entries)]

    @_failures
    def link_bounds(self, link: str) -> tuple[int, int]:
        head, number = self._redis.hmget(self._k("link", link) + ":head", ["head", "number"])
        return int(head or 0), int(number or 0)

    @_failures
    def renumber_link(self, link: str) -> None:
        self._redis.hset(self._k("link", link) + ":head", "number", 0)

    @_failures
    def trim_link(self, link: str, before: int) -> int:
        return int(self._redis.xtrim(self._k("link", link), minid=f"{max(before, 0)}-0",
                                     approximate=False))

    # -- the composer log

    @_failures
    def append_composer(self, lines: Sequence[ComposerLine]) -> int:
        if not lines:
            return self.composer_head()
        args: list[str | int] = []
        for c in lines:
            args += [c.line, c.time, c.source, c.id, c.type, json.dumps(c.via),
                     _field(c.source, c.id), _field("", c.id)]
        return int(self._append_composer(keys=[self._k("composer:head"), self._k("composer"),
                                               self._k("composer:ids")], args=args))

    @_failures
    def read_composer(self, after: int, limit: int = 1000) -> list[ComposerLine]:
        check_read(after, limit)
        entries = self._redis.xrange(self._k("composer"), f"{after + 1}-0", "+", count=limit)
        return [_composer_line(position, fields) for position, fields in _entries(entries)]

    @_failures
    def composer_head(self) -> int:
        return int(self._redis.get(self._k("composer:head")) or 0)

    @_failures
    def composer_events(self, keys: Sequence[tuple[str, str]]
                        ) -> dict[tuple[str, str], ComposerLine]:
        wanted = list(dict.fromkeys(keys))
        if not wanted:
            return {}
        found = self._redis.hmget(self._k("composer:ids"), [_field(*k) for k in wanted])
        with self._redis.pipeline(transaction=False) as tx:
            for position in found:
                if position is not None:
                    tx.xrange(self._k("composer"), f"{int(position)}-0", f"{int(position)}-0")
            replies = iter(tx.execute())
        out: dict[tuple[str, str], ComposerLine] = {}
        for key, position in zip(wanted, found, strict=True):
            if position is None:
                continue
            entries = _entries(next(replies))
            if entries:  # else trimmed meanwhile
                out[key] = _composer_line(*entries[0])
        return out

    @_failures
    def trim_composer(self, before: int) -> int:
        return int(self._trim_composer(keys=[self._k("composer"), self._k("composer:ids")],
                                       args=[max(before, 0)]))

    # -- notification logs

    @_failures
    def append_notifications(self, owner: str, name: str,
                             items: Sequence[tuple[str, bytes]]) -> list[LoggedNotification]:
        if not items:
            return []
        args: list[str | bytes] = [part for item in items for part in item]
        out = self._append_notifications(
            keys=[self._k("sub", owner, name), self._k("log", owner, name),
                  self._k("ids", owner, name)], args=args)
        return [LoggedNotification(int(position), items[int(index)][0], items[int(index)][1])
                for index, position in zip(out[::2], out[1::2], strict=True)]

    @_failures
    def read_notifications(self, owner: str, name: str, after: int,
                           limit: int = 1000) -> list[LoggedNotification]:
        check_read(after, limit)
        log = self._k("log", owner, name)
        with self._redis.pipeline() as tx:  # one snapshot: no trim between bounds and rows
            tx.hmget(self._k("sub", owner, name), ["head", "kept"])
            tx.xrange(log, "-", "+", count=1)
            tx.xrange(log, f"{after + 1}-0", "+", count=limit)
            (head, kept), oldest, entries = tx.execute()
        first = _entries(oldest)[0][0] if oldest else 0
        check_retention(owner, name, after, first, int(head or 0),
                        None if kept is None else int(kept))
        return [LoggedNotification(position, _text(fields[b"id"]), fields[b"payload"])
                for position, fields in _entries(entries)]

    @_failures
    def notification_bounds(self, owner: str, name: str) -> tuple[int, int]:
        with self._redis.pipeline() as tx:
            tx.hget(self._k("sub", owner, name), "head")
            tx.xrange(self._k("log", owner, name), "-", "+", count=1)
            head, oldest = tx.execute()
        last = int(head or 0)
        return (_entries(oldest)[0][0] if oldest else (last + 1 if last else 0), last)

    @_failures
    def trim_notifications(self, owner: str, name: str, keep: int) -> int:
        if keep < 0:
            raise ValueError(f"a retention is 0 or more entries, got {keep}")
        # MAXLEN (exact) is "keep the newest `keep`" as one command, whatever the head is now
        return int(self._trim_notifications(
            keys=[self._k("sub", owner, name), self._k("log", owner, name)], args=[keep]))

    # -- checkpoints

    @_failures
    def put_checkpoint(self, data: bytes, keep: int = 2) -> int:
        number = int(self._redis.incr(self._k("checkpoints:number")))
        with self._redis.pipeline() as tx:
            tx.hset(self._k("checkpoints"), str(number), data)
            tx.hkeys(self._k("checkpoints"))
            _, found = tx.execute()
        old = [k for k in found if int(k) <= number - max(keep, 1)]
        if old:
            self._redis.hdel(self._k("checkpoints"), *old)
        return number

    @_failures
    def checkpoints(self) -> list[tuple[int, bytes]]:
        found = self._redis.hgetall(self._k("checkpoints"))
        return sorted(((int(k), v if isinstance(v, bytes) else v.encode())
                       for k, v in found.items()), reverse=True)

    # -- the dead-letter log

    @_failures
    def append_dead_letters(self, records: Sequence[DeadLetterRecord]) -> int:
        if not records:
            return self.dead_letter_bounds()[1]
        args: list[str | int | bytes] = []
        for r in records:
            args += [r.reason, r.source, r.detail, r.time_us, r.client, r.where, r.event_id,
                     r.raw, r.size, r.kind]
        return int(self._append_dead(keys=[self._k("deadletters:head"),
                                           self._k("deadletters")], args=args))

    @_failures
    def read_dead_letters(self, after: int, limit: int = 1000, *, reason: str = "",
                          source: str = "", client: str = "") -> list[DeadLetterRecord]:
        check_read(after, limit)
        wanted = {b"reason": reason, b"source": source, b"client": client}
        out: list[DeadLetterRecord] = []
        stream = self._k("deadletters")
        while len(out) < limit:
            entries = _entries(self._redis.xrange(stream, f"{after + 1}-0", "+",
                                                  count=max(limit, 500)))
            if not entries:
                break
            positions = [p for p, _ in entries]
            again = self._redis.hmget(self._k("deadletters:republished"), positions)
            for (position, fields), republished in zip(entries, again, strict=True):
                if all(not v or _text(fields[k]) == v for k, v in wanted.items()):
                    out.append(DeadLetterRecord(
                        _text(fields[b"reason"]), _text(fields[b"source"]),
                        _text(fields[b"detail"]), int(fields[b"time"]),
                        _text(fields[b"client"]), _text(fields[b"where"]),
                        _text(fields[b"id"]), bytes(fields[b"raw"]), int(fields[b"size"]),
                        _text(fields[b"kind"]), position, int(republished or 0)))
                    if len(out) == limit:
                        break
            after = entries[-1][0]
        return out

    @_failures
    def dead_letter_bounds(self) -> tuple[int, int]:
        with self._redis.pipeline() as tx:
            tx.get(self._k("deadletters:head"))
            tx.xrange(self._k("deadletters"), "-", "+", count=1)
            head, oldest = tx.execute()
        return (_entries(oldest)[0][0] if oldest else 0), int(head or 0)

    @_failures
    def mark_republished(self, position: int, time_us: int) -> bool:
        if not self._redis.xrange(self._k("deadletters"), f"{position}-0", f"{position}-0"):
            return False
        self._redis.hset(self._k("deadletters:republished"), str(position), time_us)
        return True

    @_failures
    def trim_dead_letters(self, keep: int) -> int:
        if keep < 0:
            raise ValueError(f"a retention is 0 or more entries, got {keep}")
        head = int(self._redis.get(self._k("deadletters:head")) or 0)
        dropped = int(self._redis.xtrim(self._k("deadletters"), minid=f"{head - keep + 1}-0",
                                        approximate=False)) if head > keep else 0
        if dropped:
            again = self._k("deadletters:republished")
            gone = [f for f in self._redis.hkeys(again) if int(f) <= head - keep]
            if gone:
                self._redis.hdel(again, *gone)
        return dropped

    # -- meta

    @_failures
    def get_meta(self, key: str) -> str | None:
        value = self._redis.hget(self._k("meta"), key)
        return None if value is None else _text(value)

    @_failures
    def set_meta(self, key: str, value: str) -> None:
        self._redis.hset(self._k("meta"), key, value)

    def close(self) -> None:
        self._redis.close()

