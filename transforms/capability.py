"""Capability records: what a target language supports (research/transforms.md §4).

CG-1 … CG-5 are the language groups of EVA Table 1; CG-0 is "primitive filters only" (MQTT,
Redis). A service may declare any record.
"""

from __future__ import annotations

from dataclasses import dataclass, field

DISJUNCTION = "disjunction"
CONJUNCTION = "conjunction"
SEQUENCE = "sequence"
NEGATION = "negation"
SELECTION = "selection"

Setting = tuple[str, str, str, str]
"""(operator, anterior EIS kind, posterior EIS kind, EIC) a service evaluates natively."""

SET_SEMANTICS: frozenset[Setting] = frozenset(
    (op, "all", "all", "all_pairs") for op in (DISJUNCTION, CONJUNCTION, SEQUENCE))
"""Every combination within the frame, nothing consumed: what joins and boolean filters do."""

SNOOP_CONTEXTS: frozenset[Setting] = SET_SEMANTICS | {
    # Verified on every trace up to length 7 (research/snoop.md §5.3, tests/test_snoop_contexts.py).
    (SEQUENCE, "last", "all", "unique_pairs"),       # recent
    (SEQUENCE, "first", "first", "repeated_pairs"),  # chronicle
    (SEQUENCE, "all", "first", "unique_pairs"),      # continuous
    (CONJUNCTION, "first", "first", "repeated_pairs"),  # chronicle
}


@dataclass(frozen=True)
class Capability:
    """What a target language can evaluate, and how.

    ``negation``: ``none``, ``logical`` (untimed NOT), ``event_bounded`` (NOT(E)[S, F]) or
    ``timed`` (EVA's (not E)_T, absence over a span). ``settings``: the EIS/EIC combinations it
    evaluates natively (``None``: all of them). ``window``: ``point`` when a time frame bounds
    the distance of the operands' occurrence times (EVA), ``span`` when it bounds the whole
    span of all constituents (XChange ``within``) — the two agree only on primitive operands.
    """

    name: str
    operators: frozenset[str]
    timed: bool
    negation: str = "none"
    settings: frozenset[Setting] | None = field(default=SET_SEMANTICS)
    window: str = "point"
    timeless: bool = True
    accepts_events: bool = True
    """The mediator may publish events to it (ticks of a time class, for transferring rules)."""
    description: str = ""

    def supports(self, operator: str) -> bool:
        if operator == NEGATION:
            return self.negation == "timed"
        return operator in self.operators

    def native(self, setting: Setting) -> bool:
        return self.settings is None or setting in self.settings


CG0 = Capability("CG-0", frozenset(), timed=False, settings=frozenset(), accepts_events=False,
                 description="primitive filters only (MQTT, Redis Streams)")
CG1 = Capability("CG-1", frozenset({CONJUNCTION, DISJUNCTION}), timed=False, negation="logical",
                 description="boolean composite filters: AND, OR, untimed NOT")
CG2 = Capability("CG-2", frozenset({CONJUNCTION, DISJUNCTION, SEQUENCE}), timed=False,
                 negation="event_bounded", settings=SNOOP_CONTEXTS,
                 description="Snoop: sequence, event-bounded negation, parameter contexts")
CG3 = Capability("CG-3", frozenset({CONJUNCTION, DISJUNCTION, SEQUENCE}), timed=True,
                 description="streaming-SQL interval joins (all pairs within the interval)")
CG4 = Capability("CG-4", frozenset({CONJUNCTION, DISJUNCTION, SEQUENCE}), timed=True,
                 negation="timed", window="span",
                 description="XChange: and, andthen, or, without … during, whole-span within")
CG5 = Capability("CG-5", frozenset({CONJUNCTION, DISJUNCTION, SEQUENCE, SELECTION}), timed=True,
                 negation="timed", settings=None,
                 description="EVA itself (a peer mediator): every operator and parameter")

PRESETS: dict[str, Capability] = {c.name.lower().replace("-", ""): c
                                  for c in (CG0, CG1, CG2, CG3, CG4, CG5)}
"""By group name as the CLI spells it: ``cg0`` … ``cg5``."""
