"""The processor: one engine per (profile, bucket) key, inside Spark's stateful processing
(``transformWithStateInPandas``, event time, RocksDB state store). In the data flow it sits
between the fan-out (spark_jobs/job.py), which hands each key its rows in arrival order, and
the sinks, which get the composites and dead letters its engines report.

State per key: ``snapshot`` (the engine at some call, with its registration token), ``log``
(the input of every call since: rows and watermark, compressed) and ``head`` (a stamp naming
the state after the latest call, the token, the rows logged). A call takes the worker's cached
engine when its stamp is the head's, else restores the snapshot and replays the log; it
appends its own input to the log, and writes a fresh snapshot instead once the log holds
``StreamJob.log_rows`` rows. Snapshots are exact and the engine deterministic, so a replayed
engine is the engine that was cached. All of it is data, never code (docs/spark.md).
"""

from __future__ import annotations

import json
import re
import uuid
import zlib
from collections import OrderedDict
from collections.abc import Iterator
from contextlib import suppress
from typing import TYPE_CHECKING, Any

from eva.engine import DeadLetter, Engine, EngineConfig
from eva.events import Event, EventError, from_json_line
from eva.notify import composite_line, dead_letter_record
from eva.semantics import Notification
from eva.snapshot import MAX_STATE_BYTES, SnapshotError, inflate, restore, snapshot
from spark_jobs.profiles import Registration, profiles
from spark_jobs.routing import document

if TYPE_CHECKING:  # job.py builds its plan around this processor: the settings only, for types
    import pandas as pd

    from spark_jobs.job import StreamJob

ANCHOR = -1  # a row that only keeps a profile without `per` alive (its clock may report)
# and tells it its frame's first event (anchor_line)

COLUMNS = ["kind", "profile", "ident", "payload"]  # of every output row (job.OUT)
Row = tuple[str, str, str, str]
GroupKey = tuple[str, int]  # Spark's grouping key: (profile, bucket)


# Engines kept in the Python worker between micro-batches, by (profile, bucket): (stamp of the
# state they hold, engine). Spark reuses its Python workers, so a key's engine is often still
# here (about half the calls on local[2], where a state partition goes to whichever worker is
# free); on a miss (another worker, a restart, a retried batch) it is rebuilt from the state
# store.
# The processor class is shipped to the workers by value, globals and all, so it reaches the
# cache only through this module (shipped by reference).
_ENGINES: OrderedDict[GroupKey, tuple[str, Engine]] = OrderedDict()
_CACHED = 20_000


def _cached(key: GroupKey, stamp: str) -> Engine | None:
    """The worker's engine for the key if it holds the state named by ``stamp`` (taken out:
    a call that fails half-way must not leave a half-fed engine behind)."""
    found = _ENGINES.pop(key, None)
    return found[1] if found is not None and found[0] == stamp else None


def _keep(key: GroupKey, stamp: str, engine: Engine | None) -> None:
    _ENGINES.pop(key, None)
    if engine is not None:
        _ENGINES[key] = (stamp, engine)
        while len(_ENGINES) > _CACHED:
            _ENGINES.popitem(last=False)


# ------------------------------------------------------------------ one call's evaluation


def anchor_line(seqs: list[int], events: list[Event | None]) -> str:
    """What an anchor row carries: the frame's first event in arrival order, as JSON
    ``[seq, time]`` — a profile registered at the job's first event begins there."""
    return json.dumps(min((seq, e.time) for seq, e in zip(seqs, events, strict=True)
                          if e is not None))


def _anchor_first(line: str) -> tuple[int, int] | None:
    try:
        seq, time = json.loads(line)
    except (ValueError, TypeError):
        return None  # an anchor without it (written by an older job)
    return (seq, time) if type(seq) is int and type(time) is int else None


def _begin_at_first(engine: Engine, rows: list[tuple[int, str]], watermark: int | None) -> None:
    """Start the clock of an engine registered at the job's first event as replay starts it:
    just before the first event in arrival order, less the allowed lateness. A profile
    without ``per`` gets every frame's first event (anchors), so its first event is the job's;
    a ``per`` bucket begins at its own first event (the engine's rule, Engine.push), which
    answers the same: a partition starts at its own first event. With declared sources the
    job's first events are spread over calls; the engine begins itself once its own events
    cover every source, or, once the job's watermark moves (every source has reported), at
    its earliest event held or seen in that call (docs/spark.md, "Registration")."""
    late = engine.config.allowed_lateness
    firsts = [first for seq, line in rows
              if seq == ANCHOR and (first := _anchor_first(line)) is not None]
    if not engine.config.sources:
        if firsts:
            engine.begin(min(firsts)[1] - late - 1)
        return
    if watermark is None:
        return
    times = [time for _, time in firsts]
    for seq, line in rows:
        if seq != ANCHOR:
            with suppress(EventError):  # a malformed line has no time
                times.append(from_json_line(line).time)
    held = engine.next_instant()  # an engine not begun holds only buffered events
    times += [held] if held is not None else []
    if times:
        engine.begin(min(times) - late - 1)


def _step(engine: Engine, rows: list[tuple[int, str]], watermark: int | None,
          registered: int | None) -> list[Notification]:
    """One call's work on a key's engine, the same live and in a replay of the log: the
    clock to the watermark (events behind it are then late, and dead-lettered as such), then the
    rows in arrival order. ``registered`` None: registered at the job's first event."""
    if registered is None and engine.origin is None:
        _begin_at_first(engine, rows, watermark)
    notes = engine.advance(watermark) if watermark is not None and engine.origin is not None else []
    for seq, line in rows:
        if seq == ANCHOR:
            continue
        try:
            event = from_json_line(line, seq=seq)
        except EventError as exc:
            engine.malformed(str(exc), line)
            continue
        if registered is not None and event.time <= registered:
            continue  # before the profile was registered: not its event (Def. 3.5)
        notes.extend(engine.push(event))
    return notes


def _evaluate(engine: Engine, rows: list[tuple[int, str]], watermark: int | None,
              registered: int | None) -> tuple[list[Notification], list[str]]:
    """``_step`` live: the composites, and the dead letters it reported as JSON lines."""
    letters: list[str] = []
    engine.dead_letter = lambda letter: letters.append(json.dumps(dead_letter_record(letter)))
    notes = _step(engine, rows, watermark, registered)
    engine.dead_letter = _ignore  # a cached engine keeps no reference to this call's list
    return notes, letters


def _ignore(letter: DeadLetter) -> None:
    pass


def _clock(watermark_ms: int) -> int | None:
    """Spark's watermark says no row at or before it is still to come; the clock stops just
    short of it, so an event at the newest time seen is still on time. None: no watermark yet."""
    return watermark_ms * 1000 - 1 if watermark_ms > 0 else None


def _timer(upcoming: int, watermark_ms: int) -> int:
    """The timer (ms) for the engine's next instant: a timer at T fires once the watermark
    reaches T; the clock then goes to T·1000 − 1 µs, which must reach the instant."""
    return max(-(-(upcoming + 1) // 1000), watermark_ms + 1)


# ------------------------------------------------------------------ state store entries


class CheckpointError(ValueError):
    """State in a checkpoint that this job did not write (or an older, pickle-based one):
    refused, never run."""


def refusal(exc: BaseException) -> str | None:
    """The message of a CheckpointError that failed a query, found in the text of Spark's
    exception (which carries the Python worker's traceback), or None if it was not one."""
    found = re.search(r"CheckpointError: (.+)", str(exc))
    return found.group(1).strip() if found else None


def _pack(rows: list[tuple[int, str]], watermark: int | None) -> bytes | None:
    """A log entry; None if its text is over MAX_STATE_BYTES, which ``_unpack`` refuses (the
    call then writes a snapshot instead)."""
    # Data only (JSON), like the engine snapshots: a checkpoint must not be able to run code.
    text = json.dumps([watermark, rows], separators=(",", ":")).encode()
    return zlib.compress(text, 1) if len(text) <= MAX_STATE_BYTES else None


def _unpack(blob: bytes) -> tuple[int | None, list[tuple[int, str]]]:
    failure: str | None = None
    try:  # inflate stops past MAX_STATE_BYTES: a zlib bomb is not inflated whole
        watermark, rows = json.loads(inflate(blob))
        entries = [(seq, line) for seq, line in rows]
    except Exception as exc:  # the trust boundary, as in snapshot.restore
        # Bytes from the state store: besides ValueError and TypeError, JSON nested deeper than
        # the stack is a RecursionError, and a huge document a MemoryError.
        failure = f"{type(exc).__name__}: {str(exc)[:200]}"
    if failure is not None:  # raised outside the handler: what was read is freed with it
        raise CheckpointError(f"a log entry that is not this job's ({failure})")
    if not (watermark is None or _int64(watermark)) or not all(
            _int64(seq) and type(line) is str for seq, line in entries):
        raise CheckpointError("a log entry that is not this job's (expected [watermark, "
                              "[[seq, line], …]] with 64-bit integers)")
    return watermark, entries


def _int64(value: object) -> bool:
    return type(value) is int and -(2**63) <= value < 2**63


# ------------------------------------------------------------------ one key's calls


class KeyProcessor:
    """The processor's work, apart from Spark's classes: one call of a key (its rows and the
    watermark) on the key's state, through Spark's state handle for the key being called."""

    def __init__(self, job: StreamJob, handle: Any) -> None:
        self.job = job
        self.handle = handle
        self.snap = handle.getValueState("snapshot", "blob BINARY, token STRING")
        self.log = handle.getListState("log", "entry BINARY")
        self.head = handle.getValueState("head", "stamp STRING, token STRING, logged LONG")

    def call(self, key: GroupKey, rows: list[tuple[int, str]], watermark_ms: int) -> list[Row]:
        """Evaluate the rows on the key's engine; store the call and arm the key's timer. The
        output rows: (kind, profile, ident, payload)."""
        found = profiles(self.job.table).get(key[0])
        if found is None:
            self._drop(key)
            return []
        entry = found[0]
        engine, logged = self._take(key, entry)
        waiting = engine.origin is None
        watermark = _clock(watermark_ms)
        notes, letters = _evaluate(engine, rows, watermark, entry.registered)
        if not waiting:  # anchors matter to an engine that has not begun only
            rows = [row for row in rows if row[0] != ANCHOR]
        self._store(key, entry.token, engine, logged + len(rows) + 1, rows, watermark)
        self._clear_timers()
        upcoming = engine.next_instant()
        if upcoming is not None:
            self.handle.registerTimer(_timer(upcoming, watermark_ms))
        out: list[Row] = [("composite", key[0], *composite_line(n)) for n in notes]
        return out + [("dead_letter", key[0], "", text) for text in letters]

    def _drop(self, key: GroupKey) -> None:
        """The profile left the table: its state and timers go."""
        _keep(key, "", None)
        for state in (self.snap, self.log, self.head):
            state.clear()
        self._clear_timers()

    def _clear_timers(self) -> None:
        for timer in self.handle.listTimers():
            self.handle.deleteTimer(timer)

    def _take(self, key: GroupKey, entry: Registration) -> tuple[Engine, int]:
        """The key's engine as the state store has it, and the rows logged since its
        snapshot (a new engine counts as a full log, so its first call writes a
        snapshot)."""
        if self.head.exists():
            stamp, token, logged = self.head.get()
            if token == entry.token:
                cached = _cached(key, stamp)
                return (cached if cached is not None else self._restore(key, entry)), int(logged)
        engine = Engine(EngineConfig.from_json(self.job.config))
        engine.add_document(document(entry.text), [key[0]])
        if entry.registered is not None:
            engine.begin(entry.registered)  # else at its first event (_begin_at_first)
        return engine, self.job.log_rows  # nothing in the state store yet: the call writes it

    def _restore(self, key: GroupKey, entry: Registration) -> Engine:
        """The engine of the key's snapshot, with the calls of its log replayed."""
        blob, _ = self.snap.get()
        try:
            engine = restore(bytes(blob))
            for item in self.log.get():
                watermark, rows = _unpack(bytes(item[0]))
                _step(engine, rows, watermark, entry.registered)
        except (SnapshotError, CheckpointError) as exc:
            raise CheckpointError(f"checkpoint state of profile {key[0]} bucket {key[1]} "
                                  f"refused: {exc}") from None
        return engine

    def _store(self, key: GroupKey, token: str, engine: Engine, logged: int,
               rows: list[tuple[int, str]], watermark: int | None) -> None:
        """Append the call's input to the log, or — once the log holds ``log_rows`` rows, or
        for an entry too large to read back — write a snapshot and start the log afresh; then
        name the new state and cache the engine under that name."""
        packed = _pack(rows, watermark) if logged < self.job.log_rows else None
        if packed is None:
            self.snap.update((snapshot(engine), token))
            self.log.clear()
            logged = 0
        else:
            self.log.appendList([(packed,)])
        stamp = uuid.uuid4().hex
        self.head.update((stamp, token, logged))
        _keep(key, stamp, engine)


def arrival_order(frames: Iterator[pd.DataFrame]) -> list[tuple[int, str]]:
    """A key's (seq, line) rows, from Spark's frames, in arrival order (anchors first)."""
    rows: list[tuple[int, str]] = []
    for frame in frames:
        rows.extend(zip(frame["seq"].tolist(), frame["line"].tolist(), strict=True))
    rows.sort()
    return rows


def composer_processor(job: StreamJob) -> Any:
    """A ``StatefulProcessor`` running one engine per (profile, bucket): Spark's entry points
    over ``KeyProcessor``."""
    import pandas as pd
    from pyspark.sql.streaming.stateful_processor import StatefulProcessor

    def frames(out: list[Row]) -> Iterator[pd.DataFrame]:
        if out:
            yield pd.DataFrame(out, columns=COLUMNS)

    class Processor(StatefulProcessor):
        def init(self, handle: Any) -> None:
            self.keys = KeyProcessor(job, handle)

        def handleInputRows(self, key: Any, rows: Any,
                            timerValues: Any) -> Iterator[pd.DataFrame]:
            yield from frames(self.keys.call((key[0], int(key[1])), arrival_order(rows),
                                             timerValues.getCurrentWatermarkInMs()))

        def handleExpiredTimer(self, key: Any, timerValues: Any,
                               expiredTimerInfo: Any) -> Iterator[pd.DataFrame]:
            yield from frames(self.keys.call((key[0], int(key[1])), [],
                                             timerValues.getCurrentWatermarkInMs()))

        def close(self) -> None:
            pass

    return Processor()
