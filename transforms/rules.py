"""The rule catalogue: one small function per transformation rule (research/transforms.md §6–7).

A rule sees a node whose operands a service can already evaluate and returns a ``Rewrite``: the
expression the service evaluates instead, the rule's kind and the post-filter that restores the
EVA answer. Negative rules do not exist here. ``planner`` tries the rules in catalogue order.

Positive rules always run the service at set semantics — all duplicates, all pairs — because a
relaxed operator on a consuming service loses answers (pitfall 1). Their post-filter re-runs the
original operator on the *visible sub-trace*, the events the service's notifications contain:
every event between two candidate constituents is itself a constituent of some candidate
(the window-closure lemma, transforms.md §7.3) — but not every event that decides a
selection or a list's end: :func:`hidden_operands` says where the lemma fails (same-instant
events in a sequence, ``last`` at the end of the interval), and those nodes are composed at
the mediator over their whole operands. `first` and `<i>` on the anterior operand would need
a witness subscription, so those nodes are decomposed instead. A conjunction is relaxed only
with all pairs: its unique pairs depend on the parity of every earlier list
(tests/test_transforms.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from eva import ast
from eva.printer import expr_text
from transforms.capability import (
    CONJUNCTION,
    NEGATION,
    OPERATOR,
    SELECTION,
    SEQUENCE,
    Capability,
    setting_of,
)
from transforms.plans import Kind


@dataclass(frozen=True)
class Rewrite:
    target: ast.Expr
    kind: Kind
    rule: str
    post_filter: str = ""


Rule = Callable[[ast.Expr, Capability], Rewrite | None]


def _primitive_operands(node: ast.Binary) -> bool:
    return isinstance(node.left.expr, ast.Prim) and isinstance(node.right.expr, ast.Prim)


def _frame_fits(node: ast.Conjunction | ast.Sequence, cap: Capability) -> bool:
    """The service can state this node's time frame exactly."""
    if node.span is None:
        return cap.timeless
    if not cap.timed:
        return False
    # A whole-span window equals EVA's point frame only when the operands are primitive
    # (bry_eckert.md TV-14): on composites it is stricter, which would lose answers.
    return cap.window == "point" or _primitive_operands(node)


def _set_semantics(node: ast.Binary, expr_type: type, span: int | None) -> ast.Expr:
    left = ast.Operand(ast.ALL, node.left.expr)
    right = ast.Operand(ast.ALL, node.right.expr)
    if expr_type is ast.Disjunction:
        return ast.Disjunction(left, right, ast.Pairs.ALL)
    if expr_type is ast.Conjunction:
        return ast.Conjunction(left, right, span, ast.Pairs.ALL)
    return ast.Sequence(left, right, span, ast.Pairs.ALL)


def hidden_operands(node: ast.Expr, root_eoi: bool = False) -> str:
    """Why re-running ``node`` on its visible sub-trace (the events the service's answers at
    all/all/all_pairs contain) would not give its answer: "" when it would. An event in no
    candidate is hidden, yet it can still decide which element of a list is selected or where
    a list ends (found by the random search, tests/test_runner.py):

    * a sequence's lists: an A at the instant of the B after it pairs with nothing (strictly
      before is required) but is still the last A (``last_dup(A)`` on ``a0@10 a1@11 b2@11``
      re-run on ``a0 b2`` takes a0); a B at an A's instant splits the A's into two lists
      (``unique_pairs``, ``last``); so only all/all/all_pairs, which pairs each A with each B
      on its own, is re-run;
    * a conjunction's ``last`` at the end of the interval: a later A beyond every B's frame
      overwrites the last A of the list, which the re-run never sees (continuously, the
      provisional result stays reported, so only the end-of-interval root is affected).

    The node is then composed at the mediator over its operands subscribed whole, which makes
    every hidden event visible (docs/transformations.md, rule catalogue)."""
    if not isinstance(node, (ast.Conjunction, ast.Sequence)):
        return ""
    a, b = expr_text(node.left.expr), expr_text(node.right.expr)
    if isinstance(node, ast.Sequence) and setting_of(node) != ("sequence", "all", "all",
                                                                  "all_pairs"):
        return (f"re-running {node.left.dup}/{node.right.dup}/{node.pairs} on the events of the "
                f"service's answers is unsound: an event in no answer (one of {a} at the "
                f"instant of one of {b} after it, one of {b} that splits those of {a} into "
                "lists) still decides the selection or the pairs, so the operands are "
                "subscribed whole and the sequence is composed at the mediator")
    if (isinstance(node, ast.Conjunction) and root_eoi
            and "last" in (node.left.dup.kind, node.right.dup.kind)):
        return ("at the end of the interval a last_dup result is overwritten by a later "
                f"duplicate ({a} or {b}) that pairs with nothing, which the service's answers "
                "never show: the operands are subscribed whole and the conjunction is composed "
                "at the mediator")
    return ""


def _reevaluable(node: ast.Binary) -> bool:
    """Whether re-running the node on the visible sub-trace restores its answer exactly."""
    if not _primitive_operands(node) or hidden_operands(node):
        return False
    exact_sides = ("last", "all")
    if isinstance(node, ast.Conjunction):
        # Unique pairs combine blocks of lists (1,2), (3,4), …: an invisible earlier list
        # shifts the blocks (b0 c1 b2 with T = 1: only (c1, b2) is a candidate, b0 is unseen,
        # and the re-run pairs them). Only all pairs is free of that structure.
        return (node.pairs is ast.Pairs.ALL and node.left.dup.kind in exact_sides
                and node.right.dup.kind in exact_sides)
    return True  # a disjunction at all|all returns every event of both classes


# ------------------------------------------------------------------ equivalent rules


def native_operator(node: ast.Expr, cap: Capability) -> Rewrite | None:
    """The service evaluates the operator with these very parameters and frame. Equivalent."""
    if not isinstance(node, (ast.Disjunction, ast.Conjunction, ast.Sequence)):
        return None
    if not cap.supports(OPERATOR[type(node)]) or not cap.native(setting_of(node)):
        return None
    if isinstance(node, (ast.Conjunction, ast.Sequence)) and not _frame_fits(node, cap):
        return None
    if isinstance(node, ast.Sequence) and not cap.strict_sequence:
        return None  # also matches same-instant pairs: parameters_to_all_pairs keeps t1 < t2
    return Rewrite(node, Kind.EQUIVALENT, "native_operator")


def native_negation(node: ast.Expr, cap: Capability) -> Rewrite | None:
    """Timed negation where the service has absence over a span (CG-4, CG-5). Equivalent; its
    operand must be evaluated exactly (a relaxed operand would fire the negation too rarely)."""
    if isinstance(node, ast.Negation) and cap.supports(NEGATION):
        return Rewrite(node, Kind.EQUIVALENT, "native_negation")
    return None


def native_selection(node: ast.Expr, cap: Capability) -> Rewrite | None:
    """The i-th occurrence where the service has selection (CG-5). Equivalent."""
    if isinstance(node, ast.Selection) and cap.supports(SELECTION):
        return Rewrite(node, Kind.EQUIVALENT, "native_selection")
    return None


# ------------------------------------------------------------------ positive rules


def parameters_to_all_pairs(node: ast.Expr, cap: Capability) -> Rewrite | None:
    """The service has the operator and frame but not the EIS/EIC: ask for all duplicates and
    all pairs (the universal positive target of Table 2), then re-run the EIS/EIC at the
    mediator on the visible sub-trace. Positive."""
    if not isinstance(node, (ast.Disjunction, ast.Conjunction, ast.Sequence)):
        return None
    operator = OPERATOR[type(node)]
    if not cap.supports(operator) or not _reevaluable(node):
        return None
    if isinstance(node, (ast.Conjunction, ast.Sequence)) and not _frame_fits(node, cap):
        return None
    target = _set_semantics(node, type(node), getattr(node, "span", None))
    if not cap.native(setting_of(target)):  # type: ignore[arg-type]
        return None
    return Rewrite(target, Kind.POSITIVE, "parameters_to_all_pairs",
                   f"re-run {node.left.dup}/{node.right.dup}/{node.pairs} on the visible sub-trace")


def timed_as_timeless(node: ast.Expr, cap: Capability) -> Rewrite | None:
    """The service has no time frames (CG-1, CG-2): drop T, keep the pairs inside the frame.
    Positive (EVA §5.2, 'timed conjunction')."""
    if not isinstance(node, (ast.Conjunction, ast.Sequence)) or node.span is None:
        return None
    if cap.timed or not cap.timeless or not cap.supports(OPERATOR[type(node)]):
        return None
    if not _reevaluable(node):
        return None
    target = _set_semantics(node, type(node), None)
    if not cap.native(setting_of(target)):  # type: ignore[arg-type]
        return None
    frame = ("|t2 − t1| ≤ T" if isinstance(node, ast.Conjunction) else "t1 < t2 ≤ t1 + T")
    return Rewrite(target, Kind.POSITIVE, "timed_as_timeless",
                   f"keep {frame}; re-run {node.left.dup}/{node.right.dup}/{node.pairs} on the "
                   "visible sub-trace")


def sequence_as_conjunction(node: ast.Expr, cap: Capability) -> Rewrite | None:
    """The service has no sequence (CG-1): ask for the conjunction, keep the pairs with
    t(e1) < t(e2). Positive (EVA §5.2, 'timeless sequence')."""
    if not isinstance(node, ast.Sequence) or cap.supports(SEQUENCE):
        return None
    if not cap.supports(CONJUNCTION) or not _reevaluable(node):
        return None
    span = node.span if cap.timed and (node.span is None or _frame_fits(node, cap)) else None
    if span is None and not cap.timeless:
        return None
    target = _set_semantics(node, ast.Conjunction, span)
    if not cap.native(setting_of(target)):  # type: ignore[arg-type]
        return None
    return Rewrite(target, Kind.POSITIVE, "sequence_as_conjunction",
                   f"keep t1 < t2 ≤ t1 + T; re-run {node.left.dup}/{node.right.dup}/{node.pairs} "
                   "on the visible sub-trace")


CATALOGUE: tuple[Rule, ...] = (
    native_operator, native_negation, native_selection,
    parameters_to_all_pairs, timed_as_timeless, sequence_as_conjunction,
)
"""Equivalent rules first: a positive rule is used only when no equivalent one applies."""
