"""Small helpers shared by the tests."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from eva import ast, classes
from eva.engine import Engine, EngineConfig, replay
from eva.events import Event
from eva.parser import parse
from eva.reference import evaluate
from eva.semantics import Notification
from tests.strategies import CLASSES, trace_of


def profile_doc(text: str) -> ast.Document:
    """A document with the test classes and one profile ``P`` given as ``"= expr"`` etc."""
    return parse(CLASSES + "profile P" + text + "\n")


@contextmanager
def index_switched(on: bool) -> Iterator[None]:
    """Engines (their ClassIndex) made inside use the predicate index, or evaluate every
    candidate predicate one by one (``eva.classes.INDEXED``)."""
    saved = classes.INDEXED
    classes.INDEXED = on
    try:
        yield
    finally:
        classes.INDEXED = saved


def signature(notes: list[Notification]) -> list[tuple[object, ...]]:
    return [(n.profile, n.partition, n.occ.events, n.occ.time, n.emitted) for n in notes]


def events_of(notes: list[Notification]) -> list[tuple[str, ...]]:
    return [n.occ.events for n in notes]


def run(engine: Engine, events: list[Event]) -> list[tuple[str, ...]]:
    """Push ``events`` one by one, close the engine: the composites' constituents."""
    out = []
    for e in events:
        out.extend(engine.push(e))
    out.extend(engine.close())
    return events_of(out)


def peak_stored(evaluator: Any, count: int = 3000) -> int:
    """The most events a native evaluator held at once over ``count`` events of types a, b, c,
    one µs apart (a window-bounded join holds a window, not the stream)."""
    peak = 0
    for i in range(count):
        evaluator.push(Event(f"e{i}", "s", "abc"[i % 3], i, i))
        peak = max(peak, evaluator.stored())
    return peak


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


# The end of the logistics day for the streaming tests: an event no profile wants, late enough
# to move the clock past every step.
SENTINEL = {"specversion": "1.0", "id": "end", "source": "test", "type": "none",
            "time": "2026-03-05T00:00:00Z"}


def logistics_day() -> tuple[str, list[dict[str, Any]], list[str]]:
    """The paper's profiles, the logistics day (seed 7) as CloudEvents, and what the in-process
    engine reports for it — composites as JSON lines, the sentinel closing the day."""
    from eva.engine import Engine
    from eva.events import from_cloudevent, parse_time
    from eva.notify import composite_line
    from examples.logistics.generate import day

    text = Path("examples/logistics/profiles.eva").read_text()
    events = day(7)
    engine = Engine(EngineConfig())
    engine.add_document(parse(text))
    trace = [from_cloudevent(e, i) for i, e in enumerate(events)]
    notes = [n for e in trace for n in engine.push(e)]
    notes += engine.close(parse_time(SENTINEL["time"]))
    return text, events, [composite_line(n)[1] for n in notes]


class Reader:
    """A mediator subscription (``MediatorClient.subscribe``) read in a thread, as a user's loop
    would: what it received so far, or the error that ended it."""

    def __init__(self, notes: Iterator[Any]) -> None:
        import threading

        self.got: list[Any] = []
        self.error: BaseException | None = None
        self._notes = notes
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        try:
            for note in self._notes:
                self.got.append(note)
        except BaseException as exc:
            self.error = exc

    def wait_for(self, count: int, seconds: float = 30.0) -> list[Any]:
        """What was received once there are ``count`` (fails after ``seconds``, or on an error)."""
        import time

        deadline = time.monotonic() + seconds
        while len(self.got) < count and self.error is None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert self.error is None, self.error
        assert len(self.got) >= count, f"received {len(self.got)} of {count} in {seconds} s"
        return self.got


class LogIngest:
    """The mediator's side of a broker source's ``ingest(lines, ack)`` (adapters/mqtt_source.py,
    adapters/redis_source.py): drop a (source, id) already taken, as Publish drops a duplicate,
    append the rest durably to a real store's event log, then acknowledge. ``delay``: seconds
    between the append and the ack (a kill lands there); ``fail``: calls that raise before
    appending; ``ack``: False leaves every call unacknowledged (the mediator died first).
    ``holding``: while True, an appended batch waits before its ack (so a kill of the broker
    finds it in flight, however fast the machine)."""

    def __init__(self, store: Any, *, delay: float = 0.0, fail: int = 0, ack: bool = True) -> None:
        import threading

        self.store = store
        self.delay = delay
        self.fail = fail
        self.acks = ack
        self.seen = {(e.source, e.id) for e in logged(store)}  # as Publish seeds its memory
        self.duplicates = 0
        self.calls = 0
        self.holding = False
        self._lock = threading.Lock()

    def __call__(self, lines: list[str], ack: Any) -> None:
        import time

        from eva.events import from_json_line

        with self._lock:
            self.calls += 1
            if self.fail:
                self.fail -= 1
                raise OSError("the event log could not be written (test)")
            fresh = []
            for line in lines:
                event = from_json_line(line)
                if (event.source, event.id) in self.seen:
                    self.duplicates += 1
                    continue
                self.seen.add((event.source, event.id))
                fresh.append(line)
            if fresh:
                self.store.append_events(fresh)
        time.sleep(self.delay)
        while self.holding:
            time.sleep(0.01)
        if self.acks:
            ack()


def logged(store: Any) -> list[Event]:
    """Every event in a store's event log, in order."""
    from eva.events import from_json_line

    out: list[Event] = []
    after = 0
    while batch := store.read_events(after, 1000):
        out.extend(from_json_line(item.line) for item in batch)
        after = batch[-1].position
    return out
