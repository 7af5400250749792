"""Engine snapshots: a restored engine continues exactly where the original stopped — what a
state store (the Spark job) and a restarted service rely on."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mediator.eva import ast
from mediator.eva.engine import Engine, EngineConfig
from mediator.eva.events import Event
from mediator.eva.notify import to_cloudevent
from mediator.eva.snapshot import restore, snapshot
from tests.strategies import documents, traces


@settings(max_examples=400, deadline=None, suppress_health_check=list(HealthCheck))
@given(documents(), traces(), st.integers(0, 30), st.sampled_from([0, 2]), st.booleans())
def test_a_restored_engine_continues_exactly(doc: ast.Document, trace: list[Event], cut: int,
                                             lateness: int, twice: bool) -> None:
    """Every operator and parameter, partitions, clocks, buffered out-of-order events."""
    config = EngineConfig(tick=3, allowed_lateness=lateness)
    whole = Engine(config)
    whole.add_document(doc)
    expected = [n for e in trace for n in whole.push(e)] + whole.close()
    first = Engine(config)
    first.add_document(doc)
    got = [n for e in trace[:cut] for n in first.push(e)]
    second = restore(snapshot(first))
    if twice:
        second = restore(snapshot(restore(snapshot(second))))
    got += [n for e in trace[cut:] for n in second.push(e)]
    got += second.close(max((e.time for e in trace), default=None))
    assert [to_cloudevent(n) for n in got] == [to_cloudevent(n) for n in expected]
    assert [n.emitted for n in got] == [n.emitted for n in expected]


def test_a_snapshot_keeps_no_callback_and_the_original_goes_on() -> None:
    letters: list[object] = []
    engine = Engine(EngineConfig(), letters.append)
    data = snapshot(engine)
    assert isinstance(data, bytes) and engine.dead_letter == letters.append
    later: list[object] = []
    restored = restore(data, later.append)
    restored.malformed("x")
    assert len(later) == 1 and letters == []
