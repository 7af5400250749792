"""Batch replay on Spark (issue 5, part 3): `evamed replay --engine spark` prints exactly what
the in-process engine prints. A real local SparkSession (local[2]); all Spark tests share one
xdist worker so only one JVM starts."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import astuple
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from eva import ast
from eva.engine import Engine, EngineConfig
from eva.events import REQUIRED, Event
from eva.notify import to_cloudevent
from eva.parser import parse
from eva.printer import to_text
from mediator.cli import app
from spark_jobs.batch import replay
from spark_jobs.job import StreamJob, start
from spark_jobs.profiles import Registration, write_table
from spark_jobs.sinks import directory_sink
from spark_jobs.spool import spool_file
from tests.helpers import SENTINEL, logistics_day
from tests.strategies import documents, traces

pytestmark = pytest.mark.xdist_group("spark")


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    from spark_jobs.session import build_session

    # Small Arrow frames: the jobs must not depend on how Spark cuts a file into frames (a
    # line numbering that restarted per frame reordered events; the benchmark found it).
    session = build_session("local[2]", "evamed-tests",
                            {"spark.sql.execution.arrow.maxRecordsPerBatch": "32"})
    yield session


def _written(out: Path, kind: str) -> list[str]:
    """What the directory sink wrote: every line of its composite or dead-letter files."""
    return [line for f in sorted(out.glob(f"{kind}s-*.jsonl"))
            for line in f.read_text().splitlines() if line]


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


def test_a_cluster_gets_the_spooled_rows_with_the_plan(spark: Any) -> None:
    """Executors on other machines cannot open the driver's spool file: with ``shared=False``
    the rows travel with the plan, and the answer is the same."""
    doc = parse('class A = type == "a"\nclass B = type == "b"\n'
                "profile P per data.k = ((all_dup(A); all_dup(B))_5s)_all_pairs\n")
    trace = [Event(f"e{i}", "s", "ab"[i % 2], 10 + i, i, {"k": i % 3}) for i in range(40)]
    config = EngineConfig()
    got = {shared: replay(spark, to_text(doc), trace, config=config, origin=9, end=60,
                          shared=shared) for shared in (True, False)}
    assert got[True] == got[False] == in_process(doc, trace, config) != []


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


def test_each_session_has_its_own_scratch_directory(spark: Any) -> None:
    """spark.local.dir (shuffle files, RocksDB working copies) was one fixed directory under the
    system temp directory, shared by every job on the machine: now one per session."""
    import os
    import tempfile

    from spark_jobs.session import _scratch

    local = spark.sparkContext.getConf().get("spark.local.dir")
    assert os.path.isdir(local) and os.path.basename(local).startswith("evamed-spark-")
    assert local != os.path.join(tempfile.gettempdir(), "evamed-spark")
    assert _scratch() != _scratch()


@pytest.mark.parametrize("command", ["compose", "replay"])
@pytest.mark.parametrize("java_home", [None, "empty"])
def test_spark_commands_without_java_say_what_to_install(tmp_path: Path, command: str,
                                                         java_home: str | None) -> None:
    """Without Java, PySpark failed with an 87-line traceback about its gateway: the CLI looks
    for Java first (JAVA_HOME/bin/java, else java on PATH, as Spark's launcher does) and says in
    one line what to install, exit 2."""
    import os
    import subprocess
    import sys

    (tmp_path / "empty").mkdir()
    (tmp_path / "day.jsonl").write_text(json.dumps(SENTINEL) + "\n")  # Spark would start
    env = {k: v for k, v in os.environ.items() if k != "JAVA_HOME"}
    env["PATH"] = str(tmp_path / "empty")  # no java on it
    if java_home is not None:
        env["JAVA_HOME"] = str(tmp_path / java_home)
    args = {"compose": ["--profiles", "examples/logistics/profiles.eva", "--spool", str(tmp_path),
                        "--out", str(tmp_path / "out"), "--checkpoint", str(tmp_path / "ck")],
            "replay": ["--profiles", "examples/logistics/profiles.eva", "--events",
                       str(tmp_path / "day.jsonl"), "--engine", "spark"]}[command]
    result = subprocess.run([str(Path(sys.executable).parent / "evamed"), command, *args],
                            env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert "openjdk-17-jre-headless" in result.stderr and "Traceback" not in result.stderr
    assert ("JAVA_HOME is" if java_home else "no java on PATH") in result.stderr
    assert not (tmp_path / "ck").exists()  # checked before anything is written


# ------------------------------------------------------------------ the streaming job


def test_compose_refuses_a_checkpoint_of_pickled_state_before_spark_starts(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A checkpoint written before state was data only (its layout has no state format) holds
    pickles, which are never read: refused up front, exit 2, Spark not started."""
    import spark_jobs.session

    monkeypatch.setattr(spark_jobs.session, "build_session", lambda *a, **k: pytest.fail("started"))
    profiles = tmp_path / "p.eva"
    profiles.write_text('class A = type == "a"\nprofile S = A\n')
    (tmp_path / "ck" / "spark").mkdir(parents=True)
    config = list(astuple(EngineConfig()))  # the positional form layouts once held
    (tmp_path / "ck" / "spark" / "evamed-layout.json").write_text(
        json.dumps({"buckets": 16, "config": config}))
    result = CliRunner().invoke(app, [
        "compose", "--once", "--checkpoint", str(tmp_path / "ck"), "--profiles", str(profiles),
        "--spool", str(tmp_path), "--out", str(tmp_path / "out")])
    assert result.exit_code == 2 and "holds state in format 1" in result.output, result.output


def test_compose_reports_refused_checkpoint_state_in_one_line(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """State the job did not write fails the query inside Spark (a worker's CheckpointError in
    Spark's exception text): `evamed compose` says so in one line, exit 2, no traceback."""
    import spark_jobs.job
    import spark_jobs.session

    class Query:
        def processAllAvailable(self) -> None:
            raise RuntimeError("[PYTHON_EXCEPTION] Traceback (most recent call last):\n  File "
                               "...\nspark_jobs.processor.CheckpointError: checkpoint state of "
                               "profile S bucket 3 refused: not an evamed engine snapshot\n\tat "
                               "org.apache.spark...")

        def stop(self) -> None:
            pass

    monkeypatch.setattr(spark_jobs.session, "build_session", lambda *a, **k: object())
    monkeypatch.setattr(spark_jobs.job, "start", lambda *a, **k: Query())
    profiles = tmp_path / "p.eva"
    profiles.write_text('class A = type == "a"\nprofile S per data.k = A\n')
    result = CliRunner().invoke(app, [
        "compose", "--once", "--checkpoint", str(tmp_path / "ck"), "--profiles", str(profiles),
        "--spool", str(tmp_path), "--out", str(tmp_path / "out")])
    assert result.exit_code == 2, result.output
    assert result.output.strip() == ("error: checkpoint state of profile S bucket 3 refused: "
                                     "not an evamed engine snapshot")


def test_compose_once_prints_what_replay_prints(spark: Any, tmp_path: Path) -> None:
    """`evamed compose --once` over the README's logistics day writes exactly the composites
    `evamed replay` prints, byte for byte. Without --since the profiles are registered at the
    first event, as replay registers; they were registered in 1970, and the time classes
    ticked from then: 20,572 composites for replay's 57. The job writes a file per micro-batch,
    each sorted, so the lines are compared sorted (replay prints in report order)."""
    import subprocess
    import sys

    spool, out = tmp_path / "spool", tmp_path / "out"
    spool.mkdir()
    subprocess.run([sys.executable, "examples/logistics/generate.py", "--out",
                    str(spool / "day.jsonl")], check=True, capture_output=True)
    runner = CliRunner()
    profiles = "examples/logistics/profiles.eva"
    plain = runner.invoke(app, ["replay", "--profiles", profiles, "--events",
                                str(spool / "day.jsonl")])
    assert plain.exit_code == 0, plain.output
    composed = runner.invoke(app, ["compose", "--once", "--profiles", profiles, "--spool",
                                   str(spool), "--out", str(out), "--checkpoint",
                                   str(tmp_path / "ckpt")])
    assert composed.exit_code == 0, composed.output
    want = plain.stdout.splitlines()
    assert sorted(_written(out, "composite")) == sorted(want) and len(want) > 50


def test_streaming_job_equals_the_engine_and_resumes_from_its_checkpoint(
        spark: Any, tmp_path: Path) -> None:
    """The paper's profiles over the logistics day as a stream of spool files: the job is
    stopped half-way, restarted on the same checkpoint with the rest of the files, and the
    composites it wrote are exactly the in-process engine's — none lost, none twice."""
    import os

    from eva.events import from_cloudevent

    text, events, want = logistics_day()
    trace = [from_cloudevent(e, i) for i, e in enumerate(events)]
    config = EngineConfig()
    spool, out, checkpoint = tmp_path / "spool", tmp_path / "out", str(tmp_path / "ckpt")
    spool.mkdir()
    chunks = [events[i:i + 80] for i in range(0, len(events), 80)] + [[SENTINEL]]

    def drop(k: int) -> None:
        path = spool / f"part-{k:04d}.jsonl"
        path.write_text("\n".join(json.dumps(e) for e in chunks[k]) + "\n")
        os.utime(path, (1_000_000 + k, 1_000_000 + k))

    table = str(tmp_path / "profiles.json")
    write_table(table, [Registration(text, trace[0].time - 1)])
    job = StreamJob(table, config.to_json())
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
    got = _written(out, "composite")
    assert sorted(got) == sorted(want) and len(want) > 50


def test_composers_agree_while_profiles_come_and_go(spark: Any, tmp_path: Path) -> None:
    """The composer interface: the Spark composer (the streaming job) and the in-process one
    answer the same, with a profile registered mid-stream (it sees only later events) and
    one removed mid-stream (nothing of it after the removal) — no restart of the job."""
    import random

    from eva.events import from_cloudevent
    from mediator.composer import Composer, InProcessComposer
    from spark_jobs.composer import SparkComposer

    base = ('class A = type == "a"\nclass B = type == "b"\nclass C = type == "c"\n'
            "profile S per data.k = ((all_dup(A); all_dup(B))_5s)_all_pairs\n"
            "profile N = ((all_dup(A); all_dup(((not C)_2s)_all_pairs))_2s)_all_pairs\n")
    later = ('class B = type == "b"\nclass C = type == "c"\n'
             "profile Q = ((all_dup(B), all_dup(C))_3s)_all_pairs\n")
    rng = random.Random(5)
    events = [from_cloudevent({"specversion": "1.0", "id": f"e{i}", "source": "t",
                               "type": rng.choice("abc"), "data": {"k": rng.randint(1, 3)},
                               "time": f"2026-03-02T10:{i // 60:02d}:{i % 60:02d}Z"}, i)
              for i in range(240)]
    sentinel = from_cloudevent({"specversion": "1.0", "id": "end", "source": "t", "type": "z",
                                "time": "2026-03-02T12:00:00Z"}, 240)
    chunks = [events[:80], events[80:160], [*events[160:], sentinel]]
    results = {}
    composers: list[tuple[str, Composer]] = [  # SparkComposer is one by its shape alone
        ("in-process", InProcessComposer()), ("spark", SparkComposer(spark, str(tmp_path / "spark")))]
    for name, composer in composers:
        out = []
        composer.register(base, at=events[0].time - 1)
        composer.feed(chunks[0])
        out += composer.collect()
        assert composer.register(later) == ["Q"]
        composer.feed(chunks[1])
        out += composer.collect()
        assert composer.remove("N")
        composer.feed(chunks[2])
        out += composer.collect()
        composer.close()
        results[name] = out
    by = {k: {p: sorted(json.dumps(o[2]) for o in v if o[0] == "composite" and o[1] == p)
              for p in "SNQ"} for k, v in results.items()}
    only_spark = set(by["spark"]["S"]) - set(by["in-process"]["S"])
    only_here = set(by["in-process"]["S"]) - set(by["spark"]["S"])
    diff = (sorted(only_spark)[:3], sorted(only_here)[:3])
    assert by["spark"]["S"] == by["in-process"]["S"] and len(by["spark"]["S"]) > 10, diff
    assert by["spark"]["Q"] == by["in-process"]["Q"] and by["spark"]["Q"]
    late = {e.id for e in chunks[1] + chunks[2]}
    for composite in by["spark"]["Q"]:
        assert set(json.loads(composite)["data"]["constituents"]) <= late
    removed = {e.id for e in chunks[2]}
    assert by["spark"]["N"] and not any(
        set(json.loads(c)["data"]["constituents"]) & removed for c in by["spark"]["N"])


def test_deployed_mode_reads_the_redis_log_and_writes_composites_back(
        spark: Any, tmp_path: Path, redis_url: str) -> None:
    """Deployed mode: events from the Redis store's event log, as the store writes it (a
    Python streaming Data Source, stream ids as offsets), composites written back to Redis
    keyed by id. Restarted on its checkpoint half-way, the job writes every composite once."""
    import redis

    from eva.events import from_cloudevent
    from mediator.store.redis import RedisStore
    from spark_jobs.redis_io import COMPOSITE_LOG, COMPOSITES, redis_lines, redis_sink

    text, events, lines = logistics_day()
    trace = [from_cloudevent(e, i) for i, e in enumerate(events)]
    want = {json.loads(line)["id"]: line for line in lines}
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    table = str(tmp_path / "profiles.json")
    write_table(table, [Registration(text, trace[0].time - 1)])
    job = StreamJob(table, EngineConfig().to_json())
    checkpoint = str(tmp_path / "ckpt")
    half = len(events) // 2
    for batch in (events[:half], [*events[half:], SENTINEL]):
        RedisStore(redis_url).append_events([json.dumps(e) for e in batch])
        query = start(spark, job, "", checkpoint, redis_sink(redis_url),
                      lines=redis_lines(spark, redis_url))
        query.processAllAvailable()
        query.stop()
    assert client.hgetall(COMPOSITES) == want and len(want) > 50
    assert client.xlen(COMPOSITE_LOG) == len(want)


def test_late_and_malformed_rows_reach_the_dead_letter_sink(spark: Any, tmp_path: Path) -> None:
    """A row behind Spark's watermark is not dropped unseen: its engine reports it as a late
    dead letter (with the event). A file of nothing but a broken line is reported too."""
    import time

    from eva.events import from_cloudevent

    text, events, want = logistics_day()
    late = {**events[3], "id": "late-1"}  # an early truck event, again, two files later
    lines = [json.dumps(e) for e in events]
    files = [lines[:150], lines[150:300], ["{broken"], [json.dumps(late)], lines[300:],
             [json.dumps(SENTINEL)]]
    spool, out = tmp_path / "spool", tmp_path / "out"
    spool.mkdir()
    for k, chunk in enumerate(files):
        spool_file(str(spool), f"part-{k:04d}.jsonl", chunk, time.time() - 100 + k)
    table = str(tmp_path / "profiles.json")
    write_table(table, [Registration(text, from_cloudevent(events[0]).time - 1)])
    query = start(spark, StreamJob(table, EngineConfig().to_json()), str(spool),
                  str(tmp_path / "ckpt"), directory_sink(str(out)), max_files=1)
    query.processAllAvailable()
    query.stop()
    got = _written(out, "composite")
    letters = [json.loads(line) for line in _written(out, "dead_letter")]
    assert sorted(got) == sorted(want)
    reasons = {(d["reason"], d.get("event", {}).get("id"), d.get("raw")) for d in letters}
    assert ("malformed", None, "{broken") in reasons
    assert any(reason == "late" and ident == "late-1" for reason, ident, _ in reasons), reasons


def test_a_job_killed_mid_stream_resumes_from_its_checkpoint(tmp_path: Path) -> None:
    """`evamed compose` killed with SIGKILL (driver, JVM and Python workers at once) while
    micro-batches remain; started again on the same checkpoint, the composites written are
    exactly the in-process engine's: none lost, none twice."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from eva.events import format_time, parse_time

    text, events, want = logistics_day()
    since = format_time(parse_time(events[0]["time"]) - 1)  # as the in-process engine starts
    (tmp_path / "profiles.eva").write_text(text)
    spool, out = tmp_path / "spool", tmp_path / "out"
    spool.mkdir()
    chunks = [events[i:i + 40] for i in range(0, len(events), 40)] + [[SENTINEL]]
    for k, chunk in enumerate(chunks):
        spool_file(str(spool), f"part-{k:04d}.jsonl", [json.dumps(e) for e in chunk],
                   time.time() - 1000 + k)
    command = [str(Path(sys.executable).parent / "evamed"), "compose", "--once",
               "--profiles", str(tmp_path / "profiles.eva"), "--since", since,
               "--spool", str(spool), "--out", str(out), "--checkpoint", str(tmp_path / "ckpt"),
               "--max-files", "1"]
    first = subprocess.Popen(command, start_new_session=True, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
    commits = tmp_path / "ckpt" / "spark" / "commits"
    deadline = time.monotonic() + 180
    while not (commits.is_dir() and len(list(commits.glob("[0-9]*"))) >= 4):
        assert first.poll() is None and time.monotonic() < deadline, "no batch committed"
        time.sleep(0.1)
    assert first.poll() is None  # still running: micro-batches remain
    os.killpg(first.pid, signal.SIGKILL)
    first.wait()
    done = len(list(commits.glob("[0-9]*")))
    assert done < len(chunks)
    second = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert second.returncode == 0, second.stderr[-2000:]
    got = _written(out, "composite")
    assert sorted(got) == sorted(want) and len(want) > 50


def test_declared_sources_each_have_a_watermark(spark: Any, tmp_path: Path) -> None:
    """Two declared sources whose adapters drop their own files, one source a micro-batch
    behind the other: the job waits for the slower one (a watermark per source, Spark's min
    policy) as the in-process engine does — nothing is late, the composites are the engine's.
    With one watermark for both, every event of the slower source would be late."""
    import random
    import time

    from eva.events import from_cloudevent
    from eva.parser import parse

    text = ('class A = type == "a"\nclass B = type == "b"\n'
            "profile S per data.k = ((all_dup(A); all_dup(B))_5s)_all_pairs\n")
    config = EngineConfig(sources=("urn:a", "urn:b"))
    rng = random.Random(3)

    def event(source: str, i: int) -> dict[str, Any]:
        return {"specversion": "1.0", "id": f"{source[-1]}{i}", "source": source,
                "type": source[-1], "data": {"k": rng.randint(1, 4)},
                "time": f"2026-03-02T10:{i // 60:02d}:{i % 60:02d}Z"}

    files = [[event(source, i) for i in range(start, start + 60)]
             for start in (0, 60) for source in ("urn:a", "urn:b")]
    files.append([{**event(s, 3000), "id": f"end-{s}", "type": "none"}
                  for s in ("urn:a", "urn:b")])
    engine = Engine(config)
    engine.add_document(parse(text))
    trace = [from_cloudevent(e, i) for i, e in enumerate(e for f in files for e in f)]
    want = [json.dumps(to_cloudevent(n)) for e in trace for n in engine.push(e)]
    want += [json.dumps(to_cloudevent(n)) for n in engine.close()]
    spool, out = tmp_path / "spool", tmp_path / "out"
    spool.mkdir()
    table = str(tmp_path / "profiles.json")
    write_table(table, [Registration(text, trace[0].time - 1)])
    query = start(spark, StreamJob(table, config.to_json()), str(spool),
                  str(tmp_path / "ckpt"), directory_sink(str(out)), max_files=1)
    for k, chunk in enumerate(files):
        spool_file(str(spool), f"part-{k:04d}.jsonl", [json.dumps(e) for e in chunk],
                   time.time() + k)
        query.processAllAvailable()
    query.stop()
    got = _written(out, "composite")
    letters = _written(out, "dead_letter")
    assert not letters, letters[:2]
    assert sorted(got) == sorted(want) and len(want) > 20


# ------------------------------------------------------------------ parsing in the JVM

_scalars = (st.none() | st.booleans() | st.integers(-2**70, 2**70)
            | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=4)
            | st.sampled_from(["{", "[1]", "5", "1.0", "true", "é", "\ud800", "NaN"]))
_values = st.recursive(_scalars, lambda inner: st.lists(inner, max_size=3)
                       | st.dictionaries(st.sampled_from(["k", "id", "data", "time", "x"]),
                                         inner, max_size=3), max_leaves=6)
_times = st.sampled_from([
    "2026-03-02T10:00:00Z", "2026-03-02T10:00:00.123Z", "2026-03-02T10:00:00.123456Z",
    "2026-03-02T10:00:00.1234Z", "2026-03-02T11:00:00+01:00", "2026-03-02t10:00:00z",
    "2026-02-30T10:00:00Z", "2026-03-02T10:00:60Z", "0000-01-01T00:00:00Z",
    "0001-01-01T00:00:00Z", "9999-12-31T23:59:59.999999Z", "2026-03-02 10:00:00Z",
    "2026-03-02T10:00:00", ""])


@st.composite
def _lines(draw: st.DrawFn) -> str:
    """A line as a producer might write it: mostly a CloudEvent, with the attribute types,
    extras, data, timestamps and spellings the engine's reader refuses or reads otherwise."""
    good: dict[str, Any] = {"specversion": "1.0", "id": "e1", "source": "s", "type": "a",
                            "time": "2026-03-02T10:00:00.500Z"}
    odd = {"specversion": st.sampled_from(["1.0", 1.0, "0.3"]),
           "id": st.sampled_from(["e1", "0f8f-ad5b", "12345", 7, "", "é\n\"x"]),
           "source": st.sampled_from(["s", "urn:x", 5, None]),
           "type": st.sampled_from(["a", "b", True, ["a"]]),
           "time": _times | st.sampled_from([1_772_000_000, None]),
           "subject": _scalars, "datacontenttype": st.sampled_from(["application/json"]),
           "ext": _scalars}
    changed = draw(st.sets(st.sampled_from(sorted(odd)), max_size=2))
    obj = {name: draw(odd[name]) if name in changed else good.get(name) for name in odd
           if name in good or name in changed}
    for name in draw(st.sets(st.sampled_from(sorted(REQUIRED)), max_size=1)):
        obj.pop(name)  # missing
    if draw(st.booleans()):
        obj["data"] = draw(_values)
    names = list(obj)
    order = draw(st.permutations(names))
    obj = {name: obj[name] for name in order}
    separators = draw(st.sampled_from([(",", ":"), (", ", ": ")]))
    line = json.dumps(obj, ensure_ascii=draw(st.booleans()), separators=separators)
    if not line.isascii() and any("\ud800" <= c <= "\udfff" for c in line):
        line = json.dumps(obj, separators=separators)  # UTF-8 cannot carry a lone surrogate
    mutation = draw(st.sampled_from([""] * 12 + [" x", '{"id":"b"}', ',{"evamed:end":""}],[1',
                                     "truncate", "single", "array", "nan", "big", "deep", "huge"]))
    if mutation == "truncate":
        return line[:len(line) // 2]
    if mutation == "single":
        return line.replace('"', "'")
    if mutation == "array":
        return f"[{line}]"
    if mutation == "nan":
        return line.replace("}", ', "n": NaN}', 1)
    if mutation == "huge" and "data" in obj:  # a number past a double's range, in data
        key = '"data"' + separators[1]
        return line.replace(key, key + '{"h": 1e400, "d": ', 1) + "}"
    if mutation == "big":
        return line.replace("{", '{"big": 123456789012345678901234567890, ', 1)
    if mutation == "deep":
        return line.replace('"data"', '"data": ' + "[" * 120 + "]" * 120 + ', "x"', 1)
    return line + mutation


def test_the_jvm_reads_each_line_as_the_engines_reader_does(spark: Any) -> None:
    """parse_lines (Spark's JSON reader, in the JVM) and eva.events.from_json_line agree on
    every line: the events the JVM vouches for equal the reader's (attributes and data
    included, data parsed from the JVM's text), and every other line travels whole, so the
    engine reports what replay reports — the same error message for a malformed one."""
    from eva.events import EventError, from_json_line
    from spark_jobs.job import parse_lines
    from spark_jobs.processor import event_of, rows_of

    vouched = 0

    # No shrinking: each example is a Spark job, and the failing line is in the message.
    @settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck),
              phases=[Phase.explicit, Phase.generate])
    @given(st.lists(_lines(), min_size=20, max_size=60))
    def prop(lines: list[str]) -> None:
        nonlocal vouched
        frame = spark.createDataFrame(list(zip(lines, range(len(lines)), strict=True)),
                                      "value STRING, seq LONG")
        # As the fan-out gets them: through Arrow and pandas.
        rows = sorted(rows_of(parse_lines(frame).toPandas()), key=lambda row: row[0])
        assert [row[0] for row in rows] == list(range(len(lines)))
        for row, line in zip(rows, lines, strict=True):
            try:
                want: Any = from_json_line(line, row[0])
            except EventError as exc:
                want = str(exc)
            try:
                got: Any = event_of(row)
            except EventError as exc:
                got = str(exc)
            if isinstance(want, str) or row[7] is not None:
                assert row[7] == line and got == want, line
                continue
            vouched += 1
            assert (got, repr(got.data), got.attributes) == (want, repr(want.data),
                                                             want.attributes), line

    prop()
    assert vouched > 50  # the JVM's path is taken, not only the whole lines'


def test_a_removed_profiles_state_is_gone_after_the_next_micro_batch(
        spark: Any, tmp_path: Path) -> None:
    """The state store itself (read with Spark's state data source) holds none of a removed
    profile's keys once a micro-batch has run after its removal, though no event of it came;
    the other profile's state stays."""
    import time

    text = ('class A = type == "a"\nclass B = type == "b"\nclass Z = type == "z"\n'
            "profile S per data.k = ((all_dup(A); all_dup(B))_1h)_all_pairs\n"
            "profile Q = Z\n")

    def lines(kind: str, first: int) -> list[str]:
        return [json.dumps({"specversion": "1.0", "id": f"{kind}{i}", "source": "s",
                            "type": kind, "data": {"k": i},
                            "time": f"2026-03-02T10:00:{i:02d}Z"})
                for i in range(first, first + 20)]

    spool, checkpoint = tmp_path / "spool", str(tmp_path / "ckpt")
    spool.mkdir()
    table = str(tmp_path / "profiles.json")
    write_table(table, [Registration(text, None)])
    query = start(spark, StreamJob(table, EngineConfig().to_json(), 4), str(spool), checkpoint,
                  directory_sink(str(tmp_path / "out")), max_files=1)

    def held(state: str) -> set[str]:  # the profiles of the keys with that state
        return {row.key.profile for row in spark.read.format("statestore")
                .option("path", checkpoint).option("stateVarName", state).load().collect()}

    try:
        spool_file(str(spool), "part-0.jsonl", lines("a", 0) + lines("z", 20), time.time())
        query.processAllAvailable()
        assert held("core") == held("parts") == {"S", "Q"}
        write_table(table, [Registration(text, None, frozenset({"S"}))])
        spool_file(str(spool), "part-1.jsonl", lines("z", 40), time.time() + 1)
        query.processAllAvailable()
    finally:
        query.stop()
    assert held("core") == held("parts") == {"Q"}


@pytest.mark.parametrize("seed", [1, 2])
def test_random_lines_through_the_job_are_what_replay_prints(spark: Any, tmp_path: Path,
                                                             seed: int) -> None:
    """A random trace with `per` keys, in files: events the JVM parses (with extension
    attributes, data of every kind) and lines it hands on whole (a string id of digits, data
    that is a string, an unknown extension, malformed lines), and late events — the job
    writes the composites and dead letters replay reports, byte for byte."""
    import random
    import time

    from eva.events import EventError, from_json_line
    from eva.notify import composite_line, dead_letter_record

    text = ('class A = type == "a"\nclass B = type == "b" and data.v > 2\n'
            "profile S per data.k = ((all_dup(A); all_dup(B))_4s)_all_pairs\n"
            "profile N = ((all_dup(A); all_dup(((not B)_2s)_all_pairs))_2s)_all_pairs\n")
    rng = random.Random(seed)

    def event(i: int, ms: int) -> str:
        second = ms // 1000
        obj: dict[str, Any] = {"specversion": "1.0", "id": f"e{i}", "source": "s",
                               "type": rng.choice("ab"),
                               "time": f"2026-03-02T10:{second // 60:02d}:{second % 60:02d}"
                                       f".{ms % 1000:03d}Z",
                               "data": {"k": rng.choice([1, 2, "x", 2.5]), "v": rng.randrange(5)}}
        kind = rng.randrange(12)
        if kind == 0:
            obj["subject"] = "sub"
        elif kind == 1:
            obj["id"] = str(10_000 + i)  # numeric-looking: parsed in Python
        elif kind == 2:
            obj["data"] = "just text"
        elif kind == 3:
            obj["traceparent"] = "00-ab"  # an extension the JVM does not carry
        line = json.dumps(obj)
        return {4: line[:-3], 5: line.replace('"1.0"', "1.0")}.get(kind, line)

    # In time order within a file (across keys of different buckets, the job's lateness is
    # the watermark of the micro-batches before; replay's is every event's before it).
    files = [[event(100 * f + i, 60_000 * f + 450 * i + rng.randrange(400)) for i in range(60)]
             for f in range(4)]
    files[2] += [event(900 + i, 5_000 + i) for i in range(3)]  # late: long before the newest
    files.append([json.dumps({**SENTINEL, "source": "s"})])
    engine = Engine(EngineConfig())
    engine.add_document(parse(text))
    letters: list[str] = []
    engine.dead_letter = lambda letter: letters.append(json.dumps(dead_letter_record(letter)))
    want: list[str] = []
    first = None
    for seq, line in enumerate(line for f in files for line in f):
        try:
            parsed = from_json_line(line, seq)
        except EventError as exc:
            engine.malformed(str(exc), line)
            continue
        if first is None:
            first = parsed.time
            engine.begin(first - 1)
        want += [composite_line(n)[1] for n in engine.push(parsed)]
    want += [composite_line(n)[1] for n in engine.close()]
    spool, out = tmp_path / "spool", tmp_path / "out"
    spool.mkdir()
    for k, chunk in enumerate(files):
        spool_file(str(spool), f"part-{k:04d}.jsonl", chunk, time.time() - 100 + k)
    table = str(tmp_path / "profiles.json")
    assert first is not None
    write_table(table, [Registration(text, first - 1)])
    query = start(spark, StreamJob(table, EngineConfig().to_json(), 4), str(spool),
                  str(tmp_path / "ckpt"), directory_sink(str(out)), max_files=1)
    query.processAllAvailable()
    query.stop()
    got = _written(out, "composite")
    assert sorted(got) == sorted(want) and len(want) > 20, (
        sorted(set(got) - set(want))[:3], sorted(set(want) - set(got))[:3])
    # A malformed line is the same dead letter, message included. A late event is reported
    # by each key it was routed to (here S's and N's), each saying how far behind that key's
    # engine it was: the event is replay's.
    def brief(letters: list[str]) -> set[str]:
        return {json.dumps({k: v for k, v in record.items()
                            if record["reason"] == "malformed" or k != "detail"})
                for record in map(json.loads, letters)}

    assert brief(_written(out, "dead_letter")) == brief(letters)
    reasons = {json.loads(letter)["reason"] for letter in letters}
    assert reasons == {"malformed", "late"}, reasons
