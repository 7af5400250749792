"""The predicate index (eva.classes.ClassIndex) answers exactly what evaluating each compiled
predicate answers — equality and ``in`` by hash, ranges by bisect, conjunctions counted, the
rest evaluated — on random predicates (mixed types, absent paths, NaN, bools against numbers)
and random events, as predicates are added and released between events."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from eva import ast
from eva.classes import ClassIndex, compile_predicate
from eva.engine import Engine, replay
from eva.events import Event
from eva.parser import parse
from tests.helpers import index_switched, signature

PATHS = ["type", "source", "data.x", "data.y", "data.x.z"]
VALUES: list[object] = [0, 1, 1.0, -1, 2, 2.5, True, False, None, "a", "b", "1", "", 2**53 + 1,
                        float(2**53), float("inf"), float("nan")]
OPS = ["==", "!=", "<", "<=", ">", ">=", "in"]


class Text(str):
    """A str subclass: a value of a type JSON does not give, which the tables leave to
    evaluation."""


def _compare(path: str, op: str, value: object, options: tuple[object, ...]) -> ast.Compare:
    if op == "in":
        return ast.Compare(path, op, options)
    if path == "type" and op == "==" and value == "":
        value = "a"  # some type tests that hold
    return ast.Compare(path, op, value)


values = st.sampled_from(VALUES) | st.sampled_from(["a", "b", "c"])
compares = st.builds(_compare, st.sampled_from(PATHS), st.sampled_from(OPS), values,
                     st.lists(values, max_size=4).map(tuple))


def _extend(children: st.SearchStrategy[ast.Predicate]) -> st.SearchStrategy[ast.Predicate]:
    return st.one_of(st.builds(ast.And, children, children), st.builds(ast.Or, children, children),
                     st.builds(ast.Not, children))


predicates = st.recursive(compares, _extend, max_leaves=5)
# Most subscriptions are a type test and a conjunction of data tests: weight those.
conjunctions = st.builds(
    lambda t, parts: ast.And(ast.Compare("type", "in" if isinstance(t, tuple) else "==", t),
                             parts) if parts is not None else ast.Compare("type", "==", t),
    st.sampled_from(["a", "b", ("a", "b")]),
    st.none() | st.lists(compares, min_size=1, max_size=3).map(
        lambda cs: _and(cs)))


def _and(parts: list[ast.Compare]) -> ast.Predicate:
    out: ast.Predicate = parts[0]
    for part in parts[1:]:
        out = ast.And(out, part)
    return out


field_values = st.sampled_from(VALUES) | st.sampled_from(
    ["c", Text("a"), [1], {"z": 1}, {"z": "a"}, {"z": None}])


@st.composite
def events(draw: st.DrawFn) -> Event:
    data = draw(st.none() | st.dictionaries(st.sampled_from(["x", "y"]), field_values,
                                            max_size=2))
    return Event("e", draw(st.sampled_from(["a", "s", "1"])), draw(st.sampled_from("abc")), 0,
                 data=data)


def expected(preds: dict[int, ast.Predicate], event: Event) -> frozenset[int]:
    return frozenset(i for i, pred in preds.items() if compile_predicate(pred, {})(event))


@settings(max_examples=400, deadline=None)
@given(preds=st.lists(predicates | conjunctions, min_size=1, max_size=12),
       trace=st.lists(events(), max_size=12))
def test_the_index_matches_what_evaluating_each_predicate_gives(
        preds: list[ast.Predicate], trace: list[Event]) -> None:
    on, off = ClassIndex(indexed=True), ClassIndex(indexed=False)
    ids = {on.add(p, {}): p for p in preds}
    assert [off.add(p, {}) for p in preds] == [on.add(p, {}) for p in preds]
    for event in trace:
        want = expected(ids, event)
        assert on.match(event) == want, event
        assert off.match(event) == want, event
    assert on.tests == off.tests  # every candidate is decided, by look-up or by evaluation


@settings(max_examples=300, deadline=None)
@given(steps=st.lists(st.tuples(st.sampled_from(["add", "release", "event"]),
                                predicates | conjunctions, events()), max_size=30))
def test_adding_and_releasing_between_events_keeps_the_answers(
        steps: list[tuple[str, ast.Predicate, Event]]) -> None:
    """The type plans are kept up to date in place (built on the first event of a type, then
    changed predicate by predicate), never rebuilt."""
    index = ClassIndex(indexed=True)
    active: dict[int, ast.Predicate] = {}
    for action, pred, event in steps:
        if action == "add":
            active[index.add(pred, {})] = pred
        elif action == "release" and active:
            ident = sorted(active)[hash(pred) % len(active)]
            index.release(ident)
            del active[ident]
        else:
            assert index.match(event) == expected(active, event), (event, active)


def test_equality_follows_json_values_not_python_keys() -> None:
    """1 == 1.0, but true is not 1 (a dict would take True for 1); absent reads as null; a
    string is no number."""
    index = ClassIndex(indexed=True)
    one = index.add(ast.Compare("data.v", "==", 1), {})
    true = index.add(ast.Compare("data.v", "==", True), {})
    null = index.add(ast.Compare("data.v", "==", None), {})
    text = index.add(ast.Compare("data.v", "in", ("1", 1.0, 1)), {})

    def hits(data: object) -> frozenset[int]:
        return index.match(Event("e", "s", "a", 0, data=data))

    assert hits({"v": 1.0}) == {one, text}
    assert hits({"v": True}) == {true}
    assert hits({"v": "1"}) == {text}
    assert hits({}) == hits(None) == hits({"v": None}) == {null}
    assert hits({"v": [1]}) == hits({"v": {"1": 1}}) == frozenset()


def test_ranges_cut_at_equal_bounds_and_never_order_mixed_types() -> None:
    index = ClassIndex(indexed=True)
    ops = {op: index.add(ast.Compare("data.p", op, 5), {}) for op in ("<", "<=", ">", ">=")}
    big = index.add(ast.Compare("data.p", ">", 2**53), {})
    word = index.add(ast.Compare("data.p", ">=", "m"), {})

    def hits(value: object) -> frozenset[int]:
        return index.match(Event("e", "s", "a", 0, data={"p": value}))

    assert hits(5) == hits(5.0) == {ops["<="], ops[">="]}
    assert hits(4.5) == {ops["<"], ops["<="]}
    assert hits(6) == {ops[">"], ops[">="]}
    assert hits(2**53 + 1) == {ops[">"], ops[">="], big}  # exact, not through floats
    assert hits(float(2**53)) == {ops[">"], ops[">="]}
    assert hits("z") == {word}
    assert hits(True) == hits(None) == hits(float("nan")) == hits([6]) == frozenset()


def test_a_conjunction_of_indexed_tests_is_counted_not_evaluated() -> None:
    index = ClassIndex(indexed=True)
    for i in range(1000):
        index.add(parse_pred(f'type == "a" and data.customer == "c{i}" and data.price > {i}'), {})
    residual = index.add(parse_pred('type == "a" and data.customer == "c1" and data.n != 2'), {})
    plan = index.plan("a")
    assert plan.evaluated() == 0 and plan.decided == 1001
    assert index.match(Event("e", "s", "a", 0, data={"customer": "c7", "price": 8})) == {7}
    assert index.match(Event("e", "s", "a", 0, data={"customer": "c1", "price": 2})) == {
        1, residual}
    assert index.match(Event("e", "s", "a", 0, data={"customer": "c1", "n": 2})) == frozenset()
    assert index.match(Event("e", "s", "b", 0, data={"customer": "c7", "price": 8})) == set()
    assert index.plan("a") is plan  # added to in place, never rebuilt


def parse_pred(text: str) -> ast.Predicate:
    body = parse(f"class K = {text}\nprofile P = K\n").classes[0].body
    assert not isinstance(body, ast.Every)
    return body


@pytest.mark.parametrize("indexed", [True, False])
def test_removing_a_profile_releases_only_predicates_no_other_profile_uses(
        indexed: bool) -> None:
    text = ('class A = type == "a" and data.k == 1\nclass B = type == "b" and data.k > 0\n'
            "profile P = ((all_dup(A); all_dup(B))_5us)_all_pairs\nprofile Q = A\n")
    with index_switched(indexed):
        engine = Engine()
    engine.add_document(parse(text))
    events = [Event(f"{t}{i}", "s", t, i, i, {"k": 1}) for i, t in enumerate("abab")]
    out = engine.push(events[0])
    assert engine.remove_profile("P")
    out += engine.push(events[1]) + engine.push(events[2]) + engine.close()
    assert [(n.profile, n.occ.events) for n in out] == [("Q", ("a0",)), ("Q", ("a2",))]
    b = engine.index.add(parse_pred('type == "b" and data.k > 0'), {})
    assert engine.index.plan("b").decided == 1  # brought back by being added again
    assert engine.index.match(events[3]) == {b}


def test_many_subscribers_on_the_same_types_give_the_unindexed_answers() -> None:
    """2,000 profiles on types a/b with equality, ``in`` and range filters over the test
    classes' trace shapes: the same composites with the index on and off."""
    lines = ['class A = type == "a"', 'class B = type == "b"',
             "profile P0 = ((all_dup(A); all_dup(B))_3us)_all_pairs"]
    for i in range(1, 2000):
        test = [f'data.k == {i % 7}', f'data.k in [{i % 5}, "x{i}"]', f"data.k > {i % 4}",
                f'data.k <= {i % 3} and data.k != 2'][i % 4]
        lines += [f'class X{i} = type == "a" and {test}', f'class Y{i} = type == "b" and {test}',
                  f"profile P{i} = ((all_dup(X{i}); all_dup(Y{i}))_2us)_unique_pairs"]
    doc = parse("\n".join(lines) + "\n")
    trace = [Event(f"e{i}", "s", "ab"[i % 3 % 2], i, i, {"k": i % 6}) for i in range(60)]
    with index_switched(True):
        on = signature(replay(doc, trace))
    with index_switched(False):
        off = signature(replay(doc, trace))
    assert on == off and len(on) > 2000
