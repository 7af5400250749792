"""The CG-2 (Snoop) dialect: EVA → Snoop text, the native round trip, and a Snoop pair read
back as the EVA composite (parse_notification)."""

from __future__ import annotations

import pytest

from adapters.backends.snoop import Leaf, Op, SnoopLanguage
from eva import ast
from eva import reference as ref
from eva.classes import compile_predicate
from eva.events import Event
from eva.parser import parse
from eva.reference import evaluate
from transforms.dialects import dialect
from transforms.dialects.base import Detection, Scope, Unsupported
from transforms.plans import Kind, Remote

CLASSES = ('class A = type == "a"\n'
           'class B = type == "b" and data.n > 2\n'
           'class AB = type in ["a", "b"]\n'
           'class Q = type == "x y"\n'
           'class N = data.n == 1\n'
           'class T = every 4us\n')

SNOOP = dialect("cg2")


def expr_of(text: str) -> tuple[ast.Expr, ast.Document]:
    doc = parse(CLASSES + f"profile P = {text}\n")
    return doc.profiles[0].expr, doc


@pytest.mark.parametrize(("eva", "snoop", "tree"), [
    ("A", "a CONTEXT unrestricted", Leaf("a")),
    ("B", "b CONTEXT unrestricted", Leaf("b")),
    ("AB", "(a OR b) CONTEXT unrestricted", Op("or", (Leaf("a"), Leaf("b")))),
    ("Q", '"x y" CONTEXT unrestricted', Leaf("x y")),
    ("T", "eva.tick.T CONTEXT unrestricted", Leaf("eva.tick.T")),
    ("((all_dup(A); all_dup(B))_inf)_all_pairs", "a ; b CONTEXT unrestricted",
     Op("seq", (Leaf("a"), Leaf("b")))),
    ("((last_dup(A); all_dup(B))_inf)_unique_pairs", "a ; b CONTEXT recent",
     Op("seq", (Leaf("a"), Leaf("b")))),
    ("((first_dup(A), first_dup(B))_inf)_repeated_pairs", "a AND b CONTEXT chronicle",
     Op("and", (Leaf("a"), Leaf("b")))),
    ("((all_dup(A); all_dup(((all_dup(B), all_dup(A))_inf)_all_pairs))_inf)_all_pairs",
     "a ; (b AND a) CONTEXT unrestricted",
     Op("seq", (Leaf("a"), Op("and", (Leaf("b"), Leaf("a")))))),
    ("(all_dup((all_dup(A) | all_dup(B))_all_pairs) | all_dup(Q))_all_pairs",
     'a OR b OR "x y" CONTEXT unrestricted',
     Op("or", (Op("or", (Leaf("a"), Leaf("b"))), Leaf("x y")))),
])
def test_eva_to_snoop_and_back(eva: str, snoop: str, tree: object) -> None:
    expr, doc = expr_of(eva)
    assert SNOOP.render(expr, doc) == snoop
    assert SnoopLanguage().parse(snoop).expr == tree


@pytest.mark.parametrize(("eva", "message"), [
    ("N", "class N names no event type"),
    ("((all_dup(A); all_dup(B))_5s)_all_pairs", "Snoop cannot state sequence with a frame"),
    ("((first_dup(A); all_dup(B))_inf)_all_pairs",
     "no Snoop context evaluates these EVA parameters"),
    ("((all_dup(((last_dup(A); all_dup(B))_inf)_unique_pairs); "
     "all_dup(((first_dup(A), first_dup(B))_inf)_repeated_pairs))_inf)_all_pairs",
     "one Snoop context applies to the whole expression"),
])
def test_what_snoop_cannot_state(eva: str, message: str) -> None:
    expr, doc = expr_of(eva)
    assert SNOOP.generate(expr, doc, level=Unsupported.IGNORE).unsupported == (message,)
    assert not SNOOP.can_render(expr, doc)


def test_a_snoop_pair_reads_back_as_the_eva_composite() -> None:
    """Recent context ≙ (last, all, unique_pairs) on a flat sequence: each (initiator,
    terminator) pair is EVA's composite, keyed at its terminator, as the reference has it."""
    expr, doc = expr_of("((last_dup(A); all_dup(B))_inf)_unique_pairs")
    trace = [Event("a1", "s", "a", 1, 0), Event("a2", "s", "a", 2, 1),
             Event("b1", "s", "b", 3, 2, {"n": 5}), Event("b2", "s", "b", 4, 3, {"n": 9})]
    remote = Remote(expr, expr, Kind.EQUIVALENT, ("context",), "")
    assert SNOOP.takes_over(remote)
    matchers = {c.name: compile_predicate(c.body, doc.class_map()) for c in doc.classes
                if not isinstance(c.body, ast.Every)}
    ctx = ref.Context(trace, doc, lambda key: True, 0, 5, 1, matchers)
    scope = Scope.of(ctx)
    readings = [SNOOP.parse_notification(Detection(b.time, (trace[1], b)), remote, scope)
                for b in trace[2:]]
    got = [occ for r in readings for _, occ in r.occurrences]
    want = [n.occ for n in evaluate(doc, trace, end=5)]
    assert [(o.key, o.events, o.ident) for o in got] == [(o.key, o.events, o.ident) for o in want]
    assert readings[0].order == (trace[2].key, trace[1].key)
    outside = Detection(3, (Event("z", "other", "a", 2, 9), trace[2]))
    assert SNOOP.parse_notification(outside, remote, scope).occurrences == ()
    positive = Remote(expr, expr, Kind.POSITIVE, ("timed_as_timeless",), "keep")
    reading = SNOOP.parse_notification(Detection(3, (trace[1], trace[2])), positive, scope)
    assert not SNOOP.takes_over(positive) and reading.visible == {"a2", "b1"}
