"""Compile once: a profile becomes an immutable tree of node specs, at registration.

The Flink CEP split (STYLE.md, "Compile once; state is data"): :func:`compile_profile` runs once
per registered profile; each ``per`` partition then costs ``spec.new_state(budget, first)`` —
plain records (:mod:`eva.state`), nothing compiled. Leaves refer to class predicates by their id
in the engine's shared :class:`~eva.classes.ClassIndex`, to time classes by (document, name),
to external operands by :func:`external_id`.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any

from eva import ast
from eva import nodes as nd
from eva.classes import ClassIndex
from eva.printer import expr_text
from eva.state import Budget


def external_id(leaf: str) -> Hashable:
    """How a step names the external operand it delivers to (as a tick names its class)."""
    return ("external", leaf)


@dataclass(frozen=True, slots=True)
class ProfileSpec:
    """A compiled profile: its root node spec and what the engine dispatches on."""

    root: nd.Node
    preds: frozenset[int]
    """Ids of the class predicates its leaves test (in the engine's class index)."""
    ticks: frozenset[str]
    """Names of the time classes it uses."""
    externals: frozenset[str]
    """Names of its external operands."""
    timed: bool
    """Clock-driven: a negation, or evaluated at the end of the interval."""

    def new_state(self, budget: Budget, first: int) -> Any:
        """Fresh state for one partition created at time ``first``."""
        return self.root.new_state(budget, first)


def compile_profile(profile: ast.Profile, classes: dict[str, ast.ClassDef],
                    index: ClassIndex | None = None, *, doc_id: int = 0, tick: int = 1_000_000,
                    gc: bool = True, limit: int | None = None) -> ProfileSpec:
    """The node specs of ``profile`` (its classes in ``classes``, e.g. ``doc.class_map()``),
    its predicates added to ``index`` (the engine's shared one; a new one if not given);
    ``doc_id`` tells its time classes from another document's, ``tick`` is the default clock's
    granularity (µs), ``gc`` whether stored occurrences past their horizon go, ``limit`` how
    many composites each operator reports per step at most (None: no limit)."""
    if index is None:
        index = ClassIndex()
    preds: set[int] = set()
    ticks: set[str] = set()
    externals: set[str] = set()
    most = nd.NO_LIMIT if limit is None else limit

    def make(expr: ast.Expr, eoi: bool) -> nd.Node:
        if isinstance(expr, ast.Prim):
            body = classes[expr.name].body
            if isinstance(body, ast.Every):
                ticks.add(expr.name)
                return nd.TimeLeaf((doc_id, expr.name))
            pred = index.add(body, classes)
            preds.add(pred)
            return nd.AttributeLeaf(pred)
        if isinstance(expr, ast.External):
            externals.add(expr.name)
            return nd.TimeLeaf(external_id(expr.name))  # delivered as a tick names its class
        tag = expr_text(expr)
        if isinstance(expr, ast.Selection):
            return nd.SelectionNode(make(expr.expr, False), expr)
        if isinstance(expr, ast.Negation):
            return nd.NegationNode(make(expr.expr, False), expr, tag, tick)
        left = make(expr.left.expr, False)
        if isinstance(expr, ast.Sequence) and isinstance(expr.right.expr, ast.Negation):
            neg = expr.right.expr
            right: nd.Node = nd.AnchoredNegationNode(make(neg.expr, False), neg,
                                                     expr_text(neg), gc)
        else:
            right = make(expr.right.expr, False)
        if expr.pairs is ast.Pairs.REPEATED and not isinstance(expr, ast.Disjunction):
            return nd.RepeatedNode(left, right, expr, tag, gc, most)
        return nd.BinaryNode(left, right, expr, tag, gc, eoi, most)

    eoi = profile.evaluation is ast.Evaluation.END_OF_INTERVAL
    root = make(profile.expr, eoi)
    timed = eoi or any(isinstance(n, ast.Negation) for n in ast.walk(profile.expr))
    return ProfileSpec(root, frozenset(preds), frozenset(ticks), frozenset(externals), timed)


__all__ = ["ProfileSpec", "compile_profile", "external_id"]
