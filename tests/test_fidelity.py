"""Disagreements with the reference evaluator found by the fidelity search (``make fidelity``,
benchmarks/fidelity.py), each shrunk to a minimal example and kept here: every path — the
engine, the plan runner through each group, the batch plan oracle — gives the reference's
answer on it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from adapters.backends.registry import GROUPS, language
from benchmarks.fidelity import disagrees, from_case
from eva.engine import Engine, EngineConfig
from eva.events import Event
from eva.reference import evaluate
from tests.helpers import profile_doc, signature
from tests.strategies import trace_of
from tests.test_runner import keyed, streamed
from transforms.evaluate import evaluate_plans
from transforms.planner import plan

HIDDEN_OPERANDS = [
    # (profile after "profile P", trace): a positive rule's re-run on the visible events was
    # wrong — an event in no answer decides a selection or a list's end (hidden_operands).
    (" evaluate end_of_interval = ((all_dup(A); all_dup(AB))_inf)_unique_pairs",
     "a0@13 b1@13 a2@14 c3@15"),
    (" evaluate end_of_interval = ((last_dup(A), last_dup(AB))_1us)_all_pairs",
     "b0@13 a1@13 b2@16 b3@17"),
    (" evaluate end_of_interval = ((all_dup(A); last_dup(B))_2us)_unique_pairs",
     "b0@11 a1@12 a2@13 b3@13 b4@15 b5@15 a6@15"),
    (" = (first_dup(C) | all_dup(((last_dup(A); all_dup(B))_1us)_repeated_pairs))_all_pairs",
     "a0@10 b1@10 b2@10 c3@11 a4@11 c5@11 b6@11"),
    (" = (first_dup(C) | all_dup(((all_dup(A); all_dup(AB))_inf)_unique_pairs))_all_pairs",
     "b0@10 a1@11 b2@11 c3@13 a4@13"),
]


@pytest.mark.parametrize(("text", "trace_text"), HIDDEN_OPERANDS)
def test_hidden_operands_are_made_visible_on_every_group(text: str, trace_text: str) -> None:
    doc = profile_doc(text)
    trace = trace_of(trace_text)
    want = evaluate(doc, trace, tick=1)
    for group in GROUPS:
        exact = signature if group != "cg5" else keyed
        oracle = evaluate_plans([plan(p, doc, language(group).capability) for p in doc.profiles],
                                doc, trace, tick=1)
        assert signature(oracle) == signature(want), group
        got = [n for _, n in streamed(group, doc, trace)]
        assert exact(got) == exact(want), group


def keyed_trace(text: str) -> list[Event]:
    """``trace_of`` with every event in partition data.k = 1."""
    return [Event(e.id, e.source, e.type, e.time, e.seq, {"k": 1}) for e in trace_of(text)]


def engine_equals_reference(text: str, trace_text: str) -> None:
    doc = profile_doc(text)
    trace = keyed_trace(trace_text)
    engine = Engine(EngineConfig(tick=1))
    engine.add_document(doc)
    got = [n for e in trace for n in engine.push(e)] + engine.close()
    want = evaluate(doc, trace, tick=1)
    assert want, "the example reports something"
    assert signature(got) == signature(want)


@pytest.mark.parametrize("per", [" per data.k", ""])
@pytest.mark.parametrize("expr", [
    "(((first_dup(T); first_dup(((not A)_1us)_all_pairs))_1us)_all_pairs[1])_all_pairs",
    "((first_dup(T); all_dup(((not A)_1us)_all_pairs))_1us)_all_pairs"])
def test_a_tick_extending_the_anterior_list_still_anchors_the_negation(per: str, expr: str
                                                                      ) -> None:
    """T = every 4us over A at 11, 12, 37, 49: the tick at 40 extends the anterior list
    [t36] (first_dup: never selected) and the engine skipped it as inert — but it anchors the
    absence at 41, which closes the list, so t44 starts a new one and pairs with the absence at
    45. The engine missed that report (issue 26)."""
    engine_equals_reference(per + " = " + expr, "a0@11 a1@12 a2@37 a3@49")


CASES = json.loads((Path(__file__).parent / "fidelity_cases.json").read_text())
"""What ``make fidelity --record`` wrote: each a shrunk disagreement, with what fixed it (or,
``open``, why it is not fixed yet)."""


@pytest.mark.parametrize("record", [pytest.param(c, marks=pytest.mark.xfail(
    strict=True, reason=c["open"])) if "open" in c else c for c in CASES],
    ids=[f"{c['path']}:{c['profile']}" for c in CASES])
def test_recorded_disagreements_agree(record: dict[str, Any]) -> None:
    doc, trace = from_case(record)
    assert disagrees(record["path"], doc, trace, record["extra"]) == ""


def test_a_relaxed_node_whose_events_another_leaf_matches_is_composed_and_explain_says_why(
        ) -> None:
    """(T; A) is relaxed on CG-1 (timed_as_timeless) when alone; beside first_dup(A) and AB
    an event a5 completes its re-run's composite and is stepped for those leaves too, so it is
    composed at the mediator (transforms.planner.shared_events) and the reason is given."""
    from transforms.explanation import as_json
    from transforms.plans import Kind

    inner = "((all_dup(T); all_dup(A))_inf)_all_pairs"
    alone = profile_doc(f" = {inner}")
    assert plan(alone.profiles[0], alone, language("cg1").capability).kind is Kind.POSITIVE
    doc = profile_doc(f" = ((first_dup(A), all_dup(((all_dup({inner}), all_dup(AB))_inf)"
                      "_all_pairs))_inf)_all_pairs")
    planned = plan(doc.profiles[0], doc, language("cg1").capability)
    assert planned.kind is Kind.DECOMPOSE
    text = str(as_json(planned))
    assert "an event of A may also be one of A elsewhere in the profile" in text
