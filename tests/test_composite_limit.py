"""The bound on output (docs/semantics.md, "The limit on composites"): nested untimed all_pairs
operators make exponentially many composites under EVA's own semantics; each operator makes at
most ``composite_limit`` per step, each step cut is a dead letter naming the limit and the
profile, and memory stays bounded by the limit. (The engine equals the reference under the
limit: tests/test_engine_equivalence.py, ``…under_a_composite_limit…``.)"""

from __future__ import annotations

import json
import subprocess
import sys
import tracemalloc
from pathlib import Path

from typer.testing import CliRunner

from eva import ast
from eva.engine import COMPOSITE_LIMIT, DeadLetter, Engine, EngineConfig
from eva.events import Event, from_fields
from eva.parser import parse
from eva.retention import growth
from mediator.cli import app

runner = CliRunner()


def nested(depth: int, name: str = "Deep") -> str:
    """``depth`` untimed all_pairs conjunctions, each of the one below and A: after k events,
    an event makes about k^depth composites."""
    expr = "A"
    for _ in range(depth):
        expr = f"((all_dup({expr}), all_dup(A))_inf)_all_pairs"
    return f'class A = type == "a"\nprofile {name} = {expr}\n'


def a_events(count: int) -> list[Event]:
    return [from_fields(f"e{i}", "s", "a", 1_000_000 * (i + 1), seq=i) for i in range(count)]


def run(depth: int, events: int, limit: int) -> tuple[Engine, list[int], list[DeadLetter], int]:
    """The nested profile over ``events`` A events: the engine, the composites each event
    reported, the dead letters, and the peak of memory allocated meanwhile (bytes)."""
    letters: list[DeadLetter] = []
    doc, trace = parse(nested(depth)), a_events(events)
    tracemalloc.start()
    try:
        engine = Engine(EngineConfig(composite_limit=limit), letters.append)
        engine.add_document(doc)
        per_event = [len(engine.push(e)) for e in trace]
        per_event.append(len(engine.close()))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return engine, per_event, letters, peak


def test_nested_all_pairs_makes_at_most_the_limit_per_event_and_reports_each_cut() -> None:
    # 12 levels over 3 events: 3^12 = 531,441 composites without a limit (529,393 at the last
    # event alone).
    _, per_event, letters, _ = run(12, 3, 1000)
    assert per_event == [0, 1000, 1000, 0]  # the second event alone makes 2^11 = 2,048
    assert [d.reason for d in letters] == ["composite_limit"] * 2  # the second and third
    detail = letters[0].detail
    assert "'Deep'" in detail and "1,000 composites per step" in detail
    assert "1970-01-01T00:00:02Z" in detail and "00:00:03Z" in letters[1].detail


def test_engine_memory_on_nested_all_pairs_is_bounded_by_the_limit() -> None:
    """Unbounded, the composites of 3 events grow as 3^depth (3^24 here); under the limit each
    operator stores at most its operands' reports — the limit and one A per step — and twice
    the limit costs about twice the memory."""
    runs = {limit: run(24, 3, limit) for limit in (100, 200)}
    for limit, (engine, per_event, letters, _) in runs.items():
        assert engine.peak_stored() <= 24 * (limit + 1) * 3
        assert max(per_event) <= limit and len(letters) == 2
    small, large = runs[100][3], runs[200][3]
    assert large < 3 * small, (small, large)


def test_replay_memory_on_49_nested_all_pairs_stays_bounded(tmp_path: Path) -> None:
    """The issue's profile: 49 nested untimed all_pairs conjunctions grew plain ``replay`` past
    3.5 GB. With the limit, ten times the events cost less than three times the resident
    memory (the state of untimed all_pairs grows with the events it stores, by the limit per
    step, until the state cap), and every event past the first is a dead letter."""
    profiles = tmp_path / "deep.eva"
    profiles.write_text(nested(49))

    def peak_rss(count: int) -> tuple[int, int, list[dict[str, object]]]:
        events = tmp_path / f"events{count}.jsonl"
        events.write_text("".join(json.dumps({
            "specversion": "1.0", "id": f"e{i}", "source": "s", "type": "a",
            "time": f"2026-01-01T00:00:{i:02d}Z"}) + "\n" for i in range(count)))
        letters = tmp_path / f"letters{count}.jsonl"
        # The replay in a process of its own, which says its own peak resident set on exit.
        script = ("import atexit, resource, sys\n"
                  "atexit.register(lambda: print(resource.getrusage(resource.RUSAGE_SELF)"
                  ".ru_maxrss, file=sys.stderr))\n"
                  "from mediator.cli import main\n"
                  "sys.argv = ['evamed', 'replay', '--profiles', sys.argv[1], '--events', "
                  "sys.argv[2], '--composite-limit', '100', '--dead-letter', sys.argv[3]]\n"
                  "main()\n")
        done = subprocess.run([sys.executable, "-c", script, str(profiles), str(events),
                               str(letters)], capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr
        kib = int(done.stderr.strip().splitlines()[-1])
        return kib, len(done.stdout.splitlines()), [
            json.loads(line) for line in letters.read_text().splitlines()]

    small, small_out, small_letters = peak_rss(2)
    large, large_out, large_letters = peak_rss(20)
    assert (small_out, large_out) == (100, 1900)  # 100 per event after the first
    assert len(small_letters) == 1 and len(large_letters) == 19
    assert all(d["reason"] == "composite_limit" and "limit of 100 composites" in str(d["detail"])
               for d in large_letters)
    assert large < 3 * small, (small, large)


def test_replay_composite_limit_option(tmp_path: Path) -> None:
    profiles = tmp_path / "p.eva"
    profiles.write_text(nested(3))
    events = tmp_path / "e.jsonl"
    events.write_text("".join(json.dumps({
        "specversion": "1.0", "id": f"e{i}", "source": "s", "type": "a",
        "time": f"2026-01-01T00:00:0{i}Z"}) + "\n" for i in range(4)))
    unlimited = runner.invoke(app, ["replay", "--profiles", str(profiles), "--events",
                                    str(events), "--composite-limit", "0"])
    assert unlimited.exit_code == 0 and len(unlimited.stdout.splitlines()) == 4 + 23 + 69
    cut = runner.invoke(app, ["replay", "--profiles", str(profiles), "--events", str(events),
                              "--composite-limit", "10"])
    assert cut.exit_code == 0 and len(cut.stdout.splitlines()) == 4 + 10 + 10
    assert [json.loads(line)["reason"] for line in cut.stderr.splitlines()] == [
        "composite_limit"] * 2
    refused = runner.invoke(app, ["replay", "--profiles", str(profiles), "--events",
                                  str(events), "--composite-limit", "-1"])
    assert refused.exit_code == 2 and "--composite-limit -1" in refused.stderr


def test_the_default_limit_is_stated_and_an_older_configuration_reads_with_it() -> None:
    assert EngineConfig().composite_limit == COMPOSITE_LIMIT == 10_000
    written = EngineConfig(composite_limit=7).to_json()
    assert EngineConfig.from_json(written).composite_limit == 7
    del written["composite_limit"]  # a checkpoint written before the limit existed
    assert EngineConfig.from_json(written).composite_limit == COMPOSITE_LIMIT


def test_growth_counts_nested_operators_that_pair_with_everything_they_stored() -> None:
    def of(text: str) -> int:
        doc = parse('class A = type == "a"\nclass B = type == "b"\nprofile P = ' + text + "\n")
        return growth(doc.profiles[0].expr)

    assert of("A") == 0
    assert of("((all_dup(A), all_dup(B))_inf)_all_pairs") == 1
    inner = "((all_dup(A), all_dup(B))_inf)_all_pairs"
    assert of(f"((all_dup({inner}), all_dup(A))_inf)_all_pairs") == 2
    assert of(f"((first_dup({inner}); first_dup(A))_inf)_all_pairs") == 2  # every list
    assert of(f"((all_dup({inner}), all_dup(A))_5s)_all_pairs") == 1  # a span bounds it
    assert of(f"((first_dup({inner}); first_dup(A))_inf)_unique_pairs") == 1
    assert of(f"((all_dup({inner}), all_dup(A))_inf)_repeated_pairs") == 1  # consumed
    assert of(f"((all_dup(({inner}[1])_unique_pairs), all_dup(A))_inf)_all_pairs") == 1
    assert of(f"((all_dup(((not {inner})_5s)_all_pairs), all_dup(A))_inf)_all_pairs") == 1
    assert of(nested(49).split(" = ", 2)[2].strip()) == 49
    assert isinstance(parse(nested(2)).profiles[0].expr, ast.Conjunction)


def test_check_warns_when_composites_can_grow_exponentially(tmp_path: Path) -> None:
    path = tmp_path / "p.eva"
    path.write_text(nested(2, "Nested") + 'profile Flat = ((all_dup(A), all_dup(A))_inf)_all_pairs\n'
                    'profile Timed = ((all_dup(((all_dup(A), all_dup(A))_1s)_all_pairs), '
                    'all_dup(A))_1s)_all_pairs\n')
    result = runner.invoke(app, ["check", str(path)])
    assert result.exit_code == 0
    warnings = [line for line in result.stderr.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1 and warnings[0].startswith(
        "warning: profile Nested: its composites can grow exponentially: 2 nested operators")
    assert "10,000" in result.stderr and "Flat" not in result.stderr
