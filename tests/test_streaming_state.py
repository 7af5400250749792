"""The streaming job's per-key state (spark_jobs/streaming.py), without Spark: the processor
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

from mediator.eva.engine import EngineConfig
from mediator.eva.events import from_cloudevent, from_json_line
from spark_jobs import streaming
from spark_jobs.streaming import (
    ANCHOR,
    Registration,
    StreamJob,
    composer_processor,
    config_tuple,
    profiles,
    route,
    write_table,
)
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


def _run(job: StreamJob, files: list[list[str]], forget: bool) -> dict[str, list[str]]:
    """Feed the files as micro-batches the way Spark would: per batch, each key's rows in one
    call (the watermark is the newest time of earlier batches), then the keys whose timer the
    watermark passed. ``forget`` empties the worker's cache before every call."""
    handles: dict[tuple[str, int], _Handle] = defaultdict(_Handle)
    out: dict[str, list[str]] = defaultdict(list)
    watermark = 0
    seq = 0
    streaming._ENGINES.clear()

    def call(key: tuple[str, int], rows: list[tuple[int, str]] | None) -> None:
        if forget:
            streaming._ENGINES.clear()
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
        table = sorted(profiles(job).items())
        batch: dict[tuple[str, int], list[tuple[int, str]]] = defaultdict(list)
        newest = watermark
        for line in lines:
            event = from_json_line(line)
            for key in route(table, job.buckets, event):
                batch[key].append((seq, line))
            newest = max(newest, event.time // 1000)
            seq += 1
        for name, (_, per, _) in table:
            if per is None:
                batch.setdefault((name, 0), []).append((ANCHOR, ""))
        for key, rows in sorted(batch.items()):
            call(key, rows)
        watermark = newest
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
    job = StreamJob(table, config_tuple(EngineConfig()), 4, log_rows)
    lines = [json.dumps(e) for e in events]
    files = [lines[i:i + 60] for i in range(0, len(lines), 60)] + [[json.dumps(SENTINEL)]]
    got = _run(job, files, forget)
    assert sorted(got["composite"]) == sorted(want) and len(want) > 50
    assert not got["dead_letter"]
