"""CG-5: a peer mediator — the EVA language itself, with its full semantics.

The native query is an EVA profile document (classes and profiles, docs/language.md), evaluated
by the incremental engine. A native notification is the peer's composite: the constituent
CloudEvents plus, in ``extra``, the occurrence as the engine knows it (identity, order key,
report key, partition, constituent ids including time events and absences), so the mediator
can take the peer's answer over exactly.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from adapters.native import Detection, NativeQueryError
from mediator.eva import ast
from mediator.eva.engine import Engine, EngineConfig
from mediator.eva.events import Event
from mediator.eva.notify import tuples_from_json, tuples_to_json
from mediator.eva.parser import ProfileError, parse
from mediator.eva.printer import to_text
from mediator.eva.semantics import Notification, Occ
from mediator.eva.validate import refs
from transforms.capability import CG5, Capability


def occurrence(extra: dict[str, Any]) -> tuple[tuple[int, int, Any], Occ]:
    """(report key, occurrence) of a peer notification."""
    key = tuples_from_json(extra["key"])
    occ = Occ(key[0], key, tuples_from_json(extra["ident"]), tuple(extra["events"]),
              tuples_from_json(extra.get("anchor")))
    return tuples_from_json(extra["emitted"]), occ


class Evaluator:
    def __init__(self, doc: ast.Document, config: EngineConfig) -> None:
        self._engine = Engine(config)
        self._engine.add_document(doc)
        self._events: dict[str, Event] = {}

    def _detections(self, notes: list[Notification]) -> list[Detection]:
        out = []
        for n in notes:
            occ = n.occ
            extra = {"profile": n.profile, "partition": n.partition, "ident": tuples_to_json(occ.ident),
                     "key": tuples_to_json(occ.key), "emitted": tuples_to_json(n.emitted),
                     "events": list(occ.events), "anchor": tuples_to_json(occ.anchor)}
            constituents = tuple(self._events[i] for i in occ.events if i in self._events)
            out.append(Detection(occ.time, constituents, f"{n.profile}{list(occ.events)}", extra))
        return out

    def push(self, event: Event) -> list[Detection]:
        self._events[event.id] = event
        return self._detections(self._engine.push(event))

    def advance(self, time: int) -> list[Detection]:
        return self._detections(self._engine.close(time))


@dataclass(frozen=True)
class PeerQuery:
    text: str
    doc: ast.Document
    config: EngineConfig = field(default_factory=EngineConfig)

    def evaluator(self) -> Evaluator:
        return Evaluator(self.doc, self.config)


class PeerLanguage:
    name = "eva"
    group = "cg5"
    capability: Capability = CG5

    def __init__(self, tick: int = 1_000_000) -> None:
        self.config = EngineConfig(tick=tick)

    def parse(self, text: str) -> PeerQuery:
        try:
            doc = parse(text, "<query>")
        except ProfileError as exc:
            raise NativeQueryError(self.name, exc.message, exc.line, exc.column, text) from None
        if not doc.profiles:
            raise NativeQueryError(self.name, "the query defines no profile", 1, 1, text)
        return PeerQuery(text, doc, self.config)

    def render(self, expr: ast.Expr, doc: ast.Document) -> str:
        return self.render_profile(ast.Profile("R", expr), doc)

    def render_profile(self, profile: ast.Profile, doc: ast.Document) -> str:
        """The profile with the classes it uses (and the classes those refer to)."""
        classes = doc.class_map()
        needed: set[str] = set()

        def need(name: str) -> None:
            if name in needed:
                return
            needed.add(name)
            body = classes[name].body
            if not isinstance(body, ast.Every):
                for ref in refs(body):
                    need(ref)

        for node in ast.walk(profile.expr):
            if isinstance(node, ast.Prim):
                need(node.name)
        used = tuple(c for c in doc.classes if c.name in needed)
        return to_text(ast.Document(used, (profile,)))

