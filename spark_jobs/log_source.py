"""The embedded live feed: a Python streaming Data Source over a log table of the SQLite store
(mediator/store/sqlite.py: ``position, line`` rows, the head in ``counters`` under the table's
name) — the **composer log** (``composer_log``: the merged trace of what the Spark composer's
plans need, which the mediator's pipeline writes; docs/spark.md, "What runs where in the
mediator service") or the event log (``events``, the default: what ``Publish`` accepted) — so
the streaming job reads it itself, in log order. The deployed counterpart over the Redis
store's streams is spark_jobs/redis_io.py.

* Offsets are log positions (``{"position": n}``): a restarted query resumes after the last
  position its checkpoint committed, and a micro-batch re-run after a crash reads the same
  positions again.
* Rows are ``value STRING, seq LONG``: the line as accepted and its position (the arrival
  order the job keeps).
* ``table`` (option): the log table, ``events`` by default.
* ``cap`` (option): a file holding the newest position the job may read yet — the composer
  log's head the pipeline has written. A profile registered at composer-log position P sees
  the lines after P; the job never reads past P before that registration is in its profile
  table, so it never evaluates a line its profiles should have seen without them (and the
  processor skips the lines up to P for it: ``Registration.after``).
* ``max_rows`` (option): at most that many positions per micro-batch (a restart after a long
  stop catches up in bounded batches).
* ``releases`` (option, the composer log): the log is written in releases, each closed by a
  watermark line (spark_jobs/processor.py ``watermark_line``). Each row then carries a third
  column, ``clock``: its release's watermark; and a micro-batch ends at a watermark line
  (``max_rows`` is met at the last one within it; a release longer than that is read whole),
  so every event a micro-batch reads comes with the instant up to which its release is
  complete (spark_jobs/processor.py, "Ordered input").

It opens its own read-only connection (WAL: it reads while the mediator writes), in the
Python worker that plans the batches and in each task that reads one; never the store's.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Iterator, Sequence
from typing import Any, ClassVar
from urllib.parse import quote

from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows

from spark_jobs.processor import MARK, watermark_of

SCHEMA = "value STRING, seq LONG"
RELEASES = f"{SCHEMA}, clock LONG"
"""The rows of a log read in releases (option ``releases``)."""
TABLES = ("events", "composer_log")
"""The SQLite store's log tables a job may read."""
PAGE = 10_000
"""Rows per read: a batch's positions are read in pages, not as one result set."""


def read_cap(path: str | None) -> int | None:
    """The newest position the job may read, from the cap file (None: no cap). A file not yet
    written caps at 0: the pipeline has evaluated nothing."""
    if not path:
        return None
    try:
        with open(path, encoding="ascii") as handle:
            return int(handle.read().strip() or 0)
    except FileNotFoundError:
        return 0
    except ValueError as exc:
        raise ValueError(f"the cap file {path} does not hold a log position: {exc}") from None


def read_limit(options: dict[str, str]) -> ReadLimit:
    """``max_rows`` as Spark's read limit (none given: everything available)."""
    rows = options.get("max_rows")
    if rows is None:
        return ReadAllAvailable()
    if not rows.isdigit() or int(rows) < 1:
        raise ValueError(f"option max_rows: found {rows!r}, expected a whole number ≥ 1")
    return ReadMaxRows(int(rows))


class _Range(InputPartition):
    def __init__(self, start: int, end: int) -> None:
        self.start = start
        self.end = end


def _connect(path: str) -> sqlite3.Connection:
    # Read-only, by URI (the path quoted: a '?' or '#' in it is no URI syntax): a missing file
    # is an error here, never an empty new database.
    return sqlite3.connect(f"file:{quote(os.path.realpath(path))}?mode=ro", uri=True,
                           timeout=10.0)


class _Reader(DataSourceStreamReader):
    def __init__(self, options: dict[str, str]) -> None:
        if "path" not in options:
            raise ValueError("the evamed_sqlite_log source needs option path: the SQLite "
                             "store's file")
        self.path = options["path"]
        self.table = options.get("table", "events")
        if self.table not in TABLES:
            raise ValueError(f"option table: found {self.table!r}, expected one of "
                             f"{', '.join(TABLES)}")
        self.cap = options.get("cap")
        self.start = int(options.get("start", "0"))
        self.limit = read_limit(options)
        self.releases = options.get("releases", "false") == "true"

    def initialOffset(self) -> dict[str, Any]:
        return {"position": self.start}

    def getDefaultReadLimit(self) -> ReadLimit:
        return self.limit

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        begin = int(start["position"])
        db = _connect(self.path)
        try:
            found = db.execute("SELECT head FROM counters WHERE log = ?",
                               (self.table,)).fetchone()
        finally:
            db.close()
        end = int(found[0]) if found else 0  # a store written before that log existed
        cap = read_cap(self.cap)
        if cap is not None:
            end = min(end, cap)
        if isinstance(limit, ReadMaxRows) and begin + limit.max_rows < end:
            end = (self._release_end(begin, begin + limit.max_rows, end) if self.releases
                   else begin + limit.max_rows)
        return {"position": max(begin, end)}  # a cap moved back (a restart's replay): wait

    def _release_end(self, begin: int, limit: int, end: int) -> int:
        """The last watermark line after ``begin`` up to ``limit`` — else the first after it,
        up to ``end`` (the head and the cap are at one: a release is appended whole)."""
        db = _connect(self.path)
        try:
            for bound, order in ((limit, "DESC"), (end, "ASC")):
                low = begin if order == "DESC" else limit
                found = db.execute(
                    f"SELECT position FROM {self.table} WHERE position > ? AND position <= ? "
                    f"AND substr(line, 1, {len(MARK)}) = ? ORDER BY position {order} LIMIT 1",
                    (low, bound, MARK)).fetchone()
                if found is not None:
                    return int(found[0])
            return end
        finally:
            db.close()

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        first, last = int(start["position"]), int(end["position"])
        return [_Range(first, last)] if last > first else []

    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        assert isinstance(partition, _Range)
        rows = self._rows(partition)
        return in_releases(rows) if self.releases else rows

    def _rows(self, partition: _Range) -> Iterator[tuple[str, int]]:
        db = _connect(self.path)
        try:
            cursor = partition.start
            while cursor < partition.end:  # (start, end], in pages
                page = db.execute(f"SELECT position, line FROM {self.table} WHERE position > "
                                  "? AND position <= ? ORDER BY position LIMIT ?",
                                  (cursor, partition.end, PAGE)).fetchall()
                if not page:
                    return  # trimmed meanwhile: what is gone no live profile needs
                for position, line in page:
                    yield (line, position)
                cursor = page[-1][0]
        finally:
            db.close()

    def commit(self, end: dict[str, Any]) -> None:
        pass  # the log is the mediator's: its pipeline trims it, not this reader


def in_releases(rows: Iterator[tuple[str, int]]) -> Iterator[tuple[str, int, int | None]]:
    """A log's (line, seq) rows with their release's watermark: each line is held until the
    watermark line that closes its release (the last of a range is one: ``_release_end``)."""
    waiting: list[tuple[str, int]] = []
    for line, seq in rows:
        clock = watermark_of(line)
        if clock is None:
            waiting.append((line, seq))
            continue
        yield from ((held, at, clock) for held, at in waiting)
        waiting = []
        yield (line, seq, clock)
    yield from ((held, at, None) for held, at in waiting)  # (a range cut by a trim)


class LogSource(DataSource):
    """What the log sources share: the schema, and a reader of their options."""

    reader: ClassVar[type[Any]]  # its stream reader class, of the options

    def schema(self) -> str:
        return RELEASES if self.options.get("releases", "false") == "true" else SCHEMA

    def streamReader(self, schema: Any) -> DataSourceStreamReader:
        return self.reader(dict(self.options))


def bounded(reader: Any, cap: str | None, max_rows: int | None, releases: bool = False) -> Any:
    """A stream reader (``spark.readStream``) with the options ``cap``, ``max_rows`` and
    ``releases``."""
    if cap:
        reader = reader.option("cap", cap)
    if max_rows:
        reader = reader.option("max_rows", str(max_rows))
    return reader.option("releases", "true") if releases else reader


class SqliteLogSource(LogSource):
    """``spark.readStream.format("evamed_sqlite_log").option("path", FILE)`` (options
    ``table``, ``cap``, ``start``, ``max_rows``: the module docstring)."""

    reader = _Reader

    @classmethod
    def name(cls) -> str:
        return "evamed_sqlite_log"


def sqlite_log_lines(spark: Any, path: str, *, table: str = "events", cap: str | None = None,
                     start: int = 0, max_rows: int | None = None, releases: bool = False
                     ) -> Any:
    """The log ``table`` of the SQLite store at ``path`` as a stream of (value, seq) lines —
    (value, seq, clock) with ``releases`` — from the position after ``start`` (a fresh query;
    a restarted one resumes from its checkpoint)."""
    spark.dataSource.register(SqliteLogSource)
    reader = (spark.readStream.format("evamed_sqlite_log").option("path", path)
              .option("table", table).option("start", str(start)))
    return bounded(reader, cap, max_rows, releases).load()
