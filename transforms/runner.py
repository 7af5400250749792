"""The incremental plan runner: a document's plans evaluated as the trace streams through.

A plan's mediator-side part (its ``Local`` nodes) compiles to the engine: an EVA expression in
which each composite remote is an :class:`~eva.ast.External` operand and each primitive leaf
(a service's filter, the mediator's clock) stays the class it is. The services' notifications
feed those leaves, transformed back into EVA occurrences by the dialect of the leaf's service's
group (:meth:`~transforms.dialects.base.Dialect.parse_notification`); a primitive leaf of the
mediator itself (:data:`~transforms.federated.MEDIATOR`) is its own feed — the outer engine
takes the class from the input:

* **taken over** (a peer mediator's occurrences, Snoop's (initiator, terminator) pairs): fed to
  the outer engine as they are, once the service's progress passes their report time;
* **set semantics** (everything else, and a positive rule's post-filter): the notifications
  only say which events are *visible*. Each such remote has an engine of its own that re-runs
  the original (positive) or target expression on the visible events; its composites feed the
  outer leaf. Primitive leaves are re-evaluated by the outer engine itself on the events its
  filters made visible.

Visibility is final only once the service can no longer notify a composite containing the
event: events are held until the services' progress passes their time plus the remote's
:func:`~eva.retention.reach` (the longest a composite's report can lie after its earliest
constituent) — until the end of the input when that is unbounded (an ``inf`` span, a timeless
service's relaxed target). Nothing is decided before that, so the runner's answers lag the
input by that much (docs/transformations.md, "The plan runner").

Partitions: a ``per`` profile's partitions open where the reference opens them — at the first
event of any of the profile's classes with that value, whether or not a service ever makes it
visible — so every partition gets engines of its own, started just before that event (its
clock, ticks and negations begin there, as the reference admits them). The engines number their
own inputs; reports are mapped back to the trace's keys, so the runner's answer is the
reference's to the key (:func:`transforms.evaluate.evaluate_plans` is the test oracle). A fed
composite is stepped at its report key's place within its instant (``Engine.feed``'s
``emitted``). A round settles only the partitions given input since the last one and those
whose engines have work due (a heap of wake-up instants); still, each partition holds engines of
its own — one engine holding every partition (a partition opened at a key) is the next step for
10⁴ keys. State stays bounded for a long-running service: a partition at rest is dropped as the
engine drops a ``per`` partition, and each engine's key table forgets the inputs no report can
name any more (docs/transformations.md, "Bounded state").

The API is the engine's, per event: ``push`` (an admitted event, in time order), ``notify``
(a service's notification for a leaf), ``advance`` (the services have reported every instant up
to a time), ``close`` (end of input). :mod:`adapters.federation` connects the leaves to the
services (batches of events, each link published once per batch). For the mediator's metrics:
``stats`` (what the runner holds, a few counts) and ``take_drops`` (the relaxed answers the
post-filters dropped; docs/operations.md, Monitor).
"""

from __future__ import annotations

import base64
import bisect
import heapq
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any, Protocol

from eva import ast
from eva.admission import Held
from eva.classes import compile_predicate
from eva.engine import DeadLetter, Engine, EngineConfig
from eva.events import PASSIVE, PRIMITIVE, Event
from eva.printer import expr_text
from eva.retention import longest, reach
from eva.semantics import Key, Notification, Occ, partition_key
from eva.snapshot import restore, snapshot
from transforms.dialects.base import Detection, Reading, Scope, rerun_target, taken
from transforms.plans import Kind, Plan, PlanNode, Remote, Subscribe

Matcher = Callable[[Event], bool]
TRIM_AT = 32
"""The fewest inputs a key table drops at once (the property tests set it to 1)."""
_CANONICAL = (str, int, bool)
"""Types of ``per`` values equal to every other value of their partition key (a partition
reports the value it was opened with)."""


class Dialect(Protocol):
    """What the runner needs of a group's dialect (:class:`transforms.dialects.base.Dialect`)."""

    def takes_over(self, node: Remote) -> bool: ...

    def parse_notification(self, detection: Detection, node: Remote, scope: Scope) -> Reading:
        ...


@dataclass(frozen=True)
class Leaf:
    """A remote of a plan (or a primitive subscription) as the runner takes it from a service:
    ``expr`` is what to subscribe (render it with ``profile`` and ``root_eoi``)."""

    index: int
    profile: ast.Profile
    node: Remote | Subscribe
    expr: ast.Expr
    root_eoi: bool
    external: str
    """The outer expression's operand it feeds (``""``: a primitive class of the outer
    expression, re-evaluated there on the visible events)."""
    taken: bool
    """The notifications carry EVA occurrences to take over (else: set semantics)."""
    delay: int | None
    """How long after an event's time a notification may still name it (None: unbounded)."""
    observer: bool = False
    """A class subscribed only so that its events are seen (``Plan.observed``): they open
    partitions and are visible to nothing."""


def _inline(node: Remote) -> bool:
    """Whether the outer engine may re-run a set-semantics remote itself, on every event any
    leaf of the profile made visible: a target at set semantics gives the same composites on
    any superset of its visible events (each has all its constituents visible), and a
    disjunction's visible events are all the events of its classes. A positive rule's
    post-filter on a conjunction or sequence needs its own visible sub-trace: an engine of its
    own. (Re-run inline, a disjunction's or filter's occurrence that another operand reports at
    the same step is one element with both roles, as the trace view has it, Def. 4.1.)"""
    return node.kind is not Kind.POSITIVE or isinstance(node.original, ast.Disjunction)


def _time(key: Hashable) -> int:
    """The time of a report key (a dialect's readings type them loosely)."""
    assert isinstance(key, tuple) and isinstance(key[0], int)
    return key[0]


def trace_key(key: Any, keys: Sequence[Any], first: int = 0) -> Any:
    """A report key of an engine that evaluated part of a trace, with its own arrival numbers
    replaced by the keys of what it was given (``keys[n - first]``: the key of its n-th input,
    the ``first`` before it no longer kept) — in a primitive step's key and in a passive
    event's anchor."""
    time, phase, tiebreak = key
    if phase == PRIMITIVE:
        if not first <= tiebreak < first + len(keys):
            # A negative index would name another input silently: a horizon too short is a bug.
            raise AssertionError(f"report key {key} names input {tiebreak}, no longer kept "
                                 f"(kept: {first} to {first + len(keys) - 1})")
        return keys[tiebreak - first]
    if phase == PASSIVE and isinstance(tiebreak, tuple) and tiebreak:
        return (time, phase, trace_key(tiebreak, keys, first))
    return key


def lag(expr: ast.Expr, eoi: bool, tick: int) -> int | None:
    """How long after the time of its earliest constituent an engine running ``expr`` may
    report a composite (:func:`~eva.retention.reach`, plus the clock's granularity under a
    negation); None when nothing bounds it (an end-of-interval result waits for the next
    element of its list)."""
    found = None if eoi else reach(expr)
    if found is not None and any(isinstance(n, ast.Negation) for n in ast.walk(expr)):
        found += tick
    return found


def retagged(ident: Hashable, tags: dict[str, str]) -> Hashable:
    """An occurrence identity with the node tags it names replaced (``tags``: outer
    expression's text → the original's). A composite is named by its node's text, and an outer
    node over an ``<Ln>`` operand prints differently from the profile's own node; the answer
    must carry the profile's identities (its composite ids are made from them)."""
    if not tags or not isinstance(ident, tuple) or len(ident) < 3:
        return ident
    head = ident[0]
    if head == "not":  # ("not", tag, time[, anchor])
        rest = (retagged(ident[3], tags),) if len(ident) > 3 else ()
        return ("not", tags.get(ident[1], ident[1]), ident[2], *rest)
    if isinstance(head, str) and isinstance(ident[1], tuple):  # (tag, left, right)
        return (tags.get(head, head), retagged(ident[1], tags), retagged(ident[2], tags))
    return ident


@dataclass(frozen=True)
class RunnerStats:
    """What a runner holds, counted without walking its engines (cheap enough after every
    batch): the evaluation state that grows with the input if anything does."""

    held: int = 0        # events awaiting final visibility (the services' progress)
    visible: int = 0     # ids of events the services made visible, not yet released
    known: int = 0       # events kept for taken-over answers to name
    readings: int = 0    # taken-over answers waiting for their report time
    checks: int = 0      # relaxed answers awaiting the post-filter's verdict
    partitions: int = 0  # partitions open
    engines: int = 0     # their outer and re-run engines

    def __add__(self, other: RunnerStats) -> RunnerStats:
        # By the field names, read once: the pipeline sums one per subscription after every
        # round, and astuple (a deep copy of each) made that a third of its time while
        # 10,000 profiles were registered.
        return RunnerStats(*[getattr(self, name) + getattr(other, name) for name in _STATS])


_STATS = tuple(f.name for f in fields(RunnerStats))


class _Verdicts:
    """A relaxed query's answers (a positive rule's target; the re-run of the original is its
    post-filter) awaiting the post-filter's verdict. An answer is kept when the re-run reports
    a composite of exactly its events (at set semantics an EVA answer is one of the target's,
    the same events); it is dropped once the re-run can no longer report one: ``horizon``
    (the re-run's :func:`lag`) after the answer's earliest event, or at the end of the input.
    The service reports an answer before the runner releases its events to the re-run, so the
    verdict never precedes the answer."""

    def __init__(self, horizon: int) -> None:
        self.horizon = horizon
        self.waiting: dict[frozenset[str], int] = {}  # an answer's event ids → answers so
        self._due: list[tuple[int, int, frozenset[str]]] = []  # (verdict time, entry, ids)
        self._entries = 0

    def wait(self, events: Sequence[Event]) -> None:
        if not events:
            return
        ids = frozenset(e.id for e in events)
        count = self.waiting.get(ids, 0)
        self.waiting[ids] = count + 1
        if count == 0:
            self._entries += 1
            heapq.heappush(self._due, (min(e.time for e in events) + self.horizon,
                                       self._entries, ids))

    def kept(self, notes: Iterable[Notification]) -> None:
        for n in notes:
            self.waiting.pop(frozenset(n.occ.events), None)

    def expire(self, bound: int | None) -> int:
        """Decide the answers the re-run has had every chance to report by ``bound`` (None:
        all of them, the input has ended); how many were dropped. (A stale entry — an answer
        kept meanwhile — finds nothing waiting.)"""
        if bound is None:
            dropped = sum(self.waiting.values())
            self.waiting.clear()
            self._due.clear()
            return dropped
        dropped = 0
        due = self._due
        while due and due[0][0] <= bound:
            dropped += self.waiting.pop(heapq.heappop(due)[2], 0)
        return dropped


def _bug(letter: DeadLetter) -> None:
    raise AssertionError(f"the plan runner fed an engine what it refused: {letter.reason}: "
                         f"{letter.detail}")


LIMITS = frozenset(("composite_limit", "state_cap"))
"""Dead letters an engine of the runner writes about a profile's output or state (not about an
input): the runner keeps them (``Runner.limited``) for its caller, which suspends the profile."""


class _Keyed:
    """An engine over part of the trace whose reports carry the trace's keys: it numbers its
    own inputs, and each number is mapped back to the key of what was given."""

    def __init__(self, profiles: Iterable[ast.Profile], classes: tuple[ast.ClassDef, ...],
                 origin: int, tick: int, horizon: int | None,
                 tags: dict[str, str] | None = None, limit: int | None = None,
                 letter: Callable[[DeadLetter], None] = _bug) -> None:
        self.engine = Engine(EngineConfig(tick=tick, composite_limit=limit), letter)
        self.engine.add_document(ast.Document(classes, tuple(profiles)))
        self.engine.begin(origin)
        # Input n's trace key is keys[n - first], given at the step time given[n - first];
        # the inputs before ``first`` can be named by no report any more (``trim``).
        self.keys: list[Key] = []
        self.given: list[int] = []
        self.first = 0
        self.local: dict[Key, Key] = {}  # a trace key given → its key here (for fed keys)
        self.horizon = horizon
        """How long before a report's time an input it names may have been given (None:
        unbounded): a report names its constituents' steps and a passive event's anchor, all
        within the engine's reach of the report, plus the lag of a fed occurrence's report
        behind its own time."""
        self.tags = tags or {}

    def push(self, event: Event) -> list[Notification]:
        self._given(event.key)
        return self._mapped(self.engine.push(event))

    def _number(self, key: Key, at: int) -> int:
        """Number an input given at step time ``at``, named ``key`` in the trace."""
        self.keys.append(key)
        self.given.append(at)
        return self.first + len(self.keys) - 1

    def _given(self, key: Key) -> Key:
        """Number an input given at ``key``: its key here."""
        local = (key[0], PRIMITIVE, self._number(key, key[0]))
        self.local[key] = local
        return local

    def trim(self, done: int) -> None:
        """Forget the inputs no report can name any more, the engine having decided every
        instant up to ``done``: a later report's time is after it, so it names only inputs
        given within the horizon before. (Trimmed by halves: amortised constant per input.)"""
        if self.horizon is None:
            return
        given = self.given  # in step order: nondecreasing
        count = bisect.bisect_left(given, done - self.horizon)
        if count < TRIM_AT or count * 2 < len(given):
            return
        local = self.local
        for n, key in enumerate(self.keys[:count], start=self.first):
            if local.get(key) == (key[0], PRIMITIVE, n):
                del local[key]
        del self.keys[:count]
        del given[:count]
        self.first += count

    def feed(self, profile: str, leaf: str, emit: Key, occ: Occ) -> list[Notification]:
        # Inside the engine the occurrence is keyed as its step, like the engine's own events
        # (an anchored absence's key names its anchor's); reports map back to ``emit``. It is
        # stepped at that key's place (Engine.feed), never at its own time: a repeated_pairs
        # remote reports an older composite again at a later step, where the instants up to
        # that step's may already be processed (fed at its time, it was a ``late`` refusal).
        if emit[1] == PRIMITIVE:
            at = self._given(emit)
        else:
            self._number(emit, emit[0])  # its number is unused, unless as a stand-in anchor
            at = self._here(emit)
        local = Occ(occ.time, at, occ.ident, occ.events, occ.anchor)
        return self._mapped(self.engine.feed(profile, leaf, local, emitted=at))

    def _here(self, key: Key) -> Key:
        """A report key of a later phase in this engine's numbering: a passive event's anchor
        numbered as given here, or — an anchor this engine was never given — as the stand-in
        the feed's own (unused) number maps back to."""
        time, phase, tiebreak = key
        if phase != PASSIVE or not (isinstance(tiebreak, tuple) and tiebreak):
            return key
        if tiebreak[1] != PRIMITIVE:
            return (time, phase, self._here(tiebreak))
        found = self.local.get(tiebreak)
        if found is None:
            self.keys[-1] = tiebreak
            found = (tiebreak[0], PRIMITIVE, self.first + len(self.keys) - 1)
        return (time, phase, found)

    def advance(self, time: int) -> list[Notification]:
        return self._mapped(self.engine.advance(time))

    def close(self, time: int) -> list[Notification]:
        return self._mapped(self.engine.close(time))

    def _key(self, key: Any) -> Any:
        return trace_key(key, self.keys, self.first)

    def _mapped(self, notes: list[Notification]) -> list[Notification]:
        tags = self.tags
        return [Notification(n.profile, n.partition,
                             Occ(n.occ.time, self._key(n.occ.key), retagged(n.occ.ident, tags),
                                 n.occ.events, retagged(n.occ.anchor, tags)),
                             self._key(n.emitted)) for n in notes]


@dataclass
class _Partition:
    """One partition of a profile: its outer engine and the engines of its set-semantics
    remotes, all started just before the event that opened it."""

    value: Any
    key: Hashable  # partition_key(value)
    order: tuple[int, int]  # (its profile's position, its own in order of creation)
    outer: _Keyed | None  # None: the root is a composite remote, reported as it comes
    rerun: dict[int, _Keyed]  # leaf index → the engine re-running its expression
    last: int  # the time of its latest input
    due: int | None = None  # the earliest instant its engines have work at (None: none)
    pending: list[tuple[Key, int, int, Event | tuple[str, Occ]]] = field(default_factory=list)
    """The outer engine's input this round: (report key, position of the leaf in the outer
    expression, arrival, an event or (external operand, occurrence))."""


class _Profile:
    """A planned profile: its outer expression, leaves and partitions."""

    def __init__(self, index: int, plan: Plan, leaves: list[Leaf], outer: ast.Expr,
                 matchers: dict[str, Matcher], own_feed: bool, tags: dict[str, str],
                 tick: int, clocks: set[str]) -> None:
        self.index = index  # its position in the document's plans
        self.profile = plan.profile
        self.tags = tags  # the outer expression's node texts that differ from the profile's
        self.leaves = leaves
        self.outer = ast.Profile(plan.profile.name, outer, None, plan.profile.evaluation)
        self.root: Leaf | None = next((leaf for leaf in leaves if leaf.external
                                       and isinstance(outer, ast.External)), None)
        used = sorted({n.name for n in ast.walk(plan.profile.expr) if isinstance(n, ast.Prim)})
        # Only events of the profile's own classes open a partition (as the reference says).
        self.opens = [matchers[n] for n in used if n in matchers]
        # Where each leaf stands, left to right: at equal report keys an operand's left side
        # comes first (the trace view, Def. 4.1), so the outer engine is fed in this order.
        walk = ast.walk(outer)
        self.externals = {n.name: walk.index(n) for n in walk if isinstance(n, ast.External)}
        # By position in the walk, not walk.index(n): two leaves of one class are equal nodes,
        # and index() gave both the first one's place.
        self.classes = [(i, matchers[n.name]) for i, n in enumerate(walk)
                        if isinstance(n, ast.Prim) and n.name in matchers]
        self.partitions: dict[Hashable, _Partition] = {}
        self.opened = 0  # partitions opened so far (kept or not): the next one's order
        self.visible: set[tuple[str, str]] = set()  # made visible by a primitive leaf
        self.own_feed = own_feed  # a primitive leaf no service selects: every event is visible
        # How long before a report each engine's inputs may lie (_Keyed.horizon): a re-run
        # sees only events; the outer engine is also fed composites reported after their time.
        self.horizons = {leaf.index: lag(rerun_target(leaf.node), leaf.root_eoi, tick)
                         for leaf in leaves if leaf.external and not leaf.taken
                         and isinstance(leaf.node, Remote)}
        lags = [*self.horizons.values(), *(lag(leaf.expr, leaf.root_eoi, tick)
                                           for leaf in leaves if leaf.taken)]
        eoi = plan.profile.evaluation is ast.Evaluation.END_OF_INTERVAL
        own, fed = lag(outer, eoi, tick), longest(lags)
        self.horizon = None if own is None or fed is None else own + fed
        self.quiet = longest([self.horizon, *lags])
        """How long after a partition's latest input its engines may still hold anything, or
        a service may still report a composite of its events (None: no bound)."""
        self.takes_over = any(leaf.taken for leaf in leaves)
        self.engines = (1 if self.root is None else 0) + len(self.horizons)  # per partition
        # As the engine drops a ``per`` partition (Engine._sweep): one at rest answers as the
        # one a new event of its key would create, unless clock-driven (it acts without
        # events, from its creation). A partition fed by a service is kept while the service
        # may still report about its events.
        self.droppable = (plan.profile.per is not None and not eoi
                          and not any(isinstance(n, ast.Negation) or (isinstance(n, ast.Prim)
                                                                      and n.name in clocks)
                                      for n in ast.walk(plan.profile.expr))
                          and (self.quiet is not None or not self.takes_over))

    def position(self, event: Event) -> int:
        """Where an event stands among the leaves at its own report key: at the *last* class
        leaf it matches, so that a fed composite whose leaf stands before that one comes first
        (the trace view puts a left operand's element first at an equal key). With the first
        leaf, a composite of <L0> in (AB; (first_dup(<L0>); AB)) reported at an event of AB
        came after it, and the inner sequence took it as a new list (found by the fidelity
        search, tests/test_fidelity.py; the positions of two leaves of one class were both the
        first one's, too)."""
        return max((i for i, match in self.classes if match(event)), default=-1)


class Runner:
    """A document's plans, evaluated incrementally (see the module docstring)."""

    def __init__(self, plans: list[Plan], doc: ast.Document, dialects: Mapping[str, Dialect],
                 *, tick: int = 1_000_000, start: int | None = None,
                 end: int | None = None, limit: int | None = None) -> None:
        """``dialects``: each service's, by the name the plans' nodes give it
        (``Remote.service``). A primitive leaf of a service without one — the mediator itself,
        :data:`~transforms.federated.MEDIATOR` — is the mediator's own feed: it takes the class
        from the input (every event visible). ``limit``: the composite limit of its engines
        (None: none); what they report of it, or of their state cap, is kept in ``limited``,
        and from then on the runner settles nothing more (its answers would be incomplete: the
        caller drops it — the mediator suspends the subscription)."""
        self.doc = doc
        self.dialects = dialects
        self.tick = tick
        self.limit = limit
        self.limited: list[DeadLetter] = []
        """The engines' ``composite_limit`` and ``state_cap`` letters, oldest first: answers
        beyond a limit are missing from then on, which only the caller can act on."""
        self.start = start
        self.end = end
        classes = doc.class_map()
        self.matchers: dict[str, Matcher] = {
            c.name: compile_predicate(c.body, classes) for c in doc.classes
            if not isinstance(c.body, ast.Every)}
        self.leaves: list[Leaf] = []
        self.profiles: list[_Profile] = []
        for p in plans:
            self.profiles.append(self._profile(p))
        self._of: dict[int, _Profile] = {leaf.index: p for p in self.profiles for leaf in p.leaves}
        # The classes any profile's partitions open on, each matcher once.
        self._opens: list[Matcher] = list({id(m): m for p in self.profiles
                                           for m in p.opens}.values())
        # The events held until their visibility is final, released in key order (the own
        # feed's come in that order, learnt ones out of it).
        self._held: Held[Event] = Held()
        self._visible: dict[int, set[tuple[str, str]]] = {
            leaf.index: set() for leaf in self.leaves if leaf.external and not leaf.taken}
        self._readings: dict[int, list[tuple[Hashable, Any, Reading]]] = {}
        """Per taken-over leaf: (partition key, partition value, reading) waiting for its time."""
        # The events a taken-over answer may name (a service's copy has lost the arrival
        # number), kept as long as the answer may come after them.
        self._known: dict[tuple[str, str], Event] = {}
        self._known_order: list[tuple[int, tuple[str, str]]] = []
        taken_reach = [reach(leaf.expr) for leaf in self.leaves if leaf.taken]
        self._keep_known: int | None = longest(taken_reach) if taken_reach else -1
        # How far behind the services' progress visibility is final (None: only at the end).
        delays = [leaf.delay for leaf in self.leaves]
        self._lag: int | None = None
        if None not in delays:
            self._lag = max((d for d in delays if d is not None), default=0)
        # The post-filters of the leaves re-run by engines of their own (positive rules), where
        # the runner decides as the trace goes: decided only at the end of the input, a
        # verdict would keep every answer until then (a live plan has none such).
        self._verdicts = {index: _Verdicts(horizon) for index in self._visible
                          if self._lag is not None
                          and (horizon := self._of[index].horizons[index]) is not None}
        self._drops: dict[str, int] = {}  # answers they dropped, per service, not yet taken
        self._done: int | None = None  # every instant ≤ this is decided
        # What a round settles: the partitions given input since the last (by their order),
        # and those whose engines have work due (a heap of (instant, order, entry number)).
        self._touched: dict[tuple[int, int], tuple[_Profile, _Partition]] = {}
        self._wake: list[tuple[int, tuple[int, int], int, _Profile, _Partition]] = []
        self._entries = 0
        self._newest: int | None = None
        self._learned: set[tuple[str, str]] = set()  # held events a notification named
        self.learning = False  # given events by notifications alone (learn): partitions open there

    # ---------------------------------------------------------------- the plan, compiled

    def _dialect(self, node: Remote) -> Dialect:
        found = self.dialects.get(node.service)
        if found is None:
            raise ValueError(f"the plan assigns {expr_text(node.original)} to service "
                             f"{node.service!r}, which is not connected (services: "
                             f"{', '.join(repr(s) for s in self.dialects) or 'none'})")
        return found

    def _profile(self, p: Plan) -> _Profile:
        leaves: list[Leaf] = []
        externals: dict[Remote, str] = {}
        eoi = p.profile.evaluation is ast.Evaluation.END_OF_INTERVAL
        own = False

        def leaf(node: Remote | Subscribe, expr: ast.Expr, external: str, at_root: bool) -> None:
            taken = (isinstance(node, Remote) and bool(external)
                     and self._dialect(node).takes_over(node))
            # When the service may still name an event: what it evaluates decides, not the
            # post-filter (a timeless target may pair an event with any later one).
            delay = 0 if taken else reach(expr)
            if delay is not None and any(isinstance(n, ast.Negation) for n in ast.walk(expr)):
                delay += self.tick  # the clock's granularity
            made = Leaf(len(self.leaves), p.profile, node, expr, at_root and eoi, external, taken,
                        delay)
            self.leaves.append(made)
            leaves.append(made)

        def subscribed(node: Subscribe, at_root: bool, observer: bool = False) -> None:
            """A class from the own feed and from each service filtering (part of) it."""
            nonlocal own
            for service in node.sources:
                if service not in self.dialects:
                    own = True
                elif observer:
                    made = Leaf(len(self.leaves), p.profile, replace(node, service=service, also=()),
                                ast.Prim(node.name), False, "", False, 0, observer=True)
                    self.leaves.append(made)
                    leaves.append(made)
                else:
                    leaf(replace(node, service=service, also=()), ast.Prim(node.name), "", at_root)

        def outer(node: PlanNode, at_root: bool) -> ast.Expr:
            if isinstance(node, Subscribe):
                if not node.clock:  # a time class comes from the outer engine's own clock
                    subscribed(node, at_root)
                return ast.Prim(node.name)
            if isinstance(node, Remote):
                if not self._dialect(node).takes_over(node) and _inline(node):
                    leaf(node, node.target, "", at_root)
                    return rerun_target(node)
                if node not in externals:
                    externals[node] = f"L{len(externals)}"
                    leaf(node, node.target, externals[node], at_root)
                return ast.External(externals[node])
            expr = node.node
            kids = [outer(child, False) for child in node.children]
            made: ast.Expr
            if isinstance(expr, (ast.Selection, ast.Negation)):
                made = replace(expr, expr=kids[0])
            else:
                assert isinstance(expr, (ast.Disjunction, ast.Conjunction, ast.Sequence))
                made = replace(expr, left=replace(expr.left, expr=kids[0]),
                               right=replace(expr.right, expr=kids[1]))
            if made != expr:
                tags[expr_text(made)] = expr_text(expr)
            return made

        tags: dict[str, str] = {}
        expr = outer(p.root, True)
        for observed in p.observed:
            subscribed(observed, False, observer=True)
        clocks = {c.name for c in self.doc.classes if isinstance(c.body, ast.Every)}
        return _Profile(len(self.profiles), p, leaves, expr, self.matchers, own, tags, self.tick,
                        clocks)

    # ---------------------------------------------------------------- input

    def begin(self, origin: int) -> None:
        """Profiles see events after ``origin`` (default: just before the first event)."""
        if self.start is None:
            self.start = origin

    def push(self, event: Event) -> None:
        """An admitted event of the trace, in time order (``seq``: its arrival number). It is
        held until the services' notifications about it are final."""
        self.push_all([event])

    def push_all(self, events: Sequence[Event]) -> None:
        """:meth:`push` of each of ``events`` (the own feed's batch), in one loop."""
        if not events:
            return
        if self.start is None:
            self.start = events[0].time - 1
        start, end = self.start, self.end
        keep = self._keep_known != -1
        # Of no profile's classes, and no service can name it (no leaf of one): releasing it
        # would do nothing. Most events are of no profile of a given subscription.
        opens = None if self._visible else self._opens
        held = self._held.push
        for event in events:
            t = event.time
            if t <= start or (end is not None and t > end):
                continue  # outside the trace the profiles see
            if keep:
                ident = (event.source, event.id)
                self._known[ident] = event
                self._known_order.append((t, ident))
            self._newest = t
            if opens is not None and not _any_match(opens, event):
                continue
            held((t, PRIMITIVE, event.seq), event)  # its key

    def learn(self, event: Event, taken: bool = False) -> bool:
        """An event a notification names that the runner was not pushed: an autonomous
        service's, which the mediator sees only in its notifications. It is held as a pushed
        event is (in key order, whatever the order it is learnt in; once). False: it is late —
        at or before an instant decided already (a service reported behind its watermark, or
        after the mediator stopped waiting for it: the idle timeout). A taken-over answer's
        constituent is never late (the answer is, :meth:`notify`): it is kept to be named,
        and held only if it can still open its partition."""
        self.learning = True
        assert self.start is not None, "learn before the runner's start is set (begin)"
        ident = (event.source, event.id)
        if ident in self._learned or event.time <= self.start or (
                self.end is not None and event.time > self.end):
            return True
        if self._keep_known != -1 and ident not in self._known:
            self._known[ident] = event
            self._known_order.append((event.time, ident))
        if self._done is not None and event.time <= self._done:
            return taken
        self._held.push(event.key, event)
        self._learned.add(ident)
        if self._newest is None or event.time > self._newest:
            self._newest = event.time
        return True

    def notify(self, leaf: Leaf, detection: Detection) -> bool:
        """A notification of ``leaf``'s subscription (in the order the service sent them).
        False: a taken-over answer reported at or before an instant decided already (late,
        dropped)."""
        p = self._of[leaf.index]
        if leaf.observer:
            return True  # its events were learnt: they open partitions, and that is all
        if not leaf.taken:
            ids = {(e.source, e.id) for e in detection.constituents}
            if leaf.external:
                self._visible[leaf.index] |= ids
                verdicts = self._verdicts.get(leaf.index)
                if verdicts is not None:
                    verdicts.wait(detection.constituents)
            else:
                p.visible |= ids
            return True
        assert isinstance(leaf.node, Remote)
        # A service that takes an answer over names the partition (a peer mediator's extra).
        value = detection.extra.get("partition") if p.profile.per is not None else None
        reading = self._dialect(leaf.node).parse_notification(detection, leaf.node, self._scope(
            value, detection))
        if reading.occurrences:
            if self._done is not None and max(
                    _time(emit) for emit, _ in reading.occurrences) <= self._done:
                return False
            key = partition_key(value) if p.profile.per is not None else None
            self._readings.setdefault(leaf.index, []).append((key, value, reading))
        return True

    def _scope(self, value: Any, detection: Detection) -> Scope:
        """What a dialect reads a notification against: the partition, and the trace's own
        copies of the events the notification names."""
        known = self._known
        events = [known[k] for k in dict.fromkeys((e.source, e.id) for e in detection.constituents)
                  if k in known]
        return Scope(self.doc, value, events, self.matchers)

    def advance(self, time: int) -> list[Notification]:
        """The services have reported every instant up to ``time``, and every event up to it
        has been pushed: decide what that settles."""
        if self._lag is None:
            return []  # visibility is final only at the end of the input
        bound = time - self._lag
        if self._done is not None and bound <= self._done:
            return []
        return self._run(bound, False)

    def close(self, until: int | None = None) -> list[Notification]:
        """End of input: the trace ends at ``until`` (default: the newest event's time)."""
        end = until if until is not None else self.end if self.end is not None else self._newest
        if end is None or self.start is None:
            return []
        self.end = end
        return self._run(end, True)

    # ---------------------------------------------------------------- checkpoints

    def export_state(self) -> dict[str, Any]:
        """What the runner holds, as data (:func:`eva.snapshot.to_data` writes it): the events
        held and learnt, what the services made visible, the answers waiting, and each
        partition's engines (engine snapshots). :meth:`import_state` gives it to a runner made
        of the same plans — what it decides from then on is what this one would have."""
        profiles = [{
            "visible": p.visible, "opened": p.opened,
            "partitions": [[part.value, part.key, part.order, _keyed_state(part.outer),
                            {i: _keyed_state(e) for i, e in part.rerun.items()}, part.last,
                            part.due, part.pending] for part in p.partitions.values()]}
            for p in self.profiles]
        return {"start": self.start, "end": self.end, "done": self._done,
                "newest": self._newest, "learning": self.learning,
                "held": self._held.entries(),
                "learned": self._learned, "visible": self._visible,
                "readings": {i: [(key, value, (r.occurrences, r.visible, r.order))
                                 for key, value, r in rs] for i, rs in self._readings.items()},
                "known": self._known, "known_order": self._known_order,
                "verdicts": {i: (v.waiting, v._due, v._entries)
                             for i, v in self._verdicts.items()},
                "drops": self._drops, "touched": list(self._touched),
                "wake": [(t, order, n) for t, order, n, _, _ in self._wake],
                "entries": self._entries, "profiles": profiles}

    def import_state(self, state: dict[str, Any]) -> None:
        """Take up what :meth:`export_state` gave, into a runner made of the same plans (and
        nothing pushed to it yet). ValueError if it does not fit them."""
        if len(state["profiles"]) != len(self.profiles):
            raise ValueError(f"a state of {len(state['profiles'])} profiles for a runner of "
                             f"{len(self.profiles)}")
        self.start, self.end, self._done = state["start"], state["end"], state["done"]
        self._newest, self.learning = state["newest"], state["learning"]
        self._held = Held()
        for key, event in state["held"]:
            self._held.push(tuple(key), event)
        self._learned = set(state["learned"])
        self._visible = {i: set(v) for i, v in state["visible"].items()}
        self._readings = {i: [(key, value, Reading(*r)) for key, value, r in rs]
                          for i, rs in state["readings"].items()}
        self._known, self._known_order = dict(state["known"]), list(state["known_order"])
        for i, (waiting, due, entries) in state["verdicts"].items():
            verdicts = self._verdicts[i]
            verdicts.waiting, verdicts._due, verdicts._entries = dict(waiting), list(due), entries
        self._drops = dict(state["drops"])
        self._entries = state["entries"]
        by_order: dict[tuple[int, int], tuple[_Profile, _Partition]] = {}
        for p, data in zip(self.profiles, state["profiles"], strict=True):
            p.visible, p.opened = set(data["visible"]), data["opened"]
            p.partitions = {}
            for value, key, order, outer, rerun, last, due, pending in data["partitions"]:
                part = _Partition(value, key, order,
                                  _keyed(outer, p.horizon, p.tags, self._letter),
                                  {i: _rerun(e, p.horizons[i], self._letter)
                                   for i, e in rerun.items()},
                                  last, due, list(pending))
                p.partitions[key] = part
                by_order[order] = (p, part)
        self._touched = {order: by_order[order] for order in state["touched"]
                         if order in by_order}
        self._wake = [(t, order, n, *by_order[order]) for t, order, n in state["wake"]
                      if order in by_order]
        heapq.heapify(self._wake)

    def _letter(self, letter: DeadLetter) -> None:
        """An engine's dead letter: a limit reached is kept; any other is a bug (the runner
        gives its engines only what was admitted)."""
        if letter.reason not in LIMITS:
            _bug(letter)
        self.limited.append(letter)

    # ---------------------------------------------------------------- statistics

    def stats(self) -> RunnerStats:
        """What the runner holds now (:class:`RunnerStats`): a few counts per profile."""
        partitions = sum(len(p.partitions) for p in self.profiles)
        return RunnerStats(
            held=len(self._held),
            visible=(sum(len(v) for v in self._visible.values())
                     + sum(len(p.visible) for p in self.profiles)),
            known=len(self._known),
            readings=sum(len(r) for r in self._readings.values()),
            checks=sum(len(v.waiting) for v in self._verdicts.values()),
            partitions=partitions,
            engines=sum(len(p.partitions) * p.engines for p in self.profiles))

    def take_drops(self) -> dict[str, int]:
        """The answers of relaxed queries the post-filters dropped since the last call, per
        service (the leaf's ``service``): an answer whose events the re-run of the original
        put in no composite of its own (:class:`_Verdicts`). Counted for the remotes re-run
        by engines of their own: a positive rule's, except on a disjunction (the outer
        engine re-runs that one with the rest of the profile, and drops nothing apart)."""
        out, self._drops = self._drops, {}
        return out

    # ---------------------------------------------------------------- deciding

    def _run(self, bound: int, final: bool) -> list[Notification]:
        assert self.start is not None
        for p in self.profiles:
            if p.profile.per is None and None not in p.partitions:
                # Unpartitioned: one partition from the start, events or not (its clock).
                p.partitions[None] = self._open(p, None, self.start)
        for _, event in self._held.take(bound):
            self._release(event)
        for p in self.profiles:
            self._take_over(p, bound)
        out: list[Notification] = []
        for p, partition in self._due(bound):
            if self.limited:
                break  # a limit was reached: answers are incomplete, the caller drops us
            out.extend(self._settle(p, partition, bound, final))
            if self._resting(p, partition, bound):
                del p.partitions[partition.key]
                partition.due = None  # its entries in the wake-up heap are stale
            else:
                self._sleep(p, partition, bound)
        for index, verdicts in self._verdicts.items():
            dropped = verdicts.expire(None if final else bound)
            if dropped:
                service = self.leaves[index].node.service
                self._drops[service] = self._drops.get(service, 0) + dropped
        self._done = bound
        self._forget(bound)
        out.sort(key=lambda n: n.emitted)  # stable: profiles, partitions, reports in order
        return out

    def _due(self, bound: int) -> list[tuple[_Profile, _Partition]]:
        """The partitions to settle up to ``bound``, profiles in order, partitions in order
        of creation (the order of the answer at equal report keys): the others' engines would
        do nothing — a round costs the partitions it touches, not all of them."""
        due = self._touched
        self._touched = {}
        wake = self._wake
        while wake and wake[0][0] <= bound:
            time, order, _, p, partition = heapq.heappop(wake)
            if partition.due == time:  # else a stale entry: it was settled since
                due[order] = (p, partition)
        return [due[order] for order in sorted(due)]

    def _touch(self, p: _Profile, partition: _Partition) -> None:
        self._touched[partition.order] = (p, partition)

    def _sleep(self, p: _Profile, partition: _Partition, bound: int) -> None:
        """Note when a settled partition's engines next have work of their own (a timer, a
        tick that changes something) — or, for one that may be dropped, when everything its
        inputs left in them can have gone (``_resting``)."""
        times = [t for e in _engines(partition) if (t := e.engine.next_instant()) is not None]
        if p.droppable and p.quiet is not None and partition.last + p.quiet >= bound:
            times.append(partition.last + p.quiet + 1)
        partition.due = min(times) if times else None
        if partition.due is not None:
            self._entries += 1
            heapq.heappush(self._wake, (partition.due, partition.order, self._entries, p,
                                        partition))

    def _resting(self, p: _Profile, partition: _Partition, bound: int) -> bool:
        """Whether a settled partition can be dropped: the next event of its key would open
        one that answers as this one does (the engine drops a ``per`` partition the same way,
        Engine._sweep) — its profile is not clock-driven, its value is the one its key gives
        back, nothing is pending for it, no service can still report about its events, and
        its engines are at rest."""
        if not p.droppable or partition.pending or type(partition.value) not in _CANONICAL:
            return False
        if p.takes_over and (p.quiet is None or bound < partition.last + p.quiet):
            return False
        return all(e.engine.at_rest() for e in _engines(partition))

    def _release(self, event: Event) -> None:
        """An event whose visibility is final, to the partitions of the profiles it is of."""
        ident = (event.source, event.id)
        if self._learned:
            self._learned.discard(ident)
        for p in self.profiles:
            if not _any_match(p.opens, event):
                continue
            partition = self._partition(p, event)
            if partition is None:
                continue
            partition.last = event.time
            if partition.outer is not None and (p.own_feed or ident in p.visible):
                partition.pending.append((event.key, p.position(event), len(partition.pending),
                                          event))
                self._touch(p, partition)
            for index, engine in partition.rerun.items():
                if ident in self._visible[index]:
                    self._pending(p, partition, self.leaves[index], engine.push(event))
                    self._touch(p, partition)
            p.visible.discard(ident)
        for visible in self._visible.values():
            if visible:
                visible.discard(ident)  # nothing can name it any more

    def _forget(self, bound: int) -> None:
        """Drop the events no taken-over answer can name any more."""
        age = self._keep_known
        if age is None or age == -1:
            return
        order = self._known_order
        cut = 0
        while cut < len(order) and order[cut][0] < bound - age:
            self._known.pop(order[cut][1], None)
            cut += 1
        del order[:cut]

    def _partition(self, p: _Profile, event: Event) -> _Partition | None:
        if p.profile.per is None:
            return p.partitions[None]
        value = event.field(p.profile.per)
        if value is None:
            return None
        key = partition_key(value)
        found = p.partitions.get(key)
        if found is None:
            found = p.partitions[key] = self._open(p, value, event.time - 1)
        return found

    def _open(self, p: _Profile, value: Any, origin: int) -> _Partition:
        classes = self.doc.classes
        outer = None if p.root is not None else _Keyed([p.outer], classes, origin, self.tick,
                                                        p.horizon, p.tags, self.limit,
                                                        self._letter)
        rerun = {}
        for leaf in p.leaves:
            if leaf.external and not leaf.taken:
                assert isinstance(leaf.node, Remote)
                evaluation = (ast.Evaluation.END_OF_INTERVAL if leaf.root_eoi
                              else ast.Evaluation.CONTINUOUS)
                profile = ast.Profile(leaf.external, rerun_target(leaf.node), None, evaluation)
                rerun[leaf.index] = _Keyed([profile], classes, origin, self.tick,
                                           p.horizons[leaf.index], None, self.limit,
                                           self._letter)
        made = _Partition(value, partition_key(value) if p.profile.per is not None else None,
                          (p.index, p.opened), outer, rerun, origin + 1)
        p.opened += 1
        self._touch(p, made)  # its clock starts: its ticks may be due
        return made

    def _take_over(self, p: _Profile, bound: int) -> None:
        """The taken-over occurrences reported up to ``bound``, to their partitions."""
        for leaf in p.leaves:
            readings = self._readings.get(leaf.index)
            if not readings:
                continue
            due: dict[Hashable, tuple[Any, list[Reading]]] = {}
            later = []
            for key, value, reading in readings:
                if max(_time(emit) for emit, _ in reading.occurrences) <= bound:
                    due.setdefault(key, (value, []))[1].append(reading)
                else:
                    later.append((key, value, reading))
            self._readings[leaf.index] = later
            for key, (value, batch) in due.items():
                partition = p.partitions.get(key)
                if partition is None and self.learning and (p.profile.per is None or value is not None):
                    # Its events were learnt only with this answer, after their instants were
                    # decided (an autonomous service's): the partition opens here.
                    earliest = min(_time(emit) for r in batch for emit, _ in r.occurrences)
                    partition = p.partitions[key] = self._open(p, value, earliest - 1)
                if partition is not None:  # else a partition the trace never opened here
                    self._touch(p, partition)
                    partition.last = max(partition.last, *(_time(emit) for r in batch
                                                           for emit, _ in r.occurrences))
                    self._pending(p, partition, leaf, [
                        Notification(p.profile.name, partition.value, occ, emit)  # type: ignore[arg-type]
                        for emit, occ in taken(batch)])

    def _pending(self, p: _Profile, partition: _Partition, leaf: Leaf,
                 notes: list[Notification]) -> None:
        """A composite leaf's occurrences, for the outer engine (or the answer, at the root)."""
        verdicts = self._verdicts.get(leaf.index)
        if verdicts is not None:
            verdicts.kept(notes)
        position = p.externals.get(leaf.external, 0)
        pending = partition.pending
        pending.extend((n.emitted, position, len(pending), (leaf.external, n.occ)) for n in notes)

    def _settle(self, p: _Profile, partition: _Partition, bound: int,
                final: bool) -> list[Notification]:
        """Run the partition's engines to ``bound``: the re-runs' composites feed the outer
        leaves, whose reports are the profile's. The outer engine is given its input in report
        order, leaves left to right at equal keys."""
        for index, engine in partition.rerun.items():
            notes = engine.close(bound) if final else engine.advance(bound)
            engine.trim(bound)
            self._pending(p, partition, self.leaves[index], notes)
        pending = sorted(partition.pending, key=lambda item: item[:3])
        partition.pending = []
        name, value = p.profile.name, partition.value
        outer = partition.outer
        if outer is None:
            return [Notification(name, value, item[3][1], item[0]) for item in pending
                    if isinstance(item[3], tuple)]
        out: list[Notification] = []
        for emit, _, _, given in pending:
            if self.limited:
                # A limit was reached: the answers from here on are incomplete and the caller
                # drops the runner; going on would only make more of what the limit bounds.
                return [Notification(name, value, n.occ, n.emitted) for n in out]
            if isinstance(given, Event):
                out.extend(outer.push(given))
            else:
                out.extend(outer.feed(name, given[0], emit, given[1]))
        out.extend(outer.close(bound) if final else outer.advance(bound))
        outer.trim(bound)
        return [Notification(name, value, n.occ, n.emitted) for n in out]


def _keyed_state(keyed: _Keyed | None) -> dict[str, Any] | None:
    """A partition's engine as data: its snapshot and its map of inputs to the trace's keys."""
    if keyed is None:
        return None
    return {"engine": base64.b64encode(snapshot(keyed.engine)).decode(), "keys": keyed.keys,
            "given": keyed.given, "first": keyed.first, "local": keyed.local}


def _keyed(data: dict[str, Any] | None, horizon: int | None,
           tags: dict[str, str] | None = None,
           letter: Callable[[DeadLetter], None] = _bug) -> _Keyed | None:
    """The engine :func:`_keyed_state` wrote (its horizon and tags are the profile's)."""
    if data is None:
        return None
    made = _Keyed.__new__(_Keyed)
    made.engine = restore(base64.b64decode(data["engine"]), letter)
    made.keys, made.given = list(data["keys"]), list(data["given"])
    made.first, made.local = data["first"], dict(data["local"])
    made.horizon, made.tags = horizon, tags or {}
    return made


def _rerun(data: dict[str, Any], horizon: int | None,
           letter: Callable[[DeadLetter], None] = _bug) -> _Keyed:
    made = _keyed(data, horizon, None, letter)
    assert made is not None
    return made


def _any_match(matchers: list[Callable[[Event], bool]], event: Event) -> bool:
    """Whether one of ``matchers`` takes ``event`` (a loop, not ``any`` of a generator: once
    per event and profile of every runner)."""
    for match in matchers:  # noqa: SIM110 (the reason above)
        if match(event):
            return True
    return False


def _engines(partition: _Partition) -> list[_Keyed]:
    return [*partition.rerun.values(), *([partition.outer] if partition.outer else [])]


__all__ = ["Leaf", "Runner", "RunnerStats", "trace_key"]
