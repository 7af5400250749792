"""Hypothesis strategies: random profiles (every operator and parameter, nested) and traces."""

from __future__ import annotations

from hypothesis import strategies as st

from eva import ast
from eva.events import Event
from eva.parser import parse
from eva.printer import expr_text

CLASSES = (
    'class A = type == "a"\n'
    'class B = type == "b"\n'
    'class C = type == "c"\n'
    'class AB = type in ["a", "b"]\n'
    'class T = every 4us\n'
)
ATTRIBUTE_CLASSES = ["A", "B", "C", "AB"]

dups = st.sampled_from([ast.FIRST, ast.LAST, ast.ALL, ast.nth(2)])
pairs = st.sampled_from(list(ast.Pairs))
spans = st.sampled_from([1, 2, 3, 5, 8, None])
negation_spans = st.sampled_from([1, 2, 3, 5])


def leaves(names: list[str] | None = None) -> st.SearchStrategy[ast.Expr]:
    return st.sampled_from(names or [*ATTRIBUTE_CLASSES, "T"]).map(ast.Prim)


def _extend(children: st.SearchStrategy[ast.Expr],
            negation: bool = True) -> st.SearchStrategy[ast.Expr]:
    operand = st.builds(ast.Operand, dups, children)
    anchored = st.builds(ast.Operand, dups,
                         st.builds(ast.Negation, children, negation_spans, pairs))
    options = [
        st.builds(ast.Disjunction, operand, operand, pairs),
        st.builds(ast.Conjunction, operand, operand, spans, pairs),
        st.builds(ast.Sequence, operand, st.one_of(operand, anchored) if negation else operand,
                  spans, pairs),
        st.builds(ast.Selection, children, st.integers(1, 3), pairs),
    ]
    if negation:
        options.append(st.builds(ast.Negation, children, negation_spans, pairs))
    return st.one_of(*options)


def expressions(max_depth: int = 3, names: list[str] | None = None,
                negation: bool = True) -> st.SearchStrategy[ast.Expr]:
    """Expressions of nesting depth ≤ max_depth over the classes of CLASSES (or ``names``)."""
    strategy: st.SearchStrategy[ast.Expr] = leaves(names)
    for _ in range(max_depth):
        strategy = st.one_of(leaves(names), _extend(strategy, negation))
    return strategy


@st.composite
def documents(draw: st.DrawFn, max_depth: int = 3, classes: str = CLASSES,
              names: list[str] | None = None) -> ast.Document:
    """One profile ``P`` over ``classes`` (the expression over ``names`` of them, if given)."""
    expr = draw(expressions(max_depth, names))
    per = " per data.k" if draw(st.booleans()) and draw(st.booleans()) else ""
    evaluation = " evaluate end_of_interval" if draw(st.integers(0, 3)) == 0 else ""
    return parse(classes + f"profile P{per}{evaluation} = {expr_text(expr)}\n")


@st.composite
def traces(draw: st.DrawFn, max_size: int = 24, types: str = "abc",
           sources: tuple[str, ...] = ("s",)) -> list[Event]:
    """Traces with many equal timestamps and short gaps, so time frames both hold and fail
    (of several sources merged, if given)."""
    size = draw(st.integers(0, max_size))
    t = 10
    out = []
    for i in range(size):
        t += draw(st.sampled_from([0, 0, 1, 1, 2, 3, 6]))
        kind = draw(st.sampled_from(types))
        source = draw(st.sampled_from(sources)) if len(sources) > 1 else sources[0]
        out.append(Event(f"{kind}{i}", source, kind, t, i,
                         {"k": draw(st.sampled_from([1, 2]))}))
    return out


def trace_of(text: str, source: str = "s") -> list[Event]:
    """``"a1@1 b1@3"`` → events whose type is the id's first letter, time in µs."""
    out = []
    for seq, token in enumerate(text.split()):
        ident, _, time = token.partition("@")
        out.append(Event(ident, source, ident[0], int(time), seq))
    return out
