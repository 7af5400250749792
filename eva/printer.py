"""Canonical printer: ``parse(to_text(doc)) == doc`` for every document (property-tested)."""

from __future__ import annotations

import json
import math
import re

from eva import ast
from eva.units import format_span

# Binding strength of predicate operators, loosest first, to print only necessary parentheses.
_OR, _AND, _NOT, _ATOM = 0, 1, 2, 3


_SURROGATE = re.compile("[\ud800-\udfff]")


def _value(value: object) -> str:
    """A value as the parser reads it back; one the language cannot express is a ValueError
    (the parser refuses the same values, so parse(to_text(doc)) == doc for what it accepts)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        if _SURROGATE.search(value):
            raise ValueError(f"{value!r} holds a lone surrogate, which UTF-8 cannot encode")
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"{value!r} is not a finite number")
        return repr(value)
    if isinstance(value, int) and not -ast.MAX_INT - 1 <= value <= ast.MAX_INT:
        raise ValueError(f"{value} is outside the 64-bit integers of the language")
    return str(value)


def predicate_text(pred: ast.Predicate, context: int = _OR) -> str:
    if isinstance(pred, ast.Compare):
        if pred.op == "in":
            assert isinstance(pred.value, tuple)
            text = f"{pred.path} in [{', '.join(_value(v) for v in pred.value)}]"
        else:
            text = f"{pred.path} {pred.op} {_value(pred.value)}"
        return text
    if isinstance(pred, ast.ClassRef):
        return pred.name
    if isinstance(pred, ast.Not):
        return f"not {predicate_text(pred.operand, _NOT)}"
    if isinstance(pred, ast.And):
        # and/or parse left-associatively, so a right operand of the same kind needs parentheses.
        text = f"{predicate_text(pred.left, _AND)} and {predicate_text(pred.right, _NOT)}"
        return f"({text})" if context > _AND else text
    text = f"{predicate_text(pred.left, _OR)} or {predicate_text(pred.right, _AND)}"
    return f"({text})" if context > _OR else text


def class_text(cls: ast.ClassDef) -> str:
    if isinstance(cls.body, ast.Every):
        anchor = f" from {json.dumps(cls.body.anchor)}" if cls.body.anchor is not None else ""
        return f"class {cls.name} = every {format_span(cls.body.period)}{anchor}"
    return f"class {cls.name} = {predicate_text(cls.body)}"


def _operand(op: ast.Operand) -> str:
    return f"{op.dup}({expr_text(op.expr)})"


def expr_text(expr: ast.Expr) -> str:
    """The A-mediAS form of EVA Fig. 10."""
    if isinstance(expr, ast.Prim):
        return expr.name
    if isinstance(expr, ast.External):
        return f"<{expr.name}>"
    if isinstance(expr, ast.Disjunction):
        return f"({_operand(expr.left)} | {_operand(expr.right)})_{expr.pairs}"
    if isinstance(expr, ast.Conjunction):
        return (f"(({_operand(expr.left)}, {_operand(expr.right)})_{format_span(expr.span)})"
                f"_{expr.pairs}")
    if isinstance(expr, ast.Sequence):
        return (f"(({_operand(expr.left)}; {_operand(expr.right)})_{format_span(expr.span)})"
                f"_{expr.pairs}")
    if isinstance(expr, ast.Negation):
        return f"((not {expr_text(expr.expr)})_{format_span(expr.span)})_{expr.pairs}"
    return f"({expr_text(expr.expr)}[{expr.index}])_{expr.pairs}"


def profile_text(profile: ast.Profile) -> str:
    head = f"profile {profile.name}"
    if profile.per is not None:
        head += f" per {profile.per}"
    if profile.evaluation is not ast.Evaluation.CONTINUOUS:
        head += f" evaluate {profile.evaluation}"
    return f"{head} = {expr_text(profile.expr)}"


def to_text(doc: ast.Document) -> str:
    lines = [class_text(c) for c in doc.classes] + [profile_text(p) for p in doc.profiles]
    return "\n".join(lines) + ("\n" if lines else "")
