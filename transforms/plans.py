"""Plans: which part of a profile each service evaluates and what the mediator does.

A plan is a tree of three kinds of node. ``Subscribe`` delivers a primitive class (a service's
filter, or the mediator's own feed of the events published to it) or ticks of a time class
(the mediator's clock). ``Remote`` is a subtree a service
evaluates — the target expression, possibly relaxed, plus the post-filter that restores the
EVA answer. ``Local`` is an operator evaluated at the mediator over its children's exact
streams (decomposition, the collaboration mediator of EVA §5.3). In a federated plan
(:mod:`transforms.federated`) each leaf names the service it is assigned to.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from eva import ast
from transforms.capability import Capability


class Kind(StrEnum):
    """Transformation kinds of EVA §5.2 (negative ones are never chosen), plus decomposition."""

    EQUIVALENT = "equivalent"
    POSITIVE = "positive"
    TRANSFERRING = "transferring"
    DECOMPOSE = "decompose"

    @property
    def symbol(self) -> str:
        return {"equivalent": "↔", "positive": "+", "transferring": "⇝", "decompose": "D"}[self]


@dataclass(frozen=True)
class Subscribe:
    name: str
    clock: bool  # a time class, ticked by the mediator
    rule: str
    service: str = ""
    """The service whose filter delivers it (MEDIATOR, "": the mediator's own feed)."""
    why: str = ""  # a federated plan: why it is assigned there (explain)
    also: tuple[str, ...] = ()
    """Further autonomous services whose filters deliver part of the class (none observes all
    of it): its stream is the union of their filters' events and ``service``'s (a federated
    plan over autonomous services, :mod:`transforms.federated`)."""

    @property
    def sources(self) -> tuple[str, ...]:
        """Every service that delivers part of the class (MEDIATOR: the own feed)."""
        return (self.service, *self.also)


@dataclass(frozen=True)
class Remote:
    original: ast.Expr
    target: ast.Expr
    kind: Kind
    rules: tuple[str, ...]
    post_filter: str  # "" when the target's answer is the EVA answer
    auxiliary: tuple[str, ...] = ()  # what the mediator feeds the service (transferring rules)
    service: str = ""
    """The service that evaluates it (a single-service plan: "", its one service)."""
    why: str = ""  # a federated plan: why this service (explain)


@dataclass(frozen=True)
class Local:
    node: ast.Expr
    children: tuple[PlanNode, ...]
    rule: str
    why: str = ""  # a federated plan: why no service evaluates it whole (explain)


PlanNode = Subscribe | Remote | Local


@dataclass(frozen=True)
class Plan:
    profile: ast.Profile
    capability: Capability
    root: PlanNode
    services: tuple[tuple[str, str], ...] = ()
    """A federated plan (transforms.federated): the (name, group) of each service it was
    planned over, in the configured order; empty: one service, of ``capability``."""
    autonomous: tuple[str, ...] = ()
    """Which of ``services`` are autonomous (producers of their own; the mediator only
    subscribes)."""
    observed: tuple[Subscribe, ...] = ()
    """Classes subscribed only so that the mediator sees every event of them (a partition of a
    clock-driven ``per`` profile opens at the first event of its classes, which an autonomous
    service would otherwise never show the mediator): their events open partitions and are
    visible to nothing."""

    @property
    def kind(self) -> Kind:
        """↔∘↔ = ↔; anything positive = positive; decomposed parts are exact; ⇝ is exact once
        its auxiliary streams are complete."""
        kinds = {n.kind for n in nodes(self.root) if isinstance(n, Remote)}
        if Kind.POSITIVE in kinds:
            return Kind.POSITIVE
        if any(isinstance(n, Local) for n in nodes(self.root)):
            return Kind.DECOMPOSE
        if Kind.TRANSFERRING in kinds:
            return Kind.TRANSFERRING
        return Kind.EQUIVALENT


def nodes(node: PlanNode) -> list[PlanNode]:
    out: list[PlanNode] = [node]
    if isinstance(node, Local):
        for child in node.children:
            out.extend(nodes(child))
    return out
