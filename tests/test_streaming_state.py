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
from spark_jobs.job import StreamJob
from spark_jobs.processor import ANCHOR, CheckpointError, anchor_line, composer_processor
from spark_jobs.profiles import Registration, profiles, route, write_table
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


class _List:
    def __init__(self) -> None:
        self.items: list[tuple[Any, ...]] = []

    def get(self) -> Iterator[tuple[Any, ...]]:
        return iter(list(self.items))

    def appendList(self, values: list[tuple[Any, ...]]) -> None:
        self.items.extend(values)

    def clear(self) -> None:
        self.items = []


class _Handle:
    """One key's state handle, as Spark's keeps state per grouping key."""

    def __init__(self) -> None:
        self.states: dict[str, Any] = {}
        self.timers: set[int] = set()

    def getValueState(self, name: str, schema: str) -> _Value:
        return self.states.setdefault(name, _Value())

    def getListState(self, name: str, schema: str) -> _List:
        return self.states.setdefault(name, _List())

    def listTimers(self) -> Iterator[int]:
        return iter(sorted(self.timers))

    def deleteTimer(self, timer: int) -> None:
        self.timers.discard(timer)

    def registerTimer(self, timer: int) -> None:
        self.timers.add(timer)


class _Clock:
    def __init__(self, ms: int) -> None:
        self.ms = ms

    def getCurrentWatermarkInMs(self) -> int:
        return self.ms


def _run(job: StreamJob, files: list[list[str]], forget: bool,
         lateness_ms: int = 0) -> dict[str, list[str]]:
    """Feed the files as micro-batches the way Spark would: per batch, each key's rows in one
    call (the watermark is the newest time of earlier batches less the lateness), then the keys
    whose timer the watermark passed. ``forget`` empties the worker's cache before every
    call."""
    handles: dict[tuple[str, int], _Handle] = defaultdict(_Handle)
    out: dict[str, list[str]] = defaultdict(list)
    watermark = 0
    seq = 0
    processing._ENGINES.clear()

    def call(key: tuple[str, int], rows: list[tuple[int, str]] | None) -> None:
        if forget:
            processing._ENGINES.clear()
        processor = composer_processor(job)
        processor.init(handles[key])
        if rows is None:
            frames = processor.handleExpiredTimer(key, _Clock(watermark), None)
        else:
            frame = pd.DataFrame(rows, columns=["seq", "line"])
            frames = processor.handleInputRows(key, iter([frame]), _Clock(watermark))
        for frame in frames:
            for kind, _, _, payload in frame.itertuples(index=False):
                out[kind].append(payload)

    for lines in files:
        table = sorted(profiles(job.table).items())
        batch: dict[tuple[str, int], list[tuple[int, str]]] = defaultdict(list)
        newest = watermark
        events = [from_json_line(line) for line in lines]
        seqs = list(range(seq, seq + len(lines)))
        for line, event in zip(lines, events, strict=True):
            for key in route(table, job.buckets, event):
                batch[key].append((seq, line))
            newest = max(newest, event.time // 1000)
            seq += 1
        first = anchor_line(seqs, list(events))  # the frame's first event, as the fan-out sends
        for name, (_, per, _) in table:
            if per is None:
                batch.setdefault((name, 0), []).append((ANCHOR, first))
        for key, rows in sorted(batch.items()):
            call(key, rows)
        watermark = max(watermark, newest - lateness_ms)
        for key, handle in sorted(handles.items()):
            if any(timer <= watermark for timer in handle.timers):
                call(key, None)
    return out


@pytest.mark.parametrize(("log_rows", "forget"), [(2_000, False), (2_000, True), (1, True),
                                                  (10**9, True), (10**9, False)])
def test_cached_or_rebuilt_the_engine_answers_the_same(tmp_path: Path, log_rows: int,
                                                        forget: bool) -> None:
    text, events, want = logistics_day()
    trace = [from_cloudevent(e, i) for i, e in enumerate(events)]
    table = str(tmp_path / "profiles.json")
    write_table(table, [Registration(text, trace[0].time - 1)])
    job = StreamJob(table, EngineConfig().to_json(), 4, log_rows)
    lines = [json.dumps(e) for e in events]
    files = [lines[i:i + 60] for i in range(0, len(lines), 60)] + [[json.dumps(SENTINEL)]]
    got = _run(job, files, forget)
    assert sorted(got["composite"]) == sorted(want) and len(want) > 50
    assert not got["dead_letter"]


@pytest.mark.parametrize(("log_rows", "forget", "lateness"), [(2_000, False, 0), (1, True, 0),
                                                              (10**9, True, 2_000_000)])
def test_registered_at_the_first_event_the_job_answers_as_replay(
        tmp_path: Path, log_rows: int, forget: bool, lateness: int) -> None:
    """A registration without a time (`evamed compose --profiles` without --since) starts as
    replay starts: at the first event less the lateness. It started in 1970, so time classes
    ticked from then (P5 fired for every day since 1970, P3 paired a 1970 tick): 20,572
    composites for replay's 57. Engines rebuilt from snapshot and log keep the start."""
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
    job = StreamJob(table, config.to_json(), 4, log_rows)
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


def _key_with_a_log(tmp_path: Path) -> tuple[_Handle, Any]:
    """One key's state holding a snapshot and one log entry, and a call of the processor on it
    (as on another worker, or after a restart: nothing cached)."""
    text = 'class A = type == "a"\nprofile S = A\n'
    table = str(tmp_path / "profiles.json")
    write_table(table, [Registration(text, None)])
    job = StreamJob(table, EngineConfig().to_json(), 1, 10**9)
    rows = [(i, json.dumps({"specversion": "1.0", "id": f"e{i}", "source": "s", "type": "a",
                            "time": f"2026-03-02T10:00:0{i}Z"})) for i in range(3)]
    handle = _Handle()

    def call(chunk: list[tuple[int, str]]) -> list[Any]:
        processing._ENGINES.clear()  # as on another worker, or after a restart
        processor = composer_processor(job)
        processor.init(handle)
        frame = pd.DataFrame(chunk, columns=["seq", "line"])
        return list(processor.handleInputRows(("S", 0), iter([frame]), _Clock(0)))

    call(rows[:1])
    call(rows[1:2])  # logged: the key now has a snapshot and a log entry
    return handle, lambda: call(rows[2:])


@pytest.mark.parametrize("part", ["snapshot", "log"])
def test_tampered_checkpoint_state_is_refused_and_runs_no_code(tmp_path: Path,
                                                               part: str) -> None:
    """Whoever can write the checkpoint directory must not run code in the workers: state
    is data only (JSON records), and a key whose snapshot or log is not the job's fails with
    CheckpointError naming the key — the pickle in it is never unpickled."""
    import zlib

    handle, call = _key_with_a_log(tmp_path)
    marker = tmp_path / "ran"
    if part == "snapshot":
        token = handle.states["snapshot"].get()[1]
        handle.states["snapshot"].update((_evil(marker), token))
    else:
        handle.states["log"].items[0] = (zlib.compress(_evil(marker)),)
    with pytest.raises(CheckpointError, match="profile S bucket 0 refused"):
        call()
    assert not marker.exists()


def _inflating(head: bytes, spaces: int) -> bytes:
    """``head`` then ``spaces`` spaces, compressed in chunks (a few KB however many)."""
    import zlib

    packer = zlib.compressobj(9)
    body = packer.compress(head)
    for _ in range(spaces >> 20):
        body += packer.compress(b" " * (1 << 20))
    return body + packer.flush()


@pytest.mark.parametrize(("entry", "message"), [
    (b"[" * 100_000 + b"]" * 100_000, "RecursionError"),
    (b'[18446744073709551616,[[1,"{}"]]]', "with 64-bit integers"),
    (b'[null,[[-9223372036854775809,"{}"]]]', "with 64-bit integers"),
    (None, "inflates to more than 1,048,576 bytes"),
])
def test_a_log_entry_that_breaks_the_reader_is_refused(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, entry: bytes | None,
        message: str) -> None:
    """Issue 11 review: JSON nested past the stack escaped _unpack as a RecursionError, and a
    zlib bomb was inflated whole; both are now the key's CheckpointError, as is a watermark or
    sequence number past 64 bits (which the engine's clock would take)."""
    import zlib

    from eva import snapshot as module

    monkeypatch.setattr(module, "MAX_STATE_BYTES", 1 << 20)  # the bomb stays small
    handle, call = _key_with_a_log(tmp_path)
    blob = _inflating(b"[null,[]]", 64 << 20) if entry is None else zlib.compress(entry)
    handle.states["log"].items[0] = (blob,)
    with pytest.raises(CheckpointError, match="profile S bucket 0 refused") as caught:
        call()
    assert message in str(caught.value), str(caught.value)


def test_a_log_entry_too_large_to_read_back_is_a_snapshot_instead(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """_unpack refuses an entry over MAX_STATE_BYTES, so the writer never logs one: such a call
    writes the engine's snapshot instead (and the log starts afresh)."""
    handle, _ = _key_with_a_log(tmp_path)
    assert len(handle.states["log"].items) == 1 and handle.states["head"].get()[2] > 0
    monkeypatch.setattr(processing, "MAX_STATE_BYTES", 100)  # under one row's entry
    (tmp_path / "small").mkdir()
    handle, _ = _key_with_a_log(tmp_path / "small")
    assert handle.states["log"].items == [] and handle.states["head"].get()[2] == 0


def test_the_layout_records_the_configuration_by_name(tmp_path: Path) -> None:
    """The checkpoint's layout keeps the engine configuration as ``EngineConfig.to_json``
    has it: the same settings resume, others are refused naming the field that changed, and
    a layout of the older state format (its configuration a positional list) is refused by
    that format."""
    from dataclasses import astuple

    from eva.snapshot import FORMAT
    from spark_jobs.job import LAYOUT, LayoutError, check_layout

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
