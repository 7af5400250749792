"""What ``evamed replay`` runs, as functions over an event iterator and sinks, so that the
service can run them as the command line does: one per mode (plain, --via, --engine spark,
--native). They raise what goes wrong (``ConnectionError``, ``PushRefused``); the command
turns it into an exit.

Every mode admits the trace with the same rules (eva/admission.py: duplicates, lateness,
horizon, malformed lines — the mediator's), so every path refuses the same events with the same
dead letters, and evaluates what it admits in time order.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import replace
from itertools import islice
from typing import TYPE_CHECKING, Any, TextIO

from eva import interrupt
from eva.admission import Rules, Stream
from eva.engine import DeadLetter, Engine, EngineConfig, push_admitted
from eva.events import Event, EventError, format_time, from_json_line, read_lines
from eva.notify import composite_lines, dead_letter_record, to_cloudevent
from eva.semantics import Notification

if TYPE_CHECKING:
    from adapters.backends.native import EventRejected
    from adapters.client import Connect, Rejected
    from eva import ast

Lines = Iterable[tuple[int, bytes]]
"""(line number, line) of a trace of CloudEvents JSON lines (common.event_lines)."""


class DeadLetters:
    """The sink of the admitting engine's dead letters: JSON lines, counted for --summary."""

    def __init__(self, out: TextIO) -> None:
        self.out = out
        self.count = 0

    def __call__(self, letter: DeadLetter) -> None:
        self.count += 1
        self.out.write(json.dumps(dead_letter_record(letter)) + "\n")


def raw(line: bytes) -> str:
    """A line as a dead letter's ``raw`` text: bytes that are not UTF-8 written as \\xNN."""
    return line.rstrip(b"\n").decode("utf-8", "backslashreplace")


BATCH = 1024
"""Lines decoded at a time (events.read_lines: one loop per batch, compiled with the engine),
and composites written at a time (one write of their joined lines). Output from a trace on
stdin therefore comes a batch at a time."""


def _read(malformed: Callable[[str, str], None], lines: Lines,
          keep: dict[str, Event] | None = None) -> Iterator[Event]:
    """The events of ``lines``, each numbered by its line (its ``seq``), decoded a batch at a
    time; a line that is not an event becomes a ``malformed`` dead letter when the consumer
    reaches it, so dead letters keep the order of the trace. ``keep``: every event by id
    (for --expand and --plot, which name the contributing events)."""
    source = iter(lines)
    while batch := list(islice(source, BATCH)):
        interrupt.check()  # a stop a signal asked for (eva/interrupt.py), between batches
        for (number, line), event in zip(batch, read_lines(batch), strict=True):
            if isinstance(event, EventError):
                malformed(f"line {number}: {event}", raw(line))
            else:
                if keep is not None:
                    keep[event.id] = event
                yield event


def admission_rules(config: EngineConfig) -> Rules:
    """The admission of a replay (eva/admission.py) from its engine configuration: its
    lateness, horizon and duplicate window."""
    return Rules(lateness=config.allowed_lateness, horizon=config.horizon,
                 remember=config.remember)


def evaluating(config: EngineConfig) -> EngineConfig:
    """The configuration of an engine that evaluates what the admission gave out: in time
    order already, so no lateness, no horizon of its own."""
    return replace(config, allowed_lateness=0, horizon=None)


SHAPES = ("json", "table", "compact")
"""How composites are printed: CloudEvents JSON lines (for programs), an aligned table or one
short line each (for people)."""


class Composites:
    """The sink of composites: CloudEvents JSON lines to ``out`` (a batch at a time: call
    ``flush`` at the end), counted per profile — or another ``shape``, with the contributing
    events inlined when ``events`` (by id) is given (--expand). ``notes``: a list that keeps
    every composite (--plot)."""

    def __init__(self, out: TextIO, shape: str = "json", events: dict[str, Event] | None = None,
                 notes: list[Notification] | None = None) -> None:
        self.out = out
        self.counts: Counter[str] = Counter()
        self.pending: list[Notification] = []
        self.shape = shape
        self.events = events
        self.notes = notes
        self.header = shape == "table"

    def __call__(self, notifications: list[Notification]) -> None:
        if notifications:
            self.pending += notifications
            if len(self.pending) >= BATCH:
                self.flush()

    def flush(self) -> None:
        pending = self.pending
        if self.notes is not None:
            self.notes += pending
        if pending:
            self.head()
            if self.shape == "json" and self.events is None:
                # The batch written by compiled code, counted there too (eva/notify.py).
                self.out.write(composite_lines(pending, self.counts))
            else:
                counts = self.counts
                for n in pending:
                    counts[n.profile] += 1
                self.out.write("\n".join([self.formatted(to_cloudevent(n)) for n in pending])
                               + "\n")
        self.pending = []

    def head(self) -> None:
        """The table's header, before its first row."""
        if self.header:
            self.out.write(f"{'time':<20}  {'profile':<10}  {'partition':<12}  events\n")
            self.header = False

    def formatted(self, body: dict[str, Any]) -> str:
        """A composite's CloudEvent (``to_cloudevent``) in this sink's shape."""
        data = body["data"]
        named = [self._event(ident) for ident in data["constituents"]]
        if self.shape == "json":
            data["events"] = named
            return json.dumps(body, ensure_ascii=False)
        events = [f"{e['type']}@{e['source']} {e['time']}" if "type" in e else e["id"]
                  for e in named] if self.events is not None else data["constituents"]
        partition = "" if "partition" not in data else json.dumps(data["partition"],
                                                                  ensure_ascii=False)
        if self.shape == "compact":
            return " ".join([body["time"], body["subject"], *([partition] if partition else []),
                             "(" + ", ".join(events) + ")"])
        gap = "\n" + " " * 48
        return (f"{body['time']:<20}  {body['subject']:<10}  {partition:<12}  "
                + gap.join(events))

    def _event(self, ident: str) -> dict[str, Any]:
        """A contributing event as --expand shows it; a tick or a passive event (not in the
        trace) by its id, which names its class and time."""
        event = (self.events or {}).get(ident)
        if event is None:
            return {"id": ident}
        return {"id": ident, "type": event.type, "source": event.source,
                "time": format_time(event.time)}


def _admit(engine: Engine, stream: Stream, lines: Lines, end: int | None, emit: Composites,
           keep: dict[str, Event] | None = None) -> None:
    """Every line through the admission ``stream`` (a malformed one is a dead letter), what it
    gives out — in time order — pushed to ``engine``, whose clock starts at the admission's
    origin and follows its watermark; then both closed. A batch of lines at a time: decoded
    by one call, admitted and evaluated by another (``push_admitted``, compiled)."""
    watermark: int | None = None
    source = iter(lines)
    try:
        while batch := list(islice(source, BATCH)):
            found: list[Notification] = []
            decoded = read_lines(batch)
            if keep is not None:
                keep.update((e.id, e) for e in decoded if not isinstance(e, EventError))

            def malformed(index: int, error: EventError,
                          batch: list[tuple[int, bytes]] = batch) -> None:
                # In its place among the events: dead letters keep the order of the trace.
                number, line = batch[index]
                engine.malformed(f"line {number}: {error}", raw(line))

            push_admitted(engine, stream, decoded, found, malformed)
            emit(found)
            # The engine's clock to the admission's watermark: what it holds (several
            # sources, clock-driven profiles) is decided there. Once per batch of lines: the
            # answers are the same whenever it is done, it only must not lag by more than a
            # batch.
            moved = stream.watermark
            if (moved is not None and (watermark is None or moved > watermark)
                    and engine.origin is not None):
                watermark = moved
                emit(engine.advance(moved))
        due = stream.close(end)
        if due and engine.origin is None and stream.origin is not None:
            engine.begin(stream.origin)
        for one in due:
            emit(engine.push(one))
        emit(engine.close(end))
    finally:
        emit.flush()  # what was found before an interruption is written too


class Admitted:
    """The events the admission takes, for the modes that evaluate elsewhere (--via, --engine
    spark), as they stream in: given out in time order as the watermark passes them, numbered
    in that order; ``origin``: where the clock starts."""

    def __init__(self, lines: Lines, config: EngineConfig, end: int | None,
                 dead: DeadLetters, keep: dict[str, Event] | None = None) -> None:
        self.keep = keep
        self.dead = dead
        self.stream = Stream(admission_rules(config), dead)
        self.lines = lines
        self.end = end
        self.count = 0

    @property
    def origin(self) -> int | None:
        return self.stream.origin

    def __iter__(self) -> Iterator[Event]:
        stream = self.stream

        def malformed(detail: str, line: str) -> None:
            self.dead(DeadLetter("malformed", detail, None, line))

        def numbered(events: list[Event]) -> Iterator[Event]:
            for event in events:
                yield event.renumbered(self.count)
                self.count += 1

        for event in _read(malformed, self.lines, self.keep):
            yield from numbered(stream.push(event))
        yield from numbered(stream.close(self.end))


def replay_plain(doc: ast.Document, wanted: list[str] | None, lines: Lines,
                 config: EngineConfig, end: int | None, out: TextIO,
                 dead: DeadLetters, emit: Composites | None = None) -> Counter[str]:
    """The composites of the profiles (``wanted``: only these) over the trace, by the
    incremental engine, to ``out`` as CloudEvents JSON lines (or ``emit``, a sink of another
    shape); the count per profile."""
    engine = Engine(evaluating(config), dead)
    engine.add_document(doc, wanted)
    emit = emit or Composites(out)
    _admit(engine, Stream(admission_rules(config), dead), lines, end, emit, emit.events)
    return emit.counts


def transport(group: str, tick: int, address: str | None,
              rejected: Rejected | None = None) -> Connect:
    """Group ``group``'s base service: in process (``rejected`` told of each event its
    evaluator refuses), or the one running at ``address`` (which counts them in its replies
    and the link logs them)."""
    from adapters.backends.registry import language
    from adapters.client import in_process, remote_transport

    if address is None:
        return in_process(language(group, tick), rejected)
    return remote_transport(address, group)


def replay_via(group: str, doc: ast.Document, wanted: list[str] | None, lines: Lines,
               config: EngineConfig, end: int | None, address: str | None, out: TextIO,
               dead: DeadLetters, emit: Composites | None = None) -> Counter[str]:
    """What :func:`replay_plain` writes, through the whole transformation path to group
    ``group``'s base service: plan, render, native evaluation, post-filter."""
    from adapters.backends.registry import language
    from adapters.federation import through_group

    federation = through_group(language(group, config.tick), doc, wanted,
                               transport=transport(group, config.tick, address),
                               tick=config.tick, end=end)
    emit = emit or Composites(out)
    admitted = Admitted(lines, config, end, dead, emit.events)
    try:
        for event in admitted:
            if admitted.origin is not None:
                federation.set_origin(admitted.origin)  # both paths share the engine's clock
            emit(federation.push([event]))
        emit(federation.close(end))
    finally:
        emit.flush()
        federation.unsubscribe()
    return emit.counts


def replay_spark(source: str, wanted: list[str] | None, lines: Lines, config: EngineConfig,
                 end: int | None, master: str, out: TextIO, dead: DeadLetters,
                 emit: Composites | None = None) -> Counter[str]:
    """What :func:`replay_plain` writes, by the same engine in Spark tasks (``source``: the
    profile file's text, which the tasks parse)."""
    from spark_jobs.batch import replay, spooled
    from spark_jobs.session import build_session

    counts: Counter[str] = Counter()
    admitted = Admitted(lines, config, end, dead, emit.events if emit is not None else None)
    with spooled(admitted) as events:
        if not events.count or admitted.origin is None:
            return counts
        # The horizon is an admission rule: Spark's engines, one per bucket, evaluate what was
        # admitted and must not apply it again to their own, partial, newest event time.
        for composite in replay(build_session(master), source, events,
                                config=evaluating(config), origin=admitted.origin,
                                end=end, profiles=wanted):
            body = json.loads(composite)
            counts[body["subject"]] += 1
            if emit is not None:
                emit.head()
                composite = emit.formatted(body)
            out.write(composite + "\n")
    return counts


def replay_native(group: str, query: str, lines: Lines, end: int | None, tick: int,
                  address: str | None, out: TextIO, malformed: TextIO) -> None:
    """The notifications of one native query of group ``group``'s language over the trace,
    with the group's own semantics, to ``out`` as JSON lines; a malformed line is reported
    to ``malformed``. The service evaluates a whole trace, so it is read first."""
    from adapters.client import evaluate

    trace: list[Event] = []
    for number, line in lines:
        try:
            trace.append(from_json_line(line, seq=len(trace)))
        except EventError as exc:
            malformed.write(json.dumps({"reason": "malformed", "detail": f"line {number}: {exc}",
                                        "raw": raw(line)}) + "\n")
    trace.sort(key=lambda e: e.key)
    last = end if end is not None else (trace[-1].time if trace else 0)

    def rejected(event: Event, exc: EventRejected) -> None:
        # As the admitting engine's dead letters: the reason, what it says, the event.
        malformed.write(json.dumps(dead_letter_record(DeadLetter(
            exc.reason, f"the {group} evaluator refused event {event.id!r}: {exc.detail}",
            event))) + "\n")

    for d in evaluate(transport(group, tick, address, rejected), query, trace, last):
        record: dict[str, Any] = {"group": group, "time": format_time(d.time), "detection": d.text,
                                  "constituents": [e.id for e in d.constituents]}
        if d.extra:
            record["extra"] = d.extra
        out.write(json.dumps(record, ensure_ascii=False) + "\n")
