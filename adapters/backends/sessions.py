"""Durable sessions of a base service: their state, and where it is kept (memory, or SQLite).

A *session* (``eva.base.v1`` ``Open``/``Register``/``Deregister``/``Ack``) is what an
autonomous service — one whose producers publish to it themselves — keeps for a client that
only registers queries and reads what they detect: its registrations and its outgoing
messages, numbered per session, kept until acknowledged. It outlives its stream, so a client
that reconnects (or a mediator that restarts) loses nothing; the evaluation is the service's
(:mod:`adapters.backends.service`), this module holds the records.

Persistence (``evamed base-service --data DIR``, :class:`SqliteStore`): the event log — every
event the service accepted for its sessions, its line as received, its arrival number (the log
position) and the Publish message it came in (with the message's advance) — and the sessions
and registrations (where in the log each was registered and deregistered). A Publish message
is appended in one transaction before it is evaluated, so an accepted event is durable before
anything it causes is sent. Messages are not stored: on a restart the service replays the log
from the oldest live registration's position in the same message boundaries, which regenerates
them, seq numbers included (the evaluators are deterministic). WAL and ``synchronous=NORMAL``:
a commit survives a SIGKILL of the process, not a power loss. Without ``--data``
(:class:`MemoryStore`) nothing survives the process, and duplicates are recognised among the
latest :data:`DEDUP_MEMORY` events only.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import os
import sqlite3
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from eva.events import Event

RETENTION = 100_000
"""Unacknowledged messages a session may hold (``--retention``): one that would hold more is
dropped, rather than growing the service's memory without bound."""
SESSION_TIMEOUT = 86_400.0
"""Seconds a session may go without an open stream before it is dropped (``--session-timeout``)."""
HEARTBEAT_MS = 200
"""A stream on which nothing was sent for this long gets a progress-only message (the default
of ``OpenRequest.heartbeat_ms``)."""
DEDUP_MEMORY = 100_000
"""Without ``--data``, the (source, id) pairs of this many latest accepted events are
remembered to recognise a re-sent event (with ``--data`` the log's index knows them all)."""
SCHEMA_VERSION = 1
DATABASE = "base-service.db"
"""The file in ``--data DIR``."""


class LogError(Exception):
    """The event log could not be read or written (its message says what and where)."""


def dropped_reason(name: str, why: str) -> str:
    """What every later call about a dropped session is told (FAILED_PRECONDITION)."""
    return f"session {name} was dropped: {why}; open it anew (create) and register again"


# ------------------------------------------------------------------ state


@dataclass(eq=False)
class Stream:
    """The open stream of a session (at most one: a newer Open supersedes it)."""

    wake: asyncio.Event = field(default_factory=asyncio.Event)
    """Something to look at: a message, a moved watermark, the session dropped, superseded."""
    superseded: bool = False


@dataclass(eq=False)
class Registration:
    """A query of a session, evaluated over the messages logged after ``position`` (message
    numbers) — until ``deregistered``. ``ordinal``: its place in the service's registration
    order (every session's), which orders a message's detections and the replay."""

    ordinal: int
    session: Session
    ident: str
    query: str
    position: int
    subscription: Any
    """The service's ``_Subscription`` of it: evaluator and clock (detections go to its
    ``found`` list, the current Publish message's)."""
    deregistered: int | None = None
    """Where it ends in the log (a replay evaluates a deregistered one up to there, so that
    its session's messages are numbered as before)."""
    ended: tuple[str, str] | None = None
    """(status name, reason) if the service ended it there (a limit, a failure): a replay
    ends it at the same message with the same words, whatever its evaluation does."""


@dataclass(eq=False)
class Session:
    name: str
    origin: int | None
    """The service's watermark when the session was created, or (it had none) the first event
    evaluated after that, minus 1; None until known. Fixed once known."""
    acked: int = 0
    seq: int = 0
    """The last seq given to a message."""
    kept: dict[int, Any] = field(default_factory=dict)
    """seq → SessionMessage, every one after ``acked`` (contiguous, in order)."""
    registrations: dict[str, Registration] = field(default_factory=dict)
    """Live ones, by subscription id, in registration order."""
    exhausted: dict[str, tuple[str, str]] = field(default_factory=dict)
    """Subscription id → (query, reason) of the registrations ended at the service's work or
    store limit: the same query under the same id is refused (it would be again)."""
    stream: Stream | None = None
    detached: float = field(default_factory=time.monotonic)
    """When its last stream ended (or it was restored): the session timeout runs from here."""
    dropped: str | None = None

    def forget(self, upto: int) -> None:
        """Acknowledged up to ``upto``: those messages are not kept any more."""
        upto = min(upto, self.seq)
        if upto <= self.acked:
            return
        for seq in range(self.acked + 1, upto + 1):
            self.kept.pop(seq, None)
        self.acked = upto

    def wake(self) -> None:
        if self.stream is not None:
            self.stream.wake.set()


# ------------------------------------------------------------------ stores


@dataclass(frozen=True)
class StoredSession:
    name: str
    origin: int | None
    acked: int


@dataclass(frozen=True)
class StoredRegistration:
    ordinal: int
    session: str
    ident: str
    query: str
    position: int
    deregistered: int | None
    ended: tuple[str, str] | None = None
    """(status name, reason) when the service ended it at ``deregistered``."""
    limits: tuple[int, int] | None = None
    """The work and store limits it was evaluated with, when it ended (native.limits)."""


def _end(stored: list[Any] | None) -> tuple[tuple[str, str] | None, tuple[int, int] | None]:
    """A stored end — ``[code, reason, work limit, store limit]`` — as (ended, limits)."""
    if not stored:
        return None, None
    return (stored[0], stored[1]), (stored[2], stored[3]) if len(stored) == 4 else None


@dataclass(frozen=True)
class LoggedMessage:
    """One Publish message as logged: its accepted events (arrival number, line) and advance."""

    number: int
    events: list[tuple[int, str]]
    newest: int | None
    advance: int | None


@dataclass
class Restored:
    """What a store held when the service started."""

    sessions: list[StoredSession] = field(default_factory=list)
    registrations: list[StoredRegistration] = field(default_factory=list)
    dropped: dict[str, str] = field(default_factory=dict)
    messages: int = 0
    """The number of the last logged message."""
    next_seq: int = 0
    """The arrival number of the next event."""


class Store(Protocol):
    """Where the event log, the sessions and the registrations are kept."""

    def transaction(self) -> contextlib.AbstractContextManager[None]: ...

    def add_event(self, event: Event, line: str, message: int) -> bool:
        """Log an event (in a transaction); False if its (source, id) is logged already."""
        ...

    def known(self, event: Event) -> bool:
        """Whether an event of this (source, id) was logged (a re-sent one)."""
        ...

    def add_message(self, number: int, newest: int | None, advance: int | None) -> None: ...

    def create_session(self, name: str, origin: int | None) -> None: ...

    def set_origin(self, name: str, origin: int) -> None: ...

    def ack(self, name: str, seq: int) -> None: ...

    def register(self, r: StoredRegistration) -> None: ...

    def deregister(self, ordinal: int, position: int, ended: tuple[str, str] | None = None,
                   limits: tuple[int, int] | None = None) -> None: ...

    def drop(self, name: str, reason: str) -> None: ...

    def restore(self) -> Restored: ...

    def messages(self, after: int) -> Iterator[LoggedMessage]:
        """The logged messages numbered after ``after``, in order."""
        ...

    def progress_before(self, number: int) -> tuple[int | None, int | None]:
        """(watermark, clock) after the messages numbered before ``number``: the greatest of
        their newest event times less one and their advances; the greatest of their newest
        event times and advances."""
        ...

    def close(self) -> None: ...


class MemoryStore:
    """No ``--data``: nothing to restore; a re-sent event is recognised among the latest
    ``remember`` accepted ones."""

    def __init__(self, remember: int = DEDUP_MEMORY) -> None:
        self._seen: set[tuple[str, str]] = set()
        self._order: deque[tuple[str, str]] = deque()
        self._remember = max(1, remember)

    @contextlib.contextmanager
    def transaction(self) -> Iterator[None]:
        yield

    def add_event(self, event: Event, line: str, message: int) -> bool:
        key = (event.source, event.id)
        if key in self._seen:
            return False
        self._seen.add(key)
        self._order.append(key)
        if len(self._order) > self._remember:
            self._seen.discard(self._order.popleft())
        return True

    def known(self, event: Event) -> bool:
        return (event.source, event.id) in self._seen

    def add_message(self, number: int, newest: int | None, advance: int | None) -> None:
        pass

    def create_session(self, name: str, origin: int | None) -> None:
        pass

    def set_origin(self, name: str, origin: int) -> None:
        pass

    def ack(self, name: str, seq: int) -> None:
        pass

    def register(self, r: StoredRegistration) -> None:
        pass

    def deregister(self, ordinal: int, position: int, ended: tuple[str, str] | None = None,
                   limits: tuple[int, int] | None = None) -> None:
        pass

    def drop(self, name: str, reason: str) -> None:
        pass

    def restore(self) -> Restored:
        return Restored()

    def messages(self, after: int) -> Iterator[LoggedMessage]:
        return iter(())

    def progress_before(self, number: int) -> tuple[int | None, int | None]:
        return None, None

    def close(self) -> None:
        pass


_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS events (
    position INTEGER PRIMARY KEY, message INTEGER NOT NULL, source TEXT NOT NULL,
    id TEXT NOT NULL, line TEXT NOT NULL, UNIQUE (source, id));
CREATE TABLE IF NOT EXISTS messages (
    number INTEGER PRIMARY KEY, newest INTEGER, advance INTEGER);
CREATE TABLE IF NOT EXISTS sessions (
    name TEXT PRIMARY KEY, created REAL NOT NULL, origin INTEGER, acked INTEGER NOT NULL,
    dropped TEXT);
CREATE TABLE IF NOT EXISTS registrations (
    ordinal INTEGER PRIMARY KEY, session TEXT NOT NULL, ident TEXT NOT NULL, query TEXT NOT NULL,
    position INTEGER NOT NULL, deregistered INTEGER);
"""


class SqliteStore:
    """``--data DIR``: one SQLite file (:data:`DATABASE`) in WAL mode, ``synchronous=NORMAL``;
    a lock file keeps a second service off the same directory, and a directory written by a
    service of another group is refused."""

    def __init__(self, directory: str | os.PathLike[str], group: str) -> None:
        where = Path(directory)
        try:
            where.mkdir(parents=True, exist_ok=True)
            self._lock = open(where / f"{DATABASE}.lock", "w")  # noqa: SIM115 (held for life)
        except OSError as exc:
            raise LogError(f"--data {where}: {exc.strerror or exc}") from None
        try:
            fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            self._lock.close()
            raise LogError(f"--data {where}: another base service uses this directory") from None
        self.path = where / DATABASE
        try:
            self._db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.executescript(_SCHEMA)
            meta = dict(self._db.execute("SELECT key, value FROM meta").fetchall())
            if not meta:
                self._db.executemany("INSERT INTO meta VALUES (?, ?)", [
                    ("schema_version", str(SCHEMA_VERSION)), ("group", group)])
        except sqlite3.Error as exc:
            self._lock.close()
            raise LogError(f"--data {where}: {self.path.name}: {exc}") from None
        if meta and meta.get("group") != group:
            self.close()
            raise LogError(f"--data {where} holds the log of a {meta.get('group')} service, not "
                           f"{group}")
        if meta and meta.get("schema_version") != str(SCHEMA_VERSION):
            self.close()
            raise LogError(f"--data {where}: schema version {meta.get('schema_version')}, this "
                           f"service reads {SCHEMA_VERSION}")

    @contextlib.contextmanager
    def transaction(self) -> Iterator[None]:
        try:
            self._db.execute("BEGIN")
            try:
                yield
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")
        except sqlite3.Error as exc:
            raise LogError(f"{self.path}: {exc}") from None

    def _write(self, sql: str, args: tuple[Any, ...]) -> sqlite3.Cursor:
        try:
            return self._db.execute(sql, args)
        except sqlite3.Error as exc:
            raise LogError(f"{self.path}: {exc}") from None

    def add_event(self, event: Event, line: str, message: int) -> bool:
        cursor = self._write("INSERT OR IGNORE INTO events VALUES (?, ?, ?, ?, ?)",
                             (event.seq, message, event.source, event.id, line))
        return cursor.rowcount == 1

    def known(self, event: Event) -> bool:
        return self._write("SELECT 1 FROM events WHERE source = ? AND id = ?",
                           (event.source, event.id)).fetchone() is not None

    def add_message(self, number: int, newest: int | None, advance: int | None) -> None:
        self._write("INSERT INTO messages VALUES (?, ?, ?)", (number, newest, advance))

    def create_session(self, name: str, origin: int | None) -> None:
        with self.transaction():
            self._write("INSERT OR REPLACE INTO sessions VALUES (?, ?, ?, 0, NULL)",
                        (name, time.time(), origin))
            self._forget_registrations(name)

    def set_origin(self, name: str, origin: int) -> None:
        self._write("UPDATE sessions SET origin = ? WHERE name = ?", (origin, name))

    def ack(self, name: str, seq: int) -> None:
        self._write("UPDATE sessions SET acked = ? WHERE name = ?", (seq, name))

    def register(self, r: StoredRegistration) -> None:
        self._write("INSERT INTO registrations VALUES (?, ?, ?, ?, ?, NULL)",
                    (r.ordinal, r.session, r.ident, r.query, r.position))

    def deregister(self, ordinal: int, position: int, ended: tuple[str, str] | None = None,
                   limits: tuple[int, int] | None = None) -> None:
        with self.transaction():
            self._write("UPDATE registrations SET deregistered = ? WHERE ordinal = ?",
                        (position, ordinal))
            if ended is not None:  # in meta: the table's shape stays what older logs have
                self._write("INSERT OR REPLACE INTO meta VALUES (?, ?)",
                            (f"ended:{ordinal}", json.dumps([*ended, *(limits or ())])))

    def drop(self, name: str, reason: str) -> None:
        with self.transaction():
            self._write("UPDATE sessions SET dropped = ? WHERE name = ?", (reason, name))
            self._forget_registrations(name)

    def _forget_registrations(self, name: str) -> None:
        """A session's registrations and their stored ends (an ordinal may be given again
        after a restart: a new registration must not find an old end)."""
        self._write("DELETE FROM meta WHERE key IN (SELECT 'ended:' || ordinal FROM "
                    "registrations WHERE session = ?)", (name,))
        self._write("DELETE FROM registrations WHERE session = ?", (name,))

    def restore(self) -> Restored:
        try:
            db = self._db
            out = Restored()
            for name, origin, acked, dropped in db.execute(
                    "SELECT name, origin, acked, dropped FROM sessions ORDER BY created"):
                if dropped is not None:
                    out.dropped[name] = dropped
                else:
                    out.sessions.append(StoredSession(name, origin, acked))
            ended = {int(key.removeprefix("ended:")): json.loads(value)
                     for key, value in db.execute(
                         "SELECT key, value FROM meta WHERE key LIKE 'ended:%'")}
            out.registrations = [
                StoredRegistration(ordinal, session, ident, query, position, deregistered,
                                   *_end(ended.get(ordinal) if deregistered is not None else None))
                for ordinal, session, ident, query, position, deregistered in db.execute(
                    "SELECT ordinal, session, ident, query, position, deregistered "
                    "FROM registrations ORDER BY ordinal")]
            out.messages = db.execute("SELECT COALESCE(MAX(number), 0) FROM messages"
                                      ).fetchone()[0]
            out.next_seq = db.execute("SELECT COALESCE(MAX(position) + 1, 0) FROM events"
                                      ).fetchone()[0]
            return out
        except sqlite3.Error as exc:
            raise LogError(f"{self.path}: {exc}") from None

    def messages(self, after: int) -> Iterator[LoggedMessage]:
        """Two cursors merged by message number (a message may log only an advance)."""
        try:
            events = self._db.execute(
                "SELECT message, position, line FROM events WHERE message > ? ORDER BY position",
                (after,))
            heads = self._db.execute(
                "SELECT number, newest, advance FROM messages WHERE number > ? ORDER BY number",
                (after,)).fetchall()
            pending = events.fetchone()
            for number, newest, advance in heads:
                found: list[tuple[int, str]] = []
                while pending is not None and pending[0] == number:
                    found.append((pending[1], pending[2]))
                    pending = events.fetchone()
                yield LoggedMessage(number, found, newest, advance)
        except sqlite3.Error as exc:
            raise LogError(f"{self.path}: {exc}") from None

    def progress_before(self, number: int) -> tuple[int | None, int | None]:
        row = self._db.execute(
            "SELECT MAX(MAX(COALESCE(newest - 1, advance), COALESCE(advance, newest - 1))), "
            "MAX(MAX(COALESCE(newest, advance), COALESCE(advance, newest))) "
            "FROM messages WHERE number < ?", (number,)).fetchone()
        return row[0], row[1]

    def close(self) -> None:
        with contextlib.suppress(sqlite3.Error, AttributeError):
            self._db.close()
        self._lock.close()
