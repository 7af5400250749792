"""The evamed CLI: check and replay, exit codes, dead letters, no tracebacks."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner, Result

from eva.events import from_cloudevent
from eva.notify import to_cloudevent
from eva.parser import parse
from eva.reference import evaluate
from mediator.cli import app
from tests.strategies import documents, traces

runner = CliRunner()
PROFILES = ('class A = type == "a"\nclass B = type == "b"\n'
            "profile S = ((all_dup(A); all_dup(B))_5s)_all_pairs\n"
            "profile N = ((all_dup(A); all_dup(((not B)_2s)_all_pairs))_2s)_all_pairs\n")


def cloud(ident: str, kind: str, second: int, **data: object) -> dict[str, object]:
    return {"specversion": "1.0", "id": ident, "source": "urn:test", "type": kind,
            "time": f"2026-03-02T10:00:{second:02d}Z", "data": data}


@pytest.fixture
def files(tmp_path: Path) -> tuple[Path, Path]:
    profiles = tmp_path / "p.eva"
    profiles.write_text(PROFILES)
    events = tmp_path / "e.jsonl"
    lines = [cloud("a1", "a", 1), cloud("b1", "b", 3), cloud("a2", "a", 10), cloud("c1", "c", 20)]
    events.write_text("\n".join(json.dumps(e) for e in lines) + "\n")
    return profiles, events


def test_check_summarises_profiles(files: tuple[Path, Path]) -> None:
    result = runner.invoke(app, ["check", str(files[0])])
    assert result.exit_code == 0, result.output
    assert "S" in result.output and "sequence" in result.output and "5s" in result.output


def test_check_of_many_profiles_is_a_summary_and_verbose_the_table(tmp_path: Path) -> None:
    """Past TABLE_AT_MOST profiles check prints what the table's columns hold, counted (a
    table of thousands of rows was most of its time); --verbose prints the table."""
    from mediator.cli.check import TABLE_AT_MOST

    path = tmp_path / "many.eva"
    count = TABLE_AT_MOST + 5
    path.write_text('class A = type == "a"\nclass B = type == "b"\n' + "".join(
        f"profile S{i} per data.k = ((all_dup(A); all_dup(B))_{i + 1}s)_all_pairs\n"
        for i in range(count)) + "profile U = ((all_dup(A); all_dup(A))_inf)_all_pairs\n")
    result = runner.invoke(app, ["check", str(path)])
    assert result.exit_code == 0, result.output
    assert f"2 classes, {count + 1} profiles" in result.output
    assert f"sequence {count + 1}" in result.output and f"partitioned (per): {count}" in (
        result.output)
    assert f"{count} bounded, 1 unbounded: U (" in result.output and "S3" not in result.output
    verbose = runner.invoke(app, ["check", "--verbose", str(path)])
    assert verbose.exit_code == 0 and "S3" in verbose.output and "data.k" in verbose.output


def test_check_reports_unbounded_state(tmp_path: Path) -> None:
    path = tmp_path / "u.eva"
    path.write_text('class A = type == "a"\nprofile U = ((all_dup(A); all_dup(A))_inf)_all_pairs\n')
    result = runner.invoke(app, ["check", str(path)])
    assert result.exit_code == 0 and "unbounded" in result.output


def test_bad_profile_exits_2_with_position_and_no_traceback(tmp_path: Path) -> None:
    path = tmp_path / "bad.eva"
    path.write_text('class A = type == "a"\nprofile X = ((all_dup(A); all_dup(A))_5)_all_pairs\n')
    for args in (["check", str(path)], ["replay", "--profiles", str(path), "--events", "x"]):
        result = runner.invoke(app, args)
        assert result.exit_code == 2
        assert f"{path}:2:" in result.output and "expected a time span" in result.output
        assert "Traceback" not in result.output


def test_replay_prints_the_reference_answer_as_cloudevents(files: tuple[Path, Path]) -> None:
    profiles, events = files
    result = runner.invoke(app, ["replay", "--profiles", str(profiles), "--events", str(events)])
    assert result.exit_code == 0, result.output
    got = [json.loads(line) for line in result.stdout.splitlines()]
    doc = parse(PROFILES)
    trace = [from_cloudevent(json.loads(line), i)
             for i, line in enumerate(events.read_text().splitlines())]
    assert got == [to_cloudevent(n) for n in evaluate(doc, trace)]
    assert [g["data"]["constituents"] for g in got] == [["a1", "b1"], ["a2", "absence@2026-03-02T10:00:12Z"]]
    assert all(g["type"] == "eva.composite" and g["subject"] in ("S", "N") for g in got)


def test_replay_one_profile(files: tuple[Path, Path]) -> None:
    profiles, events = files
    result = runner.invoke(app, ["replay", "--profiles", str(profiles), "--events", str(events),
                                 "--profile", "N"])
    assert [json.loads(x)["subject"] for x in result.stdout.splitlines()] == ["N"]
    unknown = runner.invoke(app, ["replay", "--profiles", str(profiles), "--events", str(events),
                                  "--profile", "Z"])
    assert unknown.exit_code == 2 and "no profile 'Z'" in unknown.output


def test_malformed_and_late_events_go_to_the_dead_letter_file(files: tuple[Path, Path],
                                                            tmp_path: Path) -> None:
    profiles, events = files
    text = events.read_text() + "{not json\n" + json.dumps({"id": "x"}) + "\n" + json.dumps(
        cloud("old", "a", 0)) + "\n"
    events.write_text(text)
    letters = tmp_path / "dead.jsonl"
    result = runner.invoke(app, ["replay", "--profiles", str(profiles), "--events", str(events),
                                 "--dead-letter", str(letters)])
    assert result.exit_code == 0
    records = [json.loads(x) for x in letters.read_text().splitlines()]
    assert [r["reason"] for r in records] == ["malformed", "malformed", "late"]
    assert records[0]["detail"].startswith("line 5: not JSON")
    assert "missing required attribute" in records[1]["detail"]
    assert records[2]["event"]["id"] == "old"
    assert len(result.stdout.splitlines()) == 2  # the good events still produce their answer


def test_until_extends_the_trace_for_clock_driven_results(files: tuple[Path, Path]) -> None:
    profiles, events = files
    events.write_text(json.dumps(cloud("a1", "a", 1)) + "\n")
    short = runner.invoke(app, ["replay", "--profiles", str(profiles), "--events", str(events)])
    longer = runner.invoke(app, ["replay", "--profiles", str(profiles), "--events", str(events),
                                 "--until", "2026-03-02T10:00:05Z"])
    assert short.stdout == "" and len(longer.stdout.splitlines()) == 1


def test_bad_options_exit_2(files: tuple[Path, Path]) -> None:
    profiles, events = files
    result = runner.invoke(app, ["replay", "--profiles", str(profiles), "--events", str(events),
                                 "--tick", "soon"])
    assert result.exit_code == 2 and "expected a finite span" in result.output
    missing = runner.invoke(app, ["replay", "--profiles", str(profiles), "--events", "/nope"])
    assert missing.exit_code == 2 and "cannot read" in missing.output


def test_replay_of_the_logistics_day_equals_the_reference(tmp_path: Path) -> None:
    """The paper's scenario (P1–P7 over a generated day, `make demo`): the CLI's answer is the
    reference evaluator's, composite for composite, and every profile fires."""
    from examples.logistics.generate import day

    events = tmp_path / "day.jsonl"
    lines = [json.dumps(e) for e in day(7)]
    events.write_text("\n".join(lines) + "\n")
    profiles = Path("examples/logistics/profiles.eva")
    result = runner.invoke(app, ["replay", "--profiles", str(profiles), "--events", str(events)])
    assert result.exit_code == 0, result.output
    got = [json.loads(line) for line in result.stdout.splitlines()]
    trace = [from_cloudevent(json.loads(line), i) for i, line in enumerate(lines)]
    expected = [to_cloudevent(n) for n in evaluate(parse(profiles.read_text()), trace)]
    assert got == expected
    assert {g["subject"] for g in got} == {f"P{i}" for i in range(1, 8)}


# ------------------------------------------------------------------ --via and --native


@pytest.mark.parametrize("group", ["cg0", "cg1", "cg2", "cg3", "cg4", "cg5"])
def test_replay_via_a_group_prints_what_plain_replay_prints(files: tuple[Path, Path],
                                                            group: str) -> None:
    """Including dead letters: malformed and late events are refused before any service sees
    them, and out-of-order events within the allowed lateness still count."""
    profiles, events = files
    lines = [cloud("a1", "a", 1), cloud("b1", "b", 3), cloud("a0", "a", 0), cloud("a2", "a", 10),
             cloud("b0", "b", 2), cloud("b2", "b", 12)]
    events.write_text("\n".join(json.dumps(e) for e in lines) + "\n{broken\n")
    for lateness in ("0s", "2s"):
        args = ["replay", "--profiles", str(profiles), "--events", str(events),
                "--lateness", lateness]
        plain = runner.invoke(app, args)
        via = runner.invoke(app, [*args, "--via", group])
        assert plain.exit_code == via.exit_code == 0, via.output
        assert via.stdout == plain.stdout and plain.stdout
        assert via.stderr == plain.stderr


def _cancel(ident: str, when: str) -> str:
    return json.dumps({"specversion": "1.0", "id": ident, "source": "urn:orders",
                       "type": "order.cancelled", "time": when, "data": {"customer": "A"}})


# a, a copy of a (refused: `duplicate`), b, c; then a real gap of three days: d is held (beyond
# the default 1d horizon) until e, an hour after it, confirms the jump.
ADMISSION = [_cancel("a", "2026-03-02T10:00:00Z"), _cancel("a", "2026-03-02T10:00:01Z"),
             _cancel("b", "2026-03-02T10:00:02Z"), _cancel("c", "2026-03-02T10:00:03Z"),
             _cancel("d", "2026-03-05T10:00:00Z"), _cancel("e", "2026-03-05T11:00:00Z")]


@pytest.mark.parametrize("via", [None, "cg5", "cg3"])
def test_replay_admits_every_event_once_on_every_path(tmp_path: Path, via: str | None) -> None:
    """The CLI kept the id() of refused events to tell which to pass on, and CPython gives a
    freed event's address to a later one: --via (and --engine spark) never saw c."""
    events = tmp_path / "e.jsonl"
    events.write_text("\n".join(ADMISSION) + "\n")
    result = runner.invoke(app, ["replay", "--profiles", "examples/logistics/profiles.eva",
                                 "--profile", "P7", "--events", str(events),
                                 *(["--via", via] if via else [])])
    assert result.exit_code == 0, result.output
    assert [json.loads(x)["data"]["constituents"] for x in result.stdout.splitlines()] == [
        ["a"], ["b"], ["c"], ["d"], ["e"]]
    assert [(r["reason"], r["event"]["id"]) for r in map(json.loads, result.stderr.splitlines())
            ] == [("duplicate", "a")]


def test_replay_on_spark_is_given_exactly_the_admitted_events(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The Spark path's admitted list, without starting Spark: each admitted event once, in
    arrival order, numbered as the in-process engine numbers them."""
    import spark_jobs.batch
    import spark_jobs.session
    from eva.events import from_cloudevent

    seen: dict[str, object] = {}

    def fake_replay(spark: object, text: str, events: spark_jobs.batch.Spooled,
                    **options: object) -> list[str]:
        # Spooled as they streamed in: read back before the spool is removed.
        lines = Path(events.path).read_text().splitlines()
        seen.update(events=[from_cloudevent(json.loads(r["line"]), r["seq"])
                            for r in map(json.loads, lines)], newest=events.newest, **options)
        return []

    monkeypatch.setattr(spark_jobs.session, "java_missing", lambda: None)
    monkeypatch.setattr(spark_jobs.session, "build_session", lambda *a, **k: object())
    monkeypatch.setattr(spark_jobs.batch, "replay", fake_replay)
    events = tmp_path / "e.jsonl"
    events.write_text("\n".join(ADMISSION) + "\n")
    result = runner.invoke(app, ["replay", "--profiles", "examples/logistics/profiles.eva",
                                 "--profile", "P7", "--events", str(events), "--engine", "spark"])
    assert result.exit_code == 0, result.output
    admitted = seen["events"]
    assert isinstance(admitted, list)
    assert [(e.id, e.seq) for e in admitted] == [("a", 0), ("b", 1), ("c", 2), ("d", 3), ("e", 4)]
    assert seen["end"] is None and seen["newest"] == admitted[-1].time  # the trace's end


def test_replay_native_prints_the_services_own_notifications(files: tuple[Path, Path],
                                                             tmp_path: Path) -> None:
    _, events = files
    query = tmp_path / "q.snoop"
    query.write_text("a ; b CONTEXT recent")
    result = runner.invoke(app, ["replay", "--native", "cg2", "--query", str(query),
                                 "--events", str(events)])
    assert result.exit_code == 0, result.output
    assert [json.loads(x)["constituents"] for x in result.stdout.splitlines()] == [["a1", "b1"]]


def test_replay_native_writes_a_dead_letter_for_each_event_its_evaluator_refuses(
        tmp_path: Path) -> None:
    """The peer's engine (CG-5) refuses a copy of an admitted event (same source and id): the
    run goes on without it, as a base service does, and the refusal is a dead letter on stderr
    naming the event (it used to vanish without a word)."""
    query = tmp_path / "q.eva"
    query.write_text('class A = type == "a"\nclass B = type == "b"\n'
                     "profile S = ((all_dup(A); all_dup(B))_5s)_all_pairs\n")
    events = tmp_path / "e.jsonl"
    events.write_text("\n".join(json.dumps(e) for e in [
        cloud("a1", "a", 1), cloud("a1", "a", 2), cloud("b1", "b", 3)]) + "\n")
    result = runner.invoke(app, ["replay", "--native", "cg5", "--query", str(query),
                                 "--events", str(events)])
    assert result.exit_code == 0, result.output
    assert [json.loads(x)["constituents"] for x in result.stdout.splitlines()] == [["a1", "b1"]]
    letters = [json.loads(x) for x in result.stderr.splitlines()]
    assert [(x["reason"], x["event"]["id"], x["event"]["time"]) for x in letters] == [
        ("duplicate", "a1", "2026-03-02T10:00:02Z")]
    assert "the cg5 evaluator refused event 'a1'" in letters[0]["detail"]


def test_replay_native_and_via_refuse_bad_input(files: tuple[Path, Path], tmp_path: Path) -> None:
    profiles, events = files
    query = tmp_path / "q.sql"
    query.write_text("SELECT a.id FROM a AS a\n  LEFT JOIN b AS b ON TRUE")
    bad = runner.invoke(app, ["replay", "--native", "cg3", "--query", str(query),
                              "--events", str(events)])
    assert bad.exit_code == 2 and f"sql query {query}:2:3: error: only inner joins" in bad.output
    assert "Traceback" not in bad.output
    for args in (["--native", "cg9", "--query", str(query)], ["--via", "snoop"],
                 ["--native", "cg2"]):
        result = runner.invoke(app, ["replay", "--profiles", str(profiles), "--events",
                                     str(events), *args])
        assert result.exit_code == 2 and "Traceback" not in result.output, args
    unknown = runner.invoke(app, ["base-service", "--group", "cg7"])
    assert unknown.exit_code == 2 and "expected one of cg0" in unknown.output


@pytest.mark.parametrize(("content", "where"), [
    (b'SELECT a.id FROM a AS a WHERE a.type = "caf\xe9"', ":1:44: error: found the byte 0xe9"),
    ("SELECT a.id FROM a AS a WHERE a.subject = '{}'".format("\u00e9" * 40_000).encode(),
     ":1:1: error: the query is 65,537 bytes"),
])
def test_replay_native_refuses_a_query_file_that_is_not_utf8_or_too_large(
        files: tuple[Path, Path], tmp_path: Path, content: bytes, where: str) -> None:
    """Issue 11: a non-UTF-8 query file ended in a UnicodeDecodeError traceback; a large one was
    read whole. Past the limit the file is cut mid-character, and still the size is reported."""
    _, events = files
    query = tmp_path / "q.sql"
    query.write_bytes(content)
    result = runner.invoke(app, ["replay", "--native", "cg3", "--query", str(query),
                                 "--events", str(events)])
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert f"{query}{where}" in result.output, result.output


def _balanced_disjunction(low: int, high: int) -> str:
    """A disjunction of the classes C(low % 4) … C((high − 1) % 4), high − low − 1 operators,
    as a balanced tree (log2 levels deep: inside EVA's 50)."""
    if high - low == 1:
        return f"C{low % 4}"
    mid = (low + high) // 2
    return (f"(all_dup({_balanced_disjunction(low, mid)}) | "
            f"all_dup({_balanced_disjunction(mid, high)}))_all_pairs")


LONG = {  # issue 11 review: what passes `evamed check` but broke the native languages' limits
    # 99 terms: 98 levels, just under EVA's 100; comparisons CG-3 keeps and != it widens away
    "and-chain": "class A = " + " and ".join(
        ['type == "a"'] + [f"data.k{i} != {i}" if i % 2 else f"data.n > {-i - 1}"
                           for i in range(98)]) + '\nclass B = type == "b"\n'
    "profile S = ((all_dup(A); all_dup(B))_5s)_all_pairs\nprofile T = A\n",
    "disjunction": "".join(f'class C{j} = type == "{"ab"[j % 2]}" and data.n > {-j}\n'
                           for j in range(4)) + f"profile D = {_balanced_disjunction(0, 1001)}\n",
}
TOO_LONG = {("disjunction", "cg3"): "bytes; a native query may be at most 65,536 bytes (64 KiB)"}
"""Where a language genuinely cannot take the query whole (docs/backends.md, Limits): CG-3
states a disjunction as a UNION ALL of one SELECT per operand, 1,001 of them here."""


@pytest.mark.parametrize("group", ["cg0", "cg1", "cg2", "cg3", "cg4", "cg5"])
@pytest.mark.parametrize("profile", list(LONG))
def test_replay_via_takes_what_check_takes_composing_what_a_language_cannot_take_whole(
        tmp_path: Path, profile: str, group: str) -> None:
    """A 40-term and-chain in a class broke CG-1's and CG-3's nesting limits (a rich traceback),
    a 100-term one sqlglot's stack, and a 1,000-operator disjunction CG-3's size: chains are now
    rendered flat and read n-ary, and what a language still cannot take whole is composed at
    the mediator over parts it takes (replay --via exited 2 naming the limit; issue 26):
    the same output as plain replay, and explain says why."""
    path = tmp_path / "long.eva"
    path.write_text(LONG[profile])
    assert runner.invoke(app, ["check", str(path)]).exit_code == 0
    events = tmp_path / "e.jsonl"
    lines = [cloud(f"{k}{i}", k, s, n=n, k0=0 if i == 2 else 5) for i, (k, s, n) in enumerate(
        [("a", 1, 5), ("b", 3, 5), ("a", 4, -3), ("b", 6, 5), ("a", 10, 5), ("b", 12, -1)])]
    events.write_text("\n".join(json.dumps(e) for e in lines) + "\n")
    args = ["replay", "--profiles", str(path), "--events", str(events)]
    plain = runner.invoke(app, args)
    via = runner.invoke(app, [*args, "--via", group])
    assert plain.exit_code == 0 and len(plain.stdout.splitlines()) >= 3, plain.output
    assert via.exit_code == 0, via.output
    assert via.stdout == plain.stdout and via.stderr == plain.stderr
    limit = TOO_LONG.get((profile, group))
    if limit is not None:
        explained = runner.invoke(app, ["explain", "--profiles", str(path), "--group", group,
                                        "--format", "json"])
        assert explained.exit_code == 0, explained.output
        root = json.loads(explained.stdout)[0]["root"]
        assert root["node"] == "mediator", root
        assert root["why"].startswith("its language (sql) refuses the query for it — ")
        assert limit in root["why"] and root["why"].endswith("so it is composed at the mediator")


def test_explain_shows_the_native_query_each_service_is_asked(files: tuple[Path, Path]) -> None:
    profiles, _ = files
    result = runner.invoke(app, ["explain", "--profiles", str(profiles), "--profile", "S",
                                 "--group", "cg3", "--group", "cg4", "--format", "json"])
    assert result.exit_code == 0, result.output
    natives = [p["root"]["native"] for p in json.loads(result.stdout)]
    assert natives[0].startswith('SELECT a1.id, a2.id FROM "a" AS a1 JOIN "b" AS a2')
    assert natives[1] == "andthen[a, b] within 5s"


def test_explain_over_a_configuration_shows_which_service_evaluates_what(
        files: tuple[Path, Path], tmp_path: Path) -> None:
    """`explain --config`: the plan a mediator with these services would subscribe, offline —
    S goes whole to the service that observes both types."""
    profiles, _ = files
    config = tmp_path / "m.toml"
    config.write_text('[[services]]\nname = "as"\ngroup = "cg1"\ntypes = ["a"]\n\n'
                      '[[services]]\nname = "both"\ngroup = "cg3"\ntypes = ["a", "b"]\n')
    result = runner.invoke(app, ["explain", "--profiles", str(profiles), "--config", str(config),
                                 "--format", "json"])
    assert result.exit_code == 0, result.output
    s = json.loads(result.stdout)[0]
    assert s["root"]["service"] == "both" and "covered by both" in s["root"]["why"]
    text = runner.invoke(app, ["explain", "--profiles", str(profiles), "--config", str(config)])
    assert "service both evaluates" in text.stdout
    bad = runner.invoke(app, ["explain", "--profiles", str(profiles), "--config",
                              str(tmp_path / "missing.toml")])
    assert bad.exit_code == 2 and "missing.toml" in bad.output


@pytest.mark.parametrize(("args", "message"), [
    (["--spool", "s", "--out", "o"], "give --profiles or --table"),
    (["--profiles", "P", "--table", "t.json", "--spool", "s", "--out", "o"],
     "give --profiles or --table"),
    (["--profiles", "P"], "give --spool with --out, or --redis"),
    (["--profiles", "P", "--spool", "s"], "give --spool with --out, or --redis"),
    (["--profiles", "P", "--spool", "s", "--out", "o", "--buckets", "0"], "--buckets 0"),
    (["--profiles", "P", "--spool", "s", "--out", "o", "--since", "noon"], "RFC 3339"),
    (["--table", "missing.json", "--redis", "redis://x"], "no profile table"),
])
def test_compose_usage_errors_exit_2_before_spark_starts(tmp_path: Path, args: list[str],
                                                          message: str) -> None:
    profiles = tmp_path / "p.eva"
    profiles.write_text('class A = type == "a"\nprofile S = A\n')
    args = [str(profiles) if a == "P" else str(tmp_path / a) if a in ("t.json", "missing.json")
            else a for a in args]
    result = CliRunner().invoke(app, ["compose", "--checkpoint", str(tmp_path / "ck"), *args])
    assert result.exit_code == 2 and message in result.output, result.output


def test_compose_reports_a_bad_profile_with_its_position(tmp_path: Path) -> None:
    profiles = tmp_path / "p.eva"
    profiles.write_text("profile S = (A;\n")
    result = CliRunner().invoke(app, ["compose", "--checkpoint", str(tmp_path / "ck"),
                                      "--profiles", str(profiles), "--redis", "redis://x"])
    assert result.exit_code == 2 and f"{profiles}:1:" in result.output


def test_compose_passes_sources_and_lateness_to_the_job(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """The CLI's plumbing only (the job itself runs for real in tests/test_spark.py): declared
    sources and lateness reach the engine configuration and Spark's watermark delay."""
    import spark_jobs.job
    import spark_jobs.session
    from eva.engine import EngineConfig

    seen: dict[str, object] = {}

    class Query:
        def processAllAvailable(self) -> None:
            seen["processed"] = True

        def stop(self) -> None:
            seen["stopped"] = True

    def fake_start(spark: object, job: spark_jobs.job.StreamJob, spool: str,
                   checkpoint: str, sink: object, **options: object) -> Query:
        seen.update(config=EngineConfig.from_json(job.config), buckets=job.buckets, **options)
        return Query()

    monkeypatch.setattr(spark_jobs.session, "build_session", lambda *a, **k: object())
    monkeypatch.setattr(spark_jobs.job, "start", fake_start)
    profiles = tmp_path / "p.eva"
    profiles.write_text('class A = type == "a"\nprofile S = A\n')
    result = CliRunner().invoke(app, [
        "compose", "--once", "--checkpoint", str(tmp_path / "ck"), "--profiles", str(profiles),
        "--spool", str(tmp_path), "--out", str(tmp_path / "out"), "--source", "urn:a",
        "--source", "urn:b", "--lateness", "2s", "--buckets", "4"])
    assert result.exit_code == 0, result.output
    config = seen["config"]
    assert isinstance(config, EngineConfig) and config.sources == ("urn:a", "urn:b")
    assert config.allowed_lateness == 2_000_000 and seen["lateness"] == "2000 milliseconds"
    assert seen["buckets"] == 4 and seen["processed"] and seen["stopped"]


def test_compose_refuses_a_checkpoint_laid_out_otherwise(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """State is filed by (profile, bucket) with each engine's configuration: resuming a
    checkpoint with other buckets or another configuration is refused before Spark starts."""
    import spark_jobs.job
    import spark_jobs.session

    started: list[int] = []

    class Query:
        def processAllAvailable(self) -> None:
            pass

        def stop(self) -> None:
            pass

    def fake_start(spark: object, job: spark_jobs.job.StreamJob, *args: object,
                   **options: object) -> Query:
        started.append(job.buckets)
        return Query()

    monkeypatch.setattr(spark_jobs.session, "build_session", lambda *a, **k: object())
    monkeypatch.setattr(spark_jobs.job, "start", fake_start)
    profiles = tmp_path / "p.eva"
    profiles.write_text('class A = type == "a"\nprofile S = A\n')

    def compose(*extra: str) -> Result:
        return CliRunner().invoke(app, [
            "compose", "--once", "--checkpoint", str(tmp_path / "ck"), "--profiles",
            str(profiles), "--spool", str(tmp_path), "--out", str(tmp_path / "out"), *extra])

    assert compose("--buckets", "4").exit_code == 0
    assert compose("--buckets", "4").exit_code == 0  # the same layout resumes
    moved = compose("--buckets", "8")
    assert moved.exit_code == 2 and "buckets 4 → 8" in moved.output, moved.output
    retimed = compose("--buckets", "4", "--tick", "2s")
    assert retimed.exit_code == 2 and "config" in retimed.output, retimed.output
    assert started == [4, 4]


# ------------------------------------------------------------------ replay's reader and writer


@settings(max_examples=60, deadline=None)
@given(doc=documents(), trace=traces(max_size=30),
       broken=st.lists(st.tuples(st.integers(0, 40), st.sampled_from(
           [b"{", b'{"id": 1}', b"[1]", b"\xff\xfe", b'{"specversion": "1.0"}', b"null"])),
           max_size=4),
       lateness=st.sampled_from([0, 2]), batch=st.sampled_from([1, 3, 1024]))
def test_replay_writes_what_the_line_by_line_reader_and_dict_writer_wrote(
        doc: Any, trace: list[Any], broken: list[tuple[int, bytes]], lateness: int,
        batch: int) -> None:
    """runs.replay_plain (batches of lines through events.read_lines, composites from
    prebuilt fragments, written a batch at a time) writes, to the byte, what reading line by
    line with from_json_line and writing json.dumps(to_cloudevent(n)) wrote — composites and
    dead letters, in order, whatever the batch size."""
    import io

    from eva.engine import Engine, EngineConfig
    from eva.events import EventError, from_json_line
    from eva.events import to_cloudevent as event_json
    from mediator.cli import runs

    lines = [json.dumps(event_json(e)).encode() + b"\n" for e in trace]
    for at, line in broken:
        lines.insert(at % (len(lines) + 1), line + b"\n")
    numbered = list(enumerate(lines, start=1))
    config = EngineConfig(allowed_lateness=lateness, horizon=10**9)

    want_out, want_dead = io.StringIO(), io.StringIO()
    engine = Engine(config, runs.DeadLetters(want_dead))
    engine.add_document(doc)
    notes = []
    for number, line in numbered:
        try:
            event = from_json_line(line, seq=number)
        except EventError as exc:
            engine.malformed(f"line {number}: {exc}", runs.raw(line))
            continue
        notes += engine.push(event)
    notes += engine.close(None)
    want_out.write("".join(json.dumps(to_cloudevent(n)) + "\n" for n in notes))

    got_out, got_dead = io.StringIO(), io.StringIO()
    saved = runs.BATCH
    runs.BATCH = batch
    try:
        counts = runs.replay_plain(doc, None, iter(numbered), config, None, got_out,
                                   runs.DeadLetters(got_dead))
    finally:
        runs.BATCH = saved
    assert got_out.getvalue() == want_out.getvalue()
    assert got_dead.getvalue() == want_dead.getvalue()
    assert sum(counts.values()) == len(notes)


MEMORY = """
import resource, sys
from eva.engine import EngineConfig
from eva.parser import parse
from mediator.cli import runs

n = int(sys.argv[1])
doc = parse('class A = type == "A"\\nclass B = type == "B"\\n'
            'profile P = ((all_dup(A); all_dup(B))_5s)_all_pairs\\n')

def lines():
    for i in range(n):
        yield i + 1, (b'{"specversion": "1.0", "id": "e%d", "source": "s", "type": "%s", '
                      b'"time": "%s", "data": {"key": "k%d"}}' % (
                          i, b"ABC"[i % 3:i % 3 + 1], runs.format_time(
                              1_767_225_600_000_000 + i * 1_000_000).encode(), i % 10_000))

class Null:
    def write(self, text):
        return len(text)

runs.replay_plain(doc, None, lines(), EngineConfig(), None, Null(), runs.DeadLetters(Null()))
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
"""


@pytest.mark.slow
def test_replay_memory_is_flat_in_the_trace() -> None:
    """Peak memory of a replay of 10x the events within 1.2x (issue 17): nothing is kept per
    event — admitted events only for --via and --engine spark, time caches bounded."""
    import subprocess
    import sys

    def peak(n: int) -> int:
        out = subprocess.run([sys.executable, "-c", MEMORY, str(n)], capture_output=True,
                             text=True, check=True)
        return int(out.stdout.split()[-1])

    small, large = peak(20_000), peak(200_000)
    assert large <= 1.2 * small, (small, large)


@pytest.mark.parametrize("shape", ["json", "table", "compact"])
def test_replay_formats_and_expand_show_the_same_composites(files: tuple[Path, Path],
                                                            shape: str) -> None:
    """--format table|compact and --expand print each composite once, with its contributing
    events (type, source, time) inlined when expanded; plain JSON lines are unchanged."""
    profiles, events = files
    plain = runner.invoke(app, ["replay", "--profiles", str(profiles), "--events", str(events)])
    result = runner.invoke(app, ["replay", "--profiles", str(profiles), "--events", str(events),
                                 "--format", shape, "--expand"])
    assert plain.exit_code == result.exit_code == 0, result.output
    composites = [json.loads(line) for line in plain.stdout.splitlines()]
    if shape == "json":
        got = [json.loads(line) for line in result.stdout.splitlines()]
        assert [g["data"].pop("events") for g in got] == [
            [{"id": "a1", "type": "a", "source": "urn:test", "time": "2026-03-02T10:00:01Z"},
             {"id": "b1", "type": "b", "source": "urn:test", "time": "2026-03-02T10:00:03Z"}],
            [{"id": "a2", "type": "a", "source": "urn:test", "time": "2026-03-02T10:00:10Z"},
             {"id": "absence@2026-03-02T10:00:12Z"}]]
        assert got == composites
        return
    text = result.stdout
    assert text.count("a@urn:test 2026-03-02T10:00:01Z") == 1
    assert "absence@2026-03-02T10:00:12Z" in text
    rows = [line for line in text.splitlines() if line.startswith("2026")]
    assert len(rows) == len(composites)
    assert (text.startswith("time ") if shape == "table" else not text.startswith("time"))
