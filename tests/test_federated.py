"""Federated plans (transforms.federated) through many services (adapters.federation): what
"covers" means, how a subtree is assigned and ties are broken, and — the property of issue 13
item 1 — that delivery through services of random groups and coverage equals the reference
evaluator over the merged trace, batch by batch as the mediator's pipeline runs it."""

from __future__ import annotations

import random
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from adapters.backends.registry import GROUPS, language
from adapters.federation import TICK_SEQ, Federation, publish, through_group
from adapters.links import InProcessLink, Link
from eva import ast
from eva.classes import label, ticks_between
from eva.events import Event, from_cloudevent, tick_event
from eva.parser import parse
from eva.printer import expr_text
from eva.reference import evaluate
from eva.semantics import Notification
from tests.helpers import signature
from tests.strategies import CLASSES, documents, expressions, trace_of, traces
from transforms.capability import PRESETS
from transforms.explanation import as_json, explain
from transforms.federated import MEDIATOR, Coverage, ServiceInfo, covers, plan_federated
from transforms.planner import plan
from transforms.plans import Kind, Local, Plan, PlanNode, Remote, Subscribe, nodes

SOURCES = ("s1", "s2")
FEDERATED_CLASSES = CLASSES + 'class A1 = source == "s1" and type == "a"\n'
"""The strategies' classes, and one pinned to a source (covered by a service of that source)."""
NAMES = ["A", "B", "C", "AB", "A1", "T"]


def service(name: str, group: str, sources: tuple[str, ...] = ("*",),
            types: tuple[str, ...] = ("*",)) -> ServiceInfo:
    return ServiceInfo(name, group, PRESETS[group], Coverage(sources, types))


def doc_of(expr: str, per: str = "") -> ast.Document:
    return parse(FEDERATED_CLASSES + f"profile P{per} = {expr}\n")


def assigned(p: Plan) -> dict[str, str]:
    """The service of each leaf, by the leaf's expression."""
    return {expr_text(n.original) if isinstance(n, Remote) else n.name: n.service
            for n in nodes(p.root) if isinstance(n, (Remote, Subscribe))}


# ------------------------------------------------------------------ covers


def test_a_service_covers_a_class_when_it_observes_every_event_of_it() -> None:
    doc = parse(Path("examples/logistics/profiles.eva").read_text()
                + 'class Anything = data.area == "A"\n'
                + 'class Pinned = source == "urn:jams" and type == "traffic.jam"\n'
                + 'class Either = type in ["traffic.jam", "truck.location"]\n')
    classes = doc.class_map()
    jams = service("jams", "cg3", types=("traffic.*",))
    everything = service("all", "cg3")
    one_source = service("one", "cg3", sources=("urn:jams",))
    assert covers(jams, classes["Jam"], classes)
    assert not covers(jams, classes["TruckA"], classes)
    assert not covers(jams, classes["Either"], classes)  # every required type, not one
    assert covers(service("both", "cg3", types=("traffic.jam", "truck.*")), classes["Either"],
                  classes)
    # A class that names no type: only a service observing every type.
    assert not covers(jams, classes["Anything"], classes)
    assert covers(everything, classes["Anything"], classes)
    # Sources: all of them, unless the class pins its source.
    assert not covers(one_source, classes["Jam"], classes)
    assert covers(one_source, classes["Pinned"], classes)
    assert not covers(service("other", "cg3", sources=("urn:trucks",)), classes["Pinned"], classes)
    # A time class: every service (ticks injected, or its own clock).
    assert covers(service("none", "cg3", ("x",), ("y",)), classes["At2pm"], classes)


# ------------------------------------------------------------------ assignment


def test_equivalent_before_positive_whatever_the_configured_order() -> None:
    """CG-1 has no sequence (a conjunction, post-filtered: positive); CG-3 states it."""
    doc = doc_of("((all_dup(A); all_dup(B))_5us)_all_pairs")
    boolean, sql = service("boolean", "cg1"), service("sql", "cg3")
    for services in ([boolean, sql], [sql, boolean]):
        p = plan_federated(doc.profiles[0], doc, services)
        assert isinstance(p.root, Remote) and p.root.service == "sql", p.root
        assert p.root.kind is Kind.EQUIVALENT
        assert "boolean: only positively" in p.root.why
    alone = plan_federated(doc.profiles[0], doc, [boolean])
    assert isinstance(alone.root, Remote) and alone.root.kind is Kind.POSITIVE


def test_ties_go_to_fewer_auxiliary_streams_then_to_the_configured_order() -> None:
    """(T; A): CG-3 needs the ticks published (transferring, one auxiliary stream); a peer
    mediator (CG-5) has its own clock — it wins the tie though listed second. Two equal
    services: the first configured."""
    doc = doc_of("((all_dup(T); all_dup(A))_5us)_all_pairs")
    sql, peer = service("sql", "cg3"), service("peer", "cg5")
    p = plan_federated(doc.profiles[0], doc, [sql, peer])
    assert isinstance(p.root, Remote) and p.root.service == "peer"
    assert "sql: with more post-filters or auxiliary streams" in p.root.why
    first, second = service("first", "cg3"), service("second", "cg3")
    for order in ([first, second], [second, first]):
        p = plan_federated(doc.profiles[0], doc, order)
        assert isinstance(p.root, Remote) and p.root.service == order[0].name
        assert f"{order[1].name}: later in the configured order" in p.root.why


def test_a_subtree_no_service_covers_is_decomposed_and_a_class_none_covers_is_the_mediators_own(
        ) -> None:
    doc = doc_of("((all_dup(A); all_dup((all_dup(B) | all_dup(C))_all_pairs))_5us)_all_pairs")
    services = [service("as", "cg3", types=("a",)), service("bcs", "cg2", types=("b", "c"))]
    p = plan_federated(doc.profiles[0], doc, services)
    assert isinstance(p.root, Local) and p.root.why == "no service covers all of A, B and C"
    assert assigned(p) == {"A": "as", "(all_dup(B) | all_dup(C))_all_pairs": "bcs"}
    only_a = plan_federated(doc.profiles[0], doc, services[:1])
    assert assigned(only_a) == {"A": "as", "B": MEDIATOR, "C": MEDIATOR}
    assert {n.why for n in nodes(only_a.root) if isinstance(n, Subscribe)} == {
        "no service covers B", "no service covers C"}


def test_a_class_pinned_to_a_source_goes_to_the_service_of_that_source() -> None:
    doc = doc_of("((all_dup(A1), all_dup(B))_5us)_all_pairs")
    services = [service("one", "cg3", sources=("s1",)), service("all", "cg3", types=("b",))]
    assert assigned(plan_federated(doc.profiles[0], doc, services)) == {"A1": "one", "B": "all"}


def test_a_peer_takes_a_whole_profile_and_a_clock_only_over_every_event() -> None:
    """A peer mediator's answers carry its own report keys: it takes a whole profile or
    nothing. It starts its clock (and a partition) at the first event it observes: a time
    class or a negation is exact there only if it observes every event."""
    expr = "((all_dup(T); all_dup(A))_5us)_all_pairs"
    doc = doc_of(expr)
    partial, whole = service("peer", "cg5", types=("a",)), service("peer", "cg5")
    p = plan_federated(doc.profiles[0], doc, [partial])
    assert isinstance(p.root, Local)
    assert "peer: its own clock starts at the first event it observes" in p.root.why
    assert isinstance(plan_federated(doc.profiles[0], doc, [whole]).root, Remote)
    nested = doc_of(f"((all_dup(B); all_dup({expr}))_9us)_all_pairs", " per data.k")
    assert isinstance(plan_federated(nested.profiles[0], nested, [whole]).root, Remote)
    p = plan_federated(nested.profiles[0], nested, [whole, service("as", "cg3", types=("a",))])
    assert isinstance(p.root, Remote) and p.root.service == "peer"
    p = plan_federated(nested.profiles[0], nested, [partial, service("bs", "cg3", types=("b",))])
    assert assigned(p) == {"B": "bs", "T": MEDIATOR, "A": MEDIATOR}  # not a part of a profile
    own = next(n for n in nodes(p.root) if isinstance(n, Subscribe) and n.name == "A")
    assert own.why == ("covered by peer; peer: a peer mediator takes a whole profile (its "
                       "answers carry its own report keys)")


def test_one_service_observing_everything_plans_as_the_single_service_planner() -> None:
    """plan() is the special case: the same tree, the leaves named by the service (the
    reasons aside: plan() gives one only where a relaxing is refused as unsound)."""

    def bare(node: PlanNode) -> PlanNode:
        if isinstance(node, Local):
            return replace(node, children=tuple(bare(c) for c in node.children), why="")
        return replace(node, service="", why="")

    @settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
    @given(st.sampled_from(GROUPS), expressions(3, NAMES), st.booleans())
    def prop(group: str, expr: ast.Expr, per: bool) -> None:
        doc = doc_of(expr_text(expr), " per data.k" if per else "")
        profile = doc.profiles[0]
        federated = plan_federated(profile, doc, [service(group, group)])
        assert bare(federated.root) == bare(plan(profile, doc, PRESETS[group]).root)
        assert {n.service for n in nodes(federated.root) if isinstance(n, Remote)} <= {group}

    prop()


def test_service_names_are_unique_and_not_the_mediators() -> None:
    doc = doc_of("A")
    for names in (["x", "x"], ["", "y"]):
        with pytest.raises(ValueError, match="service names must be unique and not empty"):
            plan_federated(doc.profiles[0], doc, [service(n, "cg3") for n in names])


def test_explain_shows_the_assignment_and_why_and_leaves_single_service_plans_as_they_were(
        ) -> None:
    from rich.console import Console

    def text(p: Plan) -> str:
        console = Console(record=True, width=200, color_system=None)
        console.print(explain(p))
        return console.export_text()

    doc = doc_of("((all_dup(A); all_dup(B))_5us)_all_pairs")
    services = [service("boolean", "cg1"), service("sql", "cg3")]
    p = plan_federated(doc.profiles[0], doc, services)
    shown = text(p)
    assert "P over boolean (cg1), sql (cg3)" in shown
    assert "service sql evaluates: ((all_dup(A); all_dup(B))_5us)_all_pairs" in shown
    assert ("why: covered by boolean and sql; sql pushes it equivalently; boolean: only "
            "positively") in shown
    record = as_json(p)
    assert record["services"] == [{"name": "boolean", "group": "cg1"},
                                  {"name": "sql", "group": "cg3"}]
    assert record["root"]["service"] == "sql" and record["root"]["why"].startswith("covered by")
    single = plan(doc.profiles[0], doc, PRESETS["cg3"])
    assert "service evaluates:" in text(single) and "why" not in text(single)
    assert set(as_json(single)) == {"profile", "group", "kind", "root"}
    assert "service" not in as_json(single)["root"]
    own = plan_federated(doc.profiles[0], doc, [service("as", "cg3", types=("a",))])
    assert "mediator's own feed: B" in text(own) and "no service covers B" in text(own)


# ------------------------------------------------------------------ delivery through links


def links_for(services: list[ServiceInfo]) -> dict[str, Link]:
    return {s.name: InProcessLink(s, language(s.group, 1)) for s in services}


def keyed(notes: list[Notification]) -> list[tuple[object, ...]]:
    """The report key but for its tiebreak, which a peer mediator (CG-5) numbers its own
    way (tests/test_runner.py)."""
    return [(n.profile, n.partition, n.occ.events, n.occ.time, n.emitted[:2]) for n in notes]


def delivered(doc: ast.Document, services: list[ServiceInfo], trace: list[Event],
              sizes: list[int] | None = None, live: bool = False) -> list[Notification]:
    """Every profile planned over ``services`` (``live``: as a running mediator plans it) and
    run through in-process links: in batches
    of ``sizes`` (cycled) the way the pipeline runs them — begin, publish once per link,
    finish — or, without ``sizes``, pushed one event at a time; then closed."""
    links = links_for(services)
    plans = [plan_federated(p, doc, services, live=live) for p in doc.profiles]
    federation = Federation(doc, plans, links, tick=1)
    out: list[Notification] = []
    at, turn = 0, 0
    while at < len(trace):
        if not sizes:
            out.extend(federation.push([trace[at]]))
            at += 1
            continue
        size = sizes[turn % len(sizes)]
        batch, at, turn = trace[at:at + size], at + size, turn + 1
        ticks = federation.begin(batch)
        out.extend(federation.finish(publish(links, batch, ticks), batch[-1].time))
    out.extend(federation.close())
    federation.unsubscribe()
    assert all(not hs for hs in federation.handles.values())
    return out


coverages = st.tuples(
    st.sampled_from([("*",), ("*",), ("*",), ("s1",), ("s2",), ("s1", "s2")]),
    st.sampled_from([("*",), ("*",), ("a", "b"), ("b", "c"), ("a", "c"), ("a", "b", "c"),
                     ("a",), ("b",), ("c",)]))
"""Coverage by source and type, mostly of every source: the classes but A1 leave the source
open, so a service of some sources covers only A1."""


@st.composite
def service_sets(draw: st.DrawFn) -> list[ServiceInfo]:
    count = draw(st.integers(1, 3))
    out = []
    for i in range(count):
        sources, types = draw(coverages)
        out.append(service(f"s{i}", draw(st.sampled_from(GROUPS)), sources, types))
    return out


SCENARIOS = {"doc": documents(3, FEDERATED_CLASSES, NAMES), "services": service_sets(),
             "trace": traces(20, sources=SOURCES),
             "sizes": st.lists(st.integers(1, 8), min_size=1, max_size=4),
             "live": st.booleans()}
"""A profile, services of random groups and coverage, a merged trace, batch sizes, and
whether it is planned as a running mediator plans it."""


@settings(max_examples=400, deadline=None, suppress_health_check=list(HealthCheck))
@given(**SCENARIOS)
def test_delivery_through_random_services_equals_the_reference_on_the_merged_trace(
        doc: ast.Document, services: list[ServiceInfo], trace: list[Event],
        sizes: list[int], live: bool) -> None:
    """Issue 13 item 1: services of random groups, each observing part of the events (by
    source and type); each link is published what its service observes, in batches of random
    sizes; the composites are the reference's over the merged trace — to the report key."""
    got = delivered(doc, services, trace, sizes, live)
    exact = keyed if any(s.group == "cg5" for s in services) else signature
    assert exact(got) == exact(evaluate(doc, trace, tick=1))


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(**SCENARIOS)
def test_batches_of_random_sizes_decide_what_event_by_event_decides(
        doc: ast.Document, services: list[ServiceInfo], trace: list[Event],
        sizes: list[int], live: bool) -> None:
    """begin/publish/finish over batches (an instant may be split between two) gives the
    composites of pushing the events one at a time, in the same order."""
    assert (delivered(doc, services, trace, sizes, live)
            == delivered(doc, services, trace, live=live))


def joining(docs: list[tuple[ast.Document, int]], services: list[ServiceInfo],
            batches: list[list[Event]], links: dict[str, Link] | None = None
            ) -> list[list[Notification]]:
    """Each document planned live and subscribed as its own federation after its number of
    batches (as the pipeline adds a subscription between batches: it sees the events after
    the newest one evaluated), over ``links`` (default: fresh ones), the batches run as the
    pipeline runs them — every federation begins, each link is published once with the ticks
    they all ask of it, every federation finishes — then a watermark at the end and each
    closed: every federation's composites."""
    links = links if links is not None else links_for(services)
    feds: dict[int, Federation] = {}
    newest: int | None = None
    end = max((b[-1].time for b in batches if b), default=0) + 1

    def round_(events: list[Event], until: int | None, newest: int) -> None:
        ticks: dict[str, list[Event]] = {}
        for fed in feds.values():
            for name, asked in fed.begin(events, until).items():
                ticks.setdefault(name, []).extend(asked)
        detections = publish(links, events, ticks, until)
        for i, fed in feds.items():
            out[i].extend(fed.finish(detections, newest))

    out: list[list[Notification]] = [[] for _ in docs]
    for at, batch in enumerate([*batches, []]):
        for i, (doc, after) in enumerate(docs):
            if after == at:
                plans = [plan_federated(p, doc, services, live=True) for p in doc.profiles]
                feds[i] = Federation(doc, plans, links, tick=1, start=newest)
        if batch:
            round_(batch, None, batch[-1].time)
            newest = batch[-1].time
    round_([], end, end + 1)
    for i, fed in feds.items():
        out[i].extend(fed.close(end))
        fed.unsubscribe()
    return out


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(docs=st.lists(documents(2, FEDERATED_CLASSES, NAMES), min_size=1, max_size=3),
       services=service_sets(), trace=traces(16, sources=SOURCES),
       size=st.integers(1, 6), data=st.data())
def test_federations_sharing_memoryless_subscriptions_decide_what_each_alone_decides(
        docs: list[ast.Document], services: list[ServiceInfo], trace: list[Event], size: int,
        data: st.DataObject) -> None:
    """Federations joining a running trace at random batches over the same links — where a
    leaf of one class of events renders the same text, they share one subscription — decide
    exactly what each decides over links of its own, joined at the same batch; and the last
    to let go of a shared subscription unsubscribes it. The same documents join more than
    once, so that queries which remember are subscribed again too (each its own)."""
    batches = [trace[i:i + size] for i in range(0, len(trace), size)]
    joins = [(data.draw(st.sampled_from(docs)), data.draw(st.integers(0, len(batches))))
             for _ in range(data.draw(st.integers(2, 4)))]
    links = links_for(services)
    together = joining(joins, services, batches, links)
    assert together == [joining([j], services, batches)[0] for j in joins]
    assert all(not link._subs for link in links.values())  # type: ignore[attr-defined]


def test_a_leaf_of_one_class_is_subscribed_once_a_sequence_once_per_federation() -> None:
    services = [service("sql", "cg3", types=("a", "c")), service("snoop", "cg2", types=("b",))]
    links = links_for(services)

    def federation(expr: str) -> Federation:
        doc = doc_of(expr)
        return Federation(doc, [plan_federated(doc.profiles[0], doc, services, live=True)],
                          links)

    split = [federation("((all_dup(A); all_dup(B))_5s)_all_pairs") for _ in range(3)]
    assert all(f.rendered == ['SELECT a1.id FROM "a" AS a1', "b CONTEXT unrestricted"]
               for f in split)
    assert len({(f.handles["sql"][0], f.handles["snoop"][0]) for f in split}) == 1
    whole = [federation("((all_dup(A); all_dup(C))_5s)_all_pairs") for _ in range(2)]
    assert len({f.handles["sql"][0] for f in whole}) == 2  # a sequence remembers
    assert [len(link._subs) for link in links.values()] == [3, 1]  # type: ignore[attr-defined]
    for fed in [*split, *whole]:
        fed.unsubscribe()
        assert all(h in link._subs for name, link in links.items()  # type: ignore[attr-defined]
                   for f in [*split, *whole] if f._of for h in f.handles[name])
    assert all(not link._subs for link in links.values())  # type: ignore[attr-defined]


def test_a_peers_leaf_of_one_class_remembers_and_is_not_shared() -> None:
    """A peer mediator evaluating profile `A` at the end of intervals holds a1 until its
    clock moves on: a federation joining after a1 must not be told of it (as it would be over
    a shared subscription)."""
    peer = [service("peer", "cg5")]
    doc = doc_of("A", " evaluate end_of_interval")
    joins = [(doc, 0), (doc, 1)]
    got = joining(joins, peer, [trace_of("a1@10")])
    assert got == [joining([j], peer, [trace_of("a1@10")])[0] for j in joins]
    assert [len(notes) for notes in got] == [1, 0]


def logistics_day() -> tuple[ast.Document, list[Event]]:
    from examples.logistics.generate import day

    doc = parse(Path("examples/logistics/profiles.eva").read_text())
    return doc, [from_cloudevent(e, i) for i, e in enumerate(day(7))]


def test_p1_is_a_cross_source_composite_of_a_snoop_and_an_sql_service() -> None:
    """P1 (EVA §3.1): Jam observed by a CG-2 (Snoop) service of traffic events, TruckA by a
    CG-3 (SQL) service of truck events; the mediator composes them. Delivery equals the
    reference over the merged day, event by event and in the pipeline's batches."""
    doc, trace = logistics_day()
    p1 = replace(doc, profiles=(doc.profile("P1"),))
    services = [service("traffic", "cg2", types=("traffic.jam",)),
                service("trucks", "cg3", types=("truck.*",))]
    p = plan_federated(p1.profiles[0], p1, services)
    assert isinstance(p.root, Local) and assigned(p) == {"Jam": "traffic", "TruckA": "trucks"}
    # P1's classes leave the source open: a service observing some sources covers neither.
    by_source = [replace(s, coverage=Coverage(sources=(f"urn:logistics:{s.coverage.types[0]}",)))
                 for s in services]
    assert assigned(plan_federated(p1.profiles[0], p1, by_source)) == {
        "Jam": MEDIATOR, "TruckA": MEDIATOR}
    want = evaluate(p1, trace, tick=1)
    assert len(want) > 3
    for sizes in (None, [50], [7, 1, 300]):
        assert signature(delivered(p1, services, trace, sizes)) == signature(want)


def test_the_papers_profiles_over_a_service_per_source_equal_the_reference() -> None:
    """All of P1–P7 over four services of different groups, one per kind of source; what no
    service covers (cancellations, pickups) is the mediator's own feed."""
    doc, trace = logistics_day()
    services = [service("traffic", "cg2", types=("traffic.*",)),
                service("locations", "cg3", types=("truck.location",)),
                service("trips", "cg5", types=("truck.departure", "truck.arrival")),
                service("goods", "cg4", types=("goods.delivery",))]
    want = evaluate(doc, trace, tick=1)
    got = delivered(doc, services, trace, [64])
    assert keyed(got) == keyed(want) and len(want) > 20


# ------------------------------------------------------------------ the links' progress


@pytest.mark.parametrize("group", GROUPS)
def test_a_link_has_reported_every_instant_before_its_batchs_newest(group: str) -> None:
    """The pipeline decides up to T - 1 once a link has published a batch whose newest event
    is at T. For every group's evaluator: whatever a fresh link reports for the events before
    T and its clock run to T - 1 has already been reported, in the same order."""
    @settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
    @given(documents(3, FEDERATED_CLASSES, NAMES), traces(16, sources=SOURCES),
           st.randoms(use_true_random=False))
    def prop(doc: ast.Document, trace: list[Event], draw: random.Random) -> None:
        info = service(group, group)
        texts = through_group(language(group, 1), doc, tick=1).rendered
        if not texts or not trace:
            return
        # The stream a service without a clock is published: the events and T's ticks.
        every = doc.class_map()["T"].body
        assert isinstance(every, ast.Every)
        ticks = [tick_event("T", t, label(t), TICK_SEQ + i) for i, t in enumerate(
            ticks_between(every, trace[0].time - 1, trace[-1].time))]
        stream = sorted([*trace, *(ticks if not info.capability.clock else [])],
                        key=lambda e: e.key)
        link = InProcessLink(info, language(group, 1))
        handles = [link.subscribe(text) for text in texts]
        so_far: dict[str, list[object]] = {h: [] for h in handles}
        at = 0
        while at < len(stream):
            batch = stream[at:at + draw.randint(1, 5)]
            at += len(batch)
            for h, found in link.publish(batch).items():
                so_far[h].extend(found)
            newest = batch[-1].time
            fresh = InProcessLink(info, language(group, 1))
            again = [fresh.subscribe(text) for text in texts]
            before = fresh.publish([e for e in stream if e.time < newest], until=newest - 1)
            for h, h2 in zip(handles, again, strict=True):
                assert so_far[h][:len(before[h2])] == before[h2], (group, newest)

    prop()


def test_a_live_plan_pushes_nothing_the_mediator_could_decide_only_at_the_end() -> None:
    """A running mediator's input has no end: a subtree whose answers could name an event at
    any later time (an _inf frame at set semantics) is composed at the mediator instead; a
    bounded one is still pushed."""
    everything = [service("sql", "cg3")]
    unbounded = doc_of("((all_dup(A), all_dup(B))_inf)_all_pairs")
    bounded = doc_of("((all_dup(A), all_dup(B))_5s)_all_pairs")
    assert isinstance(plan_federated(unbounded.profiles[0], unbounded, everything).root, Remote)
    live = plan_federated(unbounded.profiles[0], unbounded, everything, live=True)
    assert isinstance(live.root, Local)
    assert "nothing would be decided before the input ends" in live.root.why
    assert set(assigned(live).values()) == {"sql"}  # its operands still come from the service
    pushed = plan_federated(bounded.profiles[0], bounded, everything, live=True)
    assert isinstance(pushed.root, Remote) and pushed.root.service == "sql"
