"""The planner: profile × capability → plan (research/transforms.md §6.4).

Top-down: a subtree goes whole to the service when the catalogue has a rule for its root and
the service evaluates its operands exactly; otherwise the operator is evaluated at the mediator
over its operands' plans (decomposition). Inside a service-side negation only equivalent rules
are allowed (a relaxed operand would make the negation fire too rarely); a negation evaluated
at the mediator sees its operand's exact, post-filtered stream, so anything goes below it.

Where a subtree may go is an :data:`Assign`: here one service (:func:`plan`); over many, the
best covering one (:func:`transforms.federated.plan_federated`) — the tree walk is the same.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from eva import ast
from eva.classes import required_types, type_only
from eva.events import TICK_TYPE
from transforms.capability import CONJUNCTION, OPERATOR, SET_SEMANTICS, Capability, setting_of
from transforms.plans import Kind, Local, Plan, PlanNode, Remote, Subscribe
from transforms.rules import CATALOGUE, Rewrite, hidden_operands, native_negation, native_operator

Assign = Callable[[ast.Expr], Remote | str]
"""Where a subtree goes whole: the remote of the service that evaluates it, or why none does
(the text ``explain`` shows; "" when there is nothing to choose between)."""


def plan(profile: ast.Profile, doc: ast.Document, cap: Capability,
         refuses: Callable[[Remote, ast.Profile, bool], str] | None = None) -> Plan:
    """``refuses``: why the service's language would refuse the query for a remote (its
    limits), "" if it takes it — such a subtree is composed at the mediator instead."""
    classes = doc.class_map()
    planning = planning_capability(cap, profile)

    def assign(expr: ast.Expr) -> Remote | str:
        root_eoi = expr is profile.expr and eoi(profile)
        remote = push(expr, classes, planning, root_eoi=root_eoi)
        if remote is None:
            return refused_relaxing(expr, planning, root_eoi)
        if remote.kind is Kind.POSITIVE and (shared := fed_out_of_order(remote, profile, classes)):
            return shared
        return (refuses(remote, profile, root_eoi) if refuses is not None else "") or remote

    return Plan(profile, cap, plan_expr(profile.expr, classes, assign))


def shared_events(expr: ast.Expr, profile: ast.Profile, classes: dict[str, ast.ClassDef]) -> str:
    """Why a positive rule's remote for ``expr`` could not be fed to the mediator's engine in
    the trace view's order ("" when it can): its re-run's composites are fed to the outer
    engine at their report key, which is an event's (or tick's) own step when that event
    completes them; if a leaf elsewhere in the profile may match the same event, the outer
    engine steps the event and the composite one after the other, and some node then sees them
    in the other order than the view's left-operand-first (docs/semantics.md §18, found by the
    fidelity search). Such a node is composed at the mediator instead: its operands are the
    outer engine's own leaves, stepped with the event."""
    inside = {n.name for n in ast.walk(expr) if isinstance(n, ast.Prim)}
    outside: set[str] = set()
    stack: list[ast.Expr] = [profile.expr]
    while stack:
        node = stack.pop()
        if node is expr:
            continue
        if isinstance(node, ast.Prim):
            outside.add(node.name)
        stack.extend(ast.children(node))
    for a in sorted(inside):
        for b in sorted(outside):
            if _may_share(a, b, classes):
                return (f"an event of {a} may also be one of {b} elsewhere in the profile: the "
                        "re-run's composite it completes would be fed at that event's own step, "
                        "which the mediator's engine cannot order as the trace view does at "
                        "every node, so the operands are composed at the mediator")
    return ""


def _may_share(a: str, b: str, classes: dict[str, ast.ClassDef]) -> bool:
    """Whether one event (or tick) may be of both classes."""
    if a == b:
        return True
    body_a, body_b = classes[a].body, classes[b].body
    if isinstance(body_a, ast.Every) or isinstance(body_b, ast.Every):
        return False  # a tick is only its own class's
    types_a, types_b = required_types(body_a, classes), required_types(body_b, classes)
    return types_a is None or types_b is None or bool(types_a & types_b)


def fed_out_of_order(remote: Remote, profile: ast.Profile,
                     classes: dict[str, ast.ClassDef]) -> str:
    """:func:`shared_events` for a positive rule's remote fed to the outer engine (a
    disjunction's is re-run inline, with the events: never fed)."""
    if not isinstance(remote.original, (ast.Conjunction, ast.Sequence)):
        return ""
    return shared_events(remote.original, profile, classes)


def eoi(profile: ast.Profile) -> bool:
    return profile.evaluation is ast.Evaluation.END_OF_INTERVAL


def refused_relaxing(expr: ast.Expr, cap: Capability, root_eoi: bool) -> str:
    """Why a node that a positive rule would otherwise relax is not (its re-run on the visible
    sub-trace would be unsound, :func:`transforms.rules.hidden_operands`), for ``explain``;
    "" when that is not the reason."""
    if not isinstance(expr, (ast.Conjunction, ast.Sequence)):
        return ""
    if not (cap.supports(OPERATOR[type(expr)]) or cap.supports(CONJUNCTION)):
        return ""
    if cap.native(setting_of(expr)) or not all(
            isinstance(side.expr, ast.Prim) for side in (expr.left, expr.right)):
        return ""
    exact_sides = ("last", "all")  # first and <i> are decomposed for another reason
    if expr.left.dup.kind not in exact_sides or (isinstance(expr, ast.Conjunction) and (
            expr.pairs is not ast.Pairs.ALL or expr.right.dup.kind not in exact_sides)):
        return ""
    return hidden_operands(expr, root_eoi)


def planning_capability(cap: Capability, profile: ast.Profile) -> Capability:
    """What may be pushed to a service of ``cap`` for ``profile``."""
    if profile.per is not None and not cap.partitions:
        # The service cannot keep partitions apart: only set semantics, which the mediator
        # re-runs per partition on the events that come back, is pushed.
        settings = SET_SEMANTICS if cap.settings is None else cap.settings & SET_SEMANTICS
        return replace(cap, settings=settings)
    return cap


def plan_expr(expr: ast.Expr, classes: dict[str, ast.ClassDef], assign: Assign) -> PlanNode:
    if isinstance(expr, ast.Prim) and isinstance(classes[expr.name].body, ast.Every):
        # Alone, a time class comes from the mediator's clock; ticks are injected into a
        # service only as part of a subtree the service evaluates.
        return decompose(expr, classes, assign)
    found = assign(expr)
    if isinstance(found, Remote):
        return found
    return decompose(expr, classes, assign, found)


def decompose(expr: ast.Expr, classes: dict[str, ast.ClassDef], assign: Assign,
              why: str = "") -> PlanNode:
    """The node at the mediator (``why``: why no service evaluates it whole), each operand
    planned the same way."""
    if isinstance(expr, ast.Prim):
        clock = isinstance(classes[expr.name].body, ast.Every)
        return Subscribe(expr.name, clock, "mediator_clock" if clock else "primitive_filter",
                         why=why)
    if isinstance(expr, ast.Selection):
        return Local(expr, (plan_expr(expr.expr, classes, assign),), "count_at_mediator", why)
    if isinstance(expr, ast.Negation):
        return Local(expr, (plan_expr(expr.expr, classes, assign),), "absence_at_mediator", why)
    if isinstance(expr, ast.External):
        raise ValueError(f"an external operand <{expr.name}> is the output of a plan, not a profile")
    left = plan_expr(expr.left.expr, classes, assign)
    right_expr = expr.right.expr
    if isinstance(expr, ast.Sequence) and isinstance(right_expr, ast.Negation):
        # Anchored absence needs the anterior stream: it stays with its sequence.
        right: PlanNode = Local(right_expr, (plan_expr(right_expr.expr, classes, assign),),
                                "anchored_absence_at_mediator")
    else:
        right = plan_expr(right_expr, classes, assign)
    return Local(expr, (left, right), "compose_at_mediator", why)


def push(expr: ast.Expr, classes: dict[str, ast.ClassDef], cap: Capability,
         exact_only: bool = False, root_eoi: bool = False) -> Remote | None:
    """The whole subtree at the service, or None. ``root_eoi``: the profile's root, evaluated
    at the end of the interval (a positive rule's re-run is sound on fewer nodes there)."""
    if isinstance(expr, ast.Prim):
        body = classes[expr.name].body
        if isinstance(body, ast.Every):
            return inject_ticks(expr, cap)
        if cap.predicates == "type" and required_types(body, classes) is None:
            return None  # the service knows events by type only, and this class names none
        return Remote(expr, expr, Kind.EQUIVALENT, ("primitive_filter",), "")
    if isinstance(expr, ast.Sequence) and isinstance(expr.right.expr, ast.Negation):
        return _push_anchored(expr, classes, cap)
    operands = [push(child, classes, cap, exact_only=True) for child in ast.children(expr)]
    if any(o is None for o in operands):
        return None
    for rule in CATALOGUE:
        rewrite: Rewrite | None = rule(expr, cap)
        if rewrite is None:
            continue
        if rewrite.kind is Kind.POSITIVE and (exact_only or hidden_operands(expr, root_eoi)):
            continue
        remotes = [o for o in operands if o is not None]
        if cap.context_scope == "expression" and not _one_context(rewrite.target, remotes, classes):
            continue
        return _combine(expr, rewrite, remotes)
    return None


def has_context(expr: ast.Expr) -> bool:
    """Whether some operator of the expression is evaluated at other than set semantics."""
    return any(isinstance(node, (ast.Conjunction, ast.Sequence))
               and setting_of(node) not in SET_SEMANTICS for node in ast.walk(expr))


def _one_context(target: ast.Expr, operands: list[Remote],
                 classes: dict[str, ast.ClassDef]) -> bool:
    """A Snoop-like service applies one context to the whole query, and the context↔EVA
    mapping is verified for a flat operator over distinct event types (snoop.md §5.3):
    a non-set setting only there, and nothing above it."""
    if any(has_context(o.target) for o in operands):
        return False
    if not has_context(target):
        return True
    assert isinstance(target, (ast.Conjunction, ast.Sequence))
    sides = [target.left.expr, target.right.expr]
    types = []
    for side in sides:
        if not isinstance(side, ast.Prim):
            return False
        body = classes[side.name].body
        exact = (frozenset([TICK_TYPE + side.name]) if isinstance(body, ast.Every)
                 else type_only(body, classes))
        if exact is None:
            return False
        types.append(exact)
    return not types[0] & types[1]


def _combine(expr: ast.Expr, rewrite: Rewrite, operands: list[Remote]) -> Remote:
    """A node's rewrite over its operands' remotes: rules and auxiliaries accumulate; a node
    over a transferring operand is transferring (exact once the auxiliary streams are)."""
    rules = (*(r for o in operands for r in o.rules), rewrite.rule)
    auxiliary = tuple(dict.fromkeys(a for o in operands for a in o.auxiliary))
    kind = rewrite.kind
    if kind is Kind.EQUIVALENT and any(o.kind is Kind.TRANSFERRING for o in operands):
        kind = Kind.TRANSFERRING
    return Remote(expr, rewrite.target, kind, rules, rewrite.post_filter, auxiliary)


def inject_ticks(expr: ast.Prim, cap: Capability) -> Remote | None:
    """A time class at a service: the mediator publishes the class's ticks to it as events, so
    the service composes them like any other. Transferring (auxiliary: the tick stream)."""
    if cap.clock:
        return Remote(expr, expr, Kind.EQUIVALENT, ("native_time_class",), "")
    if not cap.accepts_events:
        return None
    return Remote(expr, expr, Kind.TRANSFERRING, ("inject_ticks",), "",
                  (f"publish the ticks of {expr.name} to the service",))


def _push_anchored(expr: ast.Sequence, classes: dict[str, ast.ClassDef],
                   cap: Capability) -> Remote | None:
    """(A ; (not E)_T): only a service with timed negation and sequence states it exactly."""
    negation = expr.right.expr
    assert isinstance(negation, ast.Negation)
    anchor = push(expr.left.expr, classes, cap, exact_only=True)
    negated = push(negation.expr, classes, cap, exact_only=True)
    if anchor is None or negated is None:
        return None
    rewrite = native_operator(expr, cap)
    if rewrite is None or native_negation(negation, cap) is None:
        return None
    combined = _combine(expr, rewrite, [anchor, negated])
    return Remote(expr, expr, combined.kind,
                  (*anchor.rules, *negated.rules, "native_negation", rewrite.rule), "",
                  combined.auxiliary)
