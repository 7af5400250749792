"""Plans for people (`evamed explain`): a tree with the rule and kind at each node.

Each line names the rule function (transforms/rules.py, transforms/planner.py) so an operator can
look up exactly what the mediator does and why it is sound. A federated plan
(transforms/federated.py) also names, at each node, the service it is assigned to and why:
which services cover it, and which of them pushes it how.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from rich.markup import escape
from rich.tree import Tree

from eva import ast
from eva.printer import expr_text
from transforms.capability import OPERATOR, SELECTION, Capability, setting_of
from transforms.dialects import dialect
from transforms.dialects.base import Unsupported
from transforms.federated import MEDIATOR
from transforms.plans import Kind, Local, Plan, PlanNode, Remote, Subscribe

Render = Callable[[Remote], str]
"""A remote's target in the service's own language (:func:`renderer`: the group's dialect)."""


LEGEND = (
    "legend: ↔ equivalent — the service's answer is the EVA answer · + positive — the service "
    "answers a superset, the mediator post-filters it · ⇝ transferring — exact once the mediator "
    "feeds the auxiliary streams it names · D decomposed — the mediator evaluates the operator "
    "over its operands' streams. In parentheses: the rules applied (docs/transformations.md "
    "describes each); \"native\": the query the service is given.")
"""Printed once after ``explain``'s text output."""


def _label(node: PlanNode, render: Render | None = None, federated: bool = False,
           cap: Capability | None = None, autonomous: tuple[str, ...] = ()) -> str:
    reason = node.why if federated else (
        decomposed_because(node, cap) if isinstance(node, Local) and cap is not None else "")
    why = f"\n  why: {escape(reason)}" if reason else ""
    if isinstance(node, Subscribe):
        where = ("mediator clock" if node.clock else _sources(node) if federated
                 else "service filter")
        return f"[bold]↔[/] {where}: {node.name}  [dim]({node.rule})[/]{why}"
    if isinstance(node, Remote):
        service = f"service {node.service}" if federated else "service"
        text = f"[bold]{node.kind.symbol}[/] {service} evaluates: {expr_text(node.target)}"
        text += f"  [dim]({', '.join(dict.fromkeys(node.rules))})[/]"
        if node.post_filter:
            text += f"\n  post-filter at the mediator: {node.post_filter}"
        for aux in node.auxiliary:
            text += f"\n  auxiliary: {aux}"
        if node.target != node.original:
            text += f"\n  for: {expr_text(node.original)}"
        if render is not None:
            text += "\n  native: " + escape(render(node).strip().replace("\n", " ⏎ "))
            if (tests := reapplied(render, node)):
                text += ("\n  the mediator re-applies (the native query leaves it out): "
                         + escape("; ".join(tests)))
        if node.service in autonomous and isinstance(node.original, ast.Prim):
            text += ("\n  registered as the types the class names, if it names them (one "
                     "registration shared by every class of those types there); the mediator "
                     "selects this class's events itself")
        if (cost := growing(node)):
            text += f"\n  [yellow]cost:[/] {escape(cost)}"
        return text + why
    op = type(node.node).__name__.lower()
    return (f"[bold]{Kind.DECOMPOSE.symbol}[/] mediator evaluates the {op}: "
            f"{shape(node.node)}  [dim]({node.rule})[/]{why}")


def _sources(node: Subscribe) -> str:
    """Where a class comes from in a federated plan: the own feed, a service's filter, or the
    union of several (over autonomous services, none of which observes all of it)."""
    parts = ["the mediator's own feed" if s == MEDIATOR else f"service {s}" for s in node.sources]
    if len(parts) == 1:
        return "mediator's own feed" if node.service == MEDIATOR else f"service {node.service} filter"
    return "union of the filters of " + ", ".join(parts[:-1]) + " and " + parts[-1]


def shape(expr: ast.Expr) -> str:
    """The operator with its parameters, operands elided (they are the children below)."""
    if isinstance(expr, ast.Selection):
        return f"(…[{expr.index}])_{expr.pairs}"
    if isinstance(expr, ast.Negation):
        return f"((not …)_{_span(expr.span)})_{expr.pairs}"
    if isinstance(expr, ast.Disjunction):
        return f"({expr.left.dup}(…) | {expr.right.dup}(…))_{expr.pairs}"
    if isinstance(expr, (ast.Conjunction, ast.Sequence)):
        sep = "," if isinstance(expr, ast.Conjunction) else ";"
        return (f"(({expr.left.dup}(…){sep} {expr.right.dup}(…))_{_span(expr.span)})"
                f"_{expr.pairs}")
    return expr_text(expr)


def _span(span: int | None) -> str:
    from eva.units import format_span

    return format_span(span)


def explain(p: Plan, render: Render | None = None) -> Tree:
    if p.services:
        over = ", ".join(f"{name} ({group}{', autonomous' if name in p.autonomous else ''})"
                         for name, group in p.services) or "no service"
        title = (f"[bold]{p.profile.name}[/] over {escape(over)} — plan: "
                 f"{p.kind.symbol} {p.kind}")
    else:
        title = (f"[bold]{p.profile.name}[/] on {p.capability.name} "
                 f"({p.capability.description}) — plan: {p.kind.symbol} {p.kind}")
    if (per := partitioning(p)):
        title += f"\n{escape(per)}"
    root = Tree(title)
    relaxing = tuple(n for n, g in p.services if n in p.autonomous and g != "cg5")
    _grow(root, p.root, render, bool(p.services), None if p.services else p.capability,
          relaxing)
    if p.observed:
        seen = root.add("[bold]observed[/] (a partition opens at the first event of its "
                        "classes, which no composite need name):")
        for node in p.observed:
            seen.add(_label(node, render, True, autonomous=relaxing))
    return root


def _grow(parent: Tree, node: PlanNode, render: Render | None, federated: bool,
          cap: Capability | None, autonomous: tuple[str, ...] = ()) -> None:
    branch = parent.add(_label(node, render, federated, cap, autonomous))
    if isinstance(node, Local):
        for child in node.children:
            _grow(branch, child, render, federated, cap, autonomous)


def partitioning(p: Plan) -> str:
    """The ``per`` partitioning in words ("" without ``per``)."""
    per = p.profile.per
    if per is None:
        return ""
    text = f"per {per}: each value of {per} is evaluated apart (its own partition)"
    if not p.services and not p.capability.partitions:
        text += (f"; {p.capability.name} keeps no partitions apart, so only set semantics is "
                 "pushed and the mediator re-runs the operators per value on what comes back")
    return text


_WORDS = {"disjunction": "disjunction", "conjunction": "conjunction", "sequence": "sequence",
          "negation": "timed negation", SELECTION: "i-th selection"}


def decomposed_because(node: Local, cap: Capability) -> str:
    """Why a one-service plan evaluates ``node`` at the mediator, in words."""
    if node.why:  # the planner said why (a relaxing refused, a rendering refused)
        return node.why
    expr = node.node
    op = OPERATOR[type(expr)]
    if node.rule == "anchored_absence_at_mediator":
        return ("a negation after a sequence needs the sequence's anterior stream: it stays "
                "with its sequence at the mediator")
    if not cap.supports(op):
        has = f" (its negation is {cap.negation})" if op == "negation" and cap.negation != "none" else ""
        return f"{cap.name} has no {_WORDS[op]}{has}"
    below = [c for c in node.children if not isinstance(c, Remote)
             and not (isinstance(c, Subscribe) and not c.clock)]
    if below:
        return ("an operand is evaluated at the mediator (below), so the operator over it is "
                "too")
    relaxed = [c for c in node.children if isinstance(c, Remote) and c.kind is Kind.POSITIVE]
    if relaxed:
        return (f"an operand reaches {cap.name} only as a superset ({expr_text(relaxed[0].original)}"
                "), and the operator needs its exact stream")
    if isinstance(expr, ast.Binary):
        setting = setting_of(expr)
        if not cap.native(setting):
            _, left, right, pairs = setting
            return (f"{cap.name} does not evaluate a {op} with {left}_dup/{right}_dup and "
                    f"{pairs}, and no positive rule narrows it back exactly")
        if (isinstance(expr, (ast.Conjunction, ast.Sequence)) and expr.span is not None
                and not cap.timed):
            return f"{cap.name} has no time frames"
    return f"no rule of the catalogue states this {op} for {cap.name}"


def growing(node: Remote) -> str:
    """A warning when the service is asked for a stream that grows with the trace: an operator
    over all pairs with no time frame — dropped by the rule (the group has none: a timed group
    would bound it) or absent from the profile itself."""
    from transforms.capability import PRESETS

    spans = {expr_text(e): e.span for e in ast.walk(node.original)
             if isinstance(e, (ast.Conjunction, ast.Sequence))}
    for expr in ast.walk(node.target):
        if (isinstance(expr, (ast.Conjunction, ast.Sequence)) and expr.span is None
                and str(expr.pairs) == "all_pairs"):
            sides = f"{expr_text(expr.left.expr)} × {expr_text(expr.right.expr)}"
            relaxed = any(span is not None for span in spans.values())
            timed = ", ".join(c.name for c in PRESETS.values() if c.timed)
            why = (f"the rule dropped the profile's time frame (a timed group — {timed} — "
                   "would keep it)" if relaxed else "the profile gives no time frame")
            return (f"the service pairs every {sides} over the whole trace: its answers grow "
                    f"with the trace; {why}")
    return ""


def as_json(p: Plan, render: Render | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"profile": p.profile.name, "group": p.capability.name}
    if p.services:
        out["services"] = [{"name": name, "group": group, **(
            {"autonomous": True} if name in p.autonomous else {})} for name, group in p.services]
    if p.profile.per is not None:
        out["per"] = p.profile.per
    cap = None if p.services else p.capability
    out = {**out, "kind": str(p.kind), "root": _node_json(p.root, render, bool(p.services), cap)}
    if p.observed:
        out["observed"] = [_node_json(n, render, True) for n in p.observed]
    return out


def _node_json(node: PlanNode, render: Render | None = None, federated: bool = False,
               cap: Capability | None = None) -> dict[str, Any]:
    out: dict[str, Any]
    if isinstance(node, Subscribe):
        out = {"node": "subscribe", "class": node.name, "clock": node.clock, "rule": node.rule,
               "kind": str(Kind.EQUIVALENT)}
    elif isinstance(node, Remote):
        out = {"node": "service", "kind": str(node.kind), "rules": list(node.rules),
               "evaluates": expr_text(node.target), "for": expr_text(node.original),
               "post_filter": node.post_filter, "auxiliary": list(node.auxiliary)}
        if render is not None:
            out["native"] = render(node)
            out["reapplied"] = reapplied(render, node)
        if (cost := growing(node)):
            out["cost"] = cost
    else:
        out = {"node": "mediator", "kind": str(Kind.DECOMPOSE), "rule": node.rule,
               "operator": shape(node.node),
               "children": [_node_json(c, render, federated, cap) for c in node.children]}
        if cap is not None:
            out["why"] = decomposed_because(node, cap)
    if federated:
        # The mediator's own nodes are MEDIATOR's ("").
        out["service"] = "" if isinstance(node, Local) else node.service
        if isinstance(node, Subscribe) and node.also:
            out["also"] = list(node.also)
        out["why"] = node.why
    return out


class Renderer:
    """A remote's target in its service's native language, as ``explain`` shows it (without
    the profile's evaluation time: the query subscribed for an end-of-interval root may
    differ), and the tests of its classes that text leaves out — the mediator re-applies them
    to what the service sends back (``Rendered.widened``)."""

    def __init__(self, groups: Callable[[Remote], str], doc: ast.Document) -> None:
        self.groups = groups
        self.doc = doc

    def _rendered(self, node: Remote) -> Any:
        return dialect(self.groups(node)).generate(node.target, self.doc,
                                                   level=Unsupported.IGNORE)

    def __call__(self, node: Remote) -> str:
        rendered = self._rendered(node)
        if rendered.unsupported:
            return f"(the mediator's own feed: {'; '.join(rendered.unsupported)})"
        return str(rendered.text)

    def reapplied(self, node: Remote) -> list[str]:
        """Each test left out, as ``Class: test``."""
        rendered = self._rendered(node)
        return [] if rendered.unsupported else [f"{cls}: {test}" for cls, test in rendered.widened]


def reapplied(render: Render | None, node: Remote) -> list[str]:
    """What the mediator re-applies to ``node``'s answers (nothing known: [])."""
    return render.reapplied(node) if isinstance(render, Renderer) else []


def service_renderer(services: Iterable[tuple[str, str]], doc: ast.Document) -> Render:
    """A federated plan's remotes, each in the language of its service ((name, group) pairs:
    ``Plan.services``)."""
    by_name = dict(services)
    return Renderer(lambda node: by_name[node.service], doc)


def renderer(group: str, doc: ast.Document) -> Render:
    """A remote's target in the group's native language (:class:`Renderer`)."""
    return Renderer(lambda node: group, doc)
