"""The profile table the streaming job follows: which profile documents it evaluates, since
when, and which of their profiles were removed. The mediator writes it (``write_table``) while
the job runs; the fan-out (spark_jobs/job.py) reads it to route each event to its (profile,
bucket) keys (``route``) and the processor (spark_jobs/processor.py) to build and drop a key's
engine (``profiles``), both re-reading the file whenever it changes."""

from __future__ import annotations

import json
import os
import zlib
from dataclasses import dataclass
from functools import lru_cache

from eva.classes import Matcher
from eva.events import Event
from spark_jobs.routing import document, event_matchers, memberships
from spark_jobs.spool import write_whole


@dataclass(frozen=True)
class Registration:
    """A registered document: its text and when it was registered (µs; its profiles see
    events after that, EVA Def. 3.5). ``registered`` None: at the job's first event, as
    ``evamed replay`` registers (its clock starts at the first event's time − lateness − 1 µs;
    docs/spark.md, "Registration")."""

    text: str
    registered: int | None
    removed: frozenset[str] = frozenset()  # profiles of the document no longer evaluated

    @property
    def token(self) -> str:
        """Identifies this registration: a profile re-registered later gets a fresh engine."""
        at = "first" if self.registered is None else self.registered
        return f"{at}:{zlib.crc32(self.text.encode())}"


Entry = tuple[Registration, str | None, list[Matcher]]
"""A profile's row of the table: its registration, its ``per`` path, the matchers of its event
classes."""


def write_table(path: str, registrations: list[Registration]) -> None:
    """The profile table the running job follows: written whole and atomically."""
    write_whole(path, json.dumps([{"text": r.text, "registered": r.registered,
                                   "removed": sorted(r.removed)} for r in registrations]))


@lru_cache(maxsize=32)
def _table(path: str, version: int) -> dict[str, Entry]:
    with open(path, encoding="utf-8") as handle:
        entries = [Registration(e["text"], None if e["registered"] is None else int(e["registered"]),
                                frozenset(e.get("removed", ()))) for e in json.load(handle)]
    out = {}
    for entry in entries:
        doc = document(entry.text)
        for profile in doc.profiles:
            if profile.name not in entry.removed:
                out[profile.name] = (entry, profile.per, event_matchers(profile, doc))
    return out


def profiles(table: str) -> dict[str, Entry]:
    """Profile name → its entry, by the table at path ``table`` as it is now (re-read when the
    file changes: profiles come and go while the job runs)."""
    return _table(table, os.stat(table).st_mtime_ns)


def route(table: list[tuple[str, Entry]], buckets: int, event: Event | None) -> list[tuple[str, int]]:
    """The (profile, bucket) keys an event belongs to, by the (sorted) profile table; a
    malformed line (None) goes to one profile's bucket 0, whose engine reports it as a dead
    letter."""
    if event is None:
        return [(name, 0) for name, _ in table[:1]]
    return memberships(((name, per, matchers) for name, (_, per, matchers) in table), event,
                       buckets)
