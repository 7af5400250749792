"""The profile table the streaming job follows: which profile documents it evaluates, since
when, and which of their profiles were removed. The mediator writes it (``write_table``) while
the job runs; the fan-out (spark_jobs/job.py) reads it to route each event to its (profile,
bucket) keys (``route``) and to clear a removed profile's keys (``removed``), and the processor
(spark_jobs/processor.py) to build and drop a key's engine (``profiles``), both re-reading the
file whenever it changes."""

from __future__ import annotations

import json
import os
import zlib
from dataclasses import dataclass
from functools import lru_cache

from eva.classes import Matcher
from eva.events import Event, field_path
from spark_jobs.routing import (
    bucket_at,
    clock_driven,
    document,
    envelope_only,
    event_matchers,
)
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
    after: int = 0
    """The input position it was registered at (the composer log's, for the mediator's live
    jobs): its profiles see the lines after it only (0: every line)."""

    @property
    def token(self) -> str:
        """Identifies this registration: a profile re-registered later gets a fresh engine."""
        at = "first" if self.registered is None else self.registered
        where = f"@{self.after}" if self.after else ""
        return f"{at}{where}:{zlib.crc32(self.text.encode())}"


Entry = tuple[Registration, str | None, list[Matcher]]
"""A profile's row of the table: its registration, its ``per`` path, the matchers of its event
classes."""


def write_table(path: str, registrations: list[Registration]) -> None:
    """The profile table the running job follows: written whole and atomically."""
    write_whole(path, json.dumps([{"text": r.text, "registered": r.registered,
                                   "removed": sorted(r.removed), "after": r.after}
                                  for r in registrations]))


@lru_cache(maxsize=32)
def _table(path: str, version: int
           ) -> tuple[dict[str, Entry], tuple[str, ...], tuple[str, ...]]:
    with open(path, encoding="utf-8") as handle:
        entries = [Registration(e["text"], None if e["registered"] is None else int(e["registered"]),
                                frozenset(e.get("removed", ())), int(e.get("after", 0)))
                   for e in json.load(handle)]
    out = {}
    for entry in entries:
        doc = document(entry.text)
        for profile in doc.profiles:
            if profile.name not in entry.removed:
                out[profile.name] = (entry, profile.per, event_matchers(profile, doc))
    gone = {name for entry in entries for name in entry.removed if name not in out}
    alone = []
    for name, (entry, per, _) in sorted(out.items()):
        doc = document(entry.text)
        if per is not None and clock_driven(next(p for p in doc.profiles if p.name == name), doc):
            alone.append(name)
    return out, tuple(sorted(gone)), tuple(alone)


def profiles(table: str) -> dict[str, Entry]:
    """Profile name → its entry, by the table at path ``table`` as it is now (re-read when the
    file changes: profiles come and go while the job runs)."""
    return _table(table, os.stat(table).st_mtime_ns)[0]


def acts_alone(table: str) -> tuple[str, ...]:
    """The ``per`` profiles of the table whose engines act without events — a negation, a time
    class, results at the end of an interval: an ordered job's fan-out gives every bucket of
    theirs each frame's watermark (processor.CLOCK), so that every key of a micro-batch decides
    up to it, not only those with events in it."""
    return _table(table, os.stat(table).st_mtime_ns)[2]


def removed(table: str) -> tuple[str, ...]:
    """The profiles the table lists as removed (and not registered again): the fan-out sends
    each of their buckets a drop row in every frame, so their state goes at the next
    micro-batch, whether or not an event of theirs comes. A writer of the table may forget a
    removed profile (or its whole document) once a micro-batch has run after its removal."""
    return _table(table, os.stat(table).st_mtime_ns)[1]


Route = tuple[str, tuple[str, tuple[str, ...]] | None]  # a profile and its split ``per`` path


class Router:
    """The (profile, bucket) keys of events, by one version of the table: a profile whose
    classes test only ``type`` and ``source`` (routing.envelope_only) is matched once per
    (type, source) pair seen, the others per event; a ``per`` value is read once per event and
    profile. A malformed line (None) goes to one profile's bucket 0, whose engine reports it
    as a dead letter."""

    def __init__(self, table: dict[str, Entry], buckets: int) -> None:
        self.buckets = buckets
        names = sorted(table)
        self.first = [(name, 0) for name in names[:1]]
        routes = []
        for name in names:
            entry, per, matchers = table[name]
            profile = next(p for p in document(entry.text).profiles if p.name == name)
            routes.append((name, None if per is None else field_path(per), matchers,
                           envelope_only(profile, document(entry.text))))
        self.envelope = [(name, per, matchers) for name, per, matchers, only in routes if only]
        self.other = [(name, per, matchers) for name, per, matchers, only in routes if not only]
        self.seen: dict[tuple[str, str], list[Route]] = {}

    def keys(self, event: Event | None) -> list[tuple[str, int]]:
        if event is None:
            return self.first
        pair = (event.type, event.source)
        wanted = self.seen.get(pair)
        if wanted is None:
            wanted = [(name, per) for name, per, matchers in self.envelope
                      if any(match(event) for match in matchers)]
            if len(self.seen) < 4096:  # a bound, should types or sources run wild
                self.seen[pair] = wanted
        if self.other:
            wanted = wanted + [(name, per) for name, per, matchers in self.other
                               if any(match(event) for match in matchers)]
        out = []
        for name, per in wanted:
            group = 0 if per is None else bucket_at(event, per, self.buckets)
            if group is not None:
                out.append((name, group))
        return out


def router(table: str, buckets: int) -> Router:
    """The router of the table at path ``table`` as it is now."""
    return _router(table, os.stat(table).st_mtime_ns, buckets)


@lru_cache(maxsize=8)
def _router(table: str, version: int, buckets: int) -> Router:
    return Router(_table(table, version)[0], buckets)
