"""Provenance: where the events a composite names came from.

A composite names its constituents by id only; a notification says more of each — its source,
type and time — and which services they came through (EVA §5.3: the user sees which of the
federated services contributed). :class:`Origins` keeps, for as long as a composite of a live
document may still name an event, what the pipeline saw of it: its source, type and time, and
the (link, handle) pairs whose notifications named it.
"""

from __future__ import annotations

import heapq
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from adapters.links import Handle
from eva import ast
from eva.classes import required_types
from eva.events import TICK_SOURCE, TICK_TYPE, Event, clock_id
from eva.semantics import source_and_id
from mediator.config import RESERVED_SERVICE as OWN_FEED  # a constituent no service reported
from transforms.dialects.base import Detection
from transforms.runner import lag


@dataclass(frozen=True)
class Described:
    """What a notification says of a composite's constituents besides their ids (in their
    order): source, type and time of each (a tick's type and time from its id; "" and 0 for
    one no longer known), and the services they came through."""

    sources: list[str]
    types: list[str]
    times: list[int]
    services: list[str]


NOT_KEPT = -1
"""An ``_Origins`` horizon: no live document can match the event."""


def _longer(a: int | None, b: int | None) -> int | None:
    """The longer of two horizons (None: unbounded; NOT_KEPT: none)."""
    if a == NOT_KEPT or b == NOT_KEPT:
        return b if a == NOT_KEPT else a
    return None if a is None or b is None else max(a, b)


class Origins:
    """Where the events a composite may still name came from: each one's source, and the
    (link, handle) pairs whose detections named it (the plan leaves that made it visible).
    A composite names only ids; this keeps each event a live document can match (by its type)
    as long as a composite of that document may still name it."""

    def __init__(self) -> None:
        self._source: dict[str, str] = {}
        self._kind: dict[str, tuple[str, int]] = {}  # id → (type, time), as _source
        self._via: dict[tuple[str, str], set[tuple[str, Handle]]] = {}  # by (source, id)
        self._expiry: list[tuple[int, str]] = []  # a heap: (time to forget, id)
        self.clear()

    def clear(self) -> None:
        """No live document: nothing more is kept (what is kept expires as before)."""
        self._by_type: dict[str, int | None] = {}  # type → the longest horizon matching it
        self._any: int | None = NOT_KEPT  # of the documents with a class of any type
        self._longest: int | None = NOT_KEPT  # of every document (ticks)

    def export_state(self) -> dict[str, Any]:
        """What it keeps, as data (a checkpoint's part: eva.snapshot.to_data)."""
        return {"source": self._source, "kind": self._kind, "via": self._via,
                "expiry": self._expiry}

    def import_state(self, state: dict[str, Any]) -> None:
        self._source, self._kind = dict(state["source"]), dict(state["kind"])
        self._via = {k: set(v) for k, v in state["via"].items()}
        self._expiry = list(state["expiry"])
        heapq.heapify(self._expiry)

    def widen(self, types: frozenset[str] | None, horizon: int | None) -> None:
        """Keep what one more document may name too (``types`` None: any type)."""
        if types is None:
            self._any = _longer(self._any, horizon)
        for t in types or ():
            self._by_type[t] = _longer(self._by_type.get(t, NOT_KEPT), horizon)
        self._longest = _longer(self._longest, horizon)

    def __len__(self) -> int:
        """The events it keeps."""
        return len(self._source)

    def note(self, events: Iterable[Event]) -> None:
        source = self._source
        horizons: dict[str, int | None] = {}  # per type, for the batch: a batch has few types
        for e in events:
            if e.id in source:
                continue
            kind = e.type
            if kind in horizons:
                horizon = horizons[kind]
            else:
                horizon = horizons[kind] = (
                    self._longest if kind.startswith(TICK_TYPE)
                    else _longer(self._by_type.get(kind, NOT_KEPT), self._any))
            if horizon == NOT_KEPT:
                continue
            source[e.id] = e.source
            self._kind[e.id] = (kind, e.time)
            if horizon is not None:
                heapq.heappush(self._expiry, (e.time + horizon, e.id))

    def reported(self, link: str, handle: Handle, detections: Iterable[Detection]) -> None:
        for d in detections:
            self.note(d.constituents)  # the ticks the mediator published
            for e in d.constituents:
                if e.id in self._source:
                    self._via.setdefault((e.source, e.id), set()).add((link, handle))

    def forget(self, newest: int) -> None:
        """Drop what no composite reported after ``newest`` can name."""
        while self._expiry and self._expiry[0][0] < newest:
            _, ident = heapq.heappop(self._expiry)
            source = self._source.pop(ident, None)
            self._kind.pop(ident, None)
            if source is not None:
                self._via.pop((source, ident), None)

    def describe(self, constituents: Sequence[str], handles: set[tuple[str, Handle]],
                 occurrence: Hashable = None) -> Described:
        """The sources, types and times, one per constituent, and the services they came
        through (each once, in constituent order; a constituent no service reported: the
        mediator's own). The
        occurrence's identity names each primitive constituent's (source, id) — CloudEvents
        make only the pair unique — and is read where it does; else by id, as kept."""
        pairs = _pairs(occurrence, constituents)
        sources: list[str] = []
        services: dict[str, None] = {}
        for at, ident in enumerate(constituents):
            pair = pairs[at] if pairs is not None else None
            source = pair[0] if pair is not None else self._source.get(
                ident, TICK_SOURCE if ident.startswith("tick:") else "")
            sources.append(source)
            named = self._via.get((source, ident), set())
            via = sorted({link for link, h in handles if (link, h) in named})
            for link in via or [OWN_FEED]:
                services[link] = None
        kinds = [self._kind.get(ident) or clock_id(ident) or ('', 0) for ident in constituents]
        return Described(sources, [k[0] for k in kinds], [k[1] for k in kinds], list(services))


def _pairs(occurrence: Hashable, constituents: Sequence[str]
           ) -> list[tuple[str, str] | None] | None:
    """Each constituent's (source, id) as the occurrence's identity names it (None for a tick
    or an absence), in constituent order (eva.semantics: a primitive's identity is the pair
    with its time — the bare pair in a checkpoint of an earlier version —, a binary
    composite's (tag, left, right)); None when the identity is not of those shapes or does not
    name exactly these constituents."""
    out: list[tuple[str, str] | None] = []

    def walk(ident: Any) -> bool:
        if not isinstance(ident, tuple) or not ident:
            return False
        pair = source_and_id(ident)
        if pair is not None:
            out.append(pair)
            return True
        if ident[0] in ("tick", "not"):
            out.append(None)
            return True
        return (len(ident) == 3 and isinstance(ident[0], str)
                and walk(ident[1]) and walk(ident[2]))

    if not walk(occurrence) or len(out) != len(constituents):
        return None
    if any(p is not None and p[1] != c for p, c in zip(out, constituents, strict=True)):
        return None
    return out


def horizon(doc: ast.Document, tick: int) -> int | None:
    """How long after an event a composite of the document may still name it: the profiles'
    reach, once for the composite's own span and once for the runner's wait on the services'
    answers (a leaf's delay is at most its profile's reach), plus the clock's granularity."""
    found = 0
    for p in doc.profiles:
        reach = lag(p.expr, p.evaluation is ast.Evaluation.END_OF_INTERVAL, tick)
        if reach is None:
            return None
        found = max(found, 2 * reach + 2 * tick)
    return found


def types(doc: ast.Document) -> frozenset[str] | None:
    """The event types the document's profiles can match (None: any)."""
    classes = doc.class_map()
    out: set[str] = set()
    for name in {n.name for p in doc.profiles for n in ast.walk(p.expr) if isinstance(n, ast.Prim)}:
        body = classes[name].body
        if isinstance(body, ast.Every):
            continue
        found = required_types(body, classes)
        if found is None:
            return None
        out |= found
    return frozenset(out)


__all__ = ["NOT_KEPT", "Described", "Origins", "horizon", "types"]
