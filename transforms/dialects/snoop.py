"""CG-2: Snoop — ``traffic.jam AND truck.location CONTEXT unrestricted``.

Snoop knows events only by type (capability ``predicates="type"``): a class is written as the
types it requires (``eva.classes.required_types``, the projection the planner checks too); the
mediator applies any other test itself. Snoop has no time frames, and one parameter context
applies to the whole query: set semantics is ``unrestricted``, another context is used only
where the verified mapping of research/snoop.md §5.3 holds (a flat operator over distinct
types). Operators read left-associatively at one precedence: a left operand needs no brackets.

A notification of a context other than set semantics is an (initiator, terminator) pair: it
reads back as the EVA composite of its two constituents.
"""

from __future__ import annotations

import re

from eva import ast
from eva import semantics as sem
from eva.classes import label, required_types, resolve
from eva.events import Event
from eva.printer import expr_text
from eva.semantics import occurrence as primitive
from transforms.capability import CG2, SET_SEMANTICS, SNOOP_SETTINGS, setting_of
from transforms.dialects.base import (
    TICK_TYPE,
    Detection,
    Dialect,
    ExprRule,
    Reading,
    Rendering,
    Scope,
    balanced,
    beyond_type,
    operator_chain,
)
from transforms.planner import has_context
from transforms.plans import Kind, Remote

TYPE_PATTERN = r"(?!(AND|OR|NOT|CONTEXT)\b)[A-Za-z_][A-Za-z0-9_.:\-]*"
"""An event type Snoop reads bare (the grammar's TYPE); any other is written "quoted"."""
_BARE = re.compile(TYPE_PATTERN + r"\Z")

SETTING_CONTEXT: dict[tuple[str, str, str, str], str] = {
    setting: context for context, settings in SNOOP_SETTINGS.items() for setting in settings}

Text = tuple[str, bool]
"""A rendered operand: its text, and whether it is an operator that needs brackets as an
operand (a type, or a bracketed OR of types, does not)."""


def _name(type_: str) -> str:
    if _BARE.match(type_):
        return type_
    return '"' + type_.replace('"', '\\"') + '"'


def _or(left: Text, right: Text) -> Text:
    """``left OR right`` (texts, and whether each is such an OR): the right one bracketed."""
    return (f"{left[0]} OR ({right[0]})" if right[1] else f"{left[0]} OR {right[0]}"), True


def _operand(r: Rendering, expr: ast.Expr, top: bool = False) -> str:
    text, operator = r.expr(expr)
    return f"({text})" if operator and not top else text


def _types(r: Rendering, expr: ast.Prim) -> Text:
    body = r.classes[expr.name].body
    types = (frozenset([TICK_TYPE + expr.name]) if isinstance(body, ast.Every)
             else required_types(body, r.classes))
    if not types:
        return r.unsupported(f"class {expr.name} names no event type")
    if not isinstance(body, ast.Every):
        r.leaf(expr.name)
        for test in beyond_type(resolve(body, r.classes)):
            r.widen(test)
    text, several = balanced([(_name(t), False) for t in sorted(types)], _or)
    return (f"({text})" if several else text), False


def _disjunction(r: Rendering, expr: ast.Disjunction) -> Text:
    # OR — a union in every context — is associative: a chain of them, however it nests, is
    # written as a balanced tree, log2(n) levels of Snoop's binary OR (each a level of the
    # query's bounded depth) where the chain would be n − 1.
    chain = operator_chain(expr, lambda node: isinstance(node, ast.Disjunction))
    return balanced([(_operand(r, e), False) for e in chain], _or)[0], True


def _binary(op: str) -> ExprRule:
    def rule(r: Rendering, expr: ast.Conjunction | ast.Sequence) -> Text:
        if expr.span is not None:
            return r.cannot(expr)
        return f"{_operand(r, expr.left.expr, top=True)} {op} {_operand(r, expr.right.expr)}", True

    return rule


def _statement(r: Rendering, expr: ast.Expr, value: Text) -> str:
    """The query with the one context its parameters run in (set semantics → unrestricted)."""
    contexts = set()
    for node in ast.walk(expr):
        if isinstance(node, (ast.Conjunction, ast.Sequence)):
            setting = setting_of(node)
            if setting not in SET_SEMANTICS:
                contexts.add(SETTING_CONTEXT.get(setting, "?"))
    if "?" in contexts:
        r.unsupported("no Snoop context evaluates these EVA parameters")
        return ""
    if len(contexts) > 1:
        r.unsupported("one Snoop context applies to the whole expression")
        return ""
    return f"{value[0]} CONTEXT {contexts.pop() if contexts else 'unrestricted'}"


# ------------------------------------------------------------------ notifications


def _exact(node: Remote) -> bool:
    """A context other than set semantics answers with the pairs EVA's parameters make."""
    return node.kind is not Kind.POSITIVE and has_context(node.target)


def _pair(detection: Detection, node: Remote, scope: Scope) -> Reading:
    """A Snoop pair (initiator, terminator) as the EVA composite of a flat operator: one
    occurrence keyed as EVA reports it (a sequence at its terminator, a conjunction at the
    later operand), ordered by (key, initiator key); none when a constituent lies outside the
    partition. ValueError if the detection is not a pair."""
    target = node.target
    assert isinstance(target, (ast.Conjunction, ast.Sequence))
    assert isinstance(target.left.expr, ast.Prim) and isinstance(target.right.expr, ast.Prim)
    if len(detection.constituents) != 2:
        raise ValueError(f"a flat Snoop detection has two constituents, got {detection.text}")
    first, second = (_occurrence(e, scope) for e in detection.constituents)
    if first is None or second is None:
        return Reading()  # a constituent outside this partition
    if isinstance(target, ast.Conjunction) and not _is(detection.constituents[0],
                                                       target.left.expr.name, scope):
        first, second = second, first  # Snoop orders AND by time, EVA by operand
    key = second.key if isinstance(target, ast.Sequence) else max(first.key, second.key)
    return Reading(occurrences=((key, sem.composite(expr_text(target), first, second, key)),),
                   order=(key, first.key))


def _is(event: Event, name: str, scope: Scope) -> bool:
    if event.type.startswith(TICK_TYPE):
        return event.type == TICK_TYPE + name
    return name in scope.matchers and scope.matchers[name](event)


def _occurrence(event: Event, scope: Scope) -> sem.Occ | None:
    if event.type.startswith(TICK_TYPE):
        name = event.type[len(TICK_TYPE):]
        index = [c.name for c in scope.doc.classes].index(name)
        return sem.time_event(name, index, event.time, label(event.time))
    own = scope.events.get((event.source, event.id))
    return None if own is None else primitive(own)


SNOOP = Dialect("cg2", "snoop", CG2,
                {ast.Prim: _types, ast.Disjunction: _disjunction,
                 ast.Conjunction: _binary("AND"), ast.Sequence: _binary(";")},
                {}, _statement, cannot="Snoop cannot state {node} with a frame",
                placeholder=("", False), reader=_pair, exact=_exact)
