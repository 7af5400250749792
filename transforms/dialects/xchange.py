"""CG-4: XChange — ``and{traffic.jam{{area{"A"}}}, truck.location{{area{"A"}}}} within 5min``.

A class is written as event terms: its type(s) as labels and its top-level data equalities as
nested partial terms; other tests are widened away (the mediator re-applies the class to what
comes back). A chain of EVA operators is one n-ary XChange query where XChange's reads the same
(see :func:`_chain`): one bracket deep instead of one per operator. Every composite query needs
a temporal restriction (``within``).
"""

from __future__ import annotations

import json
import re

from eva import ast
from eva.classes import required_types, resolve, type_only
from eva.units import format_span
from transforms.capability import CG4
from transforms.dialects.base import (
    TICK_TYPE,
    Dialect,
    PredicateRule,
    Rendering,
    operands,
    operator_chain,
    verbatim,
)

KEYWORDS = ("and", "andthen", "or", "without", "within", "during", "var", "true", "false")
LABEL_PATTERN = r"(?!(" + "|".join(KEYWORDS) + r")\b)[A-Za-z_][A-Za-z0-9_.\-]*"
"""A label XChange reads bare (the grammar's LABEL); any other is written as a JSON string."""
_BARE = re.compile(LABEL_PATTERN + r"\Z")

Equalities = list[tuple[str, object]]


def _label(text: str) -> str:
    return text if _BARE.match(text) else json.dumps(text)


# ------------------------------------------------------------------ predicates: equalities


def _equality(r: Rendering, pred: ast.Compare) -> Equalities:
    if (pred.path == "type" or pred.path.startswith("data.")) and not isinstance(
            pred.value, (dict, list)) and pred.value is not None:
        return [(pred.path, pred.value)]
    return _widened(r, pred)


def _conjuncts(r: Rendering, pred: ast.And) -> Equalities:
    return [eq for p in operands(pred) for eq in r.predicate(p)]


def _widened(r: Rendering, pred: ast.Predicate) -> Equalities:
    if type_only(pred, {}) is None:  # a test of the type alone is stated by the labels
        r.widen(pred)
    return []


PREDICATES: dict[str, PredicateRule] = {
    **dict.fromkeys(("!=", "<", "<=", ">", ">=", "in", "not", "or"), _widened),
    "==": _equality, "and": _conjuncts}
"""The predicate's top-level conjuncts that are equalities; every other test is widened away."""


# ------------------------------------------------------------------ expressions


def _data_term(fields: list[tuple[list[str], object]]) -> list[str]:
    """Nested partial terms for data-field equalities, grouped by their first key."""
    groups: dict[str, list[tuple[list[str], object]]] = {}
    for path, value in fields:
        groups.setdefault(path[0], []).append((path[1:], value))
    out = []
    for key, rest in groups.items():
        leaves = [json.dumps(v) for p, v in rest if not p]
        nested = _data_term([(p, v) for p, v in rest if p])
        if len(leaves) == 1 and not nested:
            out.append(f"{_label(key)}{{{leaves[0]}}}")  # total: the field is that value
        else:
            out.append(f"{_label(key)}{{{{{', '.join(leaves + nested)}}}}}")
    return out


def _term(r: Rendering, expr: ast.Prim) -> str:
    """A class as event terms: its type(s) and data equalities."""
    body = r.classes[expr.name].body
    if isinstance(body, ast.Every):
        return _label(TICK_TYPE + expr.name)
    pred = resolve(body, r.classes)
    r.leaf(expr.name)
    types = required_types(pred, r.classes)
    equalities: Equalities = r.predicate(pred)
    fields = [(p[len("data."):].split("."), v) for p, v in equalities if p.startswith("data.")]
    inner = _data_term(fields)
    labels = ["*"] if types is None else [_label(t) for t in sorted(types)]
    terms = [f"{lab}{{{{{', '.join(inner)}}}}}" if inner else lab for lab in labels]
    return terms[0] if len(terms) == 1 else "or{" + ", ".join(terms) + "}"


def _chain(expr: ast.Disjunction | ast.Conjunction | ast.Sequence) -> list[ast.Expr]:
    """The operands, left to right, of the chain at ``expr``, iteratively: through nested
    disjunctions for ``or{…}``; for ``and{…}``/``andthen[…]`` through nested conjunctions
    (sequences) whose span is at least ``expr``'s. All three are associative in XChange
    (``andthen[andthen[a, b], c]``, ``andthen[a, andthen[b, c]]`` and ``andthen[a, b, c]``
    order a before b before c alike), and the outer ``within d`` bounds every part of an
    answer by d, so an inner ``within`` of d or more says nothing more."""
    def same(node: ast.Expr) -> bool:
        if isinstance(expr, ast.Disjunction):
            return isinstance(node, ast.Disjunction)
        return (type(node) is type(expr) and isinstance(node, (ast.Conjunction, ast.Sequence))
                and node.span is not None and expr.span is not None and node.span >= expr.span)

    return operator_chain(expr, same)


def _or(r: Rendering, expr: ast.Disjunction) -> str:
    return f"or{{{', '.join(r.expr(e) for e in _chain(expr))}}}"


def _within(r: Rendering, expr: ast.Conjunction | ast.Sequence) -> str:
    if expr.span is None:
        return r.unsupported("XChange needs a temporal restriction on every composite query")
    inner = ", ".join(r.expr(e) for e in _chain(expr))
    body = f"and{{{inner}}}" if isinstance(expr, ast.Conjunction) else f"andthen[{inner}]"
    return f"{body} within {format_span(expr.span)}"


XCHANGE = Dialect("cg4", "xchange", CG4,
                  {ast.Prim: _term, ast.Disjunction: _or, ast.Conjunction: _within,
                   ast.Sequence: _within},
                  PREDICATES, verbatim, cannot="XChange cannot state EVA's {node}")
