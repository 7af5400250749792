"""The door: how an event enters the mediator — ``Publish`` and the brokers' sources alike
(docs/semantics.md §17; docs/operations.md, "Events in").

Each line of a batch is checked, in this order, by the rules of :mod:`eva.admission` (the same
as ``evamed replay``'s): its size against its lane's ``max_event_bytes`` (``too_large``),
decoded (``malformed``), not an event an autonomous service's coverage observes
(``misrouted``), then :class:`~eva.admission.Admission` — a ``(source, id)`` already admitted
(``duplicate``), behind the watermark (``late``: older than the newest admitted time minus its
lane's lateness, or at or before an ``advance_to_us``), more than ``future`` ahead of the
mediator's clock (``future``). A *lane* is where the event came in: ``publish``, or a
``[[sources]]`` name (its own ``lateness`` and ``max_event_bytes``, if stated).

The accepted lines are appended to the event log in one durable write — **in arrival order**,
also those older than the newest (within the lateness): the own feed's reorder buffer
(mediator/ingestion.py) hands them on in time order — and only then is the admission's state
committed, the pipeline woken and the batch answered (the reply, or the broker's
acknowledgement). Every refusal is kept in the dead-letter log with the lane, the client, the
place and the raw line (mediator/dead_letters.py). One batch decides and appends at a time (a
lock), so the event log's order is the order the checks saw.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import orjson

from eva.admission import NEVER, Admission, Reason, Refused, Trial, too_large
from eva.events import Event, EventError, brief_repr, from_json_line, read_texts
from mediator.config import PUBLISH_LANE, Config
from mediator.dead_letters import DeadLetterLog, Letter
from mediator.metrics import Metrics
from mediator.security import may_publish
from mediator.store.base import Store
from transforms.federated import ServiceInfo

log = logging.getLogger("evamed.service")

ADVANCE_KEY = "door.advance"
"""Store meta: the newest ``advance_to_us`` taken (nothing at or before it is taken any more,
also after a restart)."""
SEEDED = 100_000
"""Event-log entries the door reads back at start (as many as the duplicate memory's generation
holds, as before: a restart reads no more of the log than it did)."""


def wall_clock() -> int:
    """Now, in µs since the epoch (the ``future`` rule's clock)."""
    return time.time_ns() // 1000


class LogWriteError(OSError):
    """The event log could not be written: none of ``count`` events was accepted."""

    def __init__(self, count: int, message: str) -> None:
        super().__init__(message)
        self.count = count


@dataclass
class Tally:
    """What a call (or a broker's batch) got: counts, and each refusal with its index."""

    accepted: int = 0
    dead: int = 0
    index: int = 0
    refused: list[tuple[int, str, Refused]] = field(default_factory=list)
    """(index in the call, event id, refusal), in order."""


class Judged(NamedTuple):
    """One line's fate: the event, or why it was refused. (A tuple: one is made per event,
    and a frozen dataclass's constructor cost more than judging it.)"""

    line: str
    event: Event | None
    refused: Refused | None


class Door:
    """The admission of the mediator's own feed (the module docstring)."""

    def __init__(self, store: Store, config: Config, metrics: Metrics,
                 letters: DeadLetterLog, autonomous: Sequence[ServiceInfo] = ()) -> None:
        self.store = store
        self.config = config
        self.metrics = metrics
        self.letters = letters
        self.rules = config.admission()
        self.admission = Admission(self.rules, clock=wall_clock)
        self.autonomous = list(autonomous)
        self.order = asyncio.Lock()
        """Held while a batch is decided and appended (and by ``advance``)."""
        self.appended: Callable[[int, list[str], list[Event]], None] | None = None
        """Told after each durable append, in the thread that wrote it: the log's head, the
        lines appended and their events (the pipeline's own feed takes the events instead of
        decoding the lines again; it still reads the lines from the log)."""

    @property
    def newest(self) -> int | None:
        """The newest event time admitted."""
        return self.admission.newest

    def restore(self) -> None:
        """Seed the duplicate memory and the newest time from the event log's tail, and the
        advance from the store (what was accepted before a restart is still recognised)."""
        head = self.store.event_head()
        after = max(0, head - SEEDED)
        admission = self.admission
        # What lies before the tail is not remembered: an unseeded event is no later than the
        # newest at the first seeded one's arrival — at most its time plus the lateness.
        first: int | None = None if after == 0 else NEVER
        while after < head:
            batch = self.store.read_events(after, 1000)
            if not batch:
                break
            for item in batch:
                try:
                    event = from_json_line(item.line)
                except EventError:
                    continue  # accepted by another version: not this one's to judge
                admission.take(event)
                if first is not None and first == NEVER:
                    first = event.time
            after = batch[-1].position
        if first is not None and first != NEVER and admission.newest is not None:
            admission.ids.forget_until(min(first + self.rules.longest, admission.newest))
        kept = self.store.get_meta(ADVANCE_KEY)
        if kept is not None:
            with contextlib.suppress(ValueError):
                admission.advance(int(kept))

    async def take(self, lines: Iterable[str], tally: Tally, append: Any, *,
                   lane: str = PUBLISH_LANE, client: str = "",
                   granted: Sequence[str] | None = None) -> None:
        """One batch, under :attr:`order` (the caller holds it): each line judged (``granted``:
        the sources the publishing client may publish under; None: a broker's), the accepted
        appended with ``append(lines)`` (in a thread; durable), the state committed, the
        pipeline woken by the caller. Refusals in ``tally`` and the dead-letter log.
        LogWriteError if the write failed: nothing of ``lines`` was accepted (the refusals
        found are kept all the same)."""
        trial = Trial(self.admission)
        accepted: list[str] = []
        events: list[Event] = []
        letters: list[Letter] = []
        start = tally.index
        lines = list(lines)
        limit = self.rules.max_bytes_of(lane)
        plain = not self.autonomous  # no coverage to check: the common case, in one loop
        allowed: dict[str, bool] | None = None if granted is None else {}  # per source

        def may(source: str) -> bool:  # matched once per source and batch: a fifth of the
            return may_publish(granted or (), source)  # door's time when it was per event

        decoded = _decode(lines, limit)
        i, n = 0, len(lines)
        while i < n:
            refused: Refused | None = None
            if plain:
                # Compiled: each line decoded, of a source the client may publish under and
                # admitted is taken, up to one that is not (refused: the rules refused it).
                stop, refused = trial.run(lines, decoded, i, lane, allowed, may, accepted,
                                          events)
                tally.index += stop - i
                i = stop
                if i == n:
                    break
            line = lines[i]
            event = decoded[i]
            if refused is not None and isinstance(event, Event):
                judged = Judged(line.rstrip("\r\n"), event, refused)
            else:
                judged = self._judge(line, trial, lane, client, granted, decoded[i])
            if judged.refused is None:
                accepted.append(judged.line)
                assert judged.event is not None
                events.append(judged.event)
            else:
                ident = judged.event.id if judged.event is not None else _loose_id(line)
                tally.dead += 1
                tally.refused.append((tally.index, ident, judged.refused))
                letters.append(Letter(
                    judged.refused.reason, lane, judged.refused.detail, line, client=client,
                    where=self._where(lane, judged.event, tally.index), event_id=ident))
            tally.index += 1
            i += 1
        try:
            if accepted:
                appended = self.appended

                def durably(batch: list[str]) -> Any:
                    head = append(batch)
                    if appended is not None and isinstance(head, int):
                        # In the writer's thread, straight after the write: handed on the loop,
                        # the pipeline often read the batch back from the log first. The lines
                        # are durable now: a failure here is not a failed write (the client
                        # would resend what was taken); the feed reads them from the log.
                        try:
                            appended(head, batch, events)
                        except Exception:
                            log.exception("handing %d appended events to the pipeline failed; "
                                          "it reads them from the event log", len(batch))
                    return head

                try:
                    await asyncio.to_thread(durably, accepted)
                except Exception as exc:
                    log.exception("appending %d events failed", len(accepted))
                    raise LogWriteError(len(accepted), f"the event log could not be written "
                                        f"({type(exc).__name__})") from None
                trial.commit()
                self.metrics.events_in.labels(lane).inc(len(accepted))
                tally.accepted += len(accepted)
        finally:
            if letters:
                await asyncio.to_thread(self.letters.record, letters, tally.index - start)

    def _where(self, lane: str, event: Event | None, index: int) -> str:
        """Where a refused line was: a broker's topic (MQTT), or its index in the call."""
        topic = event.attributes.get("topic") if event is not None else None
        if lane != PUBLISH_LANE and isinstance(topic, str):
            return topic
        return f"event {index}"

    def _judge(self, line: str, trial: Trial, lane: str, client: str = "",
               granted: Sequence[str] | None = None,
               decoded: Event | EventError | None = None) -> Judged:
        """``decoded``: the line's event or error when :func:`_decode` read it (None: read
        it here, after the size rule)."""
        limit = self.rules.max_bytes_of(lane)
        # A code point is at most 4 bytes: most lines pass without being encoded.
        refused = (None if limit is None or len(line) * 4 <= limit
                   else too_large(_size(line), limit))
        if refused is not None:
            return Judged(line, None, refused)
        if isinstance(decoded, EventError):
            return Judged(line, None, Refused(Reason.MALFORMED, str(decoded)))
        try:
            event = decoded if decoded is not None else from_json_line(line)
        except EventError as exc:
            return Judged(line, None, Refused(Reason.MALFORMED, str(exc)))
        except Exception as exc:  # whatever the line holds, only this event is refused
            log.exception("an event could not be read")
            return Judged(line, None, Refused(Reason.MALFORMED, f"could not be read "
                                              f"({type(exc).__name__})"))
        if granted is not None and not may_publish(granted, event.source):
            # Before the duplicate memory and the newest time see it: another client's source
            # and id taken first would make that client's real event a `duplicate`.
            return Judged(line, event, Refused(
                Reason.FORBIDDEN, f"client {client!r} may not publish under source "
                f"{brief_repr(event.source)}: it may under {_patterns(granted)} (the operator "
                "grants sources: evamed clients add NAME --sources PATTERN…)"))
        owner = self._producer(event)
        if owner:
            return Judged(line, event, Refused(
                Reason.MISROUTED, f"an event of source {brief_repr(event.source)} and type "
                f"{brief_repr(event.type)} is produced at the autonomous service {owner!r} (its "
                "coverage): publish it there — taken here, the merged trace would hold it "
                "twice or the service would miss it"))
        return Judged(line.rstrip("\r\n"), event, trial.judge(event, lane))

    def _producer(self, event: Event) -> str:
        """The autonomous service whose coverage observes ``event`` ("": none)."""
        for service in self.autonomous:
            if service.coverage.observes(event):
                return service.name
        return ""

    def check_advance(self, mark: int) -> str:
        """Why an advance is refused ("": taken)."""
        return self.admission.check_advance(mark)

    def advance(self, mark: int) -> None:
        """Nothing at or before ``mark`` is taken any more (kept in the store: also after a
        restart)."""
        if self.admission.advanced is not None and mark <= self.admission.advanced:
            return
        self.admission.advance(mark)
        try:
            self.store.set_meta(ADVANCE_KEY, str(mark))
        except Exception as exc:  # the advance holds in this process all the same
            log.warning("the advance to %d could not be kept in the store: %s", mark, exc)


def _size(line: str) -> int:
    """The line's size in UTF-8 bytes (a lone surrogate as its 3 bytes)."""
    return len(line.encode("utf-8", "surrogatepass"))


def _decode(lines: list[str], limit: int | None) -> list[Event | EventError | None]:
    """The lines that pass the size rule decoded in one compiled loop (events.read_texts),
    None for the others (too large: never read) — or None for all if the batch could not be
    read so (each line is then read alone, and only its own event refused)."""
    # A code point is at most 4 bytes: most lines pass without being encoded, and most
    # batches without a look at each line.
    small: list[bool] | None = None
    if limit is not None and max(map(len, lines), default=0) * 4 > limit:
        small = [len(line) * 4 <= limit or _size(line) <= limit for line in lines]
    try:
        if small is None:
            return list(read_texts(lines))
        read = iter(read_texts([line for line, ok in zip(lines, small, strict=True) if ok]))
    except Exception:
        log.exception("a batch of events could not be read at once")
        return [None] * len(lines)
    return [next(read) if ok else None for ok in small]


def _patterns(granted: Sequence[str]) -> str:
    """A grant as a message quotes it: the first few patterns, each cut."""
    shown = " ".join(brief_repr(p) for p in granted[:5])
    return shown + (f" and {len(granted) - 5} more" if len(granted) > 5 else "")


def _loose_id(line: str) -> str:
    """The id of a malformed event, when its JSON has one (for the dead letter)."""
    try:
        value = orjson.loads(line)
    except orjson.JSONDecodeError:
        return ""
    ident = value.get("id") if isinstance(value, dict) else None
    return ident[:200] if isinstance(ident, str) else ""


__all__ = ["ADVANCE_KEY", "Door", "LogWriteError", "Tally", "wall_clock"]
