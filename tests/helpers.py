"""Small helpers shared by the tests."""

from __future__ import annotations

from mediator.eva import ast
from mediator.eva.engine import EngineConfig, replay
from mediator.eva.events import Event
from mediator.eva.parser import parse
from mediator.eva.reference import Notification, evaluate
from tests.strategies import CLASSES, trace_of


def profile_doc(text: str) -> ast.Document:
    """A document with the test classes and one profile ``P`` given as ``"= expr"`` etc."""
    return parse(CLASSES + "profile P" + text + "\n")


def signature(notes: list[Notification]) -> list[tuple[object, ...]]:
    return [(n.profile, n.partition, n.occ.events, n.occ.time, n.emitted) for n in notes]


def events_of(notes: list[Notification]) -> list[tuple[str, ...]]:
    return [n.occ.events for n in notes]


def ref(profile: str, trace: str | list[Event], tick: int = 1) -> list[tuple[str, ...]]:
    events = trace_of(trace) if isinstance(trace, str) else trace
    return events_of(evaluate(profile_doc(profile), events, tick=tick))


def both(profile: str, trace: str | list[Event], tick: int = 1) -> list[tuple[str, ...]]:
    """The reference answer, after checking that the engine (gc on and off) gives the same."""
    events = trace_of(trace) if isinstance(trace, str) else trace
    doc = profile_doc(profile)
    expected = evaluate(doc, events, tick=tick)
    for gc in (True, False):
        got = replay(doc, events, config=EngineConfig(tick=tick, gc=gc))
        assert signature(got) == signature(expected), (profile, gc)
    return events_of(expected)
