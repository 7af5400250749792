"""A composite's identity holds its events' times (issue 29): an event re-sent once the
duplicate memory has forgotten it is either refused or gives composites of its own — never
composites whose ids repeat earlier ones, which every notification log would drop as copies
(docs/semantics.md §17)."""

from __future__ import annotations

import io
import json

from hypothesis import given, settings
from hypothesis import strategies as st

from eva import ast
from eva.admission import Admission, Reason, Rules, Trial
from eva.engine import EngineConfig
from eva.events import Event, to_cloudevent
from mediator.cli import runs
from tests.strategies import documents, traces


@st.composite
def resent(draw: st.DrawFn) -> list[Event]:
    """A trace, then some of its events again — as they were, or moved later by the same
    step, after a pause longer than any time frame the profiles use (the memory of ids has
    moved past them by then)."""
    trace = draw(traces(max_size=16))
    out = list(trace)
    if trace:
        end = trace[-1].time + draw(st.sampled_from([20, 40]))
        again = draw(st.lists(st.sampled_from(trace), max_size=8))
        out.append(Event("pause", "p", "zzz", end))
        for n, original in enumerate(again):
            moved = draw(st.booleans())
            t = original.time + end - trace[0].time if moved else original.time
            out.append(Event(original.id, original.source, original.type, max(t, end + n),
                             0, original.data) if moved else
                       Event(original.id, original.source, original.type, t, 0, original.data))
    return [Event(e.id, e.source, e.type, e.time, n, e.data) for n, e in enumerate(out)]


@settings(max_examples=300, deadline=None)
@given(doc=documents(), trace=resent(), lateness=st.sampled_from([0, 2, 5]))
def test_no_two_composites_of_a_replay_share_an_id(doc: ast.Document, trace: list[Event],
                                                     lateness: int) -> None:
    """Over traces with re-sent ids: every composite `evamed replay` prints has an id of its
    own (each re-sent event was refused as a duplicate or late, or counted as an event of its
    own)."""
    out, dead = io.StringIO(), io.StringIO()
    lines = [(n, json.dumps(to_cloudevent(e)).encode()) for n, e in enumerate(trace, 1)]
    runs.replay_plain(doc, None, iter(lines), EngineConfig(allowed_lateness=lateness),
                      None, out, runs.DeadLetters(dead))
    ids = [json.loads(line)["id"] for line in out.getvalue().splitlines()]
    assert len(ids) == len(set(ids)), out.getvalue()


def test_a_copy_the_full_memory_forgot_is_refused_and_a_later_one_is_an_event_of_its_own(
) -> None:
    """The door's memory is counted (``remembered`` per generation): a copy of an event it had
    to forget within the lateness is refused `late` with why — not taken as new — and one sent
    again at a later time is admitted (its composites' ids differ, by its time)."""
    admission = Admission(Rules(lateness=1_000, remember=None, remembered=3))

    def publish(event: Event) -> Reason | None:
        trial = Trial(admission)
        refused = trial.judge(event)
        trial.commit()
        return None if refused is None else refused.reason

    assert publish(Event("X", "fz", "a", 100)) is None
    for n in range(7):  # two rotations by count: X is forgotten
        assert publish(Event(f"o{n}", "other", "a", 101 + n)) is None
    assert ("fz", "X") not in admission.ids
    trial = Trial(admission)
    refused = trial.judge(Event("X", "fz", "a", 100))  # within the lateness: not told apart
    assert refused is not None and refused.reason is Reason.LATE
    assert "duplicate memory had to forget" in refused.detail
    assert publish(Event("X", "fz", "a", 110)) is None  # later: an event of its own
    assert publish(Event("X", "fz", "a", 111)) is Reason.DUPLICATE  # remembered again
