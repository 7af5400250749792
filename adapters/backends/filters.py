"""Single-event filter conditions, the atoms of the boolean language (CG-1) and the whole
language of primitive-filter services (CG-0): ``[type = "traffic.jam" & data.area = "A"]``
(the grammar and its reading; the mediator writes them with :mod:`transforms.dialects.filter`).

Conditions compare one attribute path (``type``, ``source``, ``subject``, ``data.x.y``, …) with a
JSON literal: ``=  !=  <  <=  >  >=  in [...]``, joined by ``&``, ``|``, ``!`` and parentheses.
They compile to the profile language's predicate AST, so comparisons mean exactly what they
mean in an EVA class (a number never equals a string; ordering only within numbers or strings).
A chain ``a & b & c`` (or ``|``) is n-ary: one node of the parse tree however long, built as a
balanced tree of binary ``and``s, so no stage recurses per term.
"""

from __future__ import annotations

from typing import Any

from lark import Token, Transformer

from adapters.backends.native import number_token, string_token
from eva import ast
from transforms.dialects.base import balanced

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
