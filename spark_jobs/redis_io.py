"""Deployed mode: the Redis notification log in, composites back to Redis.

* ``RedisStreamSource`` — a Python streaming Data Source over a Redis stream (default key
  ``evamed:notifications``, one CloudEvent JSON per entry in field ``event``). Offsets are
  stream ids, so a restarted query resumes exactly after the last committed entry.
* ``redis_sink`` — a ``foreachBatch`` writer: each composite is stored once under its id
  (``HSETNX evamed:composites``) and appended to ``evamed:composites:log`` only when new, so a
  batch re-run after a restart writes nothing twice. Dead letters go to
  ``evamed:dead-letters`` the same way (keyed by a hash of their content).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition

NOTIFICATIONS = "evamed:notifications"
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
        self.stream = options.get("stream", NOTIFICATIONS)

    def _client(self) -> Any:
        import redis

        return redis.Redis.from_url(self.url, decode_responses=True)

    def initialOffset(self) -> dict[str, Any]:
        return {"id": "0-0"}

    def latestOffset(self, start: dict[str, Any], limit: Any) -> dict[str, Any]:
        newest = self._client().xrevrange(self.stream, "+", "-", count=1)
        return {"id": newest[0][0]} if newest else (start or self.initialOffset())

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        return [_Range(start["id"], end["id"])]

    def read(self, partition: InputPartition) -> Iterator[tuple[str, int]]:
        assert isinstance(partition, _Range)
        if partition.start == partition.end:
            return
        client = self._client()
        cursor = partition.start
        while True:  # (start, end], in pages
            page = client.xrange(self.stream, f"({cursor}", partition.end, count=10_000)
            if not page:
                return
            for stream_id, fields in page:
                yield (fields.get("event", ""), _seq(stream_id))
            cursor = page[-1][0]
            if cursor == partition.end:
                return

    def commit(self, end: dict[str, Any]) -> None:
        pass  # the log is the mediator's: it trims it, not this reader


class RedisStreamSource(DataSource):
    """``spark.readStream.format("evamed_redis").option("url", …).option("stream", …)``."""

    @classmethod
    def name(cls) -> str:
        return "evamed_redis"

    def schema(self) -> str:
        return "value STRING, seq LONG"

    def streamReader(self, schema: Any) -> DataSourceStreamReader:
        return _Reader(dict(self.options))


def redis_lines(spark: Any, url: str, stream: str = NOTIFICATIONS) -> Any:
    spark.dataSource.register(RedisStreamSource)
    return (spark.readStream.format("evamed_redis").option("url", url).option("stream", stream)
            .load())


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
