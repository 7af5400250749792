"""The incremental engine equals the reference evaluator — on every operator × EIS × EIC ×
evaluation time, with random operands nested to depth 3, on random traces, with garbage
collection on (also swept before every event) and off (so collection is shown never to change
an answer), with the predicate index on and off (so matching by look-up is shown to answer as
evaluating each class predicate does), over classes on ``type`` alone and classes with data
filters."""

from __future__ import annotations

import dataclasses
import itertools

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from eva import ast
from eva import semantics as sem
from eva.engine import DeadLetter, Engine, EngineConfig, replay
from eva.events import Event
from eva.parser import parse
from eva.printer import expr_text
from eva.reference import evaluate, evaluate_profile
from tests.helpers import index_switched, signature
from tests.strategies import CLASSES, documents, expressions, traces

DUPS = [ast.FIRST, ast.LAST, ast.ALL, ast.nth(2)]
EVALUATIONS = ["", " evaluate end_of_interval"]
DATA_CLASSES = (
    # CLASSES's names over the traces' data.k (1 or 2): by hash, by range with a residual
    # test, filtering half the c events, and a disjunction (evaluated).
    'class A = type == "a" and data.k in [1, 2.0]\n'
    'class B = type == "b" and data.k >= 1 and data.k != 3\n'
    'class C = type == "c" and data.k == 1\n'
    'class AB = type in ["a", "b"] and data.k < 2 or type == "b"\n'
    'class T = every 4us\n'
)
class_sets = st.sampled_from([CLASSES, DATA_CLASSES])


def assert_engine_equals_reference(doc: ast.Document, trace: list[Event], tick: int = 1) -> None:
    expected = signature(evaluate(doc, trace, tick=tick))
    # Collection as it runs (lazily, per partition, and swept now and then), on every event
    # (a sweep before each), and off; the predicate index on, and off.
    for config, indexed in ((EngineConfig(tick=tick), True),
                            (EngineConfig(tick=tick, sweep=1), True),
                            (EngineConfig(tick=tick, gc=False), True),
                            (EngineConfig(tick=tick), False)):
        with index_switched(indexed):
            got = signature(replay(doc, trace, config=config))
        assert got == expected, f"{config}, index {'on' if indexed else 'off'}\n{doc}"


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
       trace=traces(), classes=class_sets)
def test_binary_operator_matches_reference_on_random_traces(
        op: str, left: ast.Dup, right: ast.Dup, pairs: ast.Pairs, evaluation: str,
        a: ast.Expr, b: ast.Expr, span: int | None, trace: list[Event], classes: str) -> None:
    expr = _binary(op, left, right, pairs, a, b, span)
    doc = parse(classes + f"profile P{evaluation} = {expr_text(expr)}\n")
    assert_engine_equals_reference(doc, trace)


@pytest.mark.parametrize("pairs", list(ast.Pairs))
@pytest.mark.parametrize("anchored", [False, True])
@settings(max_examples=60)
@given(inner=expressions(2), anchor=expressions(1), span=st.sampled_from([1, 2, 3, 5]),
       dup=st.sampled_from(DUPS), trace=traces(), classes=class_sets)
def test_negation_matches_reference_on_random_traces(
        pairs: ast.Pairs, anchored: bool, inner: ast.Expr, anchor: ast.Expr, span: int,
        dup: ast.Dup, trace: list[Event], classes: str) -> None:
    neg = ast.Negation(inner, span, pairs)
    expr: ast.Expr = neg
    if anchored:
        expr = ast.Sequence(ast.Operand(dup, anchor), ast.Operand(ast.ALL, neg), span + 1,
                            ast.Pairs.ALL)
    doc = parse(classes + f"profile P = {expr_text(expr)}\n")
    assert_engine_equals_reference(doc, trace)


@pytest.mark.parametrize("pairs", list(ast.Pairs))
@pytest.mark.parametrize("index", [1, 2, 3])
@settings(max_examples=30)
@given(inner=expressions(2), trace=traces(), classes=class_sets)
def test_selection_matches_reference_on_random_traces(
        pairs: ast.Pairs, index: int, inner: ast.Expr, trace: list[Event], classes: str) -> None:
    doc = parse(classes + f"profile P = {expr_text(ast.Selection(inner, index, pairs))}\n")
    assert_engine_equals_reference(doc, trace)


@settings(max_examples=1500)
@given(doc=class_sets.flatmap(lambda c: documents(3, classes=c)), trace=traces(max_size=30))
def test_random_profiles_of_depth_3_match_reference(doc: ast.Document, trace: list[Event]) -> None:
    assert_engine_equals_reference(doc, trace)


@settings(max_examples=200)
@given(doc=class_sets.flatmap(lambda c: documents(2, classes=c)), trace=traces(),
       tick=st.sampled_from([1, 2, 5]))
def test_default_clock_granularity_is_respected(doc: ast.Document, trace: list[Event],
                                                tick: int) -> None:
    assert_engine_equals_reference(doc, trace, tick=tick)


@settings(max_examples=400)
@given(expr=expressions(3), trace=traces(max_size=30), evaluation=st.sampled_from(EVALUATIONS),
       classes=class_sets)
def test_partitions_dropped_at_rest_answer_as_kept_ones(expr: ast.Expr, trace: list[Event],
                                                        evaluation: str, classes: str) -> None:
    """Every profile partitioned: with a sweep before every event, each partition at rest is
    dropped and made anew by its key's next event — the answers stay the reference's."""
    doc = parse(classes + f"profile P per data.k{evaluation} = {expr_text(expr)}\n")
    assert_engine_equals_reference(doc, trace)


def test_a_partition_remembers_its_duplicate_list_past_the_time_frame() -> None:
    """a1 expires from the time frame, yet a2 joins a1's duplicate list, so a2 is not the
    first A: no composite. A partition dropped once a1 expired would make a2 first."""
    doc = parse(CLASSES + "profile P per data.k = ((first_dup(A); all_dup(B))_5us)_all_pairs\n")
    trace = [Event("a1", "s", "a", 1, 0, {"k": 1}), Event("c1", "s", "c", 10, 1, {"k": 2}),
             Event("a2", "s", "a", 11, 2, {"k": 1}), Event("b1", "s", "b", 12, 3, {"k": 1})]
    assert evaluate(doc, trace) == []
    assert_engine_equals_reference(doc, trace)


def _externalise(expr: ast.Expr) -> ast.Expr:
    """``expr`` with every ``X`` leaf an external operand ``<x>``."""
    if isinstance(expr, ast.Prim):
        return ast.External("x") if expr.name == "X" else expr
    if isinstance(expr, (ast.Disjunction, ast.Conjunction, ast.Sequence)):
        return dataclasses.replace(
            expr, left=ast.Operand(expr.left.dup, _externalise(expr.left.expr)),
            right=ast.Operand(expr.right.dup, _externalise(expr.right.expr)))
    if isinstance(expr, (ast.Negation, ast.Selection)):
        return dataclasses.replace(expr, expr=_externalise(expr.expr))
    return expr


@settings(max_examples=300, deadline=None)
@given(expr=expressions(2, names=["A", "B", "T", "X"]), trace=traces(types="abx"),
       evaluation=st.sampled_from(list(ast.Evaluation)))
def test_external_operands_fed_to_the_engine_match_the_reference_given_their_streams(
        expr: ast.Expr, trace: list[Event], evaluation: ast.Evaluation) -> None:
    """``Engine.feed`` steps an occurrence at its time after the inputs already given for that
    instant; the reference reads the same stream from ``externals``."""
    base = parse(CLASSES + "profile P = A\n")
    profile = ast.Profile("P", _externalise(expr), None, evaluation)
    assume(ast.External("x") in ast.walk(profile.expr))
    doc = ast.Document(base.classes, (profile,))
    events = [e for e in trace if e.type != "x"]
    stream = [((e.time, 0, e.seq), sem.Occ(e.time, (e.time, 0, e.seq), ("svc", e.id), (e.id,)))
              for e in trace if e.type == "x"]
    if not trace:
        return
    start = trace[0].time - 1
    expected = evaluate_profile(profile, doc, events, start=start, end=trace[-1].time, tick=1,
                                externals={"x": stream})
    expected.sort(key=lambda n: n.emitted)
    engine = Engine(EngineConfig(tick=1))
    engine.add_document(doc)
    got = []
    fed = dict(stream)
    for e in trace:
        if e.type == "x":
            got.extend(engine.feed("P", "x", fed[(e.time, 0, e.seq)]))
        else:
            got.extend(engine.push(e))
    got.extend(engine.close())
    assert signature(got) == signature(expected), expr_text(profile.expr)


def test_feeding_behind_the_watermark_is_a_late_dead_letter() -> None:
    letters: list[DeadLetter] = []
    engine = Engine(EngineConfig(tick=1), letters.append)
    doc = parse(CLASSES + "profile P = A\n")
    seq = ast.Sequence(ast.Operand(ast.ALL, ast.External("x")), ast.Operand(ast.ALL, ast.Prim("B")),
                       5, ast.Pairs.ALL)
    engine.add_document(ast.Document(doc.classes, (ast.Profile("Q", seq),)))
    engine.feed("Q", "x", sem.Occ(10, (10, 0, 0), "x1", ("x1",)))
    engine.feed("Q", "x", sem.Occ(12, (12, 0, 1), "x2", ("x2",)))
    assert engine.feed("Q", "x", sem.Occ(9, (9, 0, 2), "x3", ("x3",))) == []
    assert [letter.reason for letter in letters] == ["late"]
    assert "<x>" in letters[0].detail and "'Q'" in letters[0].detail
    got = engine.push(Event("b1", "s", "b", 13, 0)) + engine.close()
    assert [n.occ.events for n in got] == [("x1", "b1"), ("x2", "b1")]
    with pytest.raises(ValueError, match="has no external operand <y>"):
        engine.feed("Q", "y", sem.Occ(20, (20, 0, 3), "y", ("y",)))
    with pytest.raises(ValueError, match="no profile 'R'"):
        engine.feed("R", "x", sem.Occ(20, (20, 0, 3), "y", ("y",)))


@st.composite
def reported_at(draw: st.DrawFn, trace: list[Event]) -> list[tuple[sem.Key, sem.Occ]]:
    """A stream of the ``x`` events of ``trace`` reported at any phase of their instant: as
    events (their key), at a tick (a time class's position), at a passive event (free, or
    anchored at an earlier event) or at an end-of-interval close — in report order."""
    stream = []
    for i, e in enumerate(trace):
        if e.type != "x":
            continue
        earlier = [(d.time, 0, d.seq) for d in trace[:i] if d.time < e.time]
        emit = draw(st.sampled_from([
            (e.time, 0, e.seq), (e.time, 1, draw(st.integers(0, 5))), (e.time, 2, ()),
            *([(e.time, 2, draw(st.sampled_from(earlier)))] if earlier else []),
            (e.time, sem.CLOSE, 0)]))
        stream.append((emit, sem.Occ(e.time, emit, ("svc", e.id), (e.id,))))
    return sorted(stream, key=lambda s: s[0])


@settings(max_examples=300, deadline=None)
@given(expr=expressions(2, names=["A", "B", "T", "X"]), data=st.data(),
       trace=traces(types="abx"), evaluation=st.sampled_from(list(ast.Evaluation)))
def test_occurrences_fed_at_a_tick_or_clock_step_take_their_place_in_the_instant(
        expr: ast.Expr, data: st.DataObject, trace: list[Event],
        evaluation: ast.Evaluation) -> None:
    """``Engine.feed(..., emitted)`` with a report key of a later phase steps the occurrence
    among the instant's ticks, passive events and end-of-interval closes, where the reference's
    trace view puts it (left side first at equal keys)."""
    base = parse(CLASSES + "profile P = A\n")
    profile = ast.Profile("P", _externalise(expr), None, evaluation)
    assume(ast.External("x") in ast.walk(profile.expr) and trace)
    doc = ast.Document(base.classes, (profile,))
    stream = data.draw(reported_at(trace))
    expected = evaluate_profile(profile, doc, [e for e in trace if e.type != "x"],
                                start=trace[0].time - 1, end=trace[-1].time, tick=1,
                                externals={"x": stream})
    expected.sort(key=lambda n: n.emitted)
    engine = Engine(EngineConfig(tick=1))
    engine.add_document(doc)
    got = []
    fed = {occ.ident: (emit, occ) for emit, occ in stream}
    for e in trace:  # fed in arrival order: an x event's arrival number is its seq
        if e.type == "x":
            emit, occ = fed[("svc", e.id)]
            got.extend(engine.feed("P", "x", occ, emitted=emit))
        else:
            got.extend(engine.push(e))
    got.extend(engine.close())
    assert signature(got) == signature(expected), (expr_text(profile.expr), stream)


SAME_INSTANT = [
    # (outer expression, evaluation, <x>'s report key at 12: T's tick is (12, 1, 4)) — each
    # ordered otherwise when fed at phase 0, before the instant's tick and clock steps.
    ("(first_dup(T) | first_dup(<x>))_unique_pairs", ast.Evaluation.CONTINUOUS, (12, 1, 0)),
    ("(first_dup(T) | first_dup(<x>))_unique_pairs", ast.Evaluation.CONTINUOUS, (12, 1, 4)),
    ("(last_dup(T) | last_dup(<x>))_all_pairs", ast.Evaluation.END_OF_INTERVAL, (12, 1, 4)),
    ("((last_dup(T), last_dup(<x>))_1us)_unique_pairs", ast.Evaluation.END_OF_INTERVAL,
     (12, 1, 4)),
    ("((last_dup(<x>), last_dup(T))_1us)_unique_pairs", ast.Evaluation.CONTINUOUS, (12, 2, ())),
    ("((last_dup(<x>), last_dup(T))_1us)_unique_pairs", ast.Evaluation.END_OF_INTERVAL,
     (12, sem.CLOSE, 0)),
]


@pytest.mark.parametrize(("text", "evaluation", "emit"), SAME_INSTANT)
def test_a_feed_at_a_tick_or_clock_step_key_is_ordered_with_the_instants_own_steps(
        text: str, evaluation: ast.Evaluation, emit: sem.Key) -> None:
    base = parse(CLASSES + "profile P = A\n")
    expr = parse(CLASSES + 'class X = type == "x"\nprofile P = ' + text.replace("<x>", "X")
                 + "\n").profiles[0].expr
    profile = ast.Profile("P", _externalise(expr), None, evaluation)
    doc = ast.Document(base.classes, (profile,))
    occ = sem.Occ(12, emit, ("svc", "x"), ("x",))
    trace = [Event("c1", "s", "c", 11, 0)]
    expected = signature(evaluate_profile(profile, doc, trace, start=10, end=13, tick=1,
                                          externals={"x": [(emit, occ)]}))
    got = {}
    for at in (emit, None):
        engine = Engine(EngineConfig(tick=1))
        engine.add_document(doc, start=10)
        got[at] = signature(engine.push(trace[0]) + engine.feed("P", "x", occ, emitted=at)
                            + engine.close(13))
    assert got[emit] == expected
    assert got[None] != expected  # what stepping it at phase 0 gave


def assert_limited_engine_equals_reference(doc: ast.Document, trace: list[Event],
                                           limit: int) -> None:
    """Under a composite limit the engine reports the reference's composites — the first
    ``limit`` per operator and step — and one ``composite_limit`` letter per step the
    reference cut, with collection on and off."""
    limited: list[tuple[object, sem.Key]] = []
    expected = signature(evaluate(doc, trace, tick=1, limit=limit, limited=limited))
    for config in (EngineConfig(tick=1, composite_limit=limit),
                   EngineConfig(tick=1, composite_limit=limit, gc=False)):
        letters: list[DeadLetter] = []
        got = signature(replay(doc, trace, config=config, dead_letter=letters.append))
        assert got == expected, f"{config}\n{doc}"
        cut = [d for d in letters if d.reason == "composite_limit"]
        assert len(cut) == len(limited), f"{config}\n{doc}\n{cut}\n{limited}"


@settings(max_examples=600)
@given(doc=class_sets.flatmap(lambda c: documents(3, classes=c)), trace=traces(max_size=30),
       limit=st.sampled_from([1, 2, 3, 5]))
def test_random_profiles_under_a_composite_limit_match_the_reference(
        doc: ast.Document, trace: list[Event], limit: int) -> None:
    assert_limited_engine_equals_reference(doc, trace, limit)


@pytest.mark.parametrize(("op", "left", "right", "pairs", "evaluation"), BINARY,
                         ids=lambda v: str(v).strip() or "continuous")
@settings(max_examples=6)
@given(a=expressions(2), b=expressions(2), span=st.sampled_from([3, None]),
       trace=traces(), limit=st.sampled_from([1, 2, 4]))
def test_binary_operator_under_a_composite_limit_matches_reference(
        op: str, left: ast.Dup, right: ast.Dup, pairs: ast.Pairs, evaluation: str,
        a: ast.Expr, b: ast.Expr, span: int | None, trace: list[Event], limit: int) -> None:
    expr = _binary(op, left, right, pairs, a, b, span)
    doc = parse(CLASSES + f"profile P{evaluation} = {expr_text(expr)}\n")
    assert_limited_engine_equals_reference(doc, trace, limit)
