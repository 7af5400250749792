"""Batch replay on Spark (issue 5, part 3): `evamed replay --engine spark` prints exactly what
the in-process engine prints. A real local SparkSession (local[2]); all Spark tests share one
xdist worker so only one JVM starts."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from typer.testing import CliRunner

from mediator.cli import app
from mediator.eva import ast
from mediator.eva.engine import Engine, EngineConfig
from mediator.eva.events import Event
from mediator.eva.notify import to_cloudevent
from mediator.eva.printer import to_text
from spark_jobs.batch import replay
from tests.strategies import documents, traces

pytestmark = pytest.mark.xdist_group("spark")


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    from spark_jobs.session import build_session

    session = build_session("local[2]", "evamed-tests")
    yield session


def in_process(doc: ast.Document, trace: list[Event], config: EngineConfig) -> list[str]:
    engine = Engine(config)
    engine.add_document(doc)
    notes = [n for e in trace for n in engine.push(e)] + engine.close()
    return [json.dumps(to_cloudevent(n)) for n in notes]


def test_random_profiles_and_traces_equal_the_in_process_engine(spark: Any) -> None:
    """Every operator and parameter, `per` partitions, negations on the clock and time
    classes (tests/strategies.py), many traces with equal timestamps."""
    config = EngineConfig(tick=3)

    @settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck))
    @given(documents(), traces(max_size=30))
    def prop(doc: ast.Document, trace: list[Event]) -> None:
        if not trace:
            return
        want = in_process(doc, trace, config)
        got = replay(spark, to_text(doc), trace, config=config, origin=trace[0].time - 1,
                     end=max(e.time for e in trace))
        assert got == want

    prop()


def test_replay_engine_spark_prints_what_inprocess_prints(spark: Any, tmp_path: Path) -> None:
    """The paper's profiles (P2 and P4 `per` partitions, P5 anchored absence on a time class,
    P6 time class per truck) over the logistics day, with malformed and late events."""
    from examples.logistics.generate import day

    lines = [json.dumps(e) for e in day(7)]
    lines.insert(40, "{broken")
    lines.append(json.dumps({**json.loads(lines[5]), "id": "late-1"}))
    events = tmp_path / "day.jsonl"
    events.write_text("\n".join(lines) + "\n")
    runner = CliRunner()
    args = ["replay", "--profiles", "examples/logistics/profiles.eva", "--events", str(events)]
    plain = runner.invoke(app, args)
    on_spark = runner.invoke(app, [*args, "--engine", "spark"])
    assert plain.exit_code == on_spark.exit_code == 0, on_spark.output
    assert on_spark.stdout == plain.stdout and len(plain.stdout.splitlines()) > 50
    assert on_spark.stderr.count('"reason"') == plain.stderr.count('"reason"') == 2


def test_engine_option_is_checked() -> None:
    runner = CliRunner()
    result = runner.invoke(app, ["replay", "--profiles", "examples/logistics/profiles.eva",
                                 "--events", "x", "--engine", "flink"])
    assert result.exit_code == 2 and "expected inprocess or spark" in result.output


# ------------------------------------------------------------------ the streaming job


def test_streaming_job_equals_the_engine_and_resumes_from_its_checkpoint(
        spark: Any, tmp_path: Path) -> None:
    """The paper's profiles over the logistics day as a stream of spool files: the job is
    stopped half-way, restarted on the same checkpoint with the rest of the files, and the
    composites it wrote are exactly the in-process engine's — none lost, none twice."""
    import os

    from examples.logistics.generate import day
    from mediator.eva.events import from_cloudevent, parse_time
    from mediator.eva.parser import parse
    from spark_jobs.streaming import StreamJob, config_tuple, directory_sink, start

    text = Path("examples/logistics/profiles.eva").read_text()
    events = day(7)
    sentinel = {"specversion": "1.0", "id": "end", "source": "test", "type": "none",
                "time": "2026-03-05T00:00:00Z"}  # moves the watermark past every clock step
    trace = [from_cloudevent(e, i) for i, e in enumerate(events)]
    config = EngineConfig()
    engine = Engine(config)
    engine.add_document(parse(text))
    want = [json.dumps(to_cloudevent(n)) for e in trace for n in engine.push(e)]
    want += [json.dumps(to_cloudevent(n)) for n in engine.close(parse_time(sentinel["time"]))]
    spool, out, checkpoint = tmp_path / "spool", tmp_path / "out", str(tmp_path / "ckpt")
    spool.mkdir()
    chunks = [events[i:i + 80] for i in range(0, len(events), 80)] + [[sentinel]]

    def drop(k: int) -> None:
        path = spool / f"part-{k:04d}.jsonl"
        path.write_text("\n".join(json.dumps(e) for e in chunks[k]) + "\n")
        os.utime(path, (1_000_000 + k, 1_000_000 + k))

    job = StreamJob(text, config_tuple(config), trace[0].time - 1)
    for k in range(2):
        drop(k)
    query = start(spark, job, str(spool), checkpoint, directory_sink(str(out)), max_files=1)
    query.processAllAvailable()
    query.stop()
    for k in range(2, len(chunks)):
        drop(k)
    query = start(spark, job, str(spool), checkpoint, directory_sink(str(out)), max_files=1)
    query.processAllAvailable()
    query.stop()
    got = [line for f in sorted(out.glob("composites-*.jsonl"))
           for line in f.read_text().splitlines() if line]
    assert sorted(got) == sorted(want) and len(want) > 50
