"""The incremental plan runner (transforms.runner) gives the reference's answer for every group
(CG-0 … CG-5) — to the report key — with the groups' real native services in process, and it
decides as the trace streams through, as late as visibility requires and no later."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import astuple

import pytest
from hypothesis import HealthCheck, given, settings

from adapters.backends.registry import GROUPS, language
from adapters.federation import Federation, through_group, via
from eva import ast
from eva.events import Event
from eva.parser import parse
from eva.reference import evaluate
from eva.semantics import Notification
from tests.helpers import profile_doc, signature
from tests.strategies import CLASSES, documents, trace_of, traces
from transforms import runner
from transforms.evaluate import evaluate_plans
from transforms.planner import plan


def streamed(group: str, doc: ast.Document, trace: list[Event]) -> list[tuple[int, Notification]]:
    """(events pushed so far, composite) for each composite, as the federation decides it."""
    federation = through_group(language(group, 1), doc, tick=1)
    out: list[tuple[int, Notification]] = []
    for count, event in enumerate(trace, start=1):
        out.extend((count, n) for n in federation.push([event]))
    out.extend((len(trace) + 1, n) for n in federation.close())
    return out


def keyed(notes: list[Notification]) -> list[tuple[object, ...]]:
    """What a composite is and when it is reported: its report key but for the tiebreak,
    which the peer mediator (CG-5) numbers its own way (its time classes by its own document,
    its events by its own arrival)."""
    return [(n.profile, n.partition, n.occ.events, n.occ.time, n.emitted[:2]) for n in notes]


@pytest.mark.parametrize("group", GROUPS)
def test_runner_equals_the_reference_and_the_plan_oracle_on_random_profiles_and_traces(
        group: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runner, "TRIM_AT", 1)  # key tables trimmed as soon as they can be
    @settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck))
    @given(documents(3), traces())
    def prop(doc: ast.Document, trace: list[Event]) -> None:
        got = [n for _, n in streamed(group, doc, trace)]
        exact = signature if group != "cg5" else keyed
        assert exact(got) == exact(evaluate(doc, trace, tick=1))
        cap = language(group).capability
        oracle = evaluate_plans([plan(p, doc, cap) for p in doc.profiles], doc, trace, tick=1)
        assert exact(got) == exact(oracle)

    prop()


def test_a_partition_opens_at_its_first_event_not_at_its_first_visible_one() -> None:
    """CG-3 evaluates (T; A)_5 with injected ticks; b1 opens partition k=1 at 10, before any
    A: the tick at 12 belongs to it and pairs with a1@14, as the reference has it."""
    doc = profile_doc(" per data.k = ((all_dup(B); all_dup(((all_dup(T); all_dup(A))_5us)"
                      "_all_pairs))_20us)_all_pairs")
    trace = [Event("b1", "s", "b", 10, 0, {"k": 1}), Event("a1", "s", "a", 14, 1, {"k": 1})]
    want = evaluate(doc, trace, tick=1)
    assert [n.occ.events for n in want] == [("b1", "tick:T@1970-01-01T00:00:00.000012Z", "a1")]
    for group in GROUPS:
        assert signature([n for _, n in streamed(group, doc, trace)]) == signature(want), group


def test_bounded_plans_report_as_the_trace_streams_and_unbounded_ones_at_its_end() -> None:
    """A timed conjunction at SQL (CG-3) is final once the service is past its span: reported
    before the input ends. CG-1 has no time frames, so its relaxed target is timeless: an event
    may become visible at any later time, and the runner holds everything until the end."""
    doc = profile_doc(" = ((all_dup(A), all_dup(B))_2us)_all_pairs")
    trace = trace_of("a1@1 b1@2 c1@10 c2@20 a2@30 b2@31 c3@40")
    on_sql = streamed("cg3", doc, trace)
    assert [(count, n.occ.events) for count, n in on_sql] == [(3, ("a1", "b1")), (7, ("a2", "b2"))]
    on_boolean = streamed("cg1", doc, trace)
    assert {count for count, _ in on_boolean} == {len(trace) + 1}
    assert [n.occ.events for _, n in on_boolean] == [n.occ.events for _, n in on_sql]


def test_via_takes_an_iterator_and_ends_where_it_is_told(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The events stream in (a generator: each is pushed before the next is drawn, nothing
    collected first) and ``end`` cuts the trace as the reference does; an event out of time
    order is refused, naming both events."""
    doc = profile_doc(" = ((all_dup(A); all_dup(B))_5us)_all_pairs")
    trace = trace_of("a1@1 b1@3 a2@7 b2@9")
    steps: list[str] = []
    push = Federation.push

    def pushed(self: Federation, events: list[Event]) -> list[Notification]:
        steps.extend(f"push {event.id}" for event in events)
        return push(self, events)

    monkeypatch.setattr(Federation, "push", pushed)

    def drawn(events: list[Event]) -> Iterator[Event]:
        for event in events:
            steps.append(f"draw {event.id}")
            yield event

    for group in GROUPS:
        steps.clear()
        got, _, _ = via(language(group), doc, drawn(trace), end=8)
        assert signature(got) == signature(evaluate(doc, trace, end=8)), group
        assert steps == [f"{step} {e.id}" for e in trace for step in ("draw", "push")], group
    with pytest.raises(ValueError, match=r"event 'b1' .* comes after 'a2' .* expected the "
                       "events in time order"):
        via(language("cg3"), doc, drawn([trace[0], trace[2], trace[1]]))


def test_a_rerun_composite_reported_at_a_tick_is_ordered_with_the_outer_tick_and_close() -> None:
    """The (A, T) re-run of a positive rule completes on T's tick at 12 and is reported at the
    tick's key; the outer end-of-interval disjunction has T on its left, so the outer tick at
    12 comes first in the trace view, then the fed composite (Engine.feed at its report key;
    stepped at phase 0, before the tick, it came out in another order)."""
    doc = profile_doc(" evaluate end_of_interval = (first_dup(T) | all_dup((first_dup(A) | "
                      "all_dup(((last_dup(A), last_dup(T))_1us)_all_pairs))_all_pairs))_all_pairs")
    for text in ["a1@10 a2@12 b1@13", "a1@12 b1@13", "a1@11 a2@12 a3@12 b1@16"]:
        trace = trace_of(text)
        want = evaluate(doc, trace, tick=1)
        for group in GROUPS:
            exact = signature if group != "cg5" else keyed
            got = [n for _, n in streamed(group, doc, trace)]
            assert exact(got) == exact(want), (text, group)


@pytest.mark.parametrize("group", GROUPS)
def test_a_repeated_pairs_composite_reported_again_later_is_stepped_at_its_report(
        group: str) -> None:
    """The re-run of ((last_dup(A); last_dup(C))_1us)_repeated_pairs reports (a1, c3) and,
    again, the older (a0, c2) at c3's step (12, 0, 3). Fed to the outer <L0> at its own time,
    11, after (a1, c3) had moved the feeds' watermark to 12, it was refused as late (a crash);
    it is stepped at its report key, as the trace view places it."""
    doc = profile_doc(" evaluate end_of_interval = (first_dup(A) | first_dup((first_dup(A) | "
                      "first_dup(((last_dup(A); last_dup(C))_1us)_repeated_pairs))_all_pairs))"
                      "_all_pairs")
    trace = trace_of("a0@10 a1@11 c2@11 c3@12")
    exact = signature if group != "cg5" else keyed
    got = [n for _, n in streamed(group, doc, trace)]
    assert exact(got) == exact(evaluate(doc, trace, tick=1))
    oracle = evaluate_plans([plan(p, doc, language(group).capability) for p in doc.profiles],
                            doc, trace, tick=1)
    assert exact(got) == exact(oracle)


@pytest.mark.parametrize("group", ["cg2", "cg3"])
@pytest.mark.parametrize(("expr", "text"), [
    ("(first_dup(A) | first_dup(((last_dup(A); first_dup(B))_1us)_all_pairs))_all_pairs",
     "a0@10 a1@11 b2@11"),
    ("(first_dup(A) | first_dup((first_dup(A) | first_dup(((last_dup(A); first_dup(C))_1us)"
     "_all_pairs))_all_pairs))_all_pairs", "a0@10 a1@11 c2@11")])
def test_a_last_dup_anterior_hidden_by_the_service_is_still_the_last(
        group: str, expr: str, text: str) -> None:
    """A positive rule's post-filter on a sequence with an anterior last_dup saw only the
    visible A's: a1 is in no composite (b2 is at its instant), so the re-run took a0 as the
    last A. Such a sequence is now composed at the mediator over its whole operands
    (transforms.rules.hidden_operands); the plan oracle agrees."""
    doc = profile_doc(f" evaluate end_of_interval = {expr}")
    trace = trace_of(text)
    got = [n for _, n in streamed(group, doc, trace)]
    want = evaluate(doc, trace, tick=1)
    assert signature(got) == signature(want)
    oracle = evaluate_plans([plan(p, doc, language(group).capability) for p in doc.profiles],
                            doc, trace, tick=1)
    assert signature(oracle) == signature(want)


def state_size(group: str, per: str, count: int) -> tuple[int, int]:
    """(partitions kept, key-table entries) after ``count`` events of keys that live for two
    events each (a then b, a second apart): what a long-running runner holds."""
    doc = profile_doc(f"{per} = ((all_dup(A); all_dup(B))_2s)_all_pairs")
    federation = through_group(language(group, 1_000_000), doc)
    for i in range(count):
        federation.push([Event(f"e{i}", "s", "ab"[i % 2], (i + 1) * 1_000_000, i,
                               {"k": i // 2})])
    partitions = federation.runner.profiles[0].partitions.values()
    engines = [e for part in partitions
               for e in [*part.rerun.values(), *([part.outer] if part.outer else [])]]
    return len(partitions), sum(len(e.keys) + len(e.local) for e in engines)


@pytest.mark.parametrize("group", ["cg3", "cg5"])
@pytest.mark.parametrize("per", [" per data.k", ""])
def test_state_stays_bounded_as_the_trace_grows(group: str, per: str) -> None:
    """Partitions at rest are dropped and key tables trimmed below what no report can name:
    ten times the events, the same state (a complexity check, not a timing)."""
    small, large = state_size(group, per, 400), state_size(group, per, 4000)
    assert large[0] <= 4 and large[1] <= 200, (small, large)
    assert large[0] <= small[0] + 1 and large[1] <= small[1] + 64, (small, large)


def test_a_post_filter_drop_is_counted_once_when_the_rerun_can_no_longer_report_it() -> None:
    """SQL (CG-3) has no last_dup: it answers every (A, B) within 3 µs, and the re-run of the
    original keeps the last A's. (a1, b1) is dropped once the runner is past 1 + 3 µs (at c1),
    (a3, b2) and (a3, b3) once past 20 + 3 µs (at c2); the kept answers are no drops, and
    nothing is left for the end. (A sequence with 2_dup was the example: it is composed at the
    mediator now, transforms.rules.hidden_operands.)"""
    doc = profile_doc(" = ((last_dup(A), all_dup(B))_3us)_all_pairs")
    trace = trace_of("a1@1 a2@2 b1@3 c1@10 a3@20 a4@20 b2@21 b3@22 c2@30")
    federation = through_group(language("cg3", 1), doc, tick=1)
    drops, got = [], []
    for event in trace:
        got.extend(federation.push([event]))
        drops.append(federation.take_drops())
    got.extend(federation.close())
    assert [n.occ.events for n in got] == [("a2", "b1"), ("a4", "b2"), ("a4", "b3")]
    assert drops == [{}, {}, {}, {"cg3": 1}, {}, {}, {}, {}, {"cg3": 2}]
    assert federation.take_drops() == {} and federation.stats().checks == 0


def peak_stats(group: str, count: int) -> runner.RunnerStats:
    """The largest of each count ``stats()`` gave over ``count`` events (after each one, as
    the pipeline measures after each batch): a partitioned profile whose keys live for three
    events, and a relaxed one at CG-3/CG-4 whose answers the post-filter half drops."""
    doc = parse(CLASSES + "profile P per data.k = ((all_dup(A); all_dup(B))_2s)_all_pairs\n"
                "profile Q = ((all_dup(A); 2_dup(B))_2s)_all_pairs\n")
    federation = through_group(language(group, 1_000_000), doc)
    peak = runner.RunnerStats()
    for i in range(count):
        federation.push([Event(f"e{i}", "s", "abb"[i % 3], (i + 1) * 1_000_000, i,
                               {"k": i // 3})])
        now = federation.stats()
        peak = runner.RunnerStats(*map(max, astuple(peak), astuple(now)))
        federation.take_drops()
    return peak


@pytest.mark.parametrize("group", ["cg3", "cg4", "cg5"])
def test_the_stats_stay_bounded_as_the_trace_grows(group: str) -> None:
    """What the mediator's state gauge reports (Runner.stats): ten times the events, the same
    peak of every count — events held, visible, known, readings, verdicts pending,
    partitions, engines (a complexity check, not a timing)."""
    small, large = peak_stats(group, 300), peak_stats(group, 3000)
    assert large == small, (small, large)
    assert large.partitions <= 4 and large.held <= 8, large
