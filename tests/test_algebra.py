"""The algebraic properties of EVA §4.6, under the semantics pinned in docs/semantics.md.

Trace equivalence (Def. 4.9) compares the sets of composite occurrences: their time and the
set of contributing events. The paper states the properties for operands of *different* event
classes (Def. 4.3 requires E1 ≠ E2), so p1, p2, p3 below range over disjoint classes and
contain no negation: passive events of two operands fall on the same tick and are ordered by
operand position, and a negation is anchored only as the posterior operand of a sequence.
Under that reading properties 1–3 and 6 hold (3 for EIS other than ``last``, which Fig. 6
defines asymmetrically); 4 holds without a time frame; 5, 7 and 8 have counterexamples.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from eva import ast
from eva.parser import parse
from eva.printer import expr_text
from eva.reference import evaluate
from tests.helpers import ref
from tests.strategies import CLASSES, expressions, trace_of, traces


def occurrences(expr: ast.Expr, trace: list) -> set[tuple[int, frozenset[str]]]:
    doc = parse(CLASSES + f"profile P = {expr_text(expr)}\n")
    return {(n.occ.time, frozenset(n.occ.events)) for n in evaluate(doc, trace, tick=1)}


def op(dup: ast.Dup, expr: ast.Expr) -> ast.Operand:
    return ast.Operand(dup, expr)


def over(name: str) -> st.SearchStrategy[ast.Expr]:
    return expressions(2, [name], negation=False)


simple_dups = st.sampled_from([ast.FIRST, ast.LAST, ast.ALL])
symmetric_dups = st.sampled_from([ast.FIRST, ast.ALL, ast.nth(2)])
pairs = st.sampled_from(list(ast.Pairs))


@settings(max_examples=200)
@given(p=expressions(2), dup=simple_dups, eic=pairs, trace=traces())
def test_property_1_disjunction_is_idempotent(p: ast.Expr, dup: ast.Dup, eic: ast.Pairs,
                                              trace: list) -> None:
    assert occurrences(ast.Disjunction(op(dup, p), op(dup, p), eic), trace) == occurrences(p, trace)


@settings(max_examples=200)
@given(p1=over("A"), p2=over("B"), d1=st.sampled_from(
    [ast.FIRST, ast.LAST, ast.ALL, ast.nth(2)]), d2=st.sampled_from(
    [ast.FIRST, ast.LAST, ast.ALL, ast.nth(2)]), eic=pairs, trace=traces())
def test_property_2_disjunction_commutes(p1: ast.Expr, p2: ast.Expr, d1: ast.Dup, d2: ast.Dup,
                                         eic: ast.Pairs, trace: list) -> None:
    left = ast.Disjunction(op(d1, p1), op(d2, p2), eic)
    right = ast.Disjunction(op(d2, p2), op(d1, p1), eic)
    assert occurrences(left, trace) == occurrences(right, trace)


@settings(max_examples=300)
@given(p1=over("A"), p2=over("B"), d1=symmetric_dups, d2=symmetric_dups,
       eic=pairs, span=st.sampled_from([1, 3, None]), trace=traces())
def test_property_3_conjunction_commutes(p1: ast.Expr, p2: ast.Expr, d1: ast.Dup, d2: ast.Dup,
                                         eic: ast.Pairs, span: int | None,
                                         trace: list) -> None:
    left = ast.Conjunction(op(d1, p1), op(d2, p2), span, eic)
    right = ast.Conjunction(op(d2, p2), op(d1, p1), span, eic)
    assert occurrences(left, trace) == occurrences(right, trace)


@settings(max_examples=200)
@given(p1=over("A"), p2=over("B"), p3=over("C"), trace=traces(max_size=14))
def test_property_4_conjunction_is_associative_without_time_frame(
        p1: ast.Expr, p2: ast.Expr, p3: ast.Expr, trace: list) -> None:
    def conj(a: ast.Expr, b: ast.Expr) -> ast.Expr:
        return ast.Conjunction(op(ast.ALL, a), op(ast.ALL, b), None, ast.Pairs.ALL)

    assert occurrences(conj(p1, conj(p2, p3)), trace) == occurrences(conj(conj(p1, p2), p3), trace)


def test_property_4_fails_with_a_finite_time_frame_under_point_semantics() -> None:
    """a@0, b@10, c@20, T = 10: (a,(b,c)) needs |0 − 20| ≤ 10; ((a,b),c) only |10 − 20| ≤ 10."""
    trace = trace_of("a1@0 b1@10 c1@20")
    nested_right = " = ((all_dup(A), all_dup(((all_dup(B), all_dup(C))_10us)_all_pairs))_10us)_all_pairs"
    nested_left = " = ((all_dup(((all_dup(A), all_dup(B))_10us)_all_pairs), all_dup(C))_10us)_all_pairs"
    assert ref(nested_right, trace) == [] and ref(nested_left, trace) == [("a1", "b1", "c1")]


def test_property_5_has_a_counterexample_under_point_semantics() -> None:
    """p1;(p2,p3) only needs e1 before the later of e2, e3 (its occurrence time); the right-hand
    side needs an e1 before each. Trace b, a, c: the left matches, the right does not."""
    trace = trace_of("b1@1 a1@2 c1@3")
    left = " = ((all_dup(A); all_dup(((all_dup(B), all_dup(C))_inf)_all_pairs))_inf)_all_pairs"
    right = (" = ((all_dup(((all_dup(A); all_dup(B))_inf)_all_pairs), "
             "all_dup(((all_dup(A); all_dup(C))_inf)_all_pairs))_inf)_all_pairs")
    assert ref(left, trace) == [("a1", "b1", "c1")] and ref(right, trace) == []


@settings(max_examples=200)
@given(p1=over("A"), p2=over("B"), p3=over("C"), span=st.sampled_from([2, 5, None]),
       trace=traces())
def test_property_6_sequence_distributes_over_disjunction(
        p1: ast.Expr, p2: ast.Expr, p3: ast.Expr, span: int | None,
        trace: list) -> None:
    def seq(a: ast.Expr, b: ast.Expr) -> ast.Expr:
        return ast.Sequence(op(ast.ALL, a), op(ast.ALL, b), span, ast.Pairs.ALL)

    def disj(a: ast.Expr, b: ast.Expr) -> ast.Expr:
        return ast.Disjunction(op(ast.ALL, a), op(ast.ALL, b), ast.Pairs.ALL)

    assert occurrences(seq(p1, disj(p2, p3)), trace) == occurrences(
        disj(seq(p1, p2), seq(p1, p3)), trace)


def test_property_7_sequence_is_not_associative() -> None:
    """⟨e2, e1, e3⟩ matches E1;(E2;E3) — (E2;E3) occurs at t(e3) — but not (E1;E2);E3
    (EVA §6.1, transforms.md TV-7)."""
    trace = trace_of("b1@1 a1@2 c1@3")
    right = " = ((all_dup(A); all_dup(((all_dup(B); all_dup(C))_inf)_all_pairs))_inf)_all_pairs"
    left = " = ((all_dup(((all_dup(A); all_dup(B))_inf)_all_pairs); all_dup(C))_inf)_all_pairs"
    assert ref(right, trace) == [("a1", "b1", "c1")] and ref(left, trace) == []


def test_property_8_selection_does_not_distribute_over_sequence() -> None:
    """(p1;p2)^[2] picks the second composite; (p1^[2]; p2^[2]) pairs second events."""
    trace = trace_of("a1@1 b1@2 b2@3 a2@4 b3@5")
    outer = " = (((all_dup(A); all_dup(B))_inf)_all_pairs[2])_unique_pairs"
    inner = " = ((all_dup((A[2])_unique_pairs); all_dup((B[2])_unique_pairs))_inf)_all_pairs"
    assert ref(outer, trace) == [("a1", "b2")]
    assert ref(inner, trace) == [("a2", "b3")] or ref(inner, trace) == []
    assert ref(outer, trace) != ref(inner, trace)
