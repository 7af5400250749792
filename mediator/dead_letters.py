"""The dead-letter log: every input the mediator refused, kept as data (docs/operations.md,
"Dead letters").

Four places refuse: the door (``Publish`` and the brokers' sources, mediator/door.py), a
broker source's mapping (adapters/mapping.py, before an event exists), the own feed's reader
(mediator/ingestion.py: a line of the event log it cannot use) and the pipeline (a service's
report behind an instant decided already). Each hands its refusals of one batch to
:meth:`DeadLetterLog.record`, which appends them to the store's dead-letter log (one durable
write), counts them per source and reason, and writes **one** WARNING line for the batch. The
log keeps the newest ``dead_letters.retention`` letters; each letter keeps at most
``dead_letters.raw_bytes`` of what was refused (``size`` says how much there was).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from eva.events import brief_repr
from mediator.config import DeadLetters
from mediator.metrics import Metrics
from mediator.store.base import DeadLetterRecord, Store

log = logging.getLogger("evamed.dead_letters")

MEDIATOR = "mediator"
"""The source of a letter the own feed's reader wrote (a line of the event log)."""
SHOWN = 3
"""Letters a batch's WARNING line names (the rest are counted)."""
QUIET = 1.0
"""Seconds after a source's WARNING line during which its next batches are only counted (the
next line says how many): a producer whose every message is refused does not flood the log."""


def now_us() -> int:
    return time.time_ns() // 1000


@dataclass(frozen=True)
class Letter:
    """A refusal about to be recorded: what :meth:`DeadLetterLog.record` takes."""

    reason: str
    source: str
    detail: str
    raw: bytes | str = b""
    client: str = ""
    where: str = ""
    event_id: str = ""
    kind: str = "cloudevent"


class DeadLetterLog:
    """The store's dead-letter log, with the metrics and the log line (module docstring)."""

    def __init__(self, store: Store, metrics: Metrics | None = None,
                 settings: DeadLetters | None = None) -> None:
        self.store = store
        self.metrics = metrics
        self.settings = settings or DeadLetters()
        self._lock = threading.Lock()
        self._since_trim = 0
        self._said: dict[str, tuple[float, int, int]] = {}  # source → (when, batches, letters)

    def record(self, letters: Sequence[Letter], of: int | None = None) -> None:
        """Keep one batch's refusals (``of``: how many inputs the batch had, for the log
        line). A store that cannot be written is logged, never raised: the refusal stands."""
        if not letters:
            return
        at = now_us()
        bound = self.settings.raw_bytes
        records = []
        for letter in letters:
            raw = letter.raw.encode("utf-8", "surrogatepass") if isinstance(
                letter.raw, str) else bytes(letter.raw)
            records.append(DeadLetterRecord(
                str(letter.reason), letter.source, letter.detail, at, letter.client,
                letter.where, letter.event_id[:200], raw[:bound], len(raw), letter.kind))
        if self.metrics is not None:
            for (source, reason), count in Counter(
                    (r.source, r.reason) for r in records).items():
                self.metrics.dead_letters.labels(source, reason).inc(count)
        try:
            head = self.store.append_dead_letters(records)
        except Exception as exc:  # the refusal is said in the log line below, at least
            log.error("%d dead letters could not be kept in the store (%s): %s", len(records),
                      type(exc).__name__, exc)
            head = 0
        self._summary(records, head, of)
        self._trim(len(records))

    def _summary(self, records: list[DeadLetterRecord], head: int, of: int | None) -> None:
        source = records[0].source
        now = time.monotonic()
        with self._lock:
            when, batches, held = self._said.get(source, (-QUIET, 0, 0))
            if now - when < QUIET:
                self._said[source] = (when, batches + 1, held + len(records))
                return
            self._said[source] = (now, 0, 0)
        since = (f" (and {held} in {batches} batches since the last line)" if batches else "")
        reasons = ", ".join(f"{reason} {count}" for reason, count in
                            Counter(r.reason for r in records).most_common())
        first = records[0]
        who = f" (client {first.client})" if first.client else ""
        named = "; ".join(
            f"{r.reason}: {brief_repr(r.event_id) + ': ' if r.event_id else ''}"
            f"{r.where + ': ' if r.where else ''}{r.detail[:300]}" for r in records[:SHOWN])
        total = f" of {of}" if of is not None else ""
        at = f" (positions {head - len(records) + 1}–{head})" if head else ""
        log.warning("dead letters from %s%s: %d%s refused — %s%s%s; e.g. %s; list them with "
                    "`evamed dead-letters --source %s`", source, who, len(records), total,
                    reasons, at, since, named, source)

    def _trim(self, added: int) -> None:
        """Keep the newest ``retention`` (checked every tenth of it: between retention and
        1.1 × retention are kept)."""
        keep = self.settings.retention
        with self._lock:
            self._since_trim += added
            if self._since_trim < max(1, keep // 10):
                return
            self._since_trim = 0
        try:
            self.store.trim_dead_letters(keep)
        except Exception as exc:
            log.warning("the dead-letter log could not be trimmed: %s", exc)


__all__ = ["MEDIATOR", "DeadLetterLog", "Letter", "now_us"]
