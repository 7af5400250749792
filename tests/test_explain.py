"""``evamed explain`` as an operator reads it: why a profile was decomposed, its partitioning,
a cost warning where a service is asked for a stream that grows with the trace, a legend, full
lines when piped, and group names in any spelling."""

from __future__ import annotations

import json
from typing import Any

import pytest
from typer.testing import CliRunner

from mediator.cli import app

runner = CliRunner()
PAPER = "examples/logistics/profiles.eva"


def explain(*args: str) -> str:
    result = runner.invoke(app, ["explain", "--profiles", PAPER, *args])
    assert result.exit_code == 0, result.output
    return result.stdout


@pytest.mark.parametrize("spelling", ["cg3", "CG3", "CG-3", "cg-3"])
def test_a_group_is_accepted_in_any_spelling(spelling: str) -> None:
    assert "P1 on CG-3" in explain("--profile", "P1", "--group", spelling)


def test_an_unknown_group_names_the_choices() -> None:
    result = runner.invoke(app, ["explain", "--profiles", PAPER, "--group", "cg9"])
    assert result.exit_code == 2
    assert "no group 'cg9'" in result.output and "cg0" in result.output


def test_the_text_ends_with_a_legend_of_the_symbols() -> None:
    last = explain("--profile", "P7", "--group", "cg1").strip().splitlines()[-1]
    assert last.startswith("legend:")
    assert all(symbol in last for symbol in ("↔ equivalent", "+ positive", "⇝ transferring",
                                             "D decomposed"))


def test_a_decomposition_says_why_in_words() -> None:
    text = explain("--profile", "P3", "--group", "cg1")
    assert "why: CG-1 has no sequence" in text
    assert ("why: CG-1 does not evaluate a conjunction with first_dup/first_dup and "
            "unique_pairs") in text
    plans = json.loads(explain("--profile", "P3", "--group", "cg1", "--format", "json"))
    assert plans[0]["root"]["why"] == "CG-1 has no sequence"


def test_the_partitioning_is_stated() -> None:
    text = explain("--profile", "P4", "--group", "cg2")
    assert "per data.truck: each value of data.truck is evaluated apart" in text
    assert "CG-2 keeps no partitions apart" in text
    assert "per " not in explain("--profile", "P1", "--group", "cg3")
    assert json.loads(explain("--profile", "P4", "--group", "cg3", "--format", "json")
                      )[0]["per"] == "data.truck"


def test_a_stream_growing_with_the_trace_is_warned_of() -> None:
    """P1 on CG-1: every jam × every truck report, for ever (no time frame in CG-1); on CG-3
    the interval join bounds it."""
    text = explain("--profile", "P1", "--group", "cg1")
    assert "cost: the service pairs every Jam × TruckA over the whole trace" in text
    assert "cost:" not in explain("--profile", "P1", "--group", "cg3")
    plans = json.loads(explain("--profile", "P1", "--group", "cg1", "--format", "json"))
    assert "grow with the trace" in plans[0]["root"]["cost"]


def test_a_sequence_whose_rerun_would_miss_hidden_events_is_composed_and_explain_says_why(
        ) -> None:
    """P6, (last_dup(Location); all_dup(HalfHour))_30min, was relaxed to all/all/all_pairs on
    CG-1…CG-4 and re-run on the visible events: a Location at a tick's instant is in no answer
    yet is the last one (tests/test_runner.py). It is composed at the mediator over its whole
    operands, and explain says why."""
    for group in ["cg1", "cg2", "cg3", "cg4"]:
        text = explain("--profile", "P6", "--group", group)
        assert "plan: D decompose" in text.splitlines()[0], group
        assert ("why: re-running last_dup/all_dup/all_pairs on the events of the service's "
                "answers is unsound" in " ".join(text.split())), group
    assert "plan: ↔ equivalent" in explain("--profile", "P6", "--group", "cg5")


def test_piped_output_is_not_wrapped() -> None:
    text = explain("--profile", "P1", "--group", "cg1")
    native = next(line for line in text.splitlines() if "native:" in line)
    assert native.strip().endswith('data.area = "A"])')  # one line, however long


def _natives(plan: dict[str, Any]) -> list[dict[str, Any]]:
    found, stack = [], [plan["root"]]
    while stack:
        node = stack.pop()
        stack += node.get("children", [])
        if node["node"] == "service":
            found.append(node)
    return found


@pytest.mark.parametrize(("profile", "group", "left_out"), [
    ("P4", "cg2", ['Return: data.location == "garage"']),  # Snoop knows events by type only
    ("P1", "cg2", ['Jam: data.area == "A"', 'TruckA: data.area == "A"']),
    ("P4", "cg3", []),                                      # SQL states the equality
    ("P4", "cg4", []),                                      # so does XChange
    ("P4", "cg1", []),
])
def test_explain_lists_what_the_mediator_reapplies(profile: str, group: str,
                                                    left_out: list[str]) -> None:
    """A native query that leaves a class's test out is answered with a superset; the mediator
    re-applies the class to what comes back — explain says which tests, next to the query."""
    plans = json.loads(explain("--profile", profile, "--group", group, "--format", "json"))
    assert sorted(t for n in _natives(plans[0]) for t in n["reapplied"]) == sorted(left_out)
    text = explain("--profile", profile, "--group", group)
    lines = [line for line in text.splitlines() if "the mediator re-applies" in line]
    assert sorted(t for line in lines for t in line.split(": ", 1)[1].split("; ")) == sorted(
        left_out)
    if not left_out:
        assert "re-applies" not in text


def test_sql_and_xchange_say_which_tests_they_widen() -> None:
    """SQL's NULL logic differs from EVA's for != and not; XChange states equalities only."""
    from eva import ast
    from eva.parser import parse
    from transforms.dialects import dialect

    doc = parse('class A = type == "a" and data.x != 1 and data.y == "k"\n'
                'class B = type == "b" and data.n > 3\nprofile P = A\n')
    a, b = ast.Prim("A"), ast.Prim("B")
    assert dialect("cg3").generate(a, doc).widened == (("A", "data.x != 1"),)
    assert dialect("cg4").generate(a, doc).widened == (("A", "data.x != 1"),)
    assert dialect("cg4").generate(b, doc).widened == (("B", "data.n > 3"),)
    assert dialect("cg3").generate(b, doc).widened == ()
    assert dialect("cg2").generate(b, doc).widened == (("B", "data.n > 3"),)
