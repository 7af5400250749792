"""Federated planning: one profile over many services, each observing part of the events.

A service declares its group (a capability record) and its **coverage**: which events it
observes — patterns (``fnmatch``) over the CloudEvents ``source`` and ``type``. The planner
assigns each subtree of a profile to a service that covers all its primitive classes and can
evaluate it, and composes the rest at the mediator (docs/transformations.md, "Federated plans").

A service is **fed** (the mediator forwards it the events of its own feed that its coverage
observes) or **autonomous** (``ServiceInfo.autonomous``: it has producers of its own; the
mediator only subscribes and sees nothing but its notifications). Autonomous services observe
disjoint parts of the merged trace, and the mediator's own feed holds what none of them
observes. So over autonomous services: an autonomous service covering a class is the only
place its events are; a fed service covers a class only if no autonomous service may observe
any of it; the mediator cannot inject ticks into an autonomous service (no transferring rule);
a class that no single service observes whole is the **union** of filters at every autonomous
service that may observe some of it (``Subscribe.also``) and, unless they observe all of it
together, the own feed; and a clock-driven ``per`` profile also subscribes its classes as
**observers** (``Plan.observed``), since a partition opens at the first event of its classes
whether or not any composite names it.

The tree walk is the single-service planner's (:func:`transforms.planner.plan_expr`); only
where a subtree goes differs: :func:`plan_federated` asks every covering service's
:func:`~transforms.planner.push` and takes the best answer.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from fnmatch import fnmatchcase

from eva import ast
from eva.classes import required_types, required_values
from eva.events import Event
from eva.retention import reach
from transforms.capability import Capability
from transforms.dialects import dialect
from transforms.planner import (
    eoi,
    fed_out_of_order,
    plan_expr,
    planning_capability,
    push,
    refused_relaxing,
)
from transforms.plans import Kind, Local, Plan, PlanNode, Remote, Subscribe, nodes


@dataclass(frozen=True)
class Coverage:
    """The events a service observes: an event whose source matches one of ``sources`` and
    whose type matches one of ``types`` (``fnmatch`` patterns; ``("*",)``: all)."""

    sources: tuple[str, ...] = ("*",)
    types: tuple[str, ...] = ("*",)

    def observes(self, event: Event) -> bool:
        return (any(fnmatchcase(event.source, p) for p in self.sources)
                and any(fnmatchcase(event.type, p) for p in self.types))

    @property
    def everything(self) -> bool:
        """Every event, whatever its source and type."""
        return EVERY in self.sources and EVERY in self.types


EVERY = "*"
"""The pattern that matches every value: the only one that covers a value a class leaves open."""


@dataclass(frozen=True)
class ServiceInfo:
    """A connected service as the planner sees it (``name`` is unique among them).
    ``autonomous``: it has producers of its own (the module docstring)."""

    name: str
    group: str
    capability: Capability
    coverage: Coverage = Coverage()
    autonomous: bool = False


MEDIATOR = ""
"""The service name of a plan node evaluated at the mediator itself, on the events published
to it (``Publish``): what no connected service covers."""


FEDERATED = Capability("federated", frozenset(), timed=False, settings=frozenset(),
                       accepts_events=False,
                       description="each subtree at a service that covers it")
"""The ``capability`` of a federated plan: its services' capabilities are in its nodes."""


def covers(info: ServiceInfo, cls: ast.ClassDef, classes: dict[str, ast.ClassDef]) -> bool:
    """Whether every event that can match ``cls`` is one the service observes: each type the
    class requires matches one of its type patterns, and its source patterns match every
    source — or every source the class pins (``source == …`` / ``in``). A class that leaves the
    type (or the source) open is covered only by a service observing every type (source):
    the pattern ``*``. A time class is covered by every service (the mediator injects its
    ticks, or the service has a clock)."""
    if isinstance(cls.body, ast.Every):
        return True
    coverage = info.coverage
    return (_matched(coverage.types, required_types(cls.body, classes))
            and _matched(coverage.sources, required_values(cls.body, classes, "source")))


def _matched(patterns: tuple[str, ...], values: frozenset[str] | None) -> bool:
    """Whether every value (None: any value at all) matches one of the patterns."""
    if values is None:
        return EVERY in patterns
    return all(any(fnmatchcase(v, p) for p in patterns) for v in values)


def may_observe(info: ServiceInfo, cls: ast.ClassDef, classes: dict[str, ast.ClassDef]) -> bool:
    """Whether the service may observe some event of ``cls`` (conservatively: unless the
    types, or the sources, the class requires match none of its patterns). A time class: no
    (its ticks are nobody's events)."""
    if isinstance(cls.body, ast.Every):
        return False
    coverage = info.coverage
    return (_meets(coverage.types, required_types(cls.body, classes))
            and _meets(coverage.sources, required_values(cls.body, classes, "source")))


def _meets(patterns: tuple[str, ...], values: frozenset[str] | None) -> bool:
    """Whether some value (None: any value at all) matches one of the patterns."""
    return values is None or any(fnmatchcase(v, p) for v in values for p in patterns)


def covered_jointly(infos: Sequence[ServiceInfo], cls: ast.ClassDef,
                    classes: dict[str, ast.ClassDef]) -> bool:
    """Whether every event of ``cls`` is observed by one of ``infos`` (conservatively: each
    (source, type) the class allows is observed by one service, an open one only through the
    pattern ``*``)."""
    if isinstance(cls.body, ast.Every):
        return True
    types = required_types(cls.body, classes)
    sources = required_values(cls.body, classes, "source")
    for kind in (None,) if types is None else sorted(types):
        observing = [i.coverage for i in infos
                     if (EVERY in i.coverage.types if kind is None
                         else any(fnmatchcase(kind, p) for p in i.coverage.types))]
        if sources is None:
            if not any(EVERY in c.sources for c in observing):
                return False
        elif not all(any(fnmatchcase(s, p) for c in observing for p in c.sources)
                     for s in sources):
            return False
    return True


def _covers_merged(info: ServiceInfo, cls: ast.ClassDef, classes: dict[str, ast.ClassDef],
                   autonomous: Sequence[ServiceInfo]) -> bool:
    """Whether every event of ``cls`` in the merged trace reaches the service: it observes all
    of them, and — for a fed service, which observes only the mediator's own feed — no
    autonomous service may observe any of them (their events never enter the own feed)."""
    if not covers(info, cls, classes):
        return False
    if info.autonomous or isinstance(cls.body, ast.Every):
        return True
    return not any(may_observe(a, cls, classes) for a in autonomous)


Refuses = Callable[[ServiceInfo, Remote, ast.Profile, bool], str]
"""Why a service's language refuses the query it would be subscribed for a remote — its
limits: bracket depth, chain length, query size (adapters.federation.language_refuses) — or
"" if it takes it. (profile, root_eoi: what the rendering depends on.)"""


def plan_federated(profile: ast.Profile, doc: ast.Document,
                   services: Sequence[ServiceInfo], *, live: bool = False,
                   refuses: Refuses | None = None) -> Plan:
    """The profile over ``services`` (in the configured order): top-down, a subtree goes whole
    to the best covering service that evaluates it — equivalent or transferring before
    positive; ties to the fewer post-filters and auxiliary streams, then to the earlier
    service — else its operator is evaluated at the mediator and each operand planned the
    same way. A primitive class no service covers (and evaluates) is the mediator's own feed
    (:data:`MEDIATOR`): the events published to it. ``per`` profiles at a service without
    partitions: set semantics only, as :func:`transforms.planner.plan` does.

    ``live`` (a running mediator, whose input has no end): a subtree is not pushed where the
    mediator could decide what the service's answers make visible only at the end of the input
    — a target with no bound on how long after an event the service may still name it (an
    ``_inf`` frame evaluated at set semantics, :func:`~eva.retention.reach`); it is composed at
    the mediator instead, which decides as the trace goes."""
    names = [s.name for s in services]
    if MEDIATOR in names or len(set(names)) != len(names):
        raise ValueError(f"service names must be unique and not empty, got {names}")
    classes = doc.class_map()
    # The mediator publishes nothing to an autonomous service: no ticks of a time class.
    sites = [(info, planning_capability(replace(info.capability, accepts_events=False)
                                        if info.autonomous else info.capability, profile))
             for info in services]
    autonomous = [s for s in services if s.autonomous]

    def assign(expr: ast.Expr) -> Remote | str:
        return _assign(expr, profile, classes, sites, live, autonomous, refuses)

    root = plan_expr(profile.expr, classes, assign)
    observed: tuple[Subscribe, ...] = ()
    if autonomous:
        root = _unions(root, classes, autonomous)
        observed = _observed(profile, root, classes, autonomous)
    return Plan(profile, FEDERATED, root, tuple((s.name, s.group) for s in services),
                tuple(s.name for s in autonomous), observed)


def _union(name: str, classes: dict[str, ast.ClassDef],
           autonomous: Sequence[ServiceInfo]) -> tuple[tuple[str, ...], str]:
    """Where the events of class ``name`` are over autonomous services: each service that may
    observe some, and the own feed (MEDIATOR) unless they observe all of them together; and
    why, for explain ((), "" when no autonomous service may observe any)."""
    cls = classes[name]
    sites = [a for a in autonomous if may_observe(a, cls, classes)]
    if not sites:
        return (), ""
    own = not covered_jointly(sites, cls, classes)
    where = _and([s.name for s in sites])
    if not own:
        why = (f"{where} observes all of {name}" if len(sites) == 1
               else f"{where} observe all of {name} together")
    else:
        why = f"{where} may observe some of {name}, the mediator's own feed the rest"
    return ((MEDIATOR,) if own else ()) + tuple(s.name for s in sites), why


def _unions(node: PlanNode, classes: dict[str, ast.ClassDef],
            autonomous: Sequence[ServiceInfo]) -> PlanNode:
    """Each class the plan takes from the own feed, over autonomous services: the union of
    the filters of every service that may observe some of it (:func:`_union`)."""
    if isinstance(node, Local):
        return replace(node, children=tuple(_unions(c, classes, autonomous)
                                            for c in node.children))
    if isinstance(node, Subscribe) and not node.clock and node.service == MEDIATOR:
        where, why = _union(node.name, classes, autonomous)
        if where:
            return replace(node, service=where[0], also=where[1:],
                           why="; ".join(w for w in (node.why, why) if w))
    return node


def clock_driven(expr: ast.Expr, classes: dict[str, ast.ClassDef]) -> bool:
    """Whether the expression acts without events: a negation, or a time class."""
    return any(isinstance(n, ast.Negation) or (isinstance(n, ast.Prim)
                                               and isinstance(classes[n.name].body, ast.Every))
               for n in ast.walk(expr))


def _observed(profile: ast.Profile, root: PlanNode, classes: dict[str, ast.ClassDef],
              autonomous: Sequence[ServiceInfo]) -> tuple[Subscribe, ...]:
    """The classes of a clock-driven ``per`` profile whose every event the plan's leaves do not
    already deliver, subscribed as observers (``Plan.observed``): a partition opens at the
    first event of any of its classes (as the reference opens it), and its clock with it."""
    if profile.per is None or not clock_driven(profile.expr, classes):
        return ()
    delivered: dict[str, set[str]] = {}
    for n in nodes(root):
        if isinstance(n, Remote) and isinstance(n.original, ast.Prim):
            delivered.setdefault(n.original.name, set()).add(n.service)
        elif isinstance(n, Subscribe) and not n.clock:
            delivered.setdefault(n.name, set()).update(n.sources)
    out = []
    for name in sorted({n.name for n in ast.walk(profile.expr) if isinstance(n, ast.Prim)}):
        where, why = _union(name, classes, autonomous)
        if where and not set(where) <= delivered.get(name, set()):
            out.append(Subscribe(name, False, "partition_observer", where[0],
                                 f"its partitions open at the first event of {name}; {why}",
                                 where[1:]))
    return tuple(out)


_HOW = {Kind.EQUIVALENT: "equivalently", Kind.TRANSFERRING: "transferring (with ticks)",
        Kind.POSITIVE: "positively (post-filtered)"}


def _assign(expr: ast.Expr, profile: ast.Profile, classes: dict[str, ast.ClassDef],
            sites: list[tuple[ServiceInfo, Capability]], live: bool = False,
            autonomous: Sequence[ServiceInfo] = (), refuses: Refuses | None = None
            ) -> Remote | str:
    """The subtree at the best service that covers and evaluates it, or why there is none."""
    used = sorted({n.name for n in ast.walk(expr) if isinstance(n, ast.Prim)
                   and not isinstance(classes[n.name].body, ast.Every)})  # those cover all
    covering = [(info, cap) for info, cap in sites
                if all(_covers_merged(info, classes[name], classes, autonomous)
                       for name in used)]
    if not covering:
        if not used:
            return "no service is connected"
        return f"no service covers {'' if len(used) == 1 else 'all of '}{_and(used)}"
    options: list[tuple[tuple[int, int, int], ServiceInfo, Remote]] = []
    refusals: list[str] = []
    whole = "" if isinstance(expr, ast.Prim) else " whole"
    for order, (info, cap) in enumerate(covering):
        refused = _peer_refuses(expr, profile, classes, info) if cap.clock else ""
        if refused:
            refusals.append(f"{info.name}: {refused}")
            continue
        root_eoi = expr is profile.expr and eoi(profile)
        remote = push(expr, classes, cap, root_eoi=root_eoi)
        if remote is None:
            if (unsound := refused_relaxing(expr, cap, root_eoi)):
                refusals.append(f"{info.name}: {unsound}")
                continue
            ticked = info.autonomous and not cap.clock and any(
                isinstance(n, ast.Prim) and isinstance(classes[n.name].body, ast.Every)
                for n in ast.walk(expr))
            refusals.append(f"{info.name}: cannot evaluate it{whole}" + (
                " (it is autonomous: the mediator publishes no ticks to it)" if ticked else ""))
            continue
        if remote.kind is Kind.POSITIVE and (shared := fed_out_of_order(remote, profile,
                                                                         classes)):
            refusals.append(f"{info.name}: {shared}")
            continue
        limited = refuses(info, remote, profile, root_eoi) if refuses is not None else ""
        if limited:
            # A language's limit is no reason to fail the profile: what it cannot take whole
            # is composed at the mediator over its operands (each planned the same way).
            refusals.append(f"{info.name}: {limited}")
            continue
        if live and reach(remote.target) is None and not dialect(info.group).takes_over(remote):
            refusals.append(f"{info.name}: its answers to it could name an event at any later "
                            "time, so nothing would be decided before the input ends")
            continue
        extras = (1 if remote.post_filter else 0) + len(remote.auxiliary)
        options.append(((remote.kind is Kind.POSITIVE, extras, order), info, remote))
    by = f"covered by {_and([info.name for info, _ in covering])}"
    if not options:
        return "; ".join([by, *refusals])
    options.sort(key=lambda o: o[0])
    (rank, extras, _), best, remote = options[0]
    why = [by, f"{best.name} pushes it {_HOW[remote.kind]}"]
    for (other_rank, other_extras, _), other, _ in options[1:]:
        reason = ("only positively" if other_rank > rank else
                  "with more post-filters or auxiliary streams" if other_extras > extras else
                  "later in the configured order")
        why.append(f"{other.name}: {reason}")
    return replace(remote, service=best.name, why="; ".join([*why, *refusals]))


def _peer_refuses(expr: ast.Expr, profile: ast.Profile, classes: dict[str, ast.ClassDef],
                  info: ServiceInfo) -> str:
    """Why a service with a clock of its own (a peer mediator, whose answers the mediator
    takes over as they are) would not answer ``expr`` as the mediator does; "" if it would.
    Its occurrences carry its own report keys, numbered by its own arrivals, which the mediator
    cannot place among the trace's events: taken as the whole profile's answer they are
    delivered as they are, composed with anything else an instant's order could differ. And
    its clock starts at the first event it observes, a partition at the first event of the
    classes it is given: a time class or a negation (whose ticks and absences count from
    there) is exact only at a service that observes every event."""
    if expr is not profile.expr:
        return "a peer mediator takes a whole profile (its answers carry its own report keys)"
    if info.coverage.everything or not any(
            isinstance(n, ast.Negation) or (isinstance(n, ast.Prim)
                                            and isinstance(classes[n.name].body, ast.Every))
            for n in ast.walk(expr)):
        return ""
    return "its own clock starts at the first event it observes"


def _and(names: list[str]) -> str:
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"
