"""Single-event filter conditions, the atoms of the boolean language (CG-1) and the whole
language of primitive-filter services (CG-0): ``[type = "traffic.jam" & data.area = "A"]``.

Conditions compare one attribute path (``type``, ``source``, ``subject``, ``data.x.y``, …) with a
JSON literal: ``=  !=  <  <=  >  >=  in [...]``, joined by ``&``, ``|``, ``!`` and parentheses.
They compile to the profile language's predicate AST, so comparisons mean exactly what they
mean in an EVA class (a number never equals a string; ordering only within numbers or strings).
A chain ``a & b & c`` (or ``|``) is n-ary: one node of the parse tree however long, built as a
balanced tree of binary ``and``s, so no stage recurses per term.
"""

from __future__ import annotations

import json
from typing import Any

from lark import Token, Transformer

from adapters.backends.native import balanced, number_token, string_token
from eva import ast
from eva.classes import resolve

FILTER_GRAMMAR = r"""
filter: "[" cond "]"
?cond: conj ("|" conj)+ -> c_or
     | conj
?conj: neg ("&" neg)+ -> c_and
     | neg
?neg: "!" neg -> c_not
    | atom
?atom: PATH CMP value -> c_cmp
     | PATH "in" "[" value ("," value)* "]" -> c_in
     | "(" cond ")"
value: ESCAPED_STRING | SIGNED_NUMBER | TRUE | FALSE | NULL
PATH: /[a-z_][a-zA-Z0-9_]*(\.[a-zA-Z0-9_\-]+)*/
CMP: "!=" | "<=" | ">=" | "=" | "<" | ">"
TRUE.2: "true"
FALSE.2: "false"
NULL.2: "null"
%import common.ESCAPED_STRING
%import common.SIGNED_NUMBER
"""

FILTER_TERMINALS = {"PATH": "an attribute path (type, source, data.x …)",
                    "CMP": "a comparison (= != < <= > >=)", "ESCAPED_STRING": "a string",
                    "SIGNED_NUMBER": "a number"}


class FilterBuild(Transformer[Any, Any]):
    """Parse tree of a filter → :mod:`eva.ast` predicate."""

    def filter(self, items: list[Any]) -> ast.Predicate:
        return items[0]

    def value(self, items: list[Any]) -> object:
        token: Token = items[0]
        if token.type == "SIGNED_NUMBER":
            return number_token(token)
        if token.type == "ESCAPED_STRING":
            return string_token(token)
        return {"TRUE": True, "FALSE": False}.get(token.type)  # NULL: None

    def c_or(self, items: list[Any]) -> ast.Predicate:
        return balanced(items, ast.Or)

    def c_and(self, items: list[Any]) -> ast.Predicate:
        return balanced(items, ast.And)

    def c_not(self, items: list[Any]) -> ast.Predicate:
        return ast.Not(items[0])

    def c_cmp(self, items: list[Any]) -> ast.Predicate:
        op = "==" if str(items[1]) == "=" else str(items[1])
        return ast.Compare(str(items[0]), op, items[2])

    def c_in(self, items: list[Any]) -> ast.Predicate:
        return ast.Compare(str(items[0]), "in", tuple(items[1:]))


def _literal(value: object) -> str:
    return json.dumps(value)


def operands(pred: ast.Predicate) -> list[ast.Predicate]:
    """The operands of the ``and`` (or ``or``) chain at ``pred``, left to right, through every
    nested node of the same operator however the chain is bracketed (iterative: it may be
    long). Both operators are associative, so the chain may be written flat."""
    kind = type(pred)
    out: list[ast.Predicate] = []
    stack = [pred]
    while stack:
        node = stack.pop()
        if type(node) is kind and isinstance(node, (ast.And, ast.Or)):
            stack.extend([node.right, node.left])
        else:
            out.append(node)
    return out


def condition_text(pred: ast.Predicate) -> str:
    """An inlined predicate in filter notation, with as few brackets as the grammar allows
    (each bracket is a level of nesting, bounded for a native query): a chain is written flat,
    ``a & b & c``; an ``|`` chain is bracketed within ``&`` (which binds tighter) and a chain
    below ``!``."""
    if isinstance(pred, ast.Compare):
        if pred.op == "in":
            assert isinstance(pred.value, tuple)
            return f"{pred.path} in [{', '.join(_literal(v) for v in pred.value)}]"
        op = "=" if pred.op == "==" else pred.op
        return f"{pred.path} {op} {_literal(pred.value)}"
    if isinstance(pred, ast.Not):
        inner = condition_text(pred.operand)
        return f"!{inner}" if isinstance(pred.operand, (ast.Compare, ast.Not)) else f"!({inner})"
    if isinstance(pred, (ast.And, ast.Or)):
        conjunction = isinstance(pred, ast.And)
        parts = [f"({condition_text(p)})" if conjunction and isinstance(p, ast.Or)
                 else condition_text(p) for p in operands(pred)]
        return (" & " if conjunction else " | ").join(parts)
    raise AssertionError(f"not inlined: {pred!r}")


def filter_text(pred: ast.Predicate, classes: dict[str, ast.ClassDef]) -> str:
    return f"[{condition_text(resolve(pred, classes))}]"


TICK_TYPE = "eva.tick."
"""Ticks of a time class published to a service (transferring rule) have type eva.tick.<Class>."""
