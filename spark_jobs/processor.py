"""The processor: one engine per (profile, bucket) key, inside Spark's stateful processing
(``transformWithStateInPandas``, event time, RocksDB state store). In the data flow it sits
between the fan-out (spark_jobs/job.py), which hands each key its rows in arrival order, and
the sinks, which get the composites and dead letters its engines report.

A row is an event as the JVM parsed it (id, source, type, time in µs, data as JSON text:
``eva.events.from_fields``, data parsed only when read) or a line the JVM did not vouch for,
parsed here as the engine's reader parses every line (malformed: the same dead letter as
replay's). The key's engine comes from its state (spark_jobs/state.py: the worker's cache, or
a lazy restore of the core and the partitions it needs); a call stores the core and the
partitions it changed. Composites leave as columns (``as_columns``) and the JVM writes their
JSON (job.composite_json), each with its report key and its constituents' sources (what the
mediator orders a micro-batch's composites by, and finds their provenance with).

**Ordered input** (``StreamJob.ordered``: the mediator's composer log — events in trace order,
released in whole instants, each release closed by a watermark line, and read in whole
releases): each row carries its release's watermark (``clock``), and a key's engine decides up
to the newest its call was given — the rows' own, or a clock row's (job.fan_out sends one to
every key whose engine acts without events) — not up to Spark's watermark, which it does not
need: a micro-batch's keys all decide exactly up to the micro-batch's newest watermark line,
so no micro-batch reports a composite older than one an earlier micro-batch reported
(docs/spark.md, "Order"), and none waits for the next.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from contextlib import suppress
from typing import TYPE_CHECKING, Any, TypeVar

import orjson

from eva.engine import DeadLetter, Engine, EngineConfig
from eva.events import (
    MAX_TIME,
    MIN_TIME,
    PRIMITIVE,
    Event,
    EventError,
    from_fields,
    from_json_line,
)
from eva.notify import (
    composite_id,
    composite_line,
    dead_letter_record,
    tuples_from_json,
    tuples_to_json,
)
from eva.semantics import Notification, partition_key, source_and_id
from eva.snapshot import SnapshotError
from spark_jobs.profiles import Registration, profiles
from spark_jobs.routing import document
from spark_jobs.state import CheckpointError, GroupKey, KeyState, refused

if TYPE_CHECKING:  # job.py builds its plan around this processor: the settings only, for types
    import pandas as pd

    from spark_jobs.job import StreamJob

__all__ = ["CheckpointError", "composer_processor", "refusal", "report_key", "watermark_line",
           "watermark_of"]

_T = TypeVar("_T")

WATERMARK = "evamed:watermark"
"""The key of a watermark line of the composer log: ``{"evamed:watermark": T}`` says every
instant up to T is complete (an ordered job's clock goes there)."""
MARK = '{"' + WATERMARK + '"'
"""How a watermark line begins (the log sources find release ends by it)."""

CLOCK = -3  # an ordered job's row that only moves a key's clock (a profile acting on its own)
ANCHOR = -1  # a row that only keeps a profile without `per` alive (its clock may report)
# and tells it its frame's first event (anchor_line)
DROP = -2  # a row that only reaches a removed profile's key: its state goes (profiles.removed)

FIELDS = ["seq", "id", "source", "type", "time", "data", "attrs", "line"]  # job.PARSED
Row = tuple[int, str | None, str | None, str | None, int, str | None, str | None, str | None]
COLUMNS = ["kind", "profile", "ident", "time", "partition", "constituents", "payload", "key",
           "sources"]  # job.OUT
Out = tuple[str, str, str, int, str | None, list[str], str | None, str, list[str]]


# ------------------------------------------------------------------ rows and events


def watermark_line(time: int) -> str:
    """The composer log's watermark line for ``time``."""
    return json.dumps({WATERMARK: time})


def watermark_of(line: str | None) -> int | None:
    """The time a watermark line names; None for any other line."""
    if line is None or not line.startswith(MARK):
        return None
    try:
        found = json.loads(line)
    except ValueError:
        return None
    time = found.get(WATERMARK) if isinstance(found, dict) and len(found) == 1 else None
    return time if type(time) is int else None


def event_of(row: Row) -> Event:
    """The event of a row: from the JVM's columns, or its line parsed (EventError if it is
    malformed, with the message replay reports)."""
    seq, ident, source, kind, time, data, attrs, line = row
    if line is not None:
        return from_json_line(line, seq)
    assert ident is not None and source is not None and kind is not None  # vouched for
    attributes: dict[str, Any] = {"specversion": "1.0"}
    if attrs is not None:
        attributes.update(orjson.loads(attrs))
    return from_fields(ident, source, kind, time, seq, data, attributes)


def rows_of(frame: pd.DataFrame) -> list[Row]:
    return list(zip(*(frame[name].tolist() for name in FIELDS), strict=True))


def parsed_events(frame: pd.DataFrame) -> list[Event | None]:
    """The fan-out's view of a frame of PARSED rows: each row's event, None if malformed."""
    out: list[Event | None] = []
    for row in rows_of(frame):
        try:
            out.append(event_of(row))
        except EventError:
            out.append(None)
    return out


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


def _begin_at_first(engine: Engine, rows: list[Row], watermark: int | None) -> None:
    """Start the clock of an engine registered at the job's first event as replay starts it:
    just before the first event in arrival order, less the allowed lateness. A profile
    without ``per`` gets every frame's first event (anchors), so its first event is the job's;
    a ``per`` bucket begins at its own first event (the engine's rule, Engine.push), which
    answers the same: a partition starts at its own first event. With declared sources the
    job's first events are spread over calls; the engine begins itself once its own events
    cover every source, or, once the job's watermark moves (every source has reported), at
    its earliest event held or seen in that call (docs/spark.md, "Registration")."""
    late = engine.config.allowed_lateness
    firsts = [first for row in rows
              if row[0] == ANCHOR and row[7] is not None
              and (first := _anchor_first(row[7])) is not None]
    if not engine.config.sources:
        if firsts:
            engine.begin(min(firsts)[1] - late - 1)
        return
    if watermark is None:
        return
    times = [time for _, time in firsts]
    for row in rows:
        if row[0] >= 0:
            with suppress(EventError):  # a malformed line has no time
                times.append(row[4] if row[7] is None else event_of(row).time)
    held = engine.next_instant()  # an engine not begun holds only buffered events
    times += [held] if held is not None else []
    if times:
        engine.begin(min(times) - late - 1)


def _step(engine: Engine, rows: list[Row], watermark: int | None,
          registered: int | None) -> list[Notification]:
    """One call's work on a key's engine: the clock to the watermark (events behind it are
    then late, and dead-lettered as such), then the events in arrival order. ``registered``
    None: registered at the job's first event."""
    if registered is None and engine.origin is None:
        _begin_at_first(engine, rows, watermark)
    notes = engine.advance(watermark) if watermark is not None and engine.origin is not None else []
    for row in rows:
        if row[0] < 0:  # an anchor or a drop row: no event
            continue
        try:
            event = event_of(row)
        except EventError as exc:
            engine.malformed(str(exc), row[7])
            continue
        if registered is not None and event.time <= registered:
            continue  # before the profile was registered: not its event (Def. 3.5)
        notes.extend(engine.push(event))
    return notes


def _step_ordered(engine: Engine, rows: list[Row], clock: int | None,
                  registered: int | None, after: int) -> list[Notification]:
    """One call's work on a key's engine over ordered input: this call's events (after the
    registration's position ``after``) in arrival order, each numbered by its position in the
    log, then the clock to ``clock`` — the newest watermark the call's rows carry, which their
    release's events all lie at or before (a malformed line is reported as in ``_step``)."""
    if registered is None and engine.origin is None:
        _begin_at_first(engine, rows, clock)
    notes: list[Notification] = []
    for row in rows:
        if row[0] < 0 or row[0] <= after:  # an anchor, a clock or a drop row; a line before it
            continue
        try:
            event = event_of(row)
        except EventError as exc:
            engine.malformed(str(exc), row[7])
            continue
        if registered is not None and event.time <= registered:
            continue  # before the profile was registered: not its event (Def. 3.5)
        # Numbered by its position in the log, not the key's count of arrivals: report keys
        # (and partitions' creation keys) then compare across keys — the order the mediator
        # sorts a micro-batch by. (The engine numbers what it admits from this counter on; no
        # call of its takes the number.)
        engine._arrivals = max(engine._arrivals, row[0])
        notes.extend(engine.push(event))
    if clock is not None and engine.origin is not None:
        notes.extend(engine.advance(clock))
    return notes


def _evaluate(engine: Engine, rows: list[Row], watermark: int | None,
              registered: int | None) -> tuple[list[Notification], list[str]]:
    """``_step`` with the dead letters it reported as JSON lines."""
    return _reported(engine, lambda: _step(engine, rows, watermark, registered))


def _reported(engine: Engine, work: Callable[[], _T]) -> tuple[_T, list[str]]:
    """``work`` on the engine (``_step``, ``_step_ordered``), with the dead letters it
    reported as JSON lines."""
    letters: list[str] = []
    engine.dead_letter = lambda letter: letters.append(json.dumps(dead_letter_record(letter)))
    try:
        done = work()
    finally:
        engine.dead_letter = _ignore  # a cached engine keeps no reference to this call's list
    return done, letters


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


# ------------------------------------------------------------------ output


def as_columns(profile: str, note: Notification, engine: Engine | None = None) -> Out:
    """A composite as the processor's output row. Its JSON is the JVM's to write
    (job.composite_json) when its text needs no escape — constituent ids and a string
    partition ``_plain``, a time in years 0001–9999; otherwise the row carries the line
    ``composite_line`` wrote. Either way with its order (``key``: JSON of the report key and
    the creation key of its partition, as ``engine`` knows it; ``report_key`` reads it back)
    and its constituents' sources (``sources``)."""
    occ = note.occ
    key = json.dumps(tuples_to_json((note.emitted, _created(engine, note))))
    sources = constituent_sources(occ.ident, occ.events)
    if _plain("".join(occ.events)) and MIN_TIME <= occ.time <= MAX_TIME:
        return ("composite", profile, composite_id(note), occ.time,
                _partition_json(note.partition), list(occ.events), None, key, sources)
    ident, line = composite_line(note)
    return ("composite", profile, ident, 0, None, [], line, key, sources)


def report_key(text: str) -> Any:
    """A composite row's order: (its report key, the key its partition was created at) as
    nested tuples — replay's order within a profile: by report key, then partitions in order
    of creation (``per`` partitions of one profile at one clock step, in different
    buckets)."""
    return tuples_from_json(json.loads(text))


def _created(engine: Engine | None, note: Notification) -> Any:
    """The key at which the composite's partition was created (``()``: a profile without
    ``per``, or one not found). Only a clock step (a tick, a passive event) reports in many
    partitions at one report key, and the partitions of a clock-driven profile are kept, so
    the engine still holds it. (Read from the engine's records: no call of its gives it.)"""
    if engine is None or note.partition is None or note.emitted[1] == PRIMITIVE:
        return ()
    try:
        found = engine._named[note.profile][-1].partitions.get(partition_key(note.partition))
    except (AttributeError, KeyError, IndexError, TypeError):
        return ()
    return found.created if found is not None and found.created is not None else ()


def constituent_sources(ident: Any, events: tuple[str, ...]) -> list[str]:
    """The source of each constituent (in the order of ``events``) as the occurrence's
    identity names it — a primitive's identity is its (source, id) with its time, a binary
    composite's (tag, left, right); "" for a tick or an absence — or [] when the identity does
    not name exactly these constituents (the mediator then finds them by id alone)."""
    out: list[str] = []

    def walk(node: Any) -> bool:
        if not isinstance(node, tuple) or not node:
            return False
        pair = source_and_id(node)
        if pair is not None:
            out.append(pair[0])
            return len(out) <= len(events) and events[len(out) - 1] == pair[1]
        if node[0] in ("tick", "not"):
            out.append("")
            return True
        return (len(node) == 3 and isinstance(node[0], str)
                and walk(node[1]) and walk(node[2]))

    return out if walk(ident) and len(out) == len(events) else []


def _plain(text: str) -> bool:
    """Printable ASCII without quotes or backslashes: what json's ASCII encoder writes as it
    is, so the JVM may quote it by concatenation."""
    return text.isascii() and text.isprintable() and '"' not in text and "\\" not in text


def _partition_json(value: Any) -> str | None:
    if value is None:
        return None
    if type(value) is str and _plain(value):
        return '"' + value + '"'  # what json.dumps writes for it
    return json.dumps(value)


def refusal(exc: BaseException) -> str | None:
    """The message of a CheckpointError that failed a query, found in the text of Spark's
    exception (which carries the Python worker's traceback), or None if it was not one."""
    found = re.search(r"CheckpointError: (.+)", str(exc))
    return found.group(1).strip() if found else None


# ------------------------------------------------------------------ one key's calls


class KeyProcessor:
    """The processor's work, apart from Spark's classes: one call of a key (its rows and the
    watermark) on the key's state, through Spark's state handle for the key being called."""

    def __init__(self, job: StreamJob, handle: Any) -> None:
        self.job = job
        self.handle = handle
        self.state = KeyState(handle)

    def call(self, key: GroupKey, rows: list[Row], watermark_ms: int,
             clock: int | None = None) -> list[Out]:
        """Evaluate the rows on the key's engine; store what changed and arm the key's
        timer. ``clock``: an ordered job's, the newest watermark the rows carry. The output
        rows: COLUMNS."""
        found = profiles(self.job.table).get(key[0])
        if found is None:
            self.state.drop(key)
            return []
        entry = found[0]
        ordered = self.job.ordered
        taken = self.state.take(key, entry.token)
        if taken is None and ordered and all(row[0] < 0 for row in rows):
            return []  # a clock for a key that holds nothing: no engine to move
        engine, records = taken if taken is not None else (self._new(key, entry), None)
        try:  # a lazily restored engine reads partition records during the call
            if ordered:
                notes, letters = _reported(engine, lambda: _step_ordered(
                    engine, rows, clock, entry.registered, entry.after))
            else:
                notes, letters = _evaluate(engine, rows, _clock(watermark_ms),
                                           entry.registered)
        except SnapshotError as exc:
            raise refused(key, exc) from None
        self.state.store(key, entry.token, engine, records)
        self.state.clear_timers()
        upcoming = engine.next_instant()
        if upcoming is not None and not ordered:  # (ordered: clock rows call it)
            self.handle.registerTimer(_timer(upcoming, watermark_ms))
        out = [as_columns(key[0], n, engine) for n in notes]
        return out + [("dead_letter", key[0], "", 0, None, [], text, "", [])
                      for text in letters]

    def _new(self, key: GroupKey, entry: Registration) -> Engine:
        engine = Engine(EngineConfig.from_json(self.job.config))
        engine.add_document(document(entry.text), [key[0]])
        if entry.registered is not None:
            engine.begin(entry.registered)  # else at its first event (_begin_at_first)
        return engine


def arrival_order(frames: Iterator[pd.DataFrame]) -> tuple[list[Row], int | None]:
    """A key's rows, from Spark's frames, in arrival order (anchors, clocks and drops first),
    and the newest watermark they carry (an ordered job's ``clock`` column; None: none)."""
    rows: list[Row] = []
    clocks: list[int] = []
    for frame in frames:
        rows.extend(rows_of(frame))
        if "clock" in frame.columns:
            clocks.extend(int(c) for c in frame["clock"].dropna().tolist())
    rows.sort(key=_seq)
    return rows, max(clocks, default=None)


def _seq(row: Row) -> int:
    return row[0]


def composer_processor(job: StreamJob) -> Any:
    """A ``StatefulProcessor`` running one engine per (profile, bucket): Spark's entry points
    over ``KeyProcessor``."""
    import pandas as pd
    from pyspark.sql.streaming.stateful_processor import StatefulProcessor

    def frames(out: list[Out]) -> Iterator[pd.DataFrame]:
        if out:
            yield pd.DataFrame(out, columns=COLUMNS)

    class Processor(StatefulProcessor):
        def init(self, handle: Any) -> None:
            self.keys = KeyProcessor(job, handle)  # declares the key's state (KeyState)

        def handleInputRows(self, key: Any, rows: Any,
                            timerValues: Any) -> Iterator[pd.DataFrame]:
            ordered, clock = arrival_order(rows)
            yield from frames(self.keys.call((key[0], int(key[1])), ordered,
                                             timerValues.getCurrentWatermarkInMs(), clock))

        def handleExpiredTimer(self, key: Any, timerValues: Any,
                               expiredTimerInfo: Any) -> Iterator[pd.DataFrame]:
            yield from frames(self.keys.call((key[0], int(key[1])), [],
                                             timerValues.getCurrentWatermarkInMs()))

        def close(self) -> None:
            pass

    return Processor()
