"""Autonomous services (issue 23): each service has producers of its own and the mediator
sees nothing but its notifications — the constituents in full, and its watermark. The
federation learns the events from the notifications alone and decides up to the smallest
watermark of its inputs; what the client gets is the reference over the merged trace.

These are the algorithm's properties, in process: each service is its evaluators in this
process (a test double of the producer's side — the gRPC sessions are tested in
tests/test_sessions.py and end to end in tests/test_federation_e2e.py)."""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field, replace
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from adapters.backends.registry import GROUPS, language
from adapters.federation import Federation, merged_seq
from adapters.links import Handle, InProcessLink, Link
from eva import ast
from eva.events import Event
from eva.parser import parse
from eva.printer import expr_text
from eva.reference import evaluate
from eva.semantics import Notification
from eva.snapshot import from_data, to_data
from tests.helpers import signature
from tests.strategies import documents, dups, pairs, spans, traces
from tests.test_federated import FEDERATED_CLASSES, NAMES, SOURCES, keyed
from transforms.capability import PRESETS
from transforms.dialects.base import Detection
from transforms.federated import MEDIATOR, Coverage, ServiceInfo, plan_federated
from transforms.plans import Remote, Subscribe, nodes

CELLS = [(s, t) for s in SOURCES for t in "abc"]


def autonomous(name: str, group: str, sources: tuple[str, ...] = ("*",),
               types: tuple[str, ...] = ("*",)) -> ServiceInfo:
    return ServiceInfo(name, group, PRESETS[group], Coverage(sources, types), autonomous=True)


def _cells(info: ServiceInfo) -> set[tuple[str, str]]:
    return {(s, t) for s, t in CELLS
            if info.coverage.observes(Event("x", s, t, 0))}


@st.composite
def disjoint_services(draw: st.DrawFn) -> list[ServiceInfo]:
    """One to three autonomous services of random groups observing disjoint parts of the
    (source, type) space, what none observes being the mediator's own feed: one service
    observing everything, the types (or the sources) split between services and the own feed,
    or rectangles of source and type patterns at random."""
    groups = st.sampled_from(GROUPS)
    scheme = draw(st.sampled_from(["all", "types", "types", "sources", "rectangles"]))
    if scheme == "all":
        return [autonomous("s0", draw(groups))]
    if scheme in ("types", "sources"):
        values = "abc" if scheme == "types" else SOURCES
        owners = [draw(st.integers(-1, 2)) for _ in values]  # -1: the own feed
        out = []
        for i in sorted(set(owners) - {-1}):
            mine = tuple(v for v, o in zip(values, owners, strict=True) if o == i)
            out.append(autonomous(f"s{i}", draw(groups), *(((("*",), mine)) if scheme == "types"
                                                              else (mine, ("*",)))))
        return out
    out = []
    taken: set[tuple[str, str]] = set()
    for i in range(draw(st.integers(1, 3))):
        sources = draw(st.sampled_from([("*",), ("*",), ("s1",), ("s2",)]))
        types = draw(st.sampled_from([("*",), ("a",), ("b",), ("c",), ("a", "b"), ("b", "c"),
                                      ("a", "c")]))
        info = autonomous(f"s{i}", draw(groups), sources, types)
        if _cells(info) & taken:
            continue
        taken |= _cells(info)
        out.append(info)
    return out


class Service(InProcessLink):
    """An autonomous service in this process: its producers publish to it (the test), the
    mediator only subscribes (the federation) and reads what it says. A registration is
    durable: the same name subscribed again (a restarted mediator) is the same one."""

    def __init__(self, info: ServiceInfo, lang: Any) -> None:
        super().__init__(info, lang)
        self.named: dict[str, Handle] = {}

    def subscribe(self, text: str, name: str = "") -> Handle:
        if name and name in self.named:
            return self.named[name]
        handle = super().subscribe(text, name)
        if name:
            self.named[name] = handle
        return handle


@dataclass
class Input:
    """What one input of the merged trace does and what the mediator has received of it."""

    rank: int
    events: list[Event]
    link: Service | None = None  # None: the mediator's own feed
    sent: int = 0  # events published so far
    inbox: list[tuple[dict[Handle, list[Detection]], int, list[Event]]] = field(
        default_factory=list)
    watermark: int | None = None  # the newest the mediator has received


def merged(services: list[ServiceInfo], trace: list[Event]) -> dict[int, list[Event]]:
    """The trace split by input (rank 0: the own feed, then each service in order), each event
    renumbered with its place in the merged trace (``merged_seq``)."""
    parts: dict[int, list[Event]] = {rank: [] for rank in range(len(services) + 1)}
    for e in trace:
        rank = next((i + 1 for i, s in enumerate(services) if s.coverage.observes(e)), 0)
        parts[rank].append(e.renumbered(merged_seq(rank, len(parts[rank]))))
    return parts


def federated(doc: ast.Document, services: list[ServiceInfo], trace: list[Event],
              draw: random.Random, checkpoint: int | None = None) -> list[Notification]:
    """The document planned live over autonomous ``services``: each input publishes its part
    of the trace in batches of random sizes, the inputs in a random interleaving; what each
    says reaches the mediator after random delays, in order. The mediator starts the clock at
    the first event of any input (once every input with events has said where it starts),
    decides up to the smallest watermark of the federation's inputs after each delivery, and
    closes at the end, every service's clock run there. ``checkpoint``: after that many
    steps the mediator dies — its federation's state written as a checkpoint's data, read back
    into a new federation of the same plans, subscribed again under the same names — and goes
    on."""
    links: dict[str, Link] = {s.name: Service(s, language(s.group, 1)) for s in services}
    plans = [plan_federated(p, doc, services, live=True) for p in doc.profiles]
    federation = Federation(doc, plans, links, tick=1, owner="sub")
    inputs = [Input(rank, events, links[services[rank - 1].name] if rank else None)  # type: ignore[arg-type]
              for rank, events in merged(services, trace).items()]
    out: list[Notification] = []
    origin: int | None = None

    def bound() -> int | None:
        used = [i for i in inputs if i.events and (
            (i.link is None and federation.own_inputs)
            or (i.link is not None and i.link.info.name in federation.inputs))]
        marks = [i.watermark for i in used or [i for i in inputs if i.events]]
        return None if not marks or None in marks else min(m for m in marks if m is not None)

    def deliver(item: Input) -> None:
        detections, watermark, batch = item.inbox.pop(0)
        if item.link is None:
            federation.begin(batch)
            federation.take({})
        for handle, found in detections.items():
            assert item.link is not None
            assert not federation.learn(item.link.info.name, handle, found)
        item.watermark = watermark

    steps = 0
    while any(i.sent < len(i.events) or (i.inbox and origin is not None) for i in inputs):
        steps += 1
        if steps == checkpoint:
            data = json.loads(json.dumps(to_data(federation.export_state())))
            federation = Federation(doc, plans, links, tick=1, owner="sub")
            federation.import_state(from_data(data))
        item = draw.choice([i for i in inputs
                            if i.sent < len(i.events) or (i.inbox and origin is not None)])
        if item.inbox and origin is not None and (item.sent == len(item.events)
                                                  or draw.random() < 0.5):
            deliver(item)
        else:
            batch = item.events[item.sent:item.sent + draw.randint(1, 5)]
            item.sent += len(batch)
            detections = item.link.publish(batch) if item.link is not None else {}
            item.inbox.append((detections, batch[-1].time - 1, batch))
        if origin is None and all(i.inbox for i in inputs if i.events):
            origin = min(i.events[0].time for i in inputs if i.events) - 1
            federation.set_origin(origin)
        if origin is not None and (found := bound()) is not None:
            out.extend(federation.decide(found))
    if not trace:
        return out
    end = max(e.time for e in trace)
    for item in inputs:
        if item.link is not None:
            item.inbox.append((item.link.publish([], until=end), end, []))
        while item.inbox:
            deliver(item)
    out.extend(federation.close(end))
    federation.unsubscribe()
    return out


def reference(services: list[ServiceInfo], doc: ast.Document,
              trace: list[Event]) -> list[Notification]:
    """The reference over the merged trace (each event at its place, ``merged_seq``)."""
    events = sorted((e for part in merged(services, trace).values() for e in part),
                    key=lambda e: e.key)
    return evaluate(doc, events, tick=1)


def set_semantics(expr: ast.Expr, keep: random.Random) -> ast.Expr:
    """The expression with most of its operators at set semantics (every operand ``all_dup``,
    ``all_pairs``) — what the services' languages state — so that whole subtrees are pushed."""
    def operand(o: ast.Operand) -> ast.Operand:
        return ast.Operand(o.dup if keep.random() < 0.2 else ast.ALL, set_semantics(o.expr, keep))

    def pairs(given: ast.Pairs) -> ast.Pairs:
        return given if keep.random() < 0.2 else ast.Pairs.ALL

    if isinstance(expr, (ast.Disjunction, ast.Conjunction, ast.Sequence)):
        return replace(expr, left=operand(expr.left), right=operand(expr.right),
                       pairs=pairs(expr.pairs))
    if isinstance(expr, (ast.Negation, ast.Selection)):
        return replace(expr, expr=set_semantics(expr.expr, keep), pairs=pairs(expr.pairs))
    return expr


def binary(depth: int) -> st.SearchStrategy[ast.Expr]:
    """Disjunctions, conjunctions and sequences (depth ≤ ``depth``) over the classes — the
    operators every language but CG-0 states, so that services evaluate whole subtrees."""
    strategy: st.SearchStrategy[ast.Expr] = st.sampled_from(NAMES).map(ast.Prim)
    for _ in range(depth):
        operand = st.builds(ast.Operand, dups, strategy)
        strategy = st.one_of(strategy, st.builds(ast.Disjunction, operand, operand, pairs),
                             st.builds(ast.Conjunction, operand, operand, spans, pairs),
                             st.builds(ast.Sequence, operand, operand, spans, pairs))
    return strategy


@st.composite
def pushable(draw: st.DrawFn) -> ast.Document:
    """A profile of :func:`binary` operators, mostly at set semantics (:func:`set_semantics`),
    sometimes partitioned or evaluated at the end of intervals."""
    expr = set_semantics(draw(binary(3)), draw(st.randoms(use_true_random=False)))
    per = " per data.k" if draw(st.integers(0, 3)) == 0 else ""
    evaluation = " evaluate end_of_interval" if draw(st.integers(0, 3)) == 0 else ""
    return parse(FEDERATED_CLASSES + f"profile P{per}{evaluation} = {expr_text(expr)}\n")


@settings(max_examples=400, deadline=None, suppress_health_check=list(HealthCheck))
@given(doc=st.one_of(documents(3, FEDERATED_CLASSES, NAMES), pushable()),
       services=disjoint_services(),
       trace=traces(20, sources=SOURCES), draw=st.randoms(use_true_random=False))
def test_autonomous_services_deliver_the_reference_over_the_merged_trace(
        doc: ast.Document, services: list[ServiceInfo], trace: list[Event],
        draw: random.Random) -> None:
    """Issue 23: services of random groups, each observing a part of the events that its own
    producers publish to it (disjoint parts; the rest is the mediator's own feed); the mediator
    learns their events only from their notifications; batches, interleavings and delays at
    random: the composites are the reference's over the merged trace — to the report key."""
    got = federated(doc, services, trace, draw)
    exact = keyed if any(s.group == "cg5" for s in services) else signature
    assert exact(got) == exact(reference(services, doc, trace))


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(doc=st.one_of(documents(3, FEDERATED_CLASSES, NAMES), pushable()),
       services=disjoint_services(), trace=traces(20, sources=SOURCES),
       draw=st.randoms(use_true_random=False), at=st.integers(1, 40))
def test_a_federation_restored_from_its_checkpoint_decides_what_it_would_have(
        doc: ast.Document, services: list[ServiceInfo], trace: list[Event],
        draw: random.Random, at: int) -> None:
    """Issue 24.1: the federation's state written as data at a random step (the runner's
    held and learnt events, visibility, answers waiting, each partition's engines) and read
    back into a new federation of the same plans: it goes on to the reference's answer."""
    got = federated(doc, services, trace, draw, checkpoint=at)
    exact = keyed if any(s.group == "cg5" for s in services) else signature
    assert exact(got) == exact(reference(services, doc, trace))


# ------------------------------------------------------------------ planning


def doc_of(expr: str, per: str = "") -> ast.Document:
    return parse(FEDERATED_CLASSES + f"profile P{per} = {expr}\n")


def test_no_ticks_are_injected_into_an_autonomous_service() -> None:
    """(T; A) at a fed CG-3 service is transferring (the mediator publishes T's ticks to
    it); the mediator publishes nothing to an autonomous one, so T stays at the mediator."""
    doc = doc_of("((all_dup(T); all_dup(A))_5us)_all_pairs")
    fed = ServiceInfo("sql", "cg3", PRESETS["cg3"])
    assert isinstance(plan_federated(doc.profiles[0], doc, [fed]).root, Remote)
    p = plan_federated(doc.profiles[0], doc, [replace(fed, autonomous=True)])
    assert not isinstance(p.root, Remote)
    assert {(n.name, n.clock) for n in nodes(p.root) if isinstance(n, Subscribe)} == {("T", True)}


def test_a_class_split_between_autonomous_services_is_the_union_of_their_filters() -> None:
    """A (type a, any source) is observed partly by the service of source s1 and partly by
    that of s2: neither covers it, so it is subscribed at both — and at the own feed, unless
    they observe every source together."""
    doc = doc_of("((all_dup(A), all_dup(C))_5us)_all_pairs")
    by_source = [autonomous("one", "cg3", ("s1",)), autonomous("two", "cg3", ("s2",))]
    p = plan_federated(doc.profiles[0], doc, by_source)
    leaves = {n.name: n.sources for n in nodes(p.root) if isinstance(n, Subscribe)}
    assert leaves == {"A": (MEDIATOR, "one", "two"), "C": (MEDIATOR, "one", "two")}
    everything = [autonomous("one", "cg3", ("s1",)), autonomous("rest", "cg3", ("*",), ("c",))]
    p = plan_federated(doc.profiles[0], doc, everything)
    assert {n.name: n.sources for n in nodes(p.root) if isinstance(n, Subscribe)} == {
        "A": (MEDIATOR, "one")}
    assert {n.original for n in nodes(p.root) if isinstance(n, Remote)} == {ast.Prim("C")}


def test_a_fed_service_does_not_cover_a_class_an_autonomous_service_may_observe() -> None:
    """A fed service observes only the own feed: where an autonomous service may have events
    of a class, the fed service does not see all of them."""
    doc = doc_of("((all_dup(A); all_dup(B))_5us)_all_pairs")
    fed = ServiceInfo("sql", "cg3", PRESETS["cg3"])
    alone = plan_federated(doc.profiles[0], doc, [fed])
    assert isinstance(alone.root, Remote) and alone.root.service == "sql"
    p = plan_federated(doc.profiles[0], doc, [fed, autonomous("bs", "cg1", ("*",), ("b",))])
    assert not isinstance(p.root, Remote)
    assert {n.service for n in nodes(p.root) if isinstance(n, Remote)} == {"sql", "bs"}


def test_a_partition_of_a_clock_driven_profile_opens_at_an_event_no_composite_names() -> None:
    """T; (A; B) per key, (A; B) pushed to an autonomous service: a0 is in no composite, yet
    the reference opens the partition at a0, and T's tick at 16 lies after that. The plan
    observes A and B (their filters open partitions), so the mediator sees a0 too."""
    doc = doc_of("((all_dup(T); all_dup(((all_dup(A); all_dup(B))_2us)_all_pairs))_5us)"
                 "_all_pairs", " per data.k")
    services = [autonomous("s0", "cg3")]
    p = plan_federated(doc.profiles[0], doc, services, live=True)
    assert [(n.name, n.rule, n.sources) for n in p.observed] == [
        ("A", "partition_observer", ("s0",)), ("B", "partition_observer", ("s0",))]
    trace = [Event("a0", "s1", "a", 10, 0, {"k": 1}), Event("a1", "s1", "a", 17, 1, {"k": 1}),
             Event("b2", "s1", "b", 18, 2, {"k": 1})]
    want = reference(services, doc, trace)
    assert [n.occ.events[0] for n in want] == ["tick:T@1970-01-01T00:00:00.000016Z"]
    assert signature(federated(doc, services, trace, random.Random(1))) == signature(want)


# ------------------------------------------------------------------ the federation


def feeding(doc: ast.Document, services: list[ServiceInfo]) -> tuple[Federation, dict[str, Link]]:
    links: dict[str, Link] = {s.name: Service(s, language(s.group, 1)) for s in services}
    plans = [plan_federated(p, doc, services, live=True) for p in doc.profiles]
    return Federation(doc, plans, links, tick=1, owner="sub"), links


def test_what_a_service_reports_behind_a_decided_instant_is_late_not_evaluated() -> None:
    """A service left behind (the mediator stopped waiting for it) reports a composite whose
    events lie at or before an instant decided already: it is returned as late, and nothing
    it names reaches the answer."""
    doc = doc_of("((all_dup(A); all_dup(B))_2us)_all_pairs")
    federation, links = feeding(doc, [autonomous("s0", "cg3")])
    federation.set_origin(0)
    assert federation.decide(100) == []
    (handle,) = federation.handles["s0"]
    found = links["s0"].publish([Event("a1", "s1", "a", 10, 1), Event("b2", "s1", "b", 11, 2)])
    late = federation.learn("s0", handle, found[handle])
    assert [x.what for x in late] == ["event 'a1' of 's1' at 1970-01-01T00:00:00.000010Z",
                                     "event 'b2' of 's1' at 1970-01-01T00:00:00.000011Z"]
    assert federation.close(200) == []


def test_the_runners_state_stays_bounded_as_the_run_grows_tenfold() -> None:
    """Per key, a then b a second apart, (A; B) at an autonomous service and C's filter at
    another: after 2,000 and after 20,000 events, what the runner holds is the same."""
    doc = doc_of("((all_dup(((all_dup(A); all_dup(B))_2s)_all_pairs), all_dup(C))_3s)"
                 "_all_pairs", " per data.k")
    services = [autonomous("ab", "cg3", ("*",), ("a", "b")), autonomous("cs", "cg3", ("*",), ("c",))]

    def held(count: int) -> object:
        federation, links = feeding(doc, services)
        federation.set_origin(0)
        for i in range(count):
            kind = "abc"[i % 3]
            e = Event(f"e{i}", "s", kind, (i + 1) * 1_000_000,
                      merged_seq(1 if kind != "c" else 2, i), {"k": i // 3})
            name = "ab" if kind != "c" else "cs"
            for handle, found in links[name].publish([e]).items():
                assert not federation.learn(name, handle, found)
            federation.decide(e.time - 1)
        return federation.stats()

    assert held(2_000) == held(20_000)
