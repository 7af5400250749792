"""The composer protocol (mediator/composer.py), what the service composes through: the
in-process composer answers as the engine, profiles come and go between feeds, and both
implementations have the protocol's shape (the Spark one runs for real in tests/test_spark.py,
where the two are compared on a live job, and in tests/test_pipeline.py and
tests/test_service_e2e.py fed live). The live feed's readers — the SQLite and Redis event logs
as Spark streaming sources — are checked here without Spark: their offsets are the stores'
positions, capped where the pipeline is, paged and bounded; and ``evamed serve`` with the
Spark composer and no Java says what to install."""

from __future__ import annotations

import inspect
import json
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows
from typer.testing import CliRunner

from eva.engine import Engine, EngineConfig
from eva.events import Event, from_cloudevent
from eva.notify import composite_line
from eva.parser import parse
from mediator.cli import app
from mediator.composer import Composer, InProcessComposer
from mediator.store.redis import RedisStore
from mediator.store.sqlite import SqliteStore
from spark_jobs import log_source, redis_io
from spark_jobs.composer import SparkComposer
from tests.helpers import SENTINEL, logistics_day

METHODS = sorted(name for name in vars(Composer) if not name.startswith("_"))


def _event(i: int, kind: str, second: int) -> Event:
    return from_cloudevent({"specversion": "1.0", "id": f"e{i}", "source": "t", "type": kind,
                            "time": f"2026-03-02T10:00:{second:02d}Z"}, i)


@pytest.mark.parametrize("implementation", [InProcessComposer, SparkComposer])
@pytest.mark.parametrize("method", METHODS)
def test_both_composers_have_the_protocol_shape(implementation: type, method: str) -> None:
    """SparkComposer satisfies the protocol by its shape alone (spark_jobs does not import the
    mediator): every method, with the protocol's signature."""
    assert METHODS == ["close", "collect", "feed", "register", "remove"]
    want = inspect.signature(getattr(Composer, method))
    assert inspect.signature(getattr(implementation, method)) == want


def test_the_in_process_composer_answers_as_the_engine_on_the_logistics_day() -> None:
    """Fed in chunks, it reports what the engine's pushes report (the engine's ``close`` at
    the end of a trace has no counterpart: a composer's input does not end)."""
    text, events, _ = logistics_day()
    trace = [from_cloudevent(e, i) for i, e in enumerate([*events, SENTINEL])]
    engine = Engine(EngineConfig())
    engine.add_document(parse(text))
    want = [composite_line(n)[1] for event in trace for n in engine.push(event)]
    composer: Composer = InProcessComposer()
    composer.register(text)  # before any event: at the first, as the engine (and replay)
    got = []
    for start in range(0, len(trace), 50):
        composer.feed(trace[start:start + 50])
        got += composer.collect()
    composer.close()
    assert [json.dumps(payload) for kind, _, payload in got if kind == "composite"] == want
    assert len(want) > 20
    assert [kind for kind, _, _ in got if kind != "composite"] == []


def test_in_process_profiles_come_and_go_and_late_events_are_dead_letters() -> None:
    """A profile registered without a time sees events after the newest fed; a removed one
    reports nothing more; an event behind the clock is collected as a dead letter."""
    composer: Composer = InProcessComposer()
    assert composer.register('class A = type == "a"\nprofile S = A\n', at=0) == ["S"]
    composer.feed([_event(0, "a", 1)])
    assert composer.register('class B = type == "b"\nprofile T = B\n') == ["T"]
    composer.feed([_event(1, "b", 1), _event(2, "b", 2), _event(3, "a", 3)])
    assert composer.remove("S") and not composer.remove("S")
    composer.feed([_event(4, "a", 4), _event(5, "b", 0)])
    got = composer.collect()
    composites = [(profile, payload["data"]["constituents"]) for kind, profile, payload in got
                  if kind == "composite"]
    assert composites == [("S", ["e0"]), ("T", ["e2"]), ("S", ["e3"])]
    letters = [payload for kind, _, payload in got if kind == "dead_letter"]
    assert len(letters) == 1 and letters[0]["reason"] == "late", letters
    assert composer.collect() == []


def _read(reader: Any, start: dict[str, Any], end: dict[str, Any]) -> list[tuple[str, int]]:
    """What one micro-batch from ``start`` to ``end`` reads, as Spark plans and runs it."""
    return [row for part in reader.partitions(start, end) for row in reader.read(part)]


def _lines(count: int, first: int = 0) -> list[str]:
    return [json.dumps({"id": f"e{i}"}) for i in range(first, first + count)]


@pytest.mark.parametrize("kind", ["sqlite", "redis"])
def test_the_event_log_sources_read_positions_capped_paged_and_bounded(
        kind: str, tmp_path: Path, request: pytest.FixtureRequest,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The live feed's readers over a store's event log as the store writes it: rows are
    (line, seq) in log order; an offset is the last position read, so a reader started again
    from a committed offset (a restart) goes on after it; the cap file holds the job at the
    pipeline's position (none written yet: at 0; never read back behind the start); max_rows
    bounds a micro-batch; reads go in pages; positions trimmed meanwhile are skipped."""
    cap = tmp_path / "evaluated"
    options = {"cap": str(cap), "max_rows": "25"}
    if kind == "sqlite":
        store: Any = SqliteStore(tmp_path / "m.db")
        reader: Any = log_source._Reader({"path": store.path, **options})
        monkeypatch.setattr(log_source, "PAGE", 7)
    else:
        store = RedisStore(request.getfixturevalue("redis_url") + "?prefix=t:")
        reader = redis_io._Reader({"url": store.url, "stream": "t:events", **options})

    def seqs(rows: list[tuple[str, int]]) -> list[int]:
        return [seq if kind == "sqlite" else seq // 1_000_000 for _, seq in rows]

    store.append_events(_lines(40))
    start = reader.initialOffset()
    assert reader.latestOffset(start, reader.getDefaultReadLimit()) == start  # no cap file yet
    cap.write_text("30")
    assert isinstance(reader.getDefaultReadLimit(), ReadMaxRows)
    end = reader.latestOffset(start, reader.getDefaultReadLimit())
    rows = _read(reader, start, end)
    assert seqs(rows) == list(range(1, 26)) and rows[0][0] == _lines(1)[0]
    again = reader.latestOffset(end, ReadAllAvailable())  # the cap, whatever the limit
    assert seqs(_read(reader, end, again)) == list(range(26, 31))
    cap.write_text("10")  # a restart's replay: the cap behind the committed offset
    assert reader.latestOffset(again, ReadAllAvailable()) == again
    assert reader.partitions(again, again) == []
    store.trim_events(35)
    cap.write_text("40")
    resumed = (log_source._Reader({"path": store.path, "cap": str(cap)}) if kind == "sqlite"
               else redis_io._Reader({"url": store.url, "stream": "t:events", "cap": str(cap)}))
    last = resumed.latestOffset(again, resumed.getDefaultReadLimit())
    assert seqs(_read(resumed, again, last)) == list(range(35, 41))
    store.close()


@pytest.mark.parametrize("kind", ["sqlite", "redis"])
def test_the_composer_log_is_read_in_whole_releases_each_line_with_its_watermark(
        kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    """Read in releases (the mediator's live jobs, issue 23 item 4), each row carries its
    release's watermark — the instant up to which its release is complete — and a micro-batch
    ends at a watermark line: max_rows is met at the last one within it, and a release longer
    than that is read whole. Positions are the rows' seq, from both stores."""
    from mediator.store.base import ComposerLine
    from spark_jobs.processor import watermark_line

    def line(ident: str) -> ComposerLine:
        return ComposerLine(json.dumps({"id": ident}), 1, "s", ident, "t")

    if kind == "sqlite":
        store: Any = SqliteStore(tmp_path / "m.db")
        options = {"path": store.path, "table": "composer_log"}
        make: Any = log_source._Reader
    else:
        store = RedisStore(request.getfixturevalue("redis_url") + "?prefix=t:")
        options = {"url": store.url, "stream": "t:composer", "positions": "true"}
        make = redis_io._Reader
    for ids, mark in ((["e1", "e2"], 10), (["e3"], 20), (["e4", "e5", "e6"], 30)):
        store.append_composer([*map(line, ids), ComposerLine(watermark_line(mark), mark)])
    reader = make({**options, "releases": "true", "max_rows": "4"})
    ends: list[dict[str, Any]] = []
    rows: list[Any] = []
    start = reader.initialOffset()
    while True:
        end = reader.latestOffset(start, ReadMaxRows(4 if len(ends) < 2 else 2))
        if end == start:
            break
        rows += _read(reader, start, end)
        ends.append(end)
        start = end
    assert [json.loads(v).get("id", "wm") for v, _, _ in rows] == [
        "e1", "e2", "wm", "e3", "wm", "e4", "e5", "e6", "wm"]
    assert [(seq, clock) for _, seq, clock in rows] == [
        (1, 10), (2, 10), (3, 10), (4, 20), (5, 20), (6, 30), (7, 30), (8, 30), (9, 30)]
    assert len(ends) == 3  # at 3 (within 4), at 5, and the third release whole (past 2)
    plain = make({**options, "max_rows": "4"})  # not in releases: as the event log is read
    assert [r[1] for r in _read(plain, plain.initialOffset(), plain.latestOffset(
        plain.initialOffset(), plain.getDefaultReadLimit()))] == [1, 2, 3, 4]
    store.close()


def test_the_sqlite_log_source_refuses_what_it_cannot_read(tmp_path: Path) -> None:
    """No path, a max_rows that is not a count, a cap file that holds no position: each
    refused saying what was found and what was expected."""
    with pytest.raises(ValueError, match="needs option path"):
        log_source._Reader({})
    with pytest.raises(ValueError, match="max_rows: found 'x', expected a whole number"):
        log_source._Reader({"path": "x", "max_rows": "x"})
    cap = tmp_path / "cap"
    cap.write_text("ten")
    with pytest.raises(ValueError, match="does not hold a log position"):
        log_source.read_cap(str(cap))


def test_serve_without_java_says_what_to_install(monkeypatch: pytest.MonkeyPatch,
                                                  tmp_path: Path) -> None:
    """``evamed serve --composer spark`` without Java exits 2 before starting anything, with
    what to install — one line, no traceback."""
    import spark_jobs.session

    monkeypatch.setattr(spark_jobs.session, "java_missing", lambda: "Spark needs Java 17: "
                        "install one (Debian: apt-get install openjdk-17-jre-headless)")
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, ["serve", "--listen", "127.0.0.1:0", "--composer", "spark"])
    assert result.exit_code == 2, result.output
    assert "apt-get install openjdk-17-jre-headless" in result.output
    assert "Traceback" not in result.output and not (tmp_path / "evamed.db").exists()
