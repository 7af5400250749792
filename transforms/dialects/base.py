"""What every dialect shares: the ``Dialect`` record, its render tables and walker, and the
reading of a service's notifications back into EVA terms.

A dialect is what the mediator speaks to the base service of one language group, in the manner
of sqlglot's generators: a table from EVA AST node class to a render function, a table from
predicate form (``==``, ``in``, ``and``, …) to a render function, and an ``unsupported`` level
that says what to do with a construct the language cannot state — note it (``IGNORE``), note
and log it (``WARN``) or raise :class:`UnsupportedError` when the rendering is done
(``RAISE``). Asking whether a group can state something is :meth:`Dialect.generate`'s
``Rendered.unsupported``, not an exception.

Dialects import nothing of ``adapters``: a name or lexical rule that both a dialect and its
language's parser need (a bare Snoop type, an XChange label, SQL's interval units) is defined by
the dialect and imported by the backend.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from functools import cached_property
from typing import Any, TypeVar

from eva import ast
from eva import reference as ref
from eva.events import TICK_TYPE as TICK_TYPE  # re-exported: the tick type services see
from eva.events import Event
from eva.printer import predicate_text
from eva.semantics import Occ
from eva.validate import refs
from transforms.capability import Capability
from transforms.plans import Kind, Remote

log = logging.getLogger("evamed.dialects")

@dataclass(frozen=True)
class Detection:
    """One native notification: the occurrence time, the constituent events in the language's
    own order, a rendering in its own notation and language-specific detail."""

    time: int
    constituents: tuple[Event, ...]
    text: str = ""
    extra: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)


class Unsupported(Enum):
    """What a rendering does with a construct its language cannot state (sqlglot's ErrorLevel)."""

    IGNORE = "ignore"
    """Note it in ``Rendered.unsupported``; the text is then not a query to send."""
    WARN = "warn"
    """As IGNORE, and log each message."""
    RAISE = "raise"
    """Raise :class:`UnsupportedError` with every message once the rendering is done."""


class UnsupportedError(ValueError):
    """A rendering at level RAISE met what its language cannot state (the planner should not
    have asked for it)."""


@dataclass(frozen=True)
class Rendered:
    """The native text of an EVA expression, and what of it the language cannot state (empty:
    ``text`` is the query to subscribe). ``widened``: the tests of a class the text leaves out
    — (class, test) — which the mediator re-applies to what comes back (a language that knows
    events only by type, or whose tests read NULL otherwise than EVA)."""

    text: str
    unsupported: tuple[str, ...] = ()
    widened: tuple[tuple[str, str], ...] = ()


# ------------------------------------------------------------------ predicate forms

PredicateForm = str
"""The key of a predicate render table: a comparison operator (``==``, ``!=``, ``<``, ``<=``,
``>``, ``>=``, ``in``) or ``not``, ``and``, ``or``."""


def form(pred: ast.Predicate) -> PredicateForm:
    if isinstance(pred, ast.Compare):
        return pred.op
    if isinstance(pred, ast.Not):
        return "not"
    if isinstance(pred, ast.And):
        return "and"
    if isinstance(pred, ast.Or):
        return "or"
    raise AssertionError(f"a resolved predicate has no class reference: {pred!r}")


def operands(pred: ast.Predicate) -> list[ast.Predicate]:
    """The operands of the ``and`` (or ``or``) chain at ``pred``, left to right, through every
    nested node of the same operator however the chain is bracketed (iterative: it may be
    long). Both operators are associative, so the chain may be written flat."""
    kind = type(pred)
    out: list[ast.Predicate] = []
    stack = [pred]
    while stack:
        node = stack.pop()
        if type(node) is kind and isinstance(node, (ast.And, ast.Or)):
            stack.extend([node.right, node.left])
        else:
            out.append(node)
    return out


def beyond_type(pred: ast.Predicate) -> list[ast.Predicate]:
    """The top-level conjuncts of a resolved class predicate that test more than the event's
    ``type``: what a language knowing events only by type leaves to the mediator."""
    from eva.classes import type_only

    parts = operands(pred) if isinstance(pred, ast.And) else [pred]
    return [p for p in parts if type_only(p, {}) is None]


def operator_chain(expr: ast.Expr, same: Callable[[ast.Expr], bool]) -> list[ast.Expr]:
    """The operands, left to right, of the chain of binary nodes at ``expr`` for which ``same``
    holds (``expr`` itself among them), iteratively: a dialect that writes a chain flat reads
    it without recursing per term."""
    out: list[ast.Expr] = []
    stack: list[ast.Expr] = [expr]
    while stack:
        node = stack.pop()
        if same(node):
            assert isinstance(node, (ast.Disjunction, ast.Conjunction, ast.Sequence))
            stack.extend([node.right.expr, node.left.expr])
        else:
            out.append(node)
    return out


N = TypeVar("N")


def balanced(items: list[N], join: Callable[[N, N], N]) -> N:
    """The chain ``items[0] ∘ items[1] ∘ …`` of an associative operator as a balanced binary
    tree, operands in order: log2(n) levels where the fold would be n − 1, so the evaluators,
    which recurse per level, take an n-ary chain of any length."""
    while len(items) > 1:
        joined = [join(items[i], items[i + 1]) for i in range(0, len(items) - 1, 2)]
        items = joined + items[len(items) - len(items) % 2:]
    return items[0]


# ------------------------------------------------------------------ the render walker

ExprRule = Callable[["Rendering", Any], Any]
"""Renders one EVA node (of the class it is filed under) in the dialect's own value: text, or a
sqlglot tree for SQL. It renders children through ``Rendering.expr``."""
PredicateRule = Callable[["Rendering", Any], Any]
"""Renders one predicate node (of the form it is filed under); children through
``Rendering.predicate``."""
Statement = Callable[["Rendering", ast.Expr, Any], str]
"""The whole query from the root and its rendered value (SQL's printer, Snoop's CONTEXT clause, …)."""


def verbatim(r: Rendering, expr: ast.Expr, value: str) -> str:
    """The statement of a dialect whose root value is the query's text."""
    return value


class Rendering:
    """One rendering of an EVA expression through a dialect's tables; it collects the messages
    of what the language cannot state. A rule that notes one returns its dialect's placeholder
    and the walk goes on, so every message is found in one pass."""

    def __init__(self, dialect: Dialect, doc: ast.Document, profile: ast.Profile | None,
                 root_eoi: bool) -> None:
        self.dialect = dialect
        self.doc = doc
        self.classes = doc.class_map()
        self.profile = profile
        self.root_eoi = root_eoi
        self.messages: list[str] = []
        self.widened: list[tuple[str, str]] = []
        self.within = ""
        """The class whose predicate is being rendered (a leaf rule sets it)."""

    def expr(self, node: ast.Expr) -> Any:
        rule = self.dialect.expressions.get(type(node))
        return self.cannot(node) if rule is None else rule(self, node)

    def cannot(self, node: ast.Expr) -> Any:
        """Note that the language cannot state ``node`` (the dialect's ``cannot`` message)."""
        return self.unsupported(self.dialect.cannot.format(node=type(node).__name__.lower()))

    def predicate(self, pred: ast.Predicate) -> Any:
        rule = self.dialect.predicates.get(form(pred))
        if rule is None:
            return self.unsupported(f"{self.dialect.name} cannot state a {form(pred)} test")
        return rule(self, pred)

    def unsupported(self, message: str) -> Any:
        """Note what cannot be stated; the dialect's placeholder stands in for it."""
        self.messages.append(message)
        return self.dialect.placeholder

    def widen(self, pred: ast.Predicate) -> None:
        """Note a test of the current class that the native text leaves out (the service
        answers a superset; the mediator re-applies the class): ``explain`` lists it."""
        self.widened.append((self.within, predicate_text(pred)))

    def leaf(self, name: str) -> None:
        """The predicates rendered from now on are class ``name``'s."""
        self.within = name


@dataclass(frozen=True)
class Reading:
    """One native notification in EVA terms (what :meth:`Dialect.parse_notification` returns).

    * When the dialect takes the remote's answer over (:meth:`Dialect.takes_over`):
      ``occurrences`` are EVA occurrences of the remote's target, exact as the service computed
      them, each as ``(report key, occurrence)`` — emit them as they are (empty when the
      notification concerns another partition); ``order`` says where they go among a batch's
      (sort by it; None: arrival order — a Snoop pair is reported when its terminator arrives,
      EVA orders by (key, initiator key)).
    * Otherwise (set semantics) ``visible`` holds the ids of the events the notification
      contains: the EVA answer is :func:`rerun_target` evaluated on the sub-trace of the events
      any notification made visible.
    """

    occurrences: tuple[tuple[Hashable, Occ], ...] = ()
    visible: frozenset[str] = frozenset()
    order: Hashable | None = None


@dataclass(frozen=True)
class Scope:
    """The mediator's side of one partition, which a notification is read against."""

    doc: ast.Document
    partition: Any
    """The ``per`` value evaluated (None: the profile is not partitioned)."""
    trace: Sequence[Event]
    """The partition's events."""
    matchers: Mapping[str, Callable[[Event], bool]]
    """Class name → whether an event is of that class."""

    @cached_property
    def events(self) -> dict[tuple[str, str], Event]:
        """The partition's events by (source, id): the mediator's own copy of a constituent
        (indexed when a reading first needs it; set semantics never does)."""
        return {(e.source, e.id): e for e in self.trace}

    @staticmethod
    def of(ctx: ref.Context) -> Scope:
        return Scope(ctx.doc, ctx.partition, ctx.events, ctx.matchers)


NotificationReader = Callable[[Detection, Remote, Scope], Reading]


def _never(node: Remote) -> bool:
    return False


@dataclass(frozen=True)
class Dialect:
    """The mediator's side of one language group: its capability record, render tables and the
    reading of its notifications."""

    group: str
    """``cg0`` … ``cg5``."""
    language: str
    """The native language's name, as its service and its query errors call it."""
    capability: Capability
    expressions: Mapping[type[ast.Expr], ExprRule]
    predicates: Mapping[PredicateForm, PredicateRule]
    statement: Statement
    cannot: str = "cannot state {node}"
    """The message for an EVA node the language has no rule for (``{node}``: its name)."""
    placeholder: Any = ""
    """What stands in for a construct that cannot be stated."""
    unsupported_level: Unsupported = Unsupported.RAISE
    reader: NotificationReader | None = None
    """How a notification reads back where ``exact`` holds; elsewhere set semantics."""
    exact: Callable[[Remote], bool] = _never
    """Whether the service's notifications for a remote are EVA's occurrences exactly."""
    _rendered: dict[Hashable, str] = field(default_factory=dict, init=False, repr=False,
                                           compare=False)
    """:meth:`render`'s cache (its own per dialect: ``replace`` starts a fresh one)."""

    @property
    def name(self) -> str:
        """How messages name the group: ``CG-1``."""
        return self.capability.name

    def generate(self, expr: ast.Expr, doc: ast.Document, profile: ast.Profile | None = None,
                 root_eoi: bool = False, level: Unsupported | None = None) -> Rendered:
        """``expr`` (over ``doc``'s classes) as a query of this language, with what it cannot
        state. A peer mediator is given a whole profile: ``expr`` with ``profile``'s ``per`` and,
        when ``root_eoi``, end-of-interval evaluation; the other languages ignore both."""
        rendering = Rendering(self, doc, profile, root_eoi)
        value = rendering.expr(expr)
        # The statement may note one too (Snoop's one context for the whole query).
        text = self.statement(rendering, expr, value) if not rendering.messages else ""
        messages = tuple(rendering.messages)
        level = self.unsupported_level if level is None else level
        if messages and level is Unsupported.WARN:
            for message in messages:
                log.warning("%s", message)
        if messages and level is Unsupported.RAISE:
            raise UnsupportedError("; ".join(messages))
        return Rendered(text if not messages else "", messages,
                        tuple(dict.fromkeys(rendering.widened)))

    def render(self, expr: ast.Expr, doc: ast.Document, profile: ast.Profile | None = None,
               root_eoi: bool = False) -> str:
        """What the mediator subscribes at the service for ``expr``; :class:`UnsupportedError`
        if the language cannot state it (ask :meth:`can_render` first where that may be).

        Cached: a rendering depends only on ``expr``, the classes it uses (and those they
        refer to), the profile's ``per`` and ``root_eoi`` — the key — and many subscriptions
        render the same leaf (a class of one type, say), which cost SQL's generator ~0.25 ms
        each (docs/performance.md, "Registering profiles")."""
        key = (expr, _used(expr, doc), profile.per if profile is not None else None, root_eoi)
        text = self._rendered.get(key)
        if text is None:
            text = self.generate(expr, doc, profile, root_eoi, Unsupported.RAISE).text
            if len(self._rendered) >= RENDERED:
                self._rendered.pop(next(iter(self._rendered)), None)  # the oldest
            self._rendered[key] = text
        return text

    def can_render(self, expr: ast.Expr, doc: ast.Document) -> bool:
        """Whether the language states ``expr`` (no exception either way)."""
        return not self.generate(expr, doc, level=Unsupported.IGNORE).unsupported

    def takes_over(self, node: Remote) -> bool:
        """Whether the notifications for ``node`` carry EVA occurrences to take over as they
        are (else set semantics: re-run :func:`rerun_target` on the events they contain)."""
        return self.reader is not None and self.exact(node)

    def parse_notification(self, detection: Detection, node: Remote, scope: Scope) -> Reading:
        """One native notification of the subscription for ``node`` (a remote of this group's
        plan) in EVA terms, for the partition ``scope`` describes: the occurrences to take over
        where :meth:`takes_over` holds, else the visible event ids. See :class:`Reading`."""
        if self.reader is not None and self.exact(node):
            return self.reader(detection, node, scope)
        return Reading(visible=frozenset(e.id for e in detection.constituents))


RENDERED = 4096
"""Renderings a dialect keeps (the oldest goes first)."""


def _used(expr: ast.Expr, doc: ast.Document) -> tuple[ast.ClassDef, ...]:
    """The classes ``expr`` uses and those they refer to, in the document's order: all of the
    document a rendering may read (a name the document lacks is left to the rendering)."""
    classes = doc.class_map()
    needed: set[str] = set()
    stack = [n.name for n in ast.walk(expr) if isinstance(n, ast.Prim)]
    while stack:
        name = stack.pop()
        cls = classes.get(name)
        if name in needed or cls is None:
            continue
        needed.add(name)
        if not isinstance(cls.body, ast.Every):
            stack.extend(refs(cls.body))
    return tuple(c for c in doc.classes if c.name in needed)


def rerun_target(node: Remote) -> ast.Expr:
    """Set semantics: the expression the mediator evaluates on the visible events — the
    original for a positive rule (the post-filter restores its parameters), else the target.
    At set semantics a composite depends only on its own constituents, so this is exact."""
    return node.original if node.kind is Kind.POSITIVE else node.target


def taken(readings: Iterable[Reading]) -> list[tuple[Hashable, Occ]]:
    """The occurrences of a batch of readings that take an answer over, in EVA's order."""
    items = list(readings)
    if any(r.order is not None for r in items):
        items.sort(key=lambda r: r.order)  # type: ignore[arg-type,return-value]
    return [o for r in items for o in r.occurrences]
