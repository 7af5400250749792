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
from transforms.dialects import dialect
from transforms.dialects.base import Unsupported
from transforms.federated import MEDIATOR
from transforms.plans import Kind, Local, Plan, PlanNode, Remote, Subscribe

Render = Callable[[Remote], str]
"""A remote's target in the service's own language (:func:`renderer`: the group's dialect)."""


def _label(node: PlanNode, render: Render | None = None, federated: bool = False) -> str:
    why = f"\n  why: {escape(node.why)}" if federated and node.why else ""
    if isinstance(node, Subscribe):
        where = ("mediator clock" if node.clock else
                 "mediator's own feed" if federated and node.service == MEDIATOR else
                 f"service {node.service} filter" if federated else "service filter")
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
        return text + why
    op = type(node.node).__name__.lower()
    return (f"[bold]{Kind.DECOMPOSE.symbol}[/] mediator evaluates the {op}: "
            f"{_shape(node.node)}  [dim]({node.rule})[/]{why}")


def _shape(expr: ast.Expr) -> str:
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
        over = ", ".join(f"{name} ({group})" for name, group in p.services) or "no service"
        root = Tree(f"[bold]{p.profile.name}[/] over {escape(over)} — plan: "
                    f"{p.kind.symbol} {p.kind}")
    else:
        root = Tree(f"[bold]{p.profile.name}[/] on {p.capability.name} "
                    f"({p.capability.description}) — plan: {p.kind.symbol} {p.kind}")
    _grow(root, p.root, render, bool(p.services))
    return root


def _grow(parent: Tree, node: PlanNode, render: Render | None, federated: bool) -> None:
    branch = parent.add(_label(node, render, federated))
    if isinstance(node, Local):
        for child in node.children:
            _grow(branch, child, render, federated)


def as_json(p: Plan, render: Render | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"profile": p.profile.name, "group": p.capability.name}
    if p.services:
        out["services"] = [{"name": name, "group": group} for name, group in p.services]
    return {**out, "kind": str(p.kind), "root": _node_json(p.root, render, bool(p.services))}


def _node_json(node: PlanNode, render: Render | None = None,
               federated: bool = False) -> dict[str, Any]:
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
    else:
        out = {"node": "mediator", "kind": str(Kind.DECOMPOSE), "rule": node.rule,
               "operator": _shape(node.node),
               "children": [_node_json(c, render, federated) for c in node.children]}
    if federated:
        # The mediator's own nodes are MEDIATOR's ("").
        out["service"] = "" if isinstance(node, Local) else node.service
        out["why"] = node.why
    return out


def service_renderer(services: Iterable[tuple[str, str]], doc: ast.Document) -> Render:
    """A federated plan's remotes, each in the language of its service ((name, group) pairs:
    ``Plan.services``)."""
    by_name = {name: renderer(group, doc) for name, group in services}
    return lambda node: by_name[node.service](node)


def renderer(group: str, doc: ast.Document) -> Render:
    """A remote's target in the group's native language, as ``explain`` shows it (without the
    profile's evaluation time: the query subscribed for an end-of-interval root may differ)."""
    spoken = dialect(group)

    def render(node: Remote) -> str:
        rendered = spoken.generate(node.target, doc, level=Unsupported.IGNORE)
        if rendered.unsupported:
            return f"(the mediator's own feed: {'; '.join(rendered.unsupported)})"
        return rendered.text

    return render
