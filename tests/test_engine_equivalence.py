"""The incremental engine equals the reference evaluator — on every operator × EIS × EIC ×
evaluation time, with random operands nested to depth 3, on random traces, with garbage
collection on (also swept before every event) and off (so collection is shown never to change
an answer)."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from eva import ast
from eva.engine import EngineConfig, replay
from eva.events import Event
from eva.parser import parse
from eva.printer import expr_text
from eva.reference import evaluate
from tests.helpers import signature
from tests.strategies import CLASSES, documents, expressions, traces

DUPS = [ast.FIRST, ast.LAST, ast.ALL, ast.nth(2)]
EVALUATIONS = ["", " evaluate end_of_interval"]


def assert_engine_equals_reference(doc: ast.Document, trace: list[Event], tick: int = 1) -> None:
    expected = signature(evaluate(doc, trace, tick=tick))
    # Collection as it runs (lazily, per partition, and swept now and then), on every event
    # (a sweep before each), and off.
    for config in (EngineConfig(tick=tick), EngineConfig(tick=tick, sweep=1),
                   EngineConfig(tick=tick, gc=False)):
        got = signature(replay(doc, trace, config=config))
        assert got == expected, f"{config}\n{doc.profiles[0]}"


BINARY = [(op, l, r, p, e) for op in ("disjunction", "conjunction", "sequence")
          for l, r in itertools.product(DUPS, DUPS) for p in ast.Pairs for e in EVALUATIONS]


def _binary(op: str, left: ast.Dup, right: ast.Dup, pairs: ast.Pairs,
            a: ast.Expr, b: ast.Expr, span: int | None) -> ast.Expr:
    lo, ro = ast.Operand(left, a), ast.Operand(right, b)
    if op == "disjunction":
        return ast.Disjunction(lo, ro, pairs)
    if op == "conjunction":
        return ast.Conjunction(lo, ro, span, pairs)
    return ast.Sequence(lo, ro, span, pairs)


@pytest.mark.parametrize(("op", "left", "right", "pairs", "evaluation"), BINARY,
                         ids=lambda v: str(v).strip() or "continuous")
@settings(max_examples=12)
@given(a=expressions(2), b=expressions(2), span=st.sampled_from([1, 3, 8, None]),
       trace=traces())
def test_binary_operator_matches_reference_on_random_traces(
        op: str, left: ast.Dup, right: ast.Dup, pairs: ast.Pairs, evaluation: str,
        a: ast.Expr, b: ast.Expr, span: int | None, trace: list[Event]) -> None:
    expr = _binary(op, left, right, pairs, a, b, span)
    doc = parse(CLASSES + f"profile P{evaluation} = {expr_text(expr)}\n")
    assert_engine_equals_reference(doc, trace)


@pytest.mark.parametrize("pairs", list(ast.Pairs))
@pytest.mark.parametrize("anchored", [False, True])
@settings(max_examples=60)
@given(inner=expressions(2), anchor=expressions(1), span=st.sampled_from([1, 2, 3, 5]),
       dup=st.sampled_from(DUPS), trace=traces())
def test_negation_matches_reference_on_random_traces(
        pairs: ast.Pairs, anchored: bool, inner: ast.Expr, anchor: ast.Expr, span: int,
        dup: ast.Dup, trace: list[Event]) -> None:
    neg = ast.Negation(inner, span, pairs)
    expr: ast.Expr = neg
    if anchored:
        expr = ast.Sequence(ast.Operand(dup, anchor), ast.Operand(ast.ALL, neg), span + 1,
                            ast.Pairs.ALL)
    doc = parse(CLASSES + f"profile P = {expr_text(expr)}\n")
    assert_engine_equals_reference(doc, trace)


@pytest.mark.parametrize("pairs", list(ast.Pairs))
@pytest.mark.parametrize("index", [1, 2, 3])
@settings(max_examples=30)
@given(inner=expressions(2), trace=traces())
def test_selection_matches_reference_on_random_traces(
        pairs: ast.Pairs, index: int, inner: ast.Expr, trace: list[Event]) -> None:
    doc = parse(CLASSES + f"profile P = {expr_text(ast.Selection(inner, index, pairs))}\n")
    assert_engine_equals_reference(doc, trace)


@settings(max_examples=1500)
@given(doc=documents(3), trace=traces(max_size=30))
def test_random_profiles_of_depth_3_match_reference(doc: ast.Document, trace: list[Event]) -> None:
    assert_engine_equals_reference(doc, trace)


@settings(max_examples=200)
@given(doc=documents(2), trace=traces(), tick=st.sampled_from([1, 2, 5]))
def test_default_clock_granularity_is_respected(doc: ast.Document, trace: list[Event],
                                                tick: int) -> None:
    assert_engine_equals_reference(doc, trace, tick=tick)


@settings(max_examples=400)
@given(expr=expressions(3), trace=traces(max_size=30), evaluation=st.sampled_from(EVALUATIONS))
def test_partitions_dropped_at_rest_answer_as_kept_ones(expr: ast.Expr, trace: list[Event],
                                                        evaluation: str) -> None:
    """Every profile partitioned: with a sweep before every event, each partition at rest is
    dropped and made anew by its key's next event — the answers stay the reference's."""
    doc = parse(CLASSES + f"profile P per data.k{evaluation} = {expr_text(expr)}\n")
    assert_engine_equals_reference(doc, trace)


def test_a_partition_remembers_its_duplicate_list_past_the_time_frame() -> None:
    """a1 expires from the time frame, yet a2 joins a1's duplicate list, so a2 is not the
    first A: no composite. A partition dropped once a1 expired would make a2 first."""
    doc = parse(CLASSES + "profile P per data.k = ((first_dup(A); all_dup(B))_5us)_all_pairs\n")
    trace = [Event("a1", "s", "a", 1, 0, {"k": 1}), Event("c1", "s", "c", 10, 1, {"k": 2}),
             Event("a2", "s", "a", 11, 2, {"k": 1}), Event("b1", "s", "b", 12, 3, {"k": 1})]
    assert evaluate(doc, trace) == []
    assert_engine_equals_reference(doc, trace)
