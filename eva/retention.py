"""Retention analysis (temporal relevance, research/bry_eckert.md §2.6), done at compile time.

For each operator node: how long a stored occurrence can still contribute to a result, and
whether the node's state is bounded at all. The engine's garbage collection implements these
horizons; ``evamed check`` reports them.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from eva import ast


@dataclass(frozen=True)
class Retention:
    horizon: int | None
    """Longest time (µs) any occurrence is kept after it happened; None = unbounded."""
    reason: str
    """Why, for the unbounded case (what to change to bound it)."""


def longest(horizons: Iterable[int | None]) -> int | None:
    """The longest of some horizons (0 if none); None, unbounded, if one of them is."""
    out = 0
    for h in horizons:
        if h is None:
            return None
        out = max(out, h)
    return out


def _single(dup: ast.Dup) -> bool:
    return dup.kind in ("first", "last", "nth")


def node_retention(expr: ast.Expr) -> Retention:
    """Retention of the state the node itself keeps (its children are analysed separately)."""
    if isinstance(expr, (ast.Prim, ast.External)):
        return Retention(0, "")  # a leaf keeps nothing
    if isinstance(expr, ast.Selection):
        return Retention(0, "")  # a counter
    if isinstance(expr, ast.Negation):
        return Retention(0, "")  # the latest negated time
    if isinstance(expr, ast.Disjunction):
        return Retention(0, "")
    if expr.span is not None:
        return Retention(expr.span, "")
    if expr.pairs is ast.Pairs.UNIQUE and _single(expr.left.dup) and (
            isinstance(expr, ast.Sequence) or _single(expr.right.dup)):
        # Two lists at most, one element each.
        return Retention(0, "")
    return Retention(None, f"{_name(expr)} with an inf span and "
                           f"{expr.pairs}/{expr.left.dup}: set a finite span")


def _name(expr: ast.Expr) -> str:
    return type(expr).__name__.lower()


def retention(expr: ast.Expr) -> Retention:
    """The profile's retention: the largest node horizon, or unbounded if any node is.

    An anchored negation keeps negated times for its span as well.
    """
    worst = 0
    for node in ast.walk(expr):
        r = node_retention(node)
        if r.horizon is None:
            return r
        worst = max(worst, r.horizon)
        if isinstance(node, ast.Sequence) and isinstance(node.right.expr, ast.Negation):
            worst = max(worst, node.right.expr.span)
    return Retention(worst, "")


def reach(expr: ast.Expr) -> int | None:
    """How far (µs) before the instant a composite of ``expr`` is reported (in continuous
    evaluation) its earliest constituent can lie; None when nothing bounds it.

    Not :func:`retention`, which bounds how long a *node* keeps an occurrence: a unique_pairs
    node with single selections keeps one element, but that element may be arbitrarily old.
    Along any path of the tree each conjunction or sequence adds its span (a stored operand
    lies within it of the newest one) and a negation its span (an anchored one reports at
    t(a) + T), so their sum bounds every path. Unbounded: an inf span and repeated_pairs (a
    stored, older composite can be reported later)."""
    total = 0
    for node in ast.walk(expr):
        if isinstance(node, ast.Negation):
            total += node.span
        elif isinstance(node, (ast.Conjunction, ast.Sequence)):
            if node.span is None or node.pairs is ast.Pairs.REPEATED:
                return None
            total += node.span
    return total


def fans_out(expr: ast.Expr) -> bool:
    """Whether the operator pairs a new occurrence of an operand with a number of stored ones
    that nothing bounds: no span, and every list paired (all_pairs) or every element of a list
    (all_dup) — repeated_pairs consumes what it pairs."""
    return (isinstance(expr, (ast.Conjunction, ast.Sequence)) and expr.span is None
            and expr.pairs is not ast.Pairs.REPEATED
            and (expr.pairs is ast.Pairs.ALL
                 or ast.DupKind.ALL in (expr.left.dup.kind, expr.right.dup.kind)))


def growth(expr: ast.Expr) -> int:
    """How many operators that fan out (:func:`fans_out`) lie nested along one path of the
    tree: each multiplies the composites one event makes by the occurrences it has stored, so
    with two or more those grow exponentially in the nesting (after k events, about k^n per
    event) — what the engine's composite limit cuts (docs/semantics.md, "The limit on
    composites"). A negation, or a selection of unique_pairs (one occurrence in all), reports
    at most one occurrence per step whatever it is given: nesting restarts below it."""
    return _growth(expr)[1]


def _growth(expr: ast.Expr) -> tuple[int, int]:
    """(fanning operators along the path that ends at ``expr``'s output, most anywhere)."""
    if isinstance(expr, (ast.Prim, ast.External)):
        return 0, 0
    if isinstance(expr, (ast.Negation, ast.Selection)):
        chain, most = _growth(expr.expr)
        barrier = isinstance(expr, ast.Negation) or expr.pairs is ast.Pairs.UNIQUE
        return (0 if barrier else chain), most
    assert isinstance(expr, ast.Binary)
    left, right = _growth(expr.left.expr), _growth(expr.right.expr)
    chain = max(left[0], right[0]) + (1 if fans_out(expr) else 0)
    return chain, max(left[1], right[1], chain)
