"""The transformation path against real base services (``evamed replay --via G``).

plan → render (the group's dialect) → native evaluation (the service's own language and
semantics) → notification transformation and post-filter → EVA occurrences, composed at the
mediator where the plan says so (``transforms.evaluate``). The mediator sees only what a
service sends back: native notifications with their constituent CloudEvents.

Notification transformation, by what the service's answer is:

* **a peer mediator (CG-5)** reports EVA occurrences: taken over as they are;
* **a Snoop context (CG-2, a flat operator over distinct types)** reports (initiator,
  terminator) pairs: each becomes the EVA composite of its two constituents;
* **set semantics everywhere else** — all combinations, possibly more than EVA (a widened
  class, an XChange ``and`` of one event, same-instant ``andthen``, both orders of a
  conjunction): the EVA expression is re-run on the events the notifications contain. At set
  semantics a composite depends only on its own constituents, so this is exact; for a positive
  rule it is the post-filter that restores the original parameters.

A service may refuse the query a pushed subtree renders as: a native language has its own
limits (size, nesting; docs/backends.md, Limits), narrower in places than EVA's. That is
:class:`PushRefused`, naming the profile, the group and the service's own message.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

from adapters.backends.filters import TICK_TYPE
from adapters.backends.native import Detection, Language, NativeQueryError, Unrenderable, native_text, run
from adapters.backends.peer import PeerLanguage, occurrence
from eva import ast
from eva import reference as ref
from eva import semantics as sem
from eva.classes import label, ticks_between
from eva.events import Event
from eva.printer import expr_text
from eva.semantics import Notification, Occ, Stream
from transforms.evaluate import evaluate_plans, rerun, visible
from transforms.plan import Kind, Plan, Remote, Subscribe
from transforms.planner import has_context, plan

Transport = Callable[[str, list[Event], int], list[Detection]]
"""Evaluate native query text over events (in order) with the clock running to the end time."""


def in_process(language: Language) -> Transport:
    """The service's evaluator in this process (what ``replay --native`` runs)."""

    def evaluate(text: str, events: list[Event], until: int) -> list[Detection]:
        return run(language.parse(text), events, until)

    return evaluate


class PushRefused(ValueError):
    """The service refused a query the mediator would subscribe for a profile (one of its
    language's limits): the profile cannot be evaluated through this group."""


@dataclass
class Federation:
    """The services of one group behind a document's plans, over one finite trace."""

    language: Language
    doc: ast.Document
    trace: list[Event]
    start: int
    end: int
    tick: int
    transport: Transport
    profile: ast.Profile | None = None
    queries: dict[str, list[Detection]] = field(default_factory=dict)
    """Native text → its notifications (each distinct subscription is evaluated once)."""
    rendered: list[str] = field(default_factory=list)

    def for_profile(self, profile: ast.Profile) -> Federation:
        return replace(self, profile=profile)

    # ---------------------------------------------------------------- native evaluation

    def _ticks(self, expr: ast.Expr) -> list[Event]:
        """Ticks of the time classes in a pushed subtree, published to the service as events
        (the transferring rule); after every primitive of their instant."""
        classes = self.doc.class_map()
        out: list[Event] = []
        for node in ast.walk(expr):
            if isinstance(node, ast.Prim) and isinstance(every := classes[node.name].body, ast.Every):
                for t in ticks_between(every, self.start, self.end):
                    out.append(Event(f"tick:{node.name}@{label(t)}", "urn:evamed:clock",
                                     TICK_TYPE + node.name, t, len(self.trace) + len(out)))
        return out

    def _detections(self, text: str, expr: ast.Expr) -> list[Detection]:
        if text not in self.queries:
            events = [e for e in self.trace if self.start < e.time <= self.end]
            if not isinstance(self.language, PeerLanguage):
                events += self._ticks(expr)
            events.sort(key=lambda e: (e.time, e.id.startswith("tick:"), e.seq))
            try:
                self.queries[text] = self.transport(text, events, self.end)
            except NativeQueryError as exc:
                name = self.profile.name if self.profile is not None else "?"
                raise PushRefused(
                    f"profile {name}: the {self.language.group} service ({exc.language}) refuses "
                    f"the query the mediator would subscribe for it: {exc.message} (see "
                    f"docs/backends.md, Limits; 'evamed explain --group {self.language.group}' "
                    "shows the query)") from None
            self.rendered.append(text)
        return self.queries[text]

    # ---------------------------------------------------------------- Services

    def remote(self, node: Remote, ctx: ref.Context, root_eoi: bool) -> Stream:
        assert self.profile is not None
        text = native_text(self.language, node.target, self.doc, self.profile, root_eoi)
        if isinstance(self.language, PeerLanguage):
            return self._from_peer(self._detections(text, node.target), ctx)
        detections = self._detections(text, node.target)
        if node.kind is not Kind.POSITIVE and has_context(node.target):
            return self._pairs(node.target, detections, ctx)
        ids = {e.id for d in detections for e in d.constituents}
        expr = node.original if node.kind is Kind.POSITIVE else node.target
        return rerun(expr, visible(ctx, ids), root_eoi)

    def subscribe(self, node: Subscribe, ctx: ref.Context) -> Stream:
        prim = ast.Prim(node.name)
        if node.clock:
            return ref.eval_prim(prim, ctx)  # the mediator's own clock
        try:
            text = native_text(self.language, prim, self.doc)
        except Unrenderable:
            return ref.eval_prim(prim, ctx)  # the service cannot select it: the mediator's feed
        ids = {e.id for d in self._detections(text, prim) for e in d.constituents}
        return ref.eval_prim(prim, visible(ctx, ids))

    # ---------------------------------------------------------------- transformations back

    def _from_peer(self, detections: list[Detection], ctx: ref.Context) -> Stream:
        want = ref.partition_key(ctx.partition) if ctx.partition is not None else None
        out: Stream = []
        for d in detections:
            value = d.extra.get("partition")
            if (ref.partition_key(value) if value is not None else None) == want:
                out.append(occurrence(d.extra))
        return out

    def _pairs(self, target: ast.Expr, detections: list[Detection], ctx: ref.Context) -> Stream:
        """Snoop pairs (initiator, terminator) as EVA composites of a flat operator."""
        assert isinstance(target, (ast.Conjunction, ast.Sequence))
        assert isinstance(target.left.expr, ast.Prim) and isinstance(target.right.expr, ast.Prim)
        known = {(e.source, e.id): e for e in ctx.events}
        tag = expr_text(target)
        left_name = target.left.expr.name
        out: list[tuple[tuple[object, ...], Occ]] = []
        for d in detections:
            if len(d.constituents) != 2:
                raise ValueError(f"a flat Snoop detection has two constituents, got {d.text}")
            first, second = (self._occurrence(e, known) for e in d.constituents)
            if first is None or second is None:
                continue  # a constituent outside this partition
            if isinstance(target, ast.Conjunction) and not self._is(d.constituents[0], left_name,
                                                                    ctx):
                first, second = second, first  # Snoop orders AND by time, EVA by operand
            key = second.key if isinstance(target, ast.Sequence) else max(first.key, second.key)
            out.append(((key, first.key), sem.composite(tag, first, second, key)))
        out.sort(key=lambda item: item[0])
        return [(occ.key, occ) for _, occ in out]

    def _is(self, event: Event, name: str, ctx: ref.Context) -> bool:
        if event.type.startswith(TICK_TYPE):
            return event.type == TICK_TYPE + name
        return name in ctx.matchers and ctx.matchers[name](event)

    def _occurrence(self, event: Event, known: dict[tuple[str, str], Event]) -> Occ | None:
        if event.type.startswith(TICK_TYPE):
            name = event.type[len(TICK_TYPE):]
            index = [c.name for c in self.doc.classes].index(name)
            return sem.time_event(name, index, event.time, label(event.time))
        own = known.get((event.source, event.id))
        return None if own is None else ref.primitive(own)


def via(language: Language, doc: ast.Document, events: list[Event], *,
        profiles: list[str] | None = None, start: int | None = None, end: int | None = None,
        tick: int = 1_000_000, transport: Transport | None = None
        ) -> tuple[list[Notification], list[Plan], list[str]]:
    """Every profile through the whole transformation path to ``language``'s service: the
    notifications (equal to plain replay), the plans, and the native queries subscribed."""
    trace = sorted(events, key=lambda e: e.key)
    if start is None:
        start = min((e.time for e in trace), default=0) - 1
    if end is None:
        end = max((e.time for e in trace), default=start)
    plans = [plan(p, doc, language.capability) for p in doc.profiles
             if profiles is None or p.name in profiles]
    federation = Federation(language, doc, trace, start, end, tick,
                            transport or in_process(language))
    out = evaluate_plans(plans, doc, trace, start=start, end=end, tick=tick, services=federation)
    return out, plans, federation.rendered
