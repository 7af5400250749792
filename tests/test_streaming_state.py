"""The streaming job's per-key state (spark_jobs/processor.py), without Spark: the processor
driven call by call through an in-process double of Spark's state handle (the real one is
exercised by tests/test_spark.py). Whether a call finds its engine cached in the worker or
rebuilds it from snapshot and log, and however often snapshots are written, the answers are
the same — and they are the in-process engine's."""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from eva.engine import EngineConfig
from eva.events import from_cloudevent, from_json_line
from spark_jobs import processor as processing
from spark_jobs import state
from spark_jobs.job import StreamJob, fan_out
from spark_jobs.processor import CheckpointError, composer_processor
from spark_jobs.profiles import Registration, write_table
from tests.helpers import SENTINEL, logistics_day


class _Value:
    def __init__(self) -> None:
        self.value: tuple[Any, ...] | None = None

    def exists(self) -> bool:
        return self.value is not None

    def get(self) -> tuple[Any, ...]:
        assert self.value is not None
        return self.value

    def update(self, value: tuple[Any, ...]) -> None:
        self.value = tuple(value)

    def clear(self) -> None:
        self.value = None


class _Map:
    """Spark's MapState, counting what is read and written."""

    def __init__(self) -> None:
        self.items: dict[tuple[Any, ...], tuple[Any, ...]] = {}
        self.reads: list[str] = []
        self.writes: list[str] = []
        self.removed: list[str] = []

    def exists(self) -> bool:
        return bool(self.items)

    def getValue(self, key: tuple[Any, ...]) -> tuple[Any, ...] | None:
        self.reads.append(key[0])
        return self.items.get(tuple(key))

    def updateValue(self, key: tuple[Any, ...], value: tuple[Any, ...]) -> None:
        self.writes.append(key[0])
        self.items[tuple(key)] = tuple(value)

    def removeKey(self, key: tuple[Any, ...]) -> None:
        self.removed.append(key[0])
        self.items.pop(tuple(key), None)

    def clear(self) -> None:
        self.items = {}


class _Handle:
    """One key's state handle, as Spark's keeps state per grouping key."""

    def __init__(self) -> None:
        self.states: dict[str, Any] = {}
        self.timers: set[int] = set()

    def getValueState(self, name: str, schema: str) -> _Value:
        return self.states.setdefault(name, _Value())

    def getMapState(self, name: str, key_schema: str, value_schema: str) -> _Map:
        return self.states.setdefault(name, _Map())

    def listTimers(self) -> Iterator[int]:
        return iter(sorted(self.timers))

    def deleteTimer(self, timer: int) -> None:
        self.timers.discard(timer)

    def registerTimer(self, timer: int) -> None:
        self.timers.add(timer)

    def empty(self) -> bool:
        """Nothing of the key left in the state store."""
        return not self.timers and all(
            not state.exists() for state in self.states.values())


class _Clock:
    def __init__(self, ms: int) -> None:
        self.ms = ms

    def getCurrentWatermarkInMs(self) -> int:
        return self.ms


def _jvm_json(row: Any) -> str:
    """What job.composite_json writes in the JVM for a composite row, written here."""
    from eva.events import format_time

    name = '"' + row.profile + '"'
    ids = "[" + ", ".join('"' + i + '"' for i in row.constituents) + "]"
    partition = "" if row.partition is None else ', "partition": ' + row.partition
    return ('{"specversion": "1.0", "id": "' + row.ident + '", "source": "urn:evamed", '
            '"type": "eva.composite", "subject": ' + name + ', "time": "'
            + format_time(row.time) + '", "datacontenttype": "application/json", "data": '
            '{"profile": ' + name + ', "constituents": ' + ids + partition + "}}")


def parsed(lines: list[str], first_seq: int) -> pd.DataFrame:
    """The lines as the JVM's parse_lines hands them on (job.PARSED), by the same rule: the
    envelope's columns for a line whose attributes are the required ones, data and the
    extras, and whose data is no string; the line whole otherwise."""
    from eva.events import EventError
    from spark_jobs.job import EXTRAS

    rows: list[processing.Row] = []
    for seq, line in enumerate(lines, first_seq):
        try:
            event = from_json_line(line)
            obj = json.loads(line)
        except EventError:
            event = None
        allowed = {"specversion", "id", "source", "type", "time", "data", *EXTRAS}
        if event is None or set(obj) - allowed or isinstance(obj.get("data"), str):
            rows.append((seq, None, None, None, 0, None, None, line))
            continue
        extras = {k: v for k, v in obj.items() if k in EXTRAS}
        data = None if obj.get("data") is None else json.dumps(obj["data"])
        rows.append((seq, event.id, event.source, event.type, event.time, data,
                     json.dumps(extras) if extras else None, None))
    return pd.DataFrame(rows, columns=processing.FIELDS)


class _Store:
    """Every key's state handle, and the calls of the processor on them (as Spark makes
    them: per micro-batch, each key's rows in one call, then the keys whose timer the
    watermark passed). ``forget`` empties the worker's cache before every call."""

    def __init__(self, job: StreamJob, forget: bool = False) -> None:
        self.job = job
        self.forget = forget
        self.handles: dict[tuple[str, int], _Handle] = defaultdict(_Handle)
        self.out: dict[str, list[str]] = defaultdict(list)
        self.watermark = 0
        self.seq = 0
        state._ENGINES.clear()

    def call(self, key: tuple[str, int], rows: pd.DataFrame | None) -> None:
        if self.forget:
            state._ENGINES.clear()
        processor = composer_processor(self.job)
        processor.init(self.handles[key])
        if rows is None:
            frames = processor.handleExpiredTimer(key, _Clock(self.watermark), None)
        else:
            frames = processor.handleInputRows(key, iter([rows]), _Clock(self.watermark))
        for frame in frames:
            for row in frame.itertuples(index=False):
                self.out[row.kind].append(row.payload if row.payload is not None
                                          else _jvm_json(row))

    def batch(self, lines: list[str], lateness_ms: int = 0) -> None:
        frame = parsed(lines, self.seq)
        self.seq += len(lines)
        routed = fan_out(self.job, frame)
        newest = max([self.watermark, *(t.value // 1_000_000 for t in routed["ts"].dropna())])
        for key, rows in sorted(routed.groupby(["profile", "bucket"]), key=lambda kv: kv[0]):
            self.call((str(key[0]), int(key[1])), rows)
        self.watermark = max(self.watermark, newest - lateness_ms)
        for key, handle in sorted(self.handles.items()):
            if any(timer <= self.watermark for timer in handle.timers):
                self.call(key, None)


def _run(job: StreamJob, files: list[list[str]], forget: bool,
         lateness_ms: int = 0) -> dict[str, list[str]]:
    """Feed the files as micro-batches the way Spark would (the watermark is the newest
    time of earlier batches less the lateness)."""
    store = _Store(job, forget)
    for lines in files:
        store.batch(lines, lateness_ms)
    return store.out


@pytest.mark.parametrize("forget", [False, True])
def test_cached_or_rebuilt_the_engine_answers_the_same(tmp_path: Path, forget: bool) -> None:
    text, events, want = logistics_day()
    trace = [from_cloudevent(e, i) for i, e in enumerate(events)]
    table = str(tmp_path / "profiles.json")
    write_table(table, [Registration(text, trace[0].time - 1)])
    job = StreamJob(table, EngineConfig().to_json(), 4)
    lines = [json.dumps(e) for e in events]
    files = [lines[i:i + 60] for i in range(0, len(lines), 60)] + [[json.dumps(SENTINEL)]]
    got = _run(job, files, forget)
    assert sorted(got["composite"]) == sorted(want) and len(want) > 50
    assert not got["dead_letter"]


@pytest.mark.parametrize(("forget", "lateness"), [(False, 0), (True, 0), (True, 2_000_000)])
def test_registered_at_the_first_event_the_job_answers_as_replay(
        tmp_path: Path, forget: bool, lateness: int) -> None:
    """A registration without a time (`evamed compose --profiles` without --since) starts as
    replay starts: at the first event less the lateness. It started in 1970, so time classes
    ticked from then (P5 fired for every day since 1970, P3 paired a 1970 tick): 20,572
    composites for replay's 57. Engines restored from their state keep the start."""
    from eva.engine import Engine
    from eva.events import parse_time
    from eva.notify import composite_line
    from eva.parser import parse

    text, events, _ = logistics_day()
    config = EngineConfig(allowed_lateness=lateness)
    engine = Engine(config)
    engine.add_document(parse(text))
    trace = [from_cloudevent(e, i) for i, e in enumerate(events)]
    want = [composite_line(n)[1] for e in trace for n in engine.push(e)]
    want += [composite_line(n)[1] for n in engine.close(parse_time(SENTINEL["time"]))]
    table = str(tmp_path / "profiles.json")
    write_table(table, [Registration(text, None)])
    job = StreamJob(table, config.to_json(), 4)
    lines = [json.dumps(e) for e in events]
    files = [lines[i:i + 60] for i in range(0, len(lines), 60)] + [[json.dumps(SENTINEL)]]
    got = _run(job, files, forget, lateness // 1000)
    assert sorted(got["composite"]) == sorted(want) and len(want) > 50
    assert not got["dead_letter"]


def _evil(marker: Path) -> bytes:
    """A pickle that creates ``marker`` when unpickled: what the checkpoint state was."""
    import pickle

    class Payload:
        def __reduce__(self) -> tuple[Any, ...]:
            return (open, (str(marker), "w"))

    return pickle.dumps(Payload())


def _key_with_state(tmp_path: Path) -> tuple[_Handle, Any]:
    """One key's state (a core and partition records) after two calls, and a third call of
    the processor on it (as on another worker, or after a restart: nothing cached)."""
    text = 'class A = type == "a"\nprofile S per data.k = A\n'
    table = str(tmp_path / "profiles.json")
    write_table(table, [Registration(text, None)])
    job = StreamJob(table, EngineConfig().to_json(), 1)
    lines = [json.dumps({"specversion": "1.0", "id": f"e{i}", "source": "s", "type": "a",
                         "data": {"k": i % 2}, "time": f"2026-03-02T10:00:0{i}Z"})
             for i in range(3)]  # the third call needs the first's partition: read lazily
    handle = _Handle()

    def call(i: int) -> list[Any]:
        state._ENGINES.clear()  # as on another worker, or after a restart
        processor = composer_processor(job)
        processor.init(handle)
        return list(processor.handleInputRows(("S", 0), iter([parsed(lines[i:i + 1], i)]),
                                              _Clock(0)))

    call(0)
    call(1)
    return handle, lambda: call(2)


@pytest.mark.parametrize("part", ["core", "parts"])
def test_tampered_checkpoint_state_is_refused_and_runs_no_code(tmp_path: Path,
                                                               part: str) -> None:
    """Whoever can write the checkpoint directory must not run code in the workers: state
    is data only (JSON records), and a key whose core or partition record is not the job's
    fails with CheckpointError naming the key — the pickle in it is never unpickled."""
    handle, call = _key_with_state(tmp_path)
    marker = tmp_path / "ran"
    if part == "core":
        _, token, stamp = handle.states["core"].get()
        handle.states["core"].update((_evil(marker), token, stamp))
    else:
        records = handle.states["parts"].items
        assert len(records) == 2  # the partitions of k 0 and k 1
        for ident in records:
            records[ident] = (_evil(marker),)
    with pytest.raises(CheckpointError, match="profile S bucket 0 refused"):
        call()
    assert not marker.exists()


def test_the_layout_records_the_configuration_by_name(tmp_path: Path) -> None:
    """The checkpoint's layout keeps the engine configuration as ``EngineConfig.to_json``
    has it: the same settings resume, others are refused naming the field that changed, and
    a layout of the older state format (its configuration a positional list) is refused by
    that format."""
    from dataclasses import astuple

    from spark_jobs.job import LAYOUT, LayoutError, check_layout
    from spark_jobs.state import FORMAT

    job = StreamJob("unused", EngineConfig().to_json(), 16)
    check_layout(str(tmp_path / "new"), job)
    recorded = json.loads((tmp_path / "new" / LAYOUT).read_text())
    assert recorded == {"buckets": 16, "config": EngineConfig().to_json(), "state": FORMAT}
    check_layout(str(tmp_path / "new"), job)  # the same layout resumes
    other = StreamJob("unused", EngineConfig(tick=2_000_000).to_json(), 16)
    with pytest.raises(LayoutError, match=r"other settings \(config.tick 1000000 → 2000000\)"):
        check_layout(str(tmp_path / "new"), other)
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / LAYOUT).write_text(json.dumps(
        {"buckets": 16, "config": list(astuple(EngineConfig())), "state": 2}))
    with pytest.raises(LayoutError, match=f"holds state in format 2; this evamed reads format "
                                          f"{FORMAT} only"):
        check_layout(str(tmp_path / "old"), job)


@pytest.mark.parametrize(("text", "message"), [("{not json", "cannot be read"),
                                               ("[16]", "holds list, expected a JSON object")])
def test_an_unreadable_layout_is_refused_clearly(tmp_path: Path, text: str,
                                                 message: str) -> None:
    from spark_jobs.job import LAYOUT, LayoutError, check_layout

    (tmp_path / LAYOUT).write_text(text)
    with pytest.raises(LayoutError, match=message):
        check_layout(str(tmp_path), StreamJob("unused", EngineConfig().to_json(), 16))


def _events(spec: list[tuple[str, int, int]]) -> list[str]:
    """Lines of events (type, data.k, second)."""
    return [json.dumps({"specversion": "1.0", "id": f"{kind}{i}", "source": "s", "type": kind,
                        "data": {"k": k}, "time": f"2026-03-02T10:{second // 60:02d}:"
                                                  f"{second % 60:02d}Z"})
            for i, (kind, k, second) in enumerate(spec)]


@pytest.mark.parametrize("forget", [False, True])
def test_a_call_writes_only_the_partitions_it_changed(tmp_path: Path, forget: bool) -> None:
    """Ten partitions in one bucket: a later call with an event of one of them writes that
    partition's record only (and the core), and a restored engine reads only that record."""
    text = ('class A = type == "a"\nclass B = type == "b"\n'
            "profile S per data.k = ((all_dup(A); all_dup(B))_1h)_all_pairs\n")
    table = str(tmp_path / "profiles.json")
    write_table(table, [Registration(text, None)])
    store = _Store(StreamJob(table, EngineConfig().to_json(), 1), forget)
    store.batch(_events([("a", k, k) for k in range(10)]))
    parts = store.handles["S", 0].states["parts"]
    assert len(parts.items) == 10 and len(parts.writes) == 10
    parts.writes.clear()
    parts.reads.clear()
    store.batch(_events([("b", 3, 20)]))
    assert parts.writes == ['[0,["int",3]]'] and len(parts.items) == 10
    assert parts.reads == (['[0,["int",3]]'] if forget else [])
    assert len(store.out["composite"]) == 1


def test_a_removed_profiles_keys_are_cleared_at_the_next_micro_batch(tmp_path: Path) -> None:
    """A removed profile's keys hold nothing after the next micro-batch, though no event of
    theirs comes: the fan-out sends each of its buckets a drop row."""
    text = ('class A = type == "a"\nclass B = type == "b"\nclass Z = type == "z"\n'
            "profile S per data.k = ((all_dup(A); all_dup(B))_1h)_all_pairs\n"
            "profile Q = Z\n")
    table = str(tmp_path / "profiles.json")
    write_table(table, [Registration(text, None)])
    store = _Store(StreamJob(table, EngineConfig().to_json(), 4))
    store.batch(_events([("a", k, k) for k in range(12)]))
    held = [key for key, handle in store.handles.items()
            if key[0] == "S" and not handle.empty()]
    assert len(held) == 4  # every bucket of S holds partitions
    write_table(table, [Registration(text, None, frozenset({"S"}))])
    store.batch(_events([("z", 0, 30)]))  # nothing of S
    assert all(handle.empty() for key, handle in store.handles.items() if key[0] == "S")
    assert not store.handles["Q", 0].empty()
    assert not any(key[0] == "S" for key in state._ENGINES)


def test_composites_leave_as_columns_unless_their_text_needs_escapes() -> None:
    """The JVM writes a composite's line from its columns (job.composite_json, written here
    by _jvm_json): the bytes composite_line writes. Ids that need json's escapes leave with
    Python's line instead."""
    from eva.engine import Engine
    from eva.events import Event
    from eva.notify import composite_line
    from eva.parser import parse
    from spark_jobs.processor import COLUMNS, as_columns

    engine = Engine(EngineConfig())
    engine.add_document(parse('class A = type == "a"\nprofile S per data.k = A\n'))
    engine.begin(0)
    notes = [n for i, ident in enumerate(["e1", 'e"2', "é3", "e\\4", "e\n5"])
             for n in engine.push(Event(ident, "s", "a", 10 + i, i, {"k": ["x", 1][i % 2]}))]
    frame = pd.DataFrame([as_columns("S", n) for n in notes], columns=COLUMNS)
    out: list[Any] = list(frame.itertuples(index=False))  # as the sink gets them
    assert [r.payload is None for r in out] == [True, False, False, False, False]
    assert [r.payload or _jvm_json(r) for r in out] == [composite_line(n)[1] for n in notes]


# -- ordered input: the mediator's composer log (issue 23 item 4)


class _Ordered:
    """Spark's calls of an ordered job's processor, as ``_Store`` makes them, over composer-log
    lines read in releases (each row with its release's watermark, as the log sources give
    them); each micro-batch's composites are kept apart, with their order keys."""

    def __init__(self, job: StreamJob) -> None:
        self.job = job
        self.handles: dict[tuple[str, int], _Handle] = defaultdict(_Handle)
        self.batches: list[list[tuple[Any, str, str]]] = []  # (order key, profile, line)
        self.letters: list[str] = []
        self.seq = 1  # composer-log positions from 1
        state._ENGINES.clear()

    def batch(self, lines: list[str]) -> None:
        from spark_jobs.log_source import in_releases

        out: list[tuple[Any, str, str]] = []
        frame = parsed(lines, self.seq)
        frame["clock"] = pd.array([clock for _, _, clock in in_releases(
            iter((line, 0) for line in lines))], dtype="Int64")
        self.seq += len(lines)
        routed = fan_out(self.job, frame)
        for key, rows in sorted(routed.groupby(["profile", "bucket"]), key=lambda kv: kv[0]):
            processor = composer_processor(self.job)
            handle = self.handles[(str(key[0]), int(key[1]))]
            processor.init(handle)
            for part in processor.handleInputRows(key, iter([rows]), _Clock(0)):
                for row in part.itertuples(index=False):
                    if row.kind == "composite":
                        out.append((processing.report_key(row.key), row.profile,
                                    row.payload if row.payload is not None else _jvm_json(row)))
                    else:
                        self.letters.append(row.payload)
            assert not handle.timers  # an ordered key is called by its rows and clocks only
        self.batches.append(out)


def _composer_log(events: list[Any], releases: list[int]) -> list[str]:
    """The composer log of ``events`` (in trace order) released at the given times: each
    release's events, then its watermark line."""
    from eva.events import to_cloudevent

    lines: list[str] = []
    pending = list(events)
    for bound in releases:
        lines += [json.dumps(to_cloudevent(e)) for e in pending if e.time <= bound]
        pending = [e for e in pending if e.time > bound]
        lines.append(processing.watermark_line(bound))
    return lines


@pytest.mark.parametrize("seed", range(6))
def test_an_ordered_jobs_micro_batches_never_reorder_a_profile(tmp_path: Path,
                                                               seed: int) -> None:
    """Over the composer log cut into random micro-batches of whole releases: every key
    decides, in a micro-batch, just the instants up to the micro-batch's newest watermark line
    — those given events by their rows' release, the others (a negation, per partition) by a
    clock row — so each micro-batch's report keys lie after the previous one's. Sorted by
    order key within each micro-batch (what the mediator appends), each profile's composites
    come in replay's order — ``per`` partitions spread over buckets included — and, with the
    micro-batch that reads the last watermark line, all of them: no instant waits for a later
    event, nor for another micro-batch."""
    import random

    from eva.engine import Engine
    from eva.events import Event
    from eva.notify import composite_line
    from eva.parser import parse

    draw = random.Random(seed)
    text = ('class A = type == "a"\nclass B = type == "b"\n'
            "profile K per data.k = ((all_dup(A); last_dup(B))_3s)_all_pairs\n"
            "profile L = ((all_dup(A), all_dup(B))_2s)_all_pairs\n"
            "profile N per data.k = ((not A)_2s)_all_pairs\n")
    start = 1_772_445_600_000_000  # 2026-03-02T10:00:00Z
    events, t = [], start
    for i in range(120):
        t += draw.choice([0, 300_000, 1_000_000, 2_000_000])
        events.append(Event(f"e{i}", "urn:s", draw.choice("ab"), t, i + 1,
                            {"k": draw.randrange(6)}))
    releases = sorted({events[-1].time, *draw.sample([e.time for e in events], 15)})
    lines = _composer_log(events, releases)
    engine = Engine(EngineConfig())
    engine.add_document(parse(text), start=start)
    # Numbered by their composer-log positions, watermark lines counted: as the job numbers.
    numbered = [from_json_line(line, n) for n, line in enumerate(lines, 1)
                if "evamed:watermark" not in line]
    notes = [n for e in numbered for n in engine.push(e)] + engine.close(releases[-1])
    want = {p: [composite_line(n)[1] for n in notes if n.profile == p] for p in "KLN"}
    table = str(tmp_path / "profiles.json")
    write_table(table, [Registration(text, start)])
    job = StreamJob(table, EngineConfig().to_json(), 4, ordered=True)
    spark = _Ordered(job)
    ends = [n for n, line in enumerate(lines, 1) if "evamed:watermark" in line]
    cuts = sorted(set(draw.sample(ends, 6)) | {ends[-1]})  # micro-batches end at releases
    at = 0
    for cut in cuts:
        spark.batch(lines[at:cut])
        at = cut
    assert not spark.letters
    newest = None
    for batch in spark.batches:
        keys = [key for key, _, _ in batch]
        if keys:
            assert newest is None or min(keys) > newest, "a micro-batch reported behind"
            newest = max(keys)
    got = [line for batch in spark.batches for _, _, line in sorted(batch, key=lambda c: c[0])]
    for p in "KLN":
        assert [line for line in got if json.loads(line)["subject"] == p] == want[p], p
    assert sum(len(w) for w in want.values()) > 40
