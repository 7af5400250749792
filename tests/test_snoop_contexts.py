"""Snoop's parameter contexts as EVA parameter settings (research/snoop.md §5.3), checked
exhaustively on every E1/E2 trace up to length 7 (one event per instant) against the SEQ node
of the Snoop base service (adapters/backends/snoop.py, the node rules of §3.2).

EVA's printed Table 4 is partly wrong; these are the verified settings DESIGN §3 adopts.
"""

from __future__ import annotations

import itertools
from collections import defaultdict

import pytest

from adapters.backends.native import run
from adapters.backends.snoop import SnoopLanguage
from eva.events import Event
from eva.reference import evaluate
from tests.helpers import profile_doc


def snoop_seq(trace: list[str], context: str) -> list[tuple[tuple[str, ...], str]]:
    """The CG-2 base service's SEQ (E1;E2) in a context (snoop.md §3.2): (initiators,
    terminator) per detection."""
    query = SnoopLanguage().parse(f"a ; b CONTEXT {context}")
    events = [Event(ident, "s", ident[0], i + 1, i) for i, ident in enumerate(trace)]
    return [(tuple(e.id for e in d.constituents[:-1]), d.constituents[-1].id)
            for d in run(query, events)]


SETTINGS = {
    "unrestricted": ("all", "all", "all_pairs"),
    "recent": ("last", "all", "unique_pairs"),
    "chronicle": ("first", "first", "repeated_pairs"),
    "continuous": ("all", "first", "unique_pairs"),
    "cumulative": ("all", "first", "unique_pairs"),  # then grouped by terminator
}


def all_traces(max_len: int) -> list[list[str]]:
    out = []
    for n in range(1, max_len + 1):
        for kinds in itertools.product("ab", repeat=n):
            counts = {"a": 0, "b": 0}
            trace = []
            for k in kinds:
                counts[k] += 1
                trace.append(f"{k}{counts[k]}")
            out.append(trace)
    return out


def eva_seq(trace: list[str], setting: tuple[str, str, str],
            evaluation: str = "") -> list[tuple[str, str]]:
    first, second, pairs = setting
    doc = profile_doc(f"{evaluation} = (({first}_dup(A); {second}_dup(B))_inf)_{pairs}")
    events = [Event(ident, "s", ident[0], i + 1, i) for i, ident in enumerate(trace)]
    return [(n.occ.events[0], n.occ.events[1]) for n in evaluate(doc, events)]


@pytest.mark.parametrize("context", ["unrestricted", "recent", "chronicle", "continuous"])
def test_snoop_sequence_context_equals_its_eva_setting(context: str) -> None:
    for trace in all_traces(7):
        expected = [(inits[0], term) for inits, term in snoop_seq(trace, context)]
        assert sorted(eva_seq(trace, SETTINGS[context])) == sorted(expected), (context, trace)


def test_snoop_cumulative_is_eva_all_first_unique_grouped_by_terminator() -> None:
    for trace in all_traces(7):
        grouped: dict[str, list[str]] = defaultdict(list)
        for initiator, terminator in eva_seq(trace, SETTINGS["cumulative"]):
            grouped[terminator].append(initiator)
        got = sorted((tuple(v), k) for k, v in grouped.items())
        assert got == sorted(snoop_seq(trace, "cumulative")), trace


def test_table4_as_printed_is_wrong_for_unrestricted() -> None:
    """Table 4 prints unrestricted = (all, last, keep): on E1 E2 E2 (closed by another E1) its
    final answer has one pair where Snoop gives two (snoop.md §5.3)."""
    trace = ["a1", "b1", "b2", "a2"]
    assert len(snoop_seq(trace, "unrestricted")) == 2
    final = eva_seq(trace, ("all", "last", "all_pairs"), " evaluate end_of_interval")
    assert final == [("a1", "b2")]


def test_chronicle_needs_incremental_repetition() -> None:
    """E1 E1 E2 E1 E2: chronicle pairs (e1², e2²); batch re-application would pair e1³."""
    trace = ["a1", "a2", "b1", "a3", "b2"]
    assert eva_seq(trace, SETTINGS["chronicle"]) == [("a1", "b1"), ("a2", "b2")]
