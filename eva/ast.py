"""The profile AST: immutable nodes, compared by value, so ``parse(to_text(doc)) == doc``.

Spans are integer microseconds; ``None`` is ``inf`` (no time frame). Positions are kept out of
equality so that printed-and-reparsed documents compare equal.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

MAX_INT = 2**63 - 1
"""Integers in values, ``<n>_dup`` and ``[i]`` are 64-bit (docs/language.md, Limits)."""


class Pairs(StrEnum):
    """Event instance consumption (EIC), EVA Fig. 7 and §4.2 (row C = repeated)."""

    ALL = "all_pairs"
    UNIQUE = "unique_pairs"
    REPEATED = "repeated_pairs"


class Evaluation(StrEnum):
    """Evaluation time, EVA §4.4: early provisional results, or only final ones."""

    CONTINUOUS = "continuous"
    END_OF_INTERVAL = "end_of_interval"


class DupKind(StrEnum):
    """Which elements of a duplicate list an operand selects (EIS, EVA Fig. 6); a StrEnum, so
    it compares equal to its text."""

    FIRST = "first"
    LAST = "last"
    ALL = "all"
    NTH = "nth"


@dataclass(frozen=True, slots=True)
class Dup:
    """Event instance selection (EIS) within a duplicate list, EVA Fig. 6.

    ``kind`` is ``first``, ``last``, ``all`` or ``nth`` (then ``n`` ≥ 1 is the 1-based index);
    given as text, it becomes the :class:`DupKind` of that text (ValueError for another).
    """

    kind: DupKind
    n: int = 0

    def __post_init__(self) -> None:
        if type(self.kind) is not DupKind:
            object.__setattr__(self, "kind", DupKind(self.kind))  # frozen: set once, here

    def __str__(self) -> str:
        return f"{self.n}_dup" if self.kind == "nth" else f"{self.kind}_dup"


FIRST = Dup(DupKind.FIRST)
LAST = Dup(DupKind.LAST)
ALL = Dup(DupKind.ALL)


def nth(n: int) -> Dup:
    return Dup(DupKind.NTH, n)


# ---------------------------------------------------------------- predicates (event classes)


@dataclass(frozen=True, slots=True)
class Compare:
    """``path op value``; ``op`` is one of ``== != < <= > >= in`` (``in`` takes a tuple)."""

    path: str
    op: str
    value: object


@dataclass(frozen=True, slots=True)
class And:
    left: Predicate
    right: Predicate


@dataclass(frozen=True, slots=True)
class Or:
    left: Predicate
    right: Predicate


@dataclass(frozen=True, slots=True)
class Not:
    operand: Predicate


@dataclass(frozen=True, slots=True)
class ClassRef:
    """A reference to another class inside a predicate: the logical ∧/∨ of EVA §3.3."""

    name: str


Predicate = Compare | And | Or | Not | ClassRef


@dataclass(frozen=True, slots=True)
class Every:
    """A time-event class: ticks every ``period`` µs on a grid through ``anchor``.

    ``anchor`` is the source text after ``from``: a time of day (``"10:00"``, UTC) or an RFC 3339
    instant (no ticks before it); ``None`` aligns the grid with the epoch.
    """

    period: int
    anchor: str | None = None


@dataclass(frozen=True, slots=True)
class ClassDef:
    name: str
    body: Predicate | Every
    line: int = field(default=0, compare=False)
    column: int = field(default=0, compare=False)


# ---------------------------------------------------------------- composite expressions


@dataclass(frozen=True, slots=True)
class Prim:
    """A reference to an event class (primitive or time-event class) used as an operand."""

    name: str
    line: int = field(default=0, compare=False)
    column: int = field(default=0, compare=False)


@dataclass(frozen=True, slots=True)
class External:
    """An operand whose occurrences the caller supplies (``Engine.feed``; the reference's
    ``externals``): the output of a base service, say, in an incremental plan. The parser never
    produces one; the printer writes it ``<name>``. It is a leaf: it keeps no state, and its
    occurrences may have any time up to the instant they are delivered at."""

    name: str


@dataclass(frozen=True, slots=True)
class Operand:
    """An operand of a binary operator with its duplicate selection: ``all_dup(E)``."""

    dup: Dup
    expr: Expr


@dataclass(frozen=True, slots=True)
class Disjunction:
    """(E1 | E2): every selected event of either operand, at its own time (EVA Def. 4.4)."""

    left: Operand
    right: Operand
    pairs: Pairs


@dataclass(frozen=True, slots=True)
class Conjunction:
    """(E1, E2)_T: e1 ≠ e2, |t(e2) − t(e1)| ≤ T; time = max (EVA Def. 4.5)."""

    left: Operand
    right: Operand
    span: int | None
    pairs: Pairs


@dataclass(frozen=True, slots=True)
class Sequence:
    """(E1; E2)_T: t(e2) ∈ (t(e1), t(e1) + T]; time = t(e2) (EVA Def. 4.6)."""

    left: Operand
    right: Operand
    span: int | None
    pairs: Pairs


@dataclass(frozen=True, slots=True)
class Negation:
    """(not E)_T: a passive event at time t when no E lies in [t − T, t] (EVA Def. 4.8)."""

    expr: Expr
    span: int
    pairs: Pairs


@dataclass(frozen=True, slots=True)
class Selection:
    """(E[i]): the i-th event of E, consumption UA / UB / UC (EVA Def. 4.7, Fig. 4)."""

    expr: Expr
    index: int
    pairs: Pairs


Binary = Disjunction | Conjunction | Sequence
Expr = Prim | External | Disjunction | Conjunction | Sequence | Negation | Selection


@dataclass(frozen=True, slots=True)
class Profile:
    name: str
    expr: Expr
    per: str | None = None
    evaluation: Evaluation = Evaluation.CONTINUOUS
    line: int = field(default=0, compare=False)
    column: int = field(default=0, compare=False)


@dataclass(frozen=True, slots=True)
class Document:
    """A profile file: class definitions and profiles, in source order."""

    classes: tuple[ClassDef, ...]
    profiles: tuple[Profile, ...]

    def class_map(self) -> dict[str, ClassDef]:
        return {c.name: c for c in self.classes}

    def profile(self, name: str) -> Profile:
        for p in self.profiles:
            if p.name == name:
                return p
        raise KeyError(name)


def children(expr: Expr) -> tuple[Expr, ...]:
    if isinstance(expr, (Disjunction, Conjunction, Sequence)):
        return (expr.left.expr, expr.right.expr)
    if isinstance(expr, (Negation, Selection)):
        return (expr.expr,)
    return ()


def walk(expr: Expr) -> list[Expr]:
    """Pre-order list of the nodes of an expression (with a stack: any depth)."""
    out: list[Expr] = []
    stack = [expr]
    while stack:
        node = stack.pop()
        out.append(node)
        stack.extend(reversed(children(node)))
    return out


def depth(expr: Expr) -> int:
    """Operators on the longest path from the root to a class (0 for a class)."""
    deepest = 0
    stack = [(expr, 0)]
    while stack:
        node, level = stack.pop()
        deepest = max(deepest, level)
        stack.extend((child, level + 1) for child in children(node))
    return deepest
