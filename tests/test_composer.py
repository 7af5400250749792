"""The composer protocol (mediator/composer.py), what the service composes through: the
in-process composer answers as the engine, profiles come and go between feeds, and both
implementations have the protocol's shape (the Spark one runs for real in tests/test_spark.py,
where the two are compared on a live job)."""

from __future__ import annotations

import inspect
import json

import pytest

from eva.engine import Engine, EngineConfig
from eva.events import Event, from_cloudevent
from eva.notify import composite_line
from eva.parser import parse
from mediator.composer import Composer, InProcessComposer
from spark_jobs.composer import SparkComposer
from tests.helpers import SENTINEL, logistics_day

METHODS = sorted(name for name in vars(Composer) if not name.startswith("_"))


def _event(i: int, kind: str, second: int) -> Event:
    return from_cloudevent({"specversion": "1.0", "id": f"e{i}", "source": "t", "type": kind,
                            "time": f"2026-03-02T10:00:{second:02d}Z"}, i)


@pytest.mark.parametrize("implementation", [InProcessComposer, SparkComposer])
@pytest.mark.parametrize("method", METHODS)
def test_both_composers_have_the_protocol_shape(implementation: type, method: str) -> None:
    """SparkComposer satisfies the protocol by its shape alone (spark_jobs does not import the
    mediator): every method, with the protocol's signature."""
    assert METHODS == ["close", "collect", "feed", "register", "remove"]
    want = inspect.signature(getattr(Composer, method))
    assert inspect.signature(getattr(implementation, method)) == want


def test_the_in_process_composer_answers_as_the_engine_on_the_logistics_day() -> None:
    """Fed in chunks, it reports what the engine's pushes report (the engine's ``close`` at
    the end of a trace has no counterpart: a composer's input does not end)."""
    text, events, _ = logistics_day()
    trace = [from_cloudevent(e, i) for i, e in enumerate([*events, SENTINEL])]
    engine = Engine(EngineConfig())
    engine.add_document(parse(text))
    want = [composite_line(n)[1] for event in trace for n in engine.push(event)]
    composer: Composer = InProcessComposer()
    composer.register(text)  # before any event: at the first, as the engine (and replay)
    got = []
    for start in range(0, len(trace), 50):
        composer.feed(trace[start:start + 50])
        got += composer.collect()
    composer.close()
    assert [json.dumps(payload) for kind, _, payload in got if kind == "composite"] == want
    assert len(want) > 20
    assert [kind for kind, _, _ in got if kind != "composite"] == []


def test_in_process_profiles_come_and_go_and_late_events_are_dead_letters() -> None:
    """A profile registered without a time sees events after the newest fed; a removed one
    reports nothing more; an event behind the clock is collected as a dead letter."""
    composer: Composer = InProcessComposer()
    assert composer.register('class A = type == "a"\nprofile S = A\n', at=0) == ["S"]
    composer.feed([_event(0, "a", 1)])
    assert composer.register('class B = type == "b"\nprofile T = B\n') == ["T"]
    composer.feed([_event(1, "b", 1), _event(2, "b", 2), _event(3, "a", 3)])
    assert composer.remove("S") and not composer.remove("S")
    composer.feed([_event(4, "a", 4), _event(5, "b", 0)])
    got = composer.collect()
    composites = [(profile, payload["data"]["constituents"]) for kind, profile, payload in got
                  if kind == "composite"]
    assert composites == [("S", ["e0"]), ("T", ["e2"]), ("S", ["e3"])]
    letters = [payload for kind, _, payload in got if kind == "dead_letter"]
    assert len(letters) == 1 and letters[0]["reason"] == "late", letters
    assert composer.collect() == []
