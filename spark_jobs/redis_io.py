"""Deployed mode: the Redis store's event log in, composites back to Redis.

* ``RedisStreamSource`` — a Python streaming Data Source over a Redis stream: by default the
  Redis store's event log (mediator/store/redis.py: the stream ``evamed:events``, one
  CloudEvent JSON per entry in field ``line``, ids ``<position>-0``), so the job reads what
  ``Publish`` accepted; the mediator's live composer reads the store's composer log
  (``<prefix>composer``, same field and ids) with option ``positions``: each row's ``seq`` is
  then the entry's position (the id's first part), as the SQLite log gives it — the profile
  table names composer-log positions (``Registration.after``). Offsets are stream ids, so a
  restarted query resumes exactly after the last committed entry. Options ``cap``,
  ``max_rows`` and ``releases`` as for the SQLite log (spark_jobs/log_source.py): with the
  store's ids a cap file's position is the id ``<position>-0``.
* ``redis_sink`` — a ``foreachBatch`` writer for ``evamed compose --redis``: each composite is
  stored once under its id (``HSETNX evamed:composites``) and appended to
  ``evamed:composites:log`` only when new, so a batch re-run after a restart writes nothing
  twice. Dead letters go to ``evamed:dead-letters`` the same way (keyed by a hash of their
  content). (The mediator's live composer appends to the subscriptions' logs instead, through
  the store: spark_jobs/composer.py.)
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadLimit, ReadMaxRows

from spark_jobs.log_source import LogSource, bounded, in_releases, read_cap, read_limit
from spark_jobs.processor import MARK

EVENTS = "evamed:events"
"""The Redis store's event log under its default prefix (``<prefix>events``)."""
FIELD = "line"
"""The entry field holding the CloudEvent, as the store writes it."""
COMPOSITES = "evamed:composites"
COMPOSITE_LOG = "evamed:composites:log"
DEAD_LETTERS = "evamed:dead-letters"


def _seq(stream_id: str) -> int:
    """A stream id ("<ms>-<n>") as one increasing number: the arrival order."""
    ms, _, n = stream_id.partition("-")
    return int(ms) * 1_000_000 + int(n or 0)


class _Range(InputPartition):
    def __init__(self, start: str, end: str) -> None:
        self.start = start
        self.end = end


class _Reader(DataSourceStreamReader):
    def __init__(self, options: dict[str, str]) -> None:
        self.url = options.get("url", "redis://127.0.0.1:6379")
        self.stream = options.get("stream", EVENTS)
        self.field = options.get("field", FIELD)
        self.cap = options.get("cap")
        self.start = options.get("start", "0-0")  # a fresh query reads the entries after it
        self.positions = options.get("positions", "false") == "true"  # seq: the position
        self.releases = options.get("releases", "false") == "true"
        self.limit = read_limit(options)

    def _client(self) -> Any:
        import redis

        return redis.Redis.from_url(self.url, decode_responses=True)

    def initialOffset(self) -> dict[str, Any]:
        return {"id": self.start}

    def getDefaultReadLimit(self) -> ReadLimit:
        return self.limit

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        start = start or self.initialOffset()
        cap = read_cap(self.cap)
        end = "+" if cap is None else f"{cap}-0"
        client = self._client()
        if isinstance(limit, ReadMaxRows):
            found = client.xrange(self.stream, f"({start['id']}", end, count=limit.max_rows)
            if self.releases and len(found) == limit.max_rows:
                found = self._release_end(client, found, end)
        else:
            found = client.xrevrange(self.stream, end, f"({start['id']}", count=1)
        # Nothing new (or a cap moved back, a restart's replay): the start as it is.
        return {"id": found[-1][0]} if found else start

    def _release_end(self, client: Any, found: list[Any], end: str) -> list[Any]:
        """The entries up to the last watermark line among ``found`` — else up to the first
        after them (the head and the cap are at one: a release is appended whole)."""
        for at in range(len(found) - 1, -1, -1):
            if found[at][1].get(self.field, "").startswith(MARK):
                return found[: at + 1]
        while True:
            more = client.xrange(self.stream, f"({found[-1][0]}", end, count=1000)
            if not more:
                return found
            for at, entry in enumerate(more):
                if entry[1].get(self.field, "").startswith(MARK):
                    return found + more[: at + 1]
            found = found + more

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        return [_Range(start["id"], end["id"])] if start["id"] != end["id"] else []

    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        assert isinstance(partition, _Range)
        rows = self._rows(partition)
        return in_releases(rows) if self.releases else rows

    def _rows(self, partition: _Range) -> Iterator[tuple[str, int]]:
        client = self._client()
        cursor = partition.start
        while True:  # (start, end], in pages
            page = client.xrange(self.stream, f"({cursor}", partition.end, count=10_000)
            if not page:
                return
            for stream_id, fields in page:
                seq = int(stream_id.partition("-")[0]) if self.positions else _seq(stream_id)
                yield (fields.get(self.field, ""), seq)
            cursor = page[-1][0]
            if cursor == partition.end:
                return

    def commit(self, end: dict[str, Any]) -> None:
        pass  # the log is the mediator's: it trims it, not this reader


class RedisStreamSource(LogSource):
    """``spark.readStream.format("evamed_redis").option("url", …)`` (options ``stream``,
    ``field``, ``start``, ``positions``, ``cap``, ``max_rows``: the module docstring)."""

    reader = _Reader

    @classmethod
    def name(cls) -> str:
        return "evamed_redis"


def redis_lines(spark: Any, url: str, stream: str = EVENTS, *, field: str = FIELD,
                cap: str | None = None, start: str = "0-0", max_rows: int | None = None,
                positions: bool = False, releases: bool = False) -> Any:
    """The stream's entries after id ``start`` as (value, seq) lines — (value, seq, clock)
    with ``releases`` —: by default the Redis store's event log; ``positions``: seq is the
    store's position of the entry."""
    spark.dataSource.register(RedisStreamSource)
    reader = (spark.readStream.format("evamed_redis").option("url", url)
              .option("stream", stream).option("field", field).option("start", start)
              .option("positions", "true" if positions else "false"))
    return bounded(reader, cap, max_rows, releases).load()


def redis_sink(url: str) -> Callable[[int, list[Any]], None]:
    def write(batch_id: int, rows: list[Any]) -> None:
        import redis

        client = redis.Redis.from_url(url, decode_responses=True)
        for row in rows:
            if row.kind == "composite":
                key, log, ident = COMPOSITES, COMPOSITE_LOG, row.ident
            else:
                key, log = DEAD_LETTERS, DEAD_LETTERS + ":log"
                ident = hashlib.blake2b(row.payload.encode(), digest_size=12).hexdigest()
            if client.hsetnx(key, ident, row.payload):
                client.xadd(log, {"id": ident, "event": row.payload})

    return write
