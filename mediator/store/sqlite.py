"""The embedded store: one SQLite file in WAL mode (the default, ``sqlite:///path.db``).

Durability: every append is one transaction, committed before it returns. With WAL and
``synchronous=NORMAL`` (the default) a commit is in the WAL file, i.e. in the operating system,
when it returns: an acknowledged append survives a kill of the process (SIGKILL, a crash), not a
power loss of the machine (the last commits may be lost, the file stays consistent).
``synchronous=FULL`` (``sqlite:///path.db?synchronous=full``) syncs the WAL on every commit and
survives a power loss too, at the cost of one fsync per append (docs/operations.md, Stores).

Threads: one connection guarded by a lock; the pipeline thread and the asyncio thread share it.
Other processes (``evamed clients add`` next to a running server) open their own connection;
WAL lets them read while the server writes, and writes wait (busy timeout) for each other.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Literal

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

Synchronous = Literal["NORMAL", "FULL"]

# `head` is the notification log's last position (it survives trimming, so positions never
# repeat); `kept` the retention of the last trim (for the RetentionError message).
_SCHEMA = """
CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS clients (
    name TEXT PRIMARY KEY, token_hash TEXT NOT NULL, created_us INTEGER NOT NULL,
    revoked INTEGER NOT NULL DEFAULT 0, operator INTEGER NOT NULL DEFAULT 0,
    sources TEXT NOT NULL DEFAULT '');
CREATE INDEX IF NOT EXISTS clients_by_token ON clients (token_hash);
CREATE TABLE IF NOT EXISTS subscriptions (
    owner TEXT NOT NULL, name TEXT NOT NULL, text TEXT NOT NULL, created_us INTEGER NOT NULL,
    start_position INTEGER NOT NULL, start_time INTEGER, plans TEXT NOT NULL,
    head INTEGER NOT NULL DEFAULT 0, kept INTEGER,
    PRIMARY KEY (owner, name));
CREATE TABLE IF NOT EXISTS counters (log TEXT PRIMARY KEY, head INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS events (position INTEGER PRIMARY KEY, line TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS notifications (
    owner TEXT NOT NULL, name TEXT NOT NULL, position INTEGER NOT NULL,
    composite_id TEXT NOT NULL, payload BLOB NOT NULL,
    PRIMARY KEY (owner, name, position)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS link_logs (link TEXT PRIMARY KEY, head INTEGER NOT NULL,
    number INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS link_log (
    link TEXT NOT NULL, position INTEGER NOT NULL, number INTEGER NOT NULL,
    payload BLOB NOT NULL, PRIMARY KEY (link, position)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS checkpoints (
    number INTEGER PRIMARY KEY AUTOINCREMENT, data BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS notification_ids (
    owner TEXT NOT NULL, name TEXT NOT NULL, composite_id TEXT NOT NULL,
    PRIMARY KEY (owner, name, composite_id)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS composer_log (
    position INTEGER PRIMARY KEY, line TEXT NOT NULL, time INTEGER NOT NULL,
    source TEXT NOT NULL, id TEXT NOT NULL, type TEXT NOT NULL, via TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS composer_by_id ON composer_log (id, source);
INSERT OR IGNORE INTO counters VALUES ('composer_log', 0);
CREATE TABLE IF NOT EXISTS dead_letters (
    position INTEGER PRIMARY KEY, time_us INTEGER NOT NULL, reason TEXT NOT NULL,
    source TEXT NOT NULL, client TEXT NOT NULL, place TEXT NOT NULL, event_id TEXT NOT NULL,
    detail TEXT NOT NULL, raw BLOB NOT NULL, size INTEGER NOT NULL, kind TEXT NOT NULL,
    republished_us INTEGER NOT NULL DEFAULT 0);
CREATE INDEX IF NOT EXISTS dead_letters_by_client ON dead_letters (client, position);
INSERT OR IGNORE INTO counters VALUES ('dead_letters', 0);
"""

# Each owner's count of subscriptions (the limit per client), kept by triggers, so any writer
# (another process too) keeps it; a file written before it existed is counted once when opened.
_COUNTS = (
    "CREATE TABLE owners (owner TEXT PRIMARY KEY, subscriptions INTEGER NOT NULL)",
    "INSERT INTO owners SELECT owner, COUNT(*) FROM subscriptions GROUP BY owner",
    "CREATE TRIGGER owners_in AFTER INSERT ON subscriptions BEGIN INSERT INTO owners "
    "VALUES (NEW.owner, 1) ON CONFLICT (owner) DO UPDATE SET subscriptions = subscriptions + 1; "
    "END",
    "CREATE TRIGGER owners_out AFTER DELETE ON subscriptions BEGIN UPDATE owners "
    "SET subscriptions = subscriptions - 1 WHERE owner = OLD.owner; END",
)

_SUBSCRIPTION = "owner, name, text, created_us, start_position, start_time, plans, links"


_COMPOSER = "line, time, source, id, type, via, position"
_DEAD = ("reason, source, detail, time_us, client, place, event_id, raw, size, kind, position, "
         "republished_us")


def _dead_letter(row: tuple) -> DeadLetterRecord:
    reason, source, detail, time_us, client, place, ident, raw, size, kind, at, again = row
    return DeadLetterRecord(reason, source, detail, int(time_us), client, place, ident,
                            bytes(raw), int(size), kind, int(at), int(again))


def _composer_line(row: tuple[str, int, str, str, str, str, int]) -> ComposerLine:
    line, time, source, ident, kind, via, position = row
    return ComposerLine(line, int(time), source, ident, kind,
                        tuple((str(s), str(h)) for s, h in json.loads(via)), int(position))


_CLIENT = "name, token_hash, created_us, revoked, operator, sources"


def _client(row: tuple[str, str, int, int, int, str]) -> ClientRecord:
    return ClientRecord(row[0], row[1], row[2], bool(row[3]), bool(row[4]),
                        tuple(json.loads(row[5])) if row[5] else ())


class SqliteStore:
    """The :class:`~mediator.store.base.Store` in one SQLite file (``":memory:"`` for tests)."""

    def __init__(self, path: str | Path, *, synchronous: Synchronous = "NORMAL") -> None:
        self.path = str(path)
        self._lock = threading.Lock()
        try:
            # autocommit mode: transactions are the explicit BEGIN IMMEDIATE of _write, so a
            # writer takes the write lock up front and never fails upgrading a read lock
            self._db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False,
                                       timeout=10.0)
        except sqlite3.Error as exc:
            raise StoreError(f"cannot open the SQLite store {self.path}: {exc}") from None
        try:
            with self._locked() as db:
                db.execute("PRAGMA journal_mode=WAL")
                db.execute(f"PRAGMA synchronous={synchronous}")
            with self._write() as db:
                for statement in _SCHEMA.split(";"):
                    if statement.strip():
                        db.execute(statement)
                if not db.execute("SELECT 1 FROM sqlite_master WHERE name = 'owners'").fetchone():
                    for statement in _COUNTS:
                        db.execute(statement)
                columns = {row[1] for row in db.execute("PRAGMA table_info(subscriptions)")}
                if "links" not in columns:  # a file written before link logs existed
                    db.execute("ALTER TABLE subscriptions ADD COLUMN links TEXT NOT NULL "
                               "DEFAULT ''")
                columns = {row[1] for row in db.execute("PRAGMA table_info(clients)")}
                if "operator" not in columns:
                    db.execute("ALTER TABLE clients ADD COLUMN operator INTEGER NOT NULL "
                               "DEFAULT 0")  # a file written before operators existed
                if "sources" not in columns:  # … before grants of sources existed
                    db.execute("ALTER TABLE clients ADD COLUMN sources TEXT NOT NULL DEFAULT ''")
                row = db.execute("SELECT version FROM schema_version").fetchone()
                if row is None:
                    db.execute("INSERT INTO schema_version VALUES (?)", (SCHEMA_VERSION,))
                    db.execute("INSERT INTO counters VALUES ('events', 0)")
                elif row[0] > SCHEMA_VERSION:
                    raise StoreError(f"the SQLite store {self.path} has schema version {row[0]}; "
                                     f"this evamed reads version {SCHEMA_VERSION} (upgrade evamed)")
        except StoreError:
            self._db.close()
            raise

    @contextmanager
    def _locked(self) -> Iterator[sqlite3.Connection]:
        """The connection, under the lock; a SQLite failure (disk full, a lock held too long by
        another process) becomes a StoreError naming the file."""
        with self._lock:
            try:
                yield self._db
            except sqlite3.Error as exc:
                raise StoreError(f"the SQLite store {self.path} failed: {exc}") from None

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """One write transaction: committed when the block ends, rolled back on an exception."""
        with self._locked() as db:
            db.execute("BEGIN IMMEDIATE")
            try:
                yield db
            except BaseException:
                db.execute("ROLLBACK")
                raise
            db.execute("COMMIT")

    def _read(self, sql: str, args: tuple[object, ...] = ()) -> list[tuple]:
        with self._locked() as db:
            return db.execute(sql, args).fetchall()

    # -- clients

    def put_client(self, record: ClientRecord) -> None:
        with self._write() as db:
            db.execute(f"INSERT OR REPLACE INTO clients ({_CLIENT}) VALUES (?, ?, ?, ?, ?, ?)",
                       (record.name, record.token_hash, record.created_us, int(record.revoked),
                        int(record.operator),
                        json.dumps(list(record.sources)) if record.sources else ""))

    def client(self, name: str) -> ClientRecord | None:
        rows = self._read(f"SELECT {_CLIENT} FROM clients WHERE name = ?", (name,))
        return _client(rows[0]) if rows else None

    def client_by_token_hash(self, token_hash: str) -> ClientRecord | None:
        rows = self._read(f"SELECT {_CLIENT} FROM clients WHERE token_hash = ?", (token_hash,))
        return _client(rows[0]) if rows else None

    def clients(self) -> list[ClientRecord]:
        return [_client(row) for row in self._read(f"SELECT {_CLIENT} FROM clients ORDER BY name")]

    # -- subscriptions

    def put_subscription(self, record: SubscriptionRecord) -> None:
        # an upsert, not a replace: the log's head and retention stay with the record
        with self._write() as db:
            db.execute(
                f"INSERT INTO subscriptions ({_SUBSCRIPTION}) VALUES (?, ?, ?, ?, ?, ?, ?, ?) "
                "ON CONFLICT (owner, name) DO UPDATE SET text = excluded.text, "
                "created_us = excluded.created_us, start_position = excluded.start_position, "
                "start_time = excluded.start_time, plans = excluded.plans, "
                "links = excluded.links",
                (record.owner, record.name, record.text, record.created_us,
                 record.start_position, record.start_time, record.plans, record.links))

    def subscription(self, owner: str, name: str) -> SubscriptionRecord | None:
        rows = self._read(f"SELECT {_SUBSCRIPTION} FROM subscriptions WHERE owner = ? AND name = ?",
                          (owner, name))
        return SubscriptionRecord(*rows[0]) if rows else None

    def subscriptions(self, owner: str | None = None) -> list[SubscriptionRecord]:
        if owner is None:
            rows = self._read(f"SELECT {_SUBSCRIPTION} FROM subscriptions ORDER BY owner, name")
        else:
            rows = self._read(f"SELECT {_SUBSCRIPTION} FROM subscriptions WHERE owner = ? "
                              "ORDER BY name", (owner,))
        return [SubscriptionRecord(*row) for row in rows]

    def count_subscriptions(self, owner: str) -> int:
        rows = self._read("SELECT subscriptions FROM owners WHERE owner = ?", (owner,))
        return int(rows[0][0]) if rows else 0

    def delete_subscription(self, owner: str, name: str) -> bool:
        with self._write() as db:
            for table in ("notifications", "notification_ids"):
                db.execute(f"DELETE FROM {table} WHERE owner = ? AND name = ?", (owner, name))
            return db.execute("DELETE FROM subscriptions WHERE owner = ? AND name = ?",
                              (owner, name)).rowcount > 0

    # -- the event log

    def append_events(self, lines: Sequence[str]) -> int:
        with self._write() as db:
            (head,) = db.execute("UPDATE counters SET head = head + ? WHERE log = 'events' "
                                 "RETURNING head", (len(lines),)).fetchone()
            first = head - len(lines) + 1
            db.executemany("INSERT INTO events VALUES (?, ?)",
                           zip(range(first, head + 1), lines, strict=True))  # no tuple list
        return int(head)

    def read_events(self, after: int, limit: int = 1000) -> list[LoggedEvent]:
        check_read(after, limit)
        return [LoggedEvent(*row) for row in self._read(
            "SELECT position, line FROM events WHERE position > ? ORDER BY position LIMIT ?",
            (after, limit))]

    def event_head(self) -> int:
        return int(self._read("SELECT head FROM counters WHERE log = 'events'")[0][0])

    def trim_events(self, before: int) -> int:
        with self._write() as db:
            return db.execute("DELETE FROM events WHERE position < ?", (before,)).rowcount

    # -- link logs

    def append_link(self, link: str, items: Sequence[tuple[int, bytes]]) -> tuple[int, int]:
        with self._write() as db:
            row = db.execute("SELECT head, number FROM link_logs WHERE link = ?",
                             (link,)).fetchone()
            head, number = (int(row[0]), int(row[1])) if row else (0, 0)
            rows = []
            for given, payload in items:
                if given > number:
                    head, number = head + 1, given
                    rows.append((link, head, given, payload))
            db.executemany("INSERT INTO link_log VALUES (?, ?, ?, ?)", rows)
            db.execute("INSERT INTO link_logs VALUES (?, ?, ?) ON CONFLICT (link) DO UPDATE "
                       "SET head = excluded.head, number = excluded.number",
                       (link, head, number))
        return head, number

    def read_link(self, link: str, after: int, limit: int = 1000) -> list[LoggedMessage]:
        check_read(after, limit)
        return [LoggedMessage(*row) for row in self._read(
            "SELECT position, number, payload FROM link_log WHERE link = ? AND position > ? "
            "ORDER BY position LIMIT ?", (link, after, limit))]

    def link_bounds(self, link: str) -> tuple[int, int]:
        rows = self._read("SELECT head, number FROM link_logs WHERE link = ?", (link,))
        return (int(rows[0][0]), int(rows[0][1])) if rows else (0, 0)

    def renumber_link(self, link: str) -> None:
        with self._write() as db:
            db.execute("UPDATE link_logs SET number = 0 WHERE link = ?", (link,))

    def trim_link(self, link: str, before: int) -> int:
        with self._write() as db:
            return db.execute("DELETE FROM link_log WHERE link = ? AND position < ?",
                              (link, before)).rowcount

    # -- the composer log (its head in ``counters``, as the event log's: the Spark jobs read
    # both tables the same way, spark_jobs/log_source.py)

    def append_composer(self, lines: Sequence[ComposerLine]) -> int:
        with self._write() as db:
            (head,) = db.execute("UPDATE counters SET head = head + ? WHERE log = "
                                 "'composer_log' RETURNING head", (len(lines),)).fetchone()
            first = head - len(lines) + 1
            db.executemany("INSERT INTO composer_log VALUES (?, ?, ?, ?, ?, ?, ?)",
                           [(first + i, c.line, c.time, c.source, c.id, c.type,
                             json.dumps(c.via)) for i, c in enumerate(lines)])
        return int(head)

    def read_composer(self, after: int, limit: int = 1000) -> list[ComposerLine]:
        check_read(after, limit)
        return [_composer_line(row) for row in self._read(
            f"SELECT {_COMPOSER} FROM composer_log WHERE position > ? ORDER BY position LIMIT ?",
            (after, limit))]

    def composer_head(self) -> int:
        return int(self._read("SELECT head FROM counters WHERE log = 'composer_log'")[0][0])

    def composer_events(self, keys: Sequence[tuple[str, str]]
                        ) -> dict[tuple[str, str], ComposerLine]:
        out: dict[tuple[str, str], ComposerLine] = {}
        with self._locked() as db:
            for source, ident in dict.fromkeys(keys):
                row = (db.execute(f"SELECT {_COMPOSER} FROM composer_log WHERE id = ? AND "
                                  "source = ? ORDER BY position DESC LIMIT 1",
                                  (ident, source)).fetchone() if source else
                       db.execute(f"SELECT {_COMPOSER} FROM composer_log WHERE id = ? AND "
                                  "id != '' ORDER BY position DESC LIMIT 1",
                                  (ident,)).fetchone())
                if row is not None:
                    out[(source, ident)] = _composer_line(row)
        return out

    def trim_composer(self, before: int) -> int:
        with self._write() as db:
            return db.execute("DELETE FROM composer_log WHERE position < ?", (before,)).rowcount

    # -- notification logs

    def append_notifications(self, owner: str, name: str,
                             items: Sequence[tuple[str, bytes]]) -> list[LoggedNotification]:
        appended: list[LoggedNotification] = []
        with self._write() as db:
            row = db.execute("SELECT head FROM subscriptions WHERE owner = ? AND name = ?",
                             (owner, name)).fetchone()
            if row is None:
                return appended
            head = int(row[0])
            for composite_id, payload in items:
                # the id table is the dedupe: a row already there (or earlier in this batch)
                # inserts nothing
                if db.execute("INSERT OR IGNORE INTO notification_ids VALUES (?, ?, ?)",
                              (owner, name, composite_id)).rowcount:
                    head += 1
                    appended.append(LoggedNotification(head, composite_id, payload))
            db.executemany("INSERT INTO notifications VALUES (?, ?, ?, ?, ?)",
                           [(owner, name, n.position, n.composite_id, n.payload) for n in appended])
            db.execute("UPDATE subscriptions SET head = ? WHERE owner = ? AND name = ?",
                       (head, owner, name))
        return appended

    def read_notifications(self, owner: str, name: str, after: int,
                           limit: int = 1000) -> list[LoggedNotification]:
        check_read(after, limit)
        with self._locked() as db:  # bounds and rows from one snapshot: no trim in between
            db.execute("BEGIN")
            try:
                head, kept, first = self._bounds(owner, name)
                check_retention(owner, name, after, first, head, kept)
                rows = db.execute(
                    "SELECT position, composite_id, payload FROM notifications "
                    "WHERE owner = ? AND name = ? AND position > ? ORDER BY position LIMIT ?",
                    (owner, name, after, limit)).fetchall()
            finally:
                db.execute("COMMIT")
        return [LoggedNotification(*row) for row in rows]

    def _bounds(self, owner: str, name: str) -> tuple[int, int | None, int]:
        """(head, kept, first position kept or 0), under the lock."""
        row = self._db.execute(
            "SELECT head, kept, (SELECT MIN(position) FROM notifications n "
            "WHERE n.owner = s.owner AND n.name = s.name) "
            "FROM subscriptions s WHERE owner = ? AND name = ?", (owner, name)).fetchone()
        return (0, None, 0) if row is None else (int(row[0]), row[1], int(row[2] or 0))

    def notification_bounds(self, owner: str, name: str) -> tuple[int, int]:
        with self._locked():
            head, _, first = self._bounds(owner, name)
        return (first or (head + 1 if head else 0), head)

    def trim_notifications(self, owner: str, name: str, keep: int) -> int:
        if keep < 0:
            raise ValueError(f"a retention is 0 or more entries, got {keep}")
        with self._write() as db:
            row = db.execute("UPDATE subscriptions SET kept = ? WHERE owner = ? AND name = ? "
                             "RETURNING head", (keep, owner, name)).fetchone()
            if row is None:
                return 0
            return db.execute("DELETE FROM notifications WHERE owner = ? AND name = ? "
                              "AND position <= ?", (owner, name, row[0] - keep)).rowcount

    # -- checkpoints

    def put_checkpoint(self, data: bytes, keep: int = 2) -> int:
        with self._write() as db:
            number = int(db.execute("INSERT INTO checkpoints (data) VALUES (?) RETURNING number",
                                    (data,)).fetchone()[0])
            db.execute("DELETE FROM checkpoints WHERE number <= ?", (number - max(keep, 1),))
        return number

    def checkpoints(self) -> list[tuple[int, bytes]]:
        return [(int(n), bytes(d)) for n, d in self._read(
            "SELECT number, data FROM checkpoints ORDER BY number DESC")]

    # -- the dead-letter log

    def append_dead_letters(self, records: Sequence[DeadLetterRecord]) -> int:
        with self._write() as db:
            (head,) = db.execute("UPDATE counters SET head = head + ? WHERE log = "
                                 "'dead_letters' RETURNING head", (len(records),)).fetchone()
            first = head - len(records) + 1
            db.executemany(
                f"INSERT INTO dead_letters ({_DEAD}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [(r.reason, r.source, r.detail, r.time_us, r.client, r.where, r.event_id, r.raw,
                  r.size, r.kind, first + i, r.republished_us) for i, r in enumerate(records)])
        return int(head)

    def read_dead_letters(self, after: int, limit: int = 1000, *, reason: str = "",
                          source: str = "", client: str = "") -> list[DeadLetterRecord]:
        check_read(after, limit)
        where, args = ["position > ?"], [after]
        for column, value in (("reason", reason), ("source", source), ("client", client)):
            if value:
                where.append(f"{column} = ?")
                args.append(value)  # type: ignore[arg-type]
        return [_dead_letter(row) for row in self._read(
            f"SELECT {_DEAD} FROM dead_letters WHERE {' AND '.join(where)} ORDER BY position "
            "LIMIT ?", (*args, limit))]

    def dead_letter_bounds(self) -> tuple[int, int]:
        row = self._read("SELECT (SELECT MIN(position) FROM dead_letters), head FROM counters "
                         "WHERE log = 'dead_letters'")[0]
        return int(row[0] or 0), int(row[1])

    def mark_republished(self, position: int, time_us: int) -> bool:
        with self._write() as db:
            return db.execute("UPDATE dead_letters SET republished_us = ? WHERE position = ?",
                              (time_us, position)).rowcount > 0

    def trim_dead_letters(self, keep: int) -> int:
        if keep < 0:
            raise ValueError(f"a retention is 0 or more entries, got {keep}")
        with self._write() as db:
            (head,) = db.execute("SELECT head FROM counters WHERE log = 'dead_letters'").fetchone()
            return db.execute("DELETE FROM dead_letters WHERE position <= ?",
                              (int(head) - keep,)).rowcount

    # -- meta

    def get_meta(self, key: str) -> str | None:
        rows = self._read("SELECT value FROM meta WHERE key = ?", (key,))
        return str(rows[0][0]) if rows else None

    def set_meta(self, key: str, value: str) -> None:
        with self._write() as db:
            db.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", (key, value))

    def close(self) -> None:
        with self._lock:
            self._db.close()
