"""The streaming composition job: profiles evaluated over a stream of primitive notifications
inside Spark stateful processing (``transformWithStateInPandas``, event time, RocksDB state
store).

Layout (docs/spark.md):

    spool directory (CloudEvents JSON lines) or the Redis log
      → fan-out (mapInPandas): each event to the (profile, bucket) keys it belongs to; event
        rows carry no event time, anchor rows carry each frame's newest time
      → withWatermark(ts, lateness): moved by the anchors only
      → groupBy(profile, bucket).transformWithStateInPandas(Composer): one engine per key,
        cached in the Python worker and kept in the state store as snapshot + log of inputs;
        the clock advanced to the watermark (rows behind it are late dead letters), the rows
        pushed in arrival order, an event-time timer armed for the engine's next instant
      → foreachBatch: composites and dead letters written per batch id (a re-run batch after a
        restart overwrites its own files: no loss, no duplicates)

A bucket holds many ``per`` partitions (the engine keeps them apart), so Spark's per-key cost is
paid per bucket, not per partition (research/spark.md: per-key Python calls dominate).
"""

from __future__ import annotations

import json
import os
import re
import uuid
import zlib
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import suppress
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from eva.engine import DeadLetter, Engine, EngineConfig
from eva.events import Event, EventError, from_json_line
from eva.notify import composite_line, dead_letter_record
from eva.semantics import Notification
from eva.snapshot import FORMAT as SNAPSHOT_FORMAT
from eva.snapshot import MAX_STATE_BYTES, SnapshotError, inflate, restore, snapshot
from spark_jobs.routing import config_tuple, document, event_matchers, memberships

__all__ = ["CheckpointError", "LayoutError", "Registration", "StreamJob", "anchor_line",
           "check_layout", "config_tuple", "directory_sink", "refusal", "route", "spool_file",
           "spool_lines", "start", "write_table"]

ROUTED = "profile STRING, bucket INT, seq LONG, ts TIMESTAMP, line STRING"
OUT = "kind STRING, profile STRING, ident STRING, payload STRING"
ANCHOR = -1  # a row that only keeps a profile without `per` alive (its clock may report)
# and tells it its frame's first event (anchor_line)


@dataclass(frozen=True)
class StreamJob:
    table: str  # path of the profile table (write_table); read again whenever it changes
    config: tuple[Any, ...]  # EngineConfig as a tuple
    buckets: int = 16
    # A key's engine is written whole again once its log holds this many rows (a call with
    # more rows writes it at once; calls with few rows, and timer calls, only log).
    log_rows: int = 2_000


@dataclass(frozen=True)
class Registration:
    """A registered document: its text and when it was registered (µs; its profiles see
    events after that, EVA Def. 3.5). ``registered`` None: at the job's first event, as
    ``evamed replay`` registers (its clock starts at the first event's time − lateness − 1 µs;
    docs/spark.md, "Registration")."""

    text: str
    registered: int | None
    removed: frozenset[str] = frozenset()  # profiles of the document no longer evaluated

    @property
    def token(self) -> str:
        """Identifies this registration: a profile re-registered later gets a fresh engine."""
        at = "first" if self.registered is None else self.registered
        return f"{at}:{zlib.crc32(self.text.encode())}"


def _write_whole(path: str, text: str) -> None:
    """Readers see the old file or the new one, never part of one."""
    with open(path + ".tmp", "w", encoding="utf-8") as handle:
        handle.write(text)
    os.replace(path + ".tmp", path)


def write_table(path: str, registrations: list[Registration]) -> None:
    """The profile table the running job follows: written whole and atomically."""
    _write_whole(path, json.dumps([{"text": r.text, "registered": r.registered,
                                    "removed": sorted(r.removed)} for r in registrations]))


@lru_cache(maxsize=32)
def _table(path: str, version: int) -> dict[str, tuple[Registration, str | None, list[Any]]]:
    """profile name → (its registration, its per path, matchers of its event classes)."""
    with open(path, encoding="utf-8") as handle:
        entries = [Registration(e["text"], None if e["registered"] is None else int(e["registered"]),
                                frozenset(e.get("removed", ()))) for e in json.load(handle)]
    out = {}
    for entry in entries:
        doc = document(entry.text)
        for profile in doc.profiles:
            if profile.name not in entry.removed:
                out[profile.name] = (entry, profile.per, event_matchers(profile, doc))
    return out


def profiles(job: StreamJob) -> dict[str, tuple[Registration, str | None, list[Any]]]:
    """The table as it is now (re-read when the file changes: profiles come and go while the
    job runs)."""
    return _table(job.table, os.stat(job.table).st_mtime_ns)


def route(table: list[tuple[str, tuple[Registration, str | None, list[Any]]]], buckets: int,
          event: Event | None) -> list[tuple[str, int]]:
    """The (profile, bucket) keys an event belongs to, by the (sorted) profile table; a
    malformed line (None) goes to one profile's bucket 0, whose engine reports it as a dead
    letter."""
    if event is None:
        return [(name, 0) for name, _ in table[:1]]
    return memberships(((name, per, matchers) for name, (_, per, matchers) in table), event,
                       buckets)


# Engines kept in the Python worker between micro-batches, by (profile, bucket): (stamp of the
# state they hold, engine). Spark reuses its Python workers, so a key's engine is often still
# here (about half the calls on local[2], where a state partition goes to whichever worker is
# free); on a miss (another worker, a restart, a retried batch) it is rebuilt from the state
# store.
# The processor class is shipped to the workers by value, globals and all, so it reaches the
# cache only through these module functions (shipped by reference).
_ENGINES: OrderedDict[tuple[str, int], tuple[str, Engine]] = OrderedDict()
_CACHED = 20_000


def _cached(key: tuple[str, int], stamp: str) -> Engine | None:
    """The worker's engine for the key if it holds the state named by ``stamp`` (taken out:
    a call that fails half-way must not leave a half-fed engine behind)."""
    found = _ENGINES.pop(key, None)
    return found[1] if found is not None and found[0] == stamp else None


def _keep(key: tuple[str, int], stamp: str, engine: Engine | None) -> None:
    _ENGINES.pop(key, None)
    if engine is not None:
        _ENGINES[key] = (stamp, engine)
        while len(_ENGINES) > _CACHED:
            _ENGINES.popitem(last=False)


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


def composer_processor(job: StreamJob) -> Any:
    """A ``StatefulProcessor`` running one engine per (profile, bucket).

    State per key: ``snapshot`` (the engine at some call, with its registration token),
    ``log`` (the input of every call since: rows and watermark, compressed) and ``head`` (a
    stamp naming the state after the latest call, the token, the rows logged). A call takes the
    worker's cached engine when its stamp is the head's, else restores the snapshot and replays
    the log; it appends its own input to the log, and writes a fresh snapshot instead once the
    log holds ``job.log_rows`` rows. Snapshots are exact and the engine deterministic, so a
    replayed engine is the engine that was cached."""
    import pandas as pd
    from pyspark.sql.streaming.stateful_processor import StatefulProcessor

    columns = ["kind", "profile", "ident", "payload"]

    class Composer(StatefulProcessor):
        def init(self, handle: Any) -> None:
            self.handle = handle
            self.snap = handle.getValueState("snapshot", "blob BINARY, token STRING")
            self.log = handle.getListState("log", "entry BINARY")
            self.head = handle.getValueState("head", "stamp STRING, token STRING, logged LONG")

        def _drop(self, key: tuple[str, int]) -> None:
            """The profile left the table: its state and timers go."""
            _keep(key, "", None)
            for state in (self.snap, self.log, self.head):
                state.clear()
            for timer in self.handle.listTimers():
                self.handle.deleteTimer(timer)

        def _take(self, key: tuple[str, int], entry: Registration) -> tuple[Engine, int]:
            """The key's engine as the state store has it, and the rows logged since its
            snapshot (a new engine counts as a full log, so its first call writes a
            snapshot)."""
            if self.head.exists():
                stamp, token, logged = self.head.get()
                if token == entry.token:
                    cached = _cached(key, stamp)
                    if cached is not None:
                        return cached, int(logged)
                    blob, _ = self.snap.get()
                    try:
                        engine = restore(bytes(blob))
                        for item in self.log.get():
                            watermark, rows = _unpack(bytes(item[0]))
                            _step(engine, rows, watermark, entry.registered)
                    except (SnapshotError, CheckpointError) as exc:
                        raise CheckpointError(f"checkpoint state of profile {key[0]} bucket "
                                              f"{key[1]} refused: {exc}") from None
                    return engine, int(logged)
            engine = Engine(EngineConfig(*job.config))
            engine.add_document(document(entry.text), [key[0]])
            if entry.registered is not None:
                engine.begin(entry.registered)  # else at its first event (_begin_at_first)
            return engine, job.log_rows  # nothing in the state store yet: the call writes it

        def _call(self, key: tuple[str, int], rows: list[tuple[int, str]],
                  watermark_ms: int) -> Iterator[pd.DataFrame]:
            found = profiles(job).get(key[0])
            if found is None:
                self._drop(key)
                return
            entry = found[0]
            engine, logged = self._take(key, entry)
            waiting = engine.origin is None
            letters: list[str] = []
            engine.dead_letter = lambda letter: letters.append(
                json.dumps(dead_letter_record(letter)))
            # Spark's watermark says no row at or before it is still to come; the clock stops
            # just short of it, so an event at the newest time seen is still on time.
            watermark = watermark_ms * 1000 - 1 if watermark_ms > 0 else None
            notes = _step(engine, rows, watermark, entry.registered)
            engine.dead_letter = _ignore
            if not waiting:  # anchors matter to an engine that has not begun only
                rows = [row for row in rows if row[0] != ANCHOR]
            logged += len(rows) + 1
            packed = _pack(rows, watermark) if logged < job.log_rows else None
            if packed is None:  # a long log, or an entry too large to read back: a snapshot
                self.snap.update((snapshot(engine), entry.token))
                self.log.clear()
                logged = 0
            else:
                self.log.appendList([(packed,)])
            stamp = uuid.uuid4().hex
            self.head.update((stamp, entry.token, logged))
            _keep(key, stamp, engine)
            for timer in self.handle.listTimers():
                self.handle.deleteTimer(timer)
            upcoming = engine.next_instant()
            if upcoming is not None:
                # A timer at T fires once the watermark reaches T; the clock then goes to
                # T·1000 − 1 µs, which must reach the instant.
                self.handle.registerTimer(max(-(-(upcoming + 1) // 1000), watermark_ms + 1))
            out = [("composite", key[0], *composite_line(n)) for n in notes]
            out += [("dead_letter", key[0], "", text) for text in letters]
            if out:
                yield pd.DataFrame(out, columns=columns)

        def handleInputRows(self, key: Any, rows: Any,
                            timerValues: Any) -> Iterator[pd.DataFrame]:
            batch: list[tuple[int, str]] = []
            for frame in rows:
                batch.extend(zip(frame["seq"].tolist(), frame["line"].tolist(), strict=True))
            batch.sort()  # arrival order; anchors (seq ANCHOR) first
            yield from self._call((key[0], int(key[1])), batch,
                                  timerValues.getCurrentWatermarkInMs())

        def handleExpiredTimer(self, key: Any, timerValues: Any,
                               expiredTimerInfo: Any) -> Iterator[pd.DataFrame]:
            yield from self._call((key[0], int(key[1])), [],
                                  timerValues.getCurrentWatermarkInMs())

        def close(self) -> None:
            pass

    return Composer()


def _ignore(letter: DeadLetter) -> None:
    pass


class LayoutError(ValueError):
    """A checkpoint written by a job laid out differently (buckets, engine configuration)."""


LAYOUT = "evamed-layout.json"


def check_layout(checkpoint: str, job: StreamJob) -> None:
    """Refuse a checkpoint whose state was filed under another layout, or written in another
    state format; record the layout in a new one. State is keyed by (profile, bucket) and each
    engine keeps the configuration it was created with, so resuming with other buckets would
    evaluate a partition in two engines (or in none of its old state), and another
    configuration would mix two in one job."""
    text = json.dumps({"buckets": job.buckets, "config": job.config, "state": SNAPSHOT_FORMAT})
    path = os.path.join(checkpoint, LAYOUT)
    if not os.path.exists(path):
        os.makedirs(checkpoint, exist_ok=True)
        _write_whole(path, text)
        return
    with open(path, encoding="utf-8") as handle:
        found = json.load(handle)
    if found.get("state", 1) != SNAPSHOT_FORMAT:  # format 1 (pickles) had no such entry
        raise LayoutError(f"checkpoint {checkpoint} holds state in format {found.get('state', 1)}"
                          f"; this evamed reads format {SNAPSHOT_FORMAT} only (data, where 1 "
                          "was pickles): start on a fresh checkpoint")
    layout = json.loads(text)  # as JSON has it (the config's tuples are lists there)
    if found != layout:
        changed = ", ".join(f"{name} {found.get(name)} → {value}"
                            for name, value in layout.items() if found.get(name) != value)
        raise LayoutError(f"checkpoint {checkpoint} was written by a job with other settings "
                          f"({changed}): run with its settings, or start on a fresh checkpoint")


def spool_file(spool: str, name: str, lines: list[str], stamp: float) -> str:
    """Drop a file of lines into the spool, whole and with modification time ``stamp`` (its
    place in the arrival order) from the moment the file source can see it: written under a
    hidden name (the file source skips names starting with a dot) and renamed."""
    path = os.path.join(spool, name)
    hidden = os.path.join(spool, f".{name}.tmp")
    with open(hidden, "w", encoding="utf-8") as handle:
        handle.write("\n".join(lines) + "\n")
    os.utime(hidden, (stamp, stamp))
    os.replace(hidden, path)
    return path


def spool_lines(spark: Any, spool: str, max_files: int | None = None) -> Any:
    """A spool directory of CloudEvents JSON-lines files as a stream of (value, seq) lines.
    Arrival order (seq): files in modification order (the order the file source takes them),
    then line position; blank lines skipped."""
    import pyspark.sql.functions as F

    # Each file is one row and its lines are numbered in the JVM: the numbering holds however
    # the lines are later split up (by source, over the cores).
    reader = spark.readStream.format("text").option("wholetext", True)
    if max_files:
        reader = reader.option("maxFilesPerTrigger", max_files)
    lines = reader.load(spool).select(
        F.posexplode(F.split("value", "\n")).alias("pos", "value"),
        F.expr("unix_millis(_metadata.file_modification_time)").alias("millis"))
    return lines.where(F.trim("value") != "").select(
        "value", (F.col("millis") * 1_000_000 + F.col("pos")).alias("seq"))


def start(spark: Any, job: StreamJob, spool: str, checkpoint: str,
          sink: Callable[[int, list[Any]], None], *, lateness: str = "0 seconds",
          max_files: int | None = None, trigger: dict[str, Any] | None = None,
          lines: Any = None) -> Any:
    """Start the job over a spool directory of CloudEvents JSON-lines files (or over ``lines``,
    a stream with columns ``value`` and ``seq``, e.g. the Redis log); ``sink(batch_id, rows)``
    receives each micro-batch's (kind, profile, ident, payload) rows.

    With sources declared (``EngineConfig.sources``), each has its own watermark — the stream
    is split by source, each part watermarked, and Spark's ``min`` policy takes the slowest —
    so a source running behind the others is waited for, as the in-process engine waits for
    it; otherwise the watermark is the newest time of any source."""
    from functools import reduce

    import pandas as pd
    import pyspark.sql.functions as F

    check_layout(checkpoint, job)
    if lines is None:
        lines = spool_lines(spark, spool, max_files)

    def fan_out(frames: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
        for frame in frames:
            events: list[Event | None] = []
            for line in frame["value"]:
                try:
                    events.append(from_json_line(line))
                except EventError:
                    events.append(None)
            times = [e.time for e in events if e is not None]
            seqs = frame["seq"].tolist()
            table = sorted(profiles(job).items())  # once per frame: profiles come and go
            out: list[tuple[str, int, int, int | None, str]] = []
            for line, seq, event in zip(frame["value"], seqs, events, strict=True):
                # Event rows carry no event time: Spark would drop a row behind its watermark
                # unseen, and the engine reports it as a late dead letter instead.
                out.extend((profile, group, seq, None, line)
                           for profile, group in route(table, job.buckets, event))
            # Anchors carry the frame's newest time (they alone move the watermark) to every
            # profile without `per` (its one key: clock-only profiles stay alive) — and to one
            # key at least, so that an event no profile wants (a heartbeat) still moves the
            # watermark, which is global: every key's timer for a buffered instant then fires.
            keys = [name for name, (_, per, _) in table if per is None] or [n for n, _ in table[:1]]
            if times:
                first = anchor_line(seqs, events)
                out.extend((name, 0, ANCHOR, max(times), first) for name in keys)
            frame_out = pd.DataFrame(out, columns=["profile", "bucket", "seq", "ts", "line"])
            frame_out["ts"] = pd.to_datetime(frame_out["ts"], unit="us", utc=True)
            yield frame_out

    sources = EngineConfig(*job.config).sources
    if len(sources) > 1:
        spark.conf.set("spark.sql.streaming.multipleWatermarkPolicy", "min")
        source = F.get_json_object("value", "$.source")
        # Lines of other sources, and malformed lines, go with the first source's.
        first = ~source.isin(*sources[1:]) | source.isNull()
        parts = [lines.where(first)] + [lines.where(source == s) for s in sources[1:]]
    else:
        parts = [lines]
    routed = reduce(lambda a, b: a.union(b), [
        part.mapInPandas(fan_out, ROUTED).withWatermark("ts", lateness) for part in parts])
    composed = (routed
                .groupBy("profile", "bucket")
                .transformWithStateInPandas(statefulProcessor=composer_processor(job),
                                            outputStructType=OUT, outputMode="Append",
                                            timeMode="EventTime"))

    def each(batch: Any, batch_id: int) -> None:
        # Through Arrow: collect() would build a Row per composite in the driver.
        sink(batch_id, list(batch.toPandas().itertuples(index=False)))

    writer = composed.writeStream.foreachBatch(each).option("checkpointLocation", checkpoint)
    writer = writer.trigger(**trigger) if trigger else writer
    return writer.start()


def directory_sink(out_dir: str) -> Callable[[int, list[Any]], None]:
    """Composites and dead letters to ``out_dir`` as one file per batch id, written atomically:
    a batch re-run after a restart replaces its own file (idempotent)."""
    os.makedirs(out_dir, exist_ok=True)

    def write(batch_id: int, rows: list[Any]) -> None:
        for kind in ("composite", "dead_letter"):
            chosen = sorted(r.payload for r in rows if r.kind == kind)
            if not chosen:
                continue
            _write_whole(os.path.join(out_dir, f"{kind}s-{batch_id:08d}.jsonl"),
                         "\n".join(chosen) + "\n")

    return write
