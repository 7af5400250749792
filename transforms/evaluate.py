"""Run a plan over a finite trace, in batch: what the mediator delivers for it — the test
oracle of the incremental plan runner (:mod:`transforms.runner`, which ``replay --via`` uses).

The services behind the plan's leaves are pluggable (:class:`Services`): simulated by the EVA
evaluator on the plan's target expressions (:class:`Simulated`, a service of a group evaluates
only what its capability allows — ``within_capability`` checks the plan). A positive rule's
post-filter re-runs the original operator on the visible sub-trace; decomposed operators run
at the mediator over their operands' streams. The soundness property says the result equals
:func:`eva.reference.evaluate` for every capability.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

from eva import ast
from eva import reference as ref
from eva.events import Event
from eva.semantics import Notification, Stream
from transforms.capability import NEGATION, OPERATOR, Capability
from transforms.plans import Kind, Local, Plan, PlanNode, Remote, Subscribe, nodes


class Services(Protocol):
    """Where a plan's leaves get their streams: the services' answers, transformed back into
    EVA occurrences of one partition (``ctx``). ``root_eoi``: the remote is the profile's root
    and the profile is evaluated at the end of the interval."""

    def remote(self, node: Remote, ctx: ref.Context, root_eoi: bool) -> Stream: ...

    def subscribe(self, node: Subscribe, ctx: ref.Context) -> Stream: ...

    def for_profile(self, profile: ast.Profile) -> Services:
        """The same services, answering for this profile's remotes."""
        ...


class Simulated:
    """Every service simulated by the EVA evaluator on the plan's target expressions."""

    def for_profile(self, profile: ast.Profile) -> Simulated:
        return self

    def remote(self, node: Remote, ctx: ref.Context, root_eoi: bool) -> Stream:
        if node.kind is not Kind.POSITIVE:
            # The service's answer is the EVA answer (with the ticks the mediator published).
            if root_eoi and isinstance(node.target, (ast.Disjunction, ast.Conjunction, ast.Sequence)):
                return ref.eval_end_of_interval(node.target, ctx)
            return ref.eval_expr(node.target, ctx)
        ids = {event for _, occ in ref.eval_expr(node.target, ctx) for event in occ.events}
        return rerun(node.original, visible(ctx, ids), root_eoi)

    def subscribe(self, node: Subscribe, ctx: ref.Context) -> Stream:
        return ref.eval_prim(ast.Prim(node.name), ctx)


def rerun(expr: ast.Expr, ctx: ref.Context, root_eoi: bool) -> Stream:
    """The post-filter of a positive rule: the original expression on the visible sub-trace."""
    if root_eoi and isinstance(expr, (ast.Disjunction, ast.Conjunction, ast.Sequence)):
        return ref.eval_end_of_interval(expr, ctx)
    return ref.eval_expr(expr, ctx)


def visible(ctx: ref.Context, ids: set[str]) -> ref.Context:
    """The post-filter's input: the events the service's notifications contain."""
    return ctx.with_events([e for e in ctx.events if e.id in ids])


def evaluate_plans(plans: list[Plan], doc: ast.Document, events: Iterable[Event], *,
                   start: int | None = None, end: int | None = None,
                   tick: int = 1_000_000, services: Services | None = None) -> list[Notification]:
    """The mediator's answer for each planned profile, in detection order (as reference.evaluate)."""
    trace = list(events)
    if start is None:
        start = min((e.time for e in trace), default=0) - 1
    if end is None:
        end = max((e.time for e in trace), default=start)
    backend = services if services is not None else Simulated()
    out: list[Notification] = []
    for p in plans:

        bound = backend.for_profile(p.profile)

        def planned(_: ast.Profile, ctx: ref.Context, p: Plan = p,
                    bound: Services = bound) -> Stream:
            return root_stream(p, ctx, bound)

        out.extend(ref.evaluate_profile(p.profile, doc, trace, start=start, end=end, tick=tick,
                                        root=planned))
    out.sort(key=lambda n: n.emitted)
    return out


def root_stream(p: Plan, ctx: ref.Context, services: Services) -> Stream:
    root = p.root
    eoi = p.profile.evaluation is ast.Evaluation.END_OF_INTERVAL
    if isinstance(root, Remote):
        return services.remote(root, ctx, eoi)
    if eoi and isinstance(root, Local) and isinstance(
            root.node, (ast.Disjunction, ast.Conjunction, ast.Sequence)):
        left, right = _operands(root, ctx, services)
        return ref.end_of_interval(root.node, left, right, ctx.end)
    return stream(root, ctx, services)


def stream(node: PlanNode, ctx: ref.Context, services: Services,
           anchors: Stream | None = None) -> Stream:
    if isinstance(node, Subscribe):
        return services.subscribe(node, ctx)
    if isinstance(node, Remote):
        return services.remote(node, ctx, False)
    expr = node.node
    if isinstance(expr, ast.Selection):
        return ref.select(expr, stream(node.children[0], ctx, services))
    if isinstance(expr, ast.Negation):
        return ref.negate(expr, stream(node.children[0], ctx, services), ctx, anchors)
    assert isinstance(expr, (ast.Disjunction, ast.Conjunction, ast.Sequence))
    return ref.combine(expr, *_operands(node, ctx, services))[0]


def _operands(node: Local, ctx: ref.Context, services: Services) -> tuple[Stream, Stream]:
    expr = node.node
    assert isinstance(expr, (ast.Disjunction, ast.Conjunction, ast.Sequence))
    left = stream(node.children[0], ctx, services)
    anchored = isinstance(expr, ast.Sequence) and isinstance(expr.right.expr, ast.Negation)
    return left, stream(node.children[1], ctx, services, anchors=left if anchored else None)


def within_capability(p: Plan) -> list[str]:
    """What the plan asks of its service that the capability does not offer (empty if none)."""
    cap: Capability = p.capability
    problems = []
    for n in nodes(p.root):
        if not isinstance(n, Remote):
            continue
        for sub in ast.walk(n.target):
            if isinstance(sub, ast.Prim):
                continue
            operator = OPERATOR[type(sub)]
            if not cap.supports(operator):
                problems.append(f"{operator} is not offered by {cap.name}")
            if isinstance(sub, (ast.Conjunction, ast.Sequence)) and sub.span is not None \
                    and not cap.timed:
                problems.append(f"{cap.name} has no time frames")
            if isinstance(sub, (ast.Disjunction, ast.Conjunction, ast.Sequence)):
                pairs = "all_pairs" if isinstance(sub, ast.Disjunction) else str(sub.pairs)
                if not cap.native((operator, sub.left.dup.kind, sub.right.dup.kind, pairs)):
                    problems.append(f"{cap.name} does not evaluate {sub.left.dup}/"
                                    f"{sub.right.dup}/{sub.pairs} for {operator}")
            if operator == NEGATION and cap.negation != "timed":
                problems.append(f"{cap.name} has no timed negation")
    return problems
