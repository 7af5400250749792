"""The worked examples of the EVA paper (and of research/transforms.md), as named cases.

Every expectation here is derived by hand from the definitions, as docs/semantics.md explains;
``both`` also checks that the incremental engine (garbage collection on and off) agrees.
"""

from __future__ import annotations

import pytest

from eva.semantics import Element, L, Occ, R, cut
from tests.helpers import both

# ------------------------------------------------------------------ Example 4.1 (Fig. 5)


def test_example_4_1_trace_renumbering_cuts_the_view_into_duplicate_lists() -> None:
    """tr = e1…e12 with e1,e3,e4,e8,e9 ∈ E1, e6,e7,e10,e11,e12 ∈ E2, e2,e5 ∈ E3: the
    (E1,E2) view is renumbered into tr[1,·] = ⟨e1,e3,e4⟩, tr[2,·] = ⟨e6,e7⟩, tr[3,·] = ⟨e8,e9⟩,
    tr[4,·] = ⟨e10,e11,e12⟩ (E3 events are not in the view)."""
    e1 = {1, 3, 4, 8, 9}
    e2 = {6, 7, 10, 11, 12}
    view = [Element((i, 0, i), Occ(i, (i, 0, i), f"e{i}", (f"e{i}",)), L if i in e1 else R)
            for i in range(1, 13) if i in e1 | e2]
    lists = [[view[j].occ.events[0] for j in range(a, b)] for a, b in cut(view)]
    assert lists == [["e1", "e3", "e4"], ["e6", "e7"], ["e8", "e9"], ["e10", "e11", "e12"]]


# ------------------------------------------------------------------ Fig. 3: A/B/C × I/II/III

FIG3 = "a1@1 a2@2 b1@3 b2@4 a3@5 b3@6"
"""The sequence (E1;E2) over o o x x o x (o ∈ E1 = A, x ∈ E2 = B), no time frame."""

FIG3_EXPECTED = {
    ("first", "all_pairs"): [("a1", "b1"), ("a1", "b3"), ("a3", "b3")],
    ("last", "all_pairs"): [("a2", "b1"), ("a2", "b2"), ("a2", "b3"), ("a3", "b3")],
    ("all", "all_pairs"): [("a1", "b1"), ("a2", "b1"), ("a1", "b2"), ("a2", "b2"),
                           ("a1", "b3"), ("a2", "b3"), ("a3", "b3")],
    ("first", "unique_pairs"): [("a1", "b1"), ("a3", "b3")],
    ("last", "unique_pairs"): [("a2", "b1"), ("a2", "b2"), ("a3", "b3")],
    ("all", "unique_pairs"): [("a1", "b1"), ("a2", "b1"), ("a1", "b2"), ("a2", "b2"),
                              ("a3", "b3")],
    ("first", "repeated_pairs"): [("a1", "b1"), ("a2", "b2"), ("a3", "b3")],
    ("last", "repeated_pairs"): [("a2", "b1"), ("a1", "b2"), ("a3", "b3")],
    ("all", "repeated_pairs"): [("a1", "b1"), ("a2", "b1"), ("a3", "b3")],
}


@pytest.mark.parametrize(("dup", "pairs"), list(FIG3_EXPECTED))
def test_fig3_situations_continuous(dup: str, pairs: str) -> None:
    """Rows A (all_pairs, keep), B (unique_pairs, consume), C (repeated_pairs, consume and
    re-apply) × columns I (first), II (last, with the provisional dashed arcs), III (all)."""
    got = both(f" = (({dup}_dup(A); {dup}_dup(B))_inf)_{pairs}", FIG3)
    assert got == FIG3_EXPECTED[(dup, pairs)]


def test_fig3_column_ii_at_end_of_interval_keeps_only_closed_last_results() -> None:
    """A II evaluated at the closing of the interval: (a2, b1) is overwritten by (a2, b2); the
    lists of a3 and b3 never close in this trace, so nothing is final for them (EVA §4.4)."""
    got = both(" evaluate end_of_interval = ((last_dup(A); last_dup(B))_inf)_all_pairs", FIG3)
    assert got == [("a2", "b2")]


def test_repeated_all_differs_from_unique_all_when_evaluated_incrementally() -> None:
    """The paper notes (all, repeated) = (all, unique) for batch evaluation; DESIGN pins
    incremental repetition, under which b1 consumes a1 and a2 before b2 arrives."""
    unique = both(" = ((all_dup(A); all_dup(B))_inf)_unique_pairs", FIG3)
    repeated = both(" = ((all_dup(A); all_dup(B))_inf)_repeated_pairs", FIG3)
    assert ("a1", "b2") in unique and ("a1", "b2") not in repeated


# ------------------------------------------------------------------ P1 (Fig. 8) and P2 (Fig. 9)

P1 = " = ((all_dup(A), last_dup(B))_5us)_all_pairs"
"""P1 with A = traffic jams in area A, B = truck locations in area A, 5 µs for 5 min."""
P1_TRACE = "b1@0 b2@2 a1@4 b3@6 b4@12 a2@14 a3@30"


def test_p1_fig8_pairs_each_jam_with_the_last_truck_report_within_the_frame() -> None:
    """The jam a1 pairs with the last report of the run before it (b2) and with the last
    report of the next run that is still within ±5 (b3, not b4); a2 with b4; a3 is alone."""
    assert both(P1, P1_TRACE) == [("a1", "b2"), ("a1", "b3"), ("a2", "b4")]


def test_p1_fig8_end_of_interval_waits_for_the_frame_of_a_later_last_report() -> None:
    got = both(" evaluate end_of_interval" + P1[1:], P1_TRACE)
    assert got == [("a1", "b2"), ("a1", "b3"), ("a2", "b4")]


def test_p2_fig9_two_cancellations_within_the_frame_each_used_once() -> None:
    """P2 = ((all_dup(Cancel), all_dup(Cancel))_4weeks)_unique_pairs: the same class on both
    sides makes every cancellation a list of its own, and unique pairs take consecutive
    blocks (1,2), (3,4), …: the first pair is too far apart, the second qualifies, the fifth
    cancellation has no partner left."""
    got = both(" = ((all_dup(A), all_dup(A))_10us)_unique_pairs", "a1@0 a2@40 a3@41 a4@42 a5@43")
    assert got == [("a3", "a4")]


def test_p2_per_customer_partitions_are_independent() -> None:
    from eva.engine import replay
    from eva.events import Event
    from tests.helpers import profile_doc

    doc = profile_doc(" per data.k = ((all_dup(A), all_dup(A))_10us)_unique_pairs")
    trace = [Event(f"a{i}", "s", "a", i, i, {"k": k}) for i, k in enumerate([1, 2, 1, 2, 2])]
    got = [(n.partition, n.occ.events) for n in replay(doc, trace)]
    assert got == [(1, ("a0", "a2")), (2, ("a1", "a3"))]


# ------------------------------------------------------------------ research/transforms.md §10


def test_tv4_first_last_all_on_the_anterior_list() -> None:
    trace = "a1@1 a2@2 b1@3"
    assert both(" = ((first_dup(A); first_dup(B))_10us)_all_pairs", trace) == [("a1", "b1")]
    assert both(" = ((last_dup(A); first_dup(B))_10us)_all_pairs", trace) == [("a2", "b1")]
    assert both(" = ((all_dup(A); all_dup(B))_10us)_all_pairs", trace) == [
        ("a1", "b1"), ("a2", "b1")]


def test_tv5_unique_pairs_only_pair_neighbouring_lists() -> None:
    trace = "a1@1 b1@2 a2@3 b2@4"
    assert both(" = ((first_dup(A); first_dup(B))_inf)_unique_pairs", trace) == [
        ("a1", "b1"), ("a2", "b2")]
    assert both(" = ((first_dup(A); first_dup(B))_inf)_all_pairs", trace) == [
        ("a1", "b1"), ("a1", "b2"), ("a2", "b2")]


@pytest.mark.parametrize(("pairs", "expected"), [
    ("all_pairs", ["a3", "a4", "a5", "a6", "a7"]),   # UA: from the third on
    ("unique_pairs", ["a3"]),                        # UB: the third only
    ("repeated_pairs", ["a3", "a6"]),                # UC: every third
])
def test_tv9_selection_fig4(pairs: str, expected: list[str]) -> None:
    trace = " ".join(f"a{i}@{i}" for i in range(1, 8))
    assert [e[0] for e in both(f" = (A[3])_{pairs}", trace)] == expected


def test_tv10_disjunction_with_first_and_last_duplicates() -> None:
    trace = "a1@1 a2@2 b1@3 b2@4 a3@5"
    assert both(" = (first_dup(A) | first_dup(B))_all_pairs", trace) == [("a1",), ("b1",), ("a3",)]
    assert both(" evaluate end_of_interval = (last_dup(A) | last_dup(B))_all_pairs", trace) == [
        ("a2",), ("b2",)]


# ------------------------------------------------------------------ negation (Def. 4.8, P5)


def test_tv8_negation_interval_is_closed() -> None:
    """(not E)_5 at tick 10: an E at 5 lies in [5, 10], an E at 4 does not."""
    at5 = both(" = ((not B)_5us)_all_pairs", "b1@5 c1@10", tick=10)
    at4 = both(" = ((not B)_5us)_all_pairs", "b1@4 c1@10", tick=10)
    assert at5 == [] and at4 == [("absence@1970-01-01T00:00:00.000010Z",)]


def test_p5_anchored_absence_fires_at_anchor_plus_span() -> None:
    """P5: (Shift ; (not Load)_2)_2: no Load in (t(shift), t(shift) + 2] → passive at +2."""
    profile = " = ((all_dup(A); all_dup(((not B)_2us)_all_pairs))_2us)_all_pairs"
    assert both(profile, "a1@10 b1@11 a2@20 c1@30") == [
        ("a2", "absence@1970-01-01T00:00:00.000022Z")]


def test_negation_unique_pairs_reports_only_the_first_passive_event() -> None:
    got = both(" = ((not B)_1us)_unique_pairs", "c1@1 c2@9", tick=1)
    assert got == [("absence@1970-01-01T00:00:00.000001Z",)]
