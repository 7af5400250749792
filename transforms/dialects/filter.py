"""CG-0 and CG-1: boolean filters — ``[type = "traffic.jam" & data.area = "A"]`` for a primitive
class (CG-0 states nothing else), and ``AND(…)``/``OR(…)`` over them, untimed (CG-1).

A class is inlined (its references resolved) and written in filter notation with as few
brackets as the grammar allows (each bracket is a level of nesting, bounded for a native
query): a chain is written flat, ``a & b & c``; an ``|`` chain is bracketed within ``&`` (which
binds tighter) and a chain below ``!``. A chain of EVA disjunctions (or untimed conjunctions),
however nested, is one n-ary ``OR(…)`` (``AND(…)``): the same detections, one bracket deep.
"""

from __future__ import annotations

import json

from eva import ast
from eva.classes import resolve
from transforms.capability import CG0, CG1
from transforms.dialects.base import (
    TICK_TYPE,
    Dialect,
    PredicateRule,
    Rendering,
    operands,
    operator_chain,
    verbatim,
)

# ------------------------------------------------------------------ predicates


def _compare(r: Rendering, pred: ast.Compare) -> str:
    op = "=" if pred.op == "==" else pred.op
    return f"{pred.path} {op} {json.dumps(pred.value)}"


def _in(r: Rendering, pred: ast.Compare) -> str:
    assert isinstance(pred.value, tuple)
    return f"{pred.path} in [{', '.join(json.dumps(v) for v in pred.value)}]"


def _not(r: Rendering, pred: ast.Not) -> str:
    inner = r.predicate(pred.operand)
    return f"!{inner}" if isinstance(pred.operand, (ast.Compare, ast.Not)) else f"!({inner})"


def _and(r: Rendering, pred: ast.And) -> str:
    return " & ".join(f"({r.predicate(p)})" if isinstance(p, ast.Or) else r.predicate(p)
                      for p in operands(pred))


def _or(r: Rendering, pred: ast.Or) -> str:
    return " | ".join(r.predicate(p) for p in operands(pred))


PREDICATES: dict[str, PredicateRule] = {
    **dict.fromkeys(("==", "!=", "<", "<=", ">", ">="), _compare),
    "in": _in, "not": _not, "and": _and, "or": _or}


# ------------------------------------------------------------------ expressions


def _filter(r: Rendering, expr: ast.Prim) -> str:
    body = r.classes[expr.name].body
    if isinstance(body, ast.Every):
        return f'[type = "{TICK_TYPE}{expr.name}"]'
    return f"[{r.predicate(resolve(body, r.classes))}]"


def _untimed(node: ast.Expr) -> bool:
    return isinstance(node, ast.Conjunction) and node.span is None


def _or_query(r: Rendering, expr: ast.Disjunction) -> str:
    chain = operator_chain(expr, lambda node: isinstance(node, ast.Disjunction))
    return f"OR({', '.join(r.expr(e) for e in chain)})"


def _and_query(r: Rendering, expr: ast.Conjunction) -> str:
    if expr.span is not None:
        return r.cannot(expr)
    return f"AND({', '.join(r.expr(e) for e in operator_chain(expr, _untimed))})"


FILTER = Dialect("cg0", "filter", CG0, {ast.Prim: _filter}, PREDICATES, verbatim,
                 cannot="CG-0 states primitive filters only")
BOOLEAN = Dialect("cg1", "boolean", CG1,
                  {ast.Prim: _filter, ast.Disjunction: _or_query, ast.Conjunction: _and_query},
                  PREDICATES, verbatim,
                  cannot="CG-1 cannot state {node} with a time frame or parameters")
