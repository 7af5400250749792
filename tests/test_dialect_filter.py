"""The CG-0/CG-1 dialect, in the manner of sqlglot's validate_all: EVA → filter text, and the
native round trip parse(render(x)) == the expected native AST."""

from __future__ import annotations

import logging

import pytest

from adapters.backends.boolean import And, BooleanLanguage, Filter, Or
from adapters.backends.registry import language
from eva import ast
from eva.parser import parse
from transforms.dialects import dialect
from transforms.dialects.base import Unsupported, UnsupportedError

CLASSES = ('class A = type == "a"\n'
           'class B = type == "b" and data.n > 2\n'
           'class C = type == "c" and (data.n == 1 or data.n == 2)\n'
           'class D = not (data.n == 1 or source == "s")\n'
           'class E = B and not data.x.y != "q" and subject in ["u", 1.5, -2, true, null]\n'
           'class T = every 4us\n')

A, B = ast.Compare("type", "==", "a"), ast.Compare("type", "==", "b")


def doc(expr: str = "A") -> ast.Document:
    return parse(CLASSES + f"profile P = {expr}\n")


@pytest.mark.parametrize(("name", "text"), [
    ("A", '[type = "a"]'),
    ("B", '[type = "b" & data.n > 2]'),
    ("C", '[type = "c" & (data.n = 1 | data.n = 2)]'),
    ("D", '[!(data.n = 1 | source = "s")]'),
    ("E", '[type = "b" & data.n > 2 & !data.x.y != "q" & subject in ["u", 1.5, -2, true, null]]'),
    ("T", '[type = "eva.tick.T"]'),
])
def test_a_class_renders_as_one_filter(name: str, text: str) -> None:
    d = doc()
    for group in ("cg0", "cg1"):
        assert dialect(group).render(ast.Prim(name), d) == text
        assert language(group).parse(text).text == text


@pytest.mark.parametrize(("expr", "text", "node"), [
    ("(all_dup(A) | all_dup((all_dup(A) | all_dup(B))_all_pairs))_all_pairs",
     '[type = "a"]', None),
    ("((all_dup(A), all_dup(B))_inf)_all_pairs", 'AND([type = "a"], [type = "b" & data.n > 2])',
     And(Filter(A), Filter(ast.And(B, ast.Compare("data.n", ">", 2))))),
    ("(all_dup(A) | all_dup(T))_all_pairs", 'OR([type = "a"], [type = "eva.tick.T"])',
     Or(Filter(A), Filter(ast.Compare("type", "==", "eva.tick.T")))),
])
def test_boolean_queries_and_their_round_trip(expr: str, text: str, node: object) -> None:
    d = doc(expr)
    rendered = dialect("cg1").render(d.profiles[0].expr, d)
    if node is None:  # a chain of disjunctions is one n-ary OR
        assert rendered == 'OR([type = "a"], [type = "a"], [type = "b" & data.n > 2])'
        return
    assert rendered == text
    assert BooleanLanguage().parse(rendered).node == node


def test_what_a_group_cannot_state_is_a_level_not_an_exception(
        caplog: pytest.LogCaptureFixture) -> None:
    d = doc("((all_dup(A), all_dup(B))_5s)_all_pairs")
    timed = d.profiles[0].expr
    assert not dialect("cg1").can_render(timed, d) and not dialect("cg0").can_render(timed, d)
    assert dialect("cg0").can_render(ast.Prim("A"), d)
    ignored = dialect("cg1").generate(timed, d, level=Unsupported.IGNORE)
    assert ignored.text == "" and ignored.unsupported == (
        "CG-1 cannot state conjunction with a time frame or parameters",)
    with caplog.at_level(logging.WARNING, "evamed.dialects"):
        dialect("cg0").generate(timed, d, level=Unsupported.WARN)
    assert "CG-0 states primitive filters only" in caplog.text
    with pytest.raises(UnsupportedError, match="CG-0 states primitive filters only"):
        dialect("cg0").render(timed, d)
