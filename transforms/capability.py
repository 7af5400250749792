"""Capability records: what a target language supports (research/transforms.md §4).

CG-1 … CG-5 are the language groups of EVA Table 1; CG-0 is "primitive filters only" (MQTT,
Redis). A service may declare any record.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from eva import ast

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

SNOOP_SETTINGS: dict[str, frozenset[Setting]] = {
    # Verified for a flat operator over distinct event types (research/snoop.md §5.3) and
    # re-checked against the Snoop service on traces with simultaneous events
    # (tests/test_backends.py). Chronicle and continuous SEQ match (first, first, repeated) and
    # (all, first, unique) only when no two operand events share an instant: with a0@10 b1@10
    # b2@11, EVA's first posterior b1 fails t1 < t2 and nothing is reported, while Snoop
    # pairs a0 with b2. A mediator cannot promise that of a stream, so they are not used.
    "unrestricted": SET_SEMANTICS,
    "recent": frozenset({(SEQUENCE, "last", "all", "unique_pairs")}),
    "chronicle": frozenset({(CONJUNCTION, "first", "first", "repeated_pairs")}),
}
"""Snoop context → the EVA settings it evaluates exactly (cumulative aggregates: none)."""

SNOOP_CONTEXTS: frozenset[Setting] = frozenset().union(*SNOOP_SETTINGS.values())

OPERATOR = {ast.Disjunction: DISJUNCTION, ast.Conjunction: CONJUNCTION, ast.Sequence: SEQUENCE,
            ast.Negation: NEGATION, ast.Selection: SELECTION}


def setting_of(node: ast.Binary) -> Setting:
    """The setting a binary node asks of a service, as capability records list them."""
    # A disjunction pairs nothing: its EIC has no effect (docs/semantics.md §4).
    pairs = "all_pairs" if isinstance(node, ast.Disjunction) else str(node.pairs)
    return (OPERATOR[type(node)], node.left.dup.kind, node.right.dup.kind, pairs)


@dataclass(frozen=True)
class Capability:
    """What a target language can evaluate, and how.

    ``negation``: ``none``, ``logical`` (untimed NOT: the complement of a single-event filter),
    ``event_bounded`` (Snoop's NOT(E)[S, F]), ``during`` (XChange's exclusion within the span
    of another answer) or ``timed`` (EVA's (not E)_T on a clock or anchored; only this one
    states an EVA negation). ``settings``: the EIS/EIC combinations it evaluates natively
    (``None``: all of them). ``window``: ``point`` when a time frame bounds the distance of the
    operands' occurrence times (EVA), ``span`` when it bounds the whole span of all
    constituents (XChange ``within``) — the two agree only on primitive operands.
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
    predicates: str = "full"
    """``full``: any EVA class predicate can be stated; ``type``: only the event type (Snoop) —
    a class naming no type cannot be subscribed there, other tests are re-applied by the
    mediator, which is exact only at set semantics."""
    strict_sequence: bool = True
    """False when a sequence also matches two events of the same instant (XChange's andthen is
    ``end(s1) ≤ begin(s2)``): the sequence is then positive, the mediator keeps t1 < t2."""
    clock: bool = False
    """The service has EVA's time classes and clock itself (a peer mediator): no ticks to inject."""
    context_scope: str = "node"
    """``expression`` when one parameter setting applies to the whole native query (Snoop's
    contexts): a non-set setting is then used only on a flat operator over distinct types."""
    partitions: bool = True
    """Whether a ``per`` partition can be stated; without it only set semantics is pushed (the
    mediator re-runs the operator per partition on what comes back)."""
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
                 negation="event_bounded", settings=SNOOP_CONTEXTS, predicates="type",
                 context_scope="expression", partitions=False,
                 description="Snoop: sequence, event-bounded negation, parameter contexts")
CG3 = Capability("CG-3", frozenset({CONJUNCTION, DISJUNCTION, SEQUENCE}), timed=True,
                 description="streaming-SQL interval joins (all pairs within the interval)")
CG4 = Capability("CG-4", frozenset({CONJUNCTION, DISJUNCTION, SEQUENCE}), timed=True,
                 negation="during", window="span", timeless=False, strict_sequence=False,
                 description="XChange: and, andthen, or, without … during, whole-span within")
CG5 = Capability("CG-5", frozenset({CONJUNCTION, DISJUNCTION, SEQUENCE, SELECTION}), timed=True,
                 negation="timed", settings=None, clock=True,
                 description="EVA itself (a peer mediator): every operator and parameter")

PRESETS: dict[str, Capability] = {c.name.lower().replace("-", ""): c
                                  for c in (CG0, CG1, CG2, CG3, CG4, CG5)}
"""By group name as the CLI spells it: ``cg0`` … ``cg5``."""
