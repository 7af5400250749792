"""The fidelity search (``make fidelity``, issue 26): every path that computes composites, on
random profiles and traces, against the reference evaluator (:func:`eva.reference.evaluate`,
the definition).

    .venv/bin/python benchmarks/fidelity.py [--examples 100000] [--minutes 40] [--seed 1]
        [--record tests/fidelity_cases.json]

An *example* is one (random profile, group, random trace): the profile has depth ≤ 4 over
every operator and parameter (a ``per`` partition and end-of-interval evaluation at random),
the trace ≤ ``MAX_EVENTS`` events of two sources with many equal times. For each profile and
trace the paths are

* ``engine`` — the incremental engine (once per profile and trace);
* ``oracle:G`` and ``runner:G`` for every group G = cg0 … cg5 — the batch plan oracle
  (:func:`transforms.evaluate.evaluate_plans`) and the incremental plan runner through G's
  native service in process (what ``replay --via G`` runs), one example each G;
* sampled, as they are slower: ``via:G`` — ``replay --via G``'s path through a real base
  service (gRPC, one per group, started here); ``federated`` — the federated planner over a
  random set of services of random groups and coverage, in batches of random sizes;
  ``spark`` — batch replay on Spark (local mode), compared with the engine's lines.

A disagreement (a different answer, or an exception) is shrunk — events dropped, subtrees
replaced by their operands, parameters simplified, while the same path still disagrees — and
the minimal example is printed and, with ``--record``, appended to a JSON file that
tests/test_fidelity.py replays (``test_recorded_disagreements_agree``). Profiles whose
reference answer is larger than ``MAX_COMPOSITES`` are skipped (counted): untimed nested
``all_pairs`` grow exponentially under EVA's own semantics, which the output bound (issue 26
item 2) is for, not this search.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
import traceback
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from adapters.backends.registry import GROUPS, language
from adapters.federation import Federation, publish, through_group, via
from adapters.links import InProcessLink, Link
from eva import ast
from eva.engine import Engine, EngineConfig
from eva.events import Event
from eva.notify import to_cloudevent
from eva.parser import parse
from eva.printer import expr_text, to_text
from eva.reference import evaluate
from eva.semantics import Notification
from transforms.capability import PRESETS
from transforms.evaluate import evaluate_plans
from transforms.federated import Coverage, ServiceInfo, plan_federated
from transforms.planner import plan

CLASSES = ('class A = type == "a"\n'
           'class B = type == "b"\n'
           'class C = type == "c"\n'
           'class AB = type in ["a", "b"]\n'
           'class A1 = source == "s1" and type == "a"\n'
           'class T = every 4us\n')
NAMES = ["A", "B", "C", "AB", "A1", "T"]
SOURCES = ("s1", "s2")
MAX_DEPTH = 4
MAX_EVENTS = 12
MAX_COMPOSITES = 400
"""A profile and trace whose reference answer is larger are skipped (exponential output)."""
DUPS = [ast.FIRST, ast.LAST, ast.ALL, ast.nth(2)]
SPANS = [1, 2, 3, 5, 8, None]
NEGATION_SPANS = [1, 2, 3, 5]

Signature = list[tuple[object, ...]]


# ------------------------------------------------------------------ random examples


def random_expr(rng: random.Random, depth: int) -> ast.Expr:
    """An expression of nesting depth ≤ ``depth``: every operator and parameter."""
    if depth == 0 or rng.random() < 0.25:
        return ast.Prim(rng.choice(NAMES))

    def operand() -> ast.Operand:
        return ast.Operand(rng.choice(DUPS), random_expr(rng, depth - 1))

    pairs = rng.choice(list(ast.Pairs))
    kind = rng.randrange(6)
    if kind == 0:
        return ast.Disjunction(operand(), operand(), pairs)
    if kind == 1:
        return ast.Conjunction(operand(), operand(), rng.choice(SPANS), pairs)
    if kind == 2:
        right = operand()
        if rng.random() < 0.3:  # an anchored negation
            right = ast.Operand(rng.choice(DUPS), ast.Negation(
                random_expr(rng, depth - 1), rng.choice(NEGATION_SPANS), rng.choice(list(ast.Pairs))))
        return ast.Sequence(operand(), right, rng.choice(SPANS), pairs)
    if kind == 3:
        return ast.Selection(random_expr(rng, depth - 1), rng.randint(1, 3), pairs)
    if kind == 4:
        return ast.Negation(random_expr(rng, depth - 1), rng.choice(NEGATION_SPANS), pairs)
    return ast.Sequence(operand(), operand(), rng.choice(SPANS), pairs)


def document(expr: ast.Expr, per: bool, eoi: bool) -> ast.Document:
    head = "profile P" + (" per data.k" if per else "") + (
        " evaluate end_of_interval" if eoi else "")
    return parse(CLASSES + f"{head} = {expr_text(expr)}\n")


def random_doc(rng: random.Random) -> ast.Document:
    return document(random_expr(rng, rng.randint(1, MAX_DEPTH)), rng.random() < 0.25,
                    rng.random() < 0.25)


def random_trace(rng: random.Random, max_events: int = MAX_EVENTS) -> list[Event]:
    """Many equal times and short gaps, so frames both hold and fail; two sources."""
    t = 10
    out = []
    for i in range(rng.randint(0, max_events)):
        t += rng.choice([0, 0, 1, 1, 2, 3, 6])
        kind = rng.choice("abc")
        out.append(Event(f"{kind}{i}", rng.choice(SOURCES), kind, t, i,
                         {"k": rng.choice([1, 2])}))
    return out


def random_services(rng: random.Random) -> list[ServiceInfo]:
    """One to three services of random groups, each observing some sources and types."""
    out = []
    for i in range(rng.randint(1, 3)):
        sources = rng.choice([("*",), ("*",), ("*",), ("s1",), ("s2",), ("s1", "s2")])
        types = rng.choice([("*",), ("*",), ("a", "b"), ("b", "c"), ("a", "c"), ("a",),
                            ("b",), ("c",)])
        group = rng.choice(GROUPS)
        out.append(ServiceInfo(f"s{i}", group, PRESETS[group], Coverage(sources, types)))
    return out


# ------------------------------------------------------------------ the paths


def signature(notes: list[Notification]) -> Signature:
    return [(n.profile, n.partition, n.occ.events, n.occ.time, n.emitted) for n in notes]


def keyed(notes: list[Notification]) -> Signature:
    """A peer mediator (CG-5) numbers its report keys' tiebreaks its own way."""
    return [(n.profile, n.partition, n.occ.events, n.occ.time, n.emitted[:2]) for n in notes]


def engine_path(doc: ast.Document, trace: list[Event]) -> list[Notification]:
    engine = Engine(EngineConfig(tick=1))
    engine.add_document(doc)
    return [n for e in trace for n in engine.push(e)] + engine.close()


def oracle_path(group: str, doc: ast.Document, trace: list[Event]) -> list[Notification]:
    cap = language(group).capability
    return evaluate_plans([plan(p, doc, cap) for p in doc.profiles], doc, trace, tick=1)


def runner_path(group: str, doc: ast.Document, trace: list[Event]) -> list[Notification]:
    """Event by event through the runner and the group's native service in process."""
    federation = through_group(language(group, 1), doc, tick=1)
    out = [n for e in trace for n in federation.push([e])]
    return out + federation.close()


def federated_path(services: list[ServiceInfo], sizes: list[int], doc: ast.Document,
                   trace: list[Event]) -> list[Notification]:
    """Planned over ``services``, run through in-process links in batches of ``sizes``."""
    links: dict[str, Link] = {s.name: InProcessLink(s, language(s.group, 1)) for s in services}
    plans = [plan_federated(p, doc, services) for p in doc.profiles]
    federation = Federation(doc, plans, links, tick=1)
    out: list[Notification] = []
    at, turn = 0, 0
    while at < len(trace):
        size = sizes[turn % len(sizes)]
        batch, at, turn = trace[at:at + size], at + size, turn + 1
        ticks = federation.begin(batch)
        out.extend(federation.finish(publish(links, batch, ticks), batch[-1].time))
    out.extend(federation.close())
    federation.unsubscribe()
    return out


@dataclass
class Services:
    """Real base services (gRPC), one per group, started on first use."""

    running: dict[str, Any] = field(default_factory=dict)

    def address(self, group: str) -> str:
        if group not in self.running:
            from adapters.backends.service import serve

            self.running[group] = serve(group, "127.0.0.1:0", tick=1)
        return f"127.0.0.1:{self.running[group].port}"

    def stop(self) -> None:
        for running in self.running.values():
            running.stop()


SERVICES = Services()


def via_path(group: str, doc: ast.Document, trace: list[Event]) -> list[Notification]:
    """``replay --via G --service host:port``: the whole path through a real base service."""
    from adapters.client import remote_transport

    transport = remote_transport(SERVICES.address(group), group)
    got, _, _ = via(language(group, 1), doc, trace, tick=1, transport=transport)
    return got


_SPARK: list[Any] = []


def spark_lines(doc: ast.Document, trace: list[Event]) -> list[str]:
    """Batch replay on Spark: its composites as CloudEvents lines, in report order."""
    from spark_jobs.batch import replay
    from spark_jobs.session import build_session

    if not _SPARK:
        _SPARK.append(build_session())
    origin = min(e.time for e in trace) - 1
    return replay(_SPARK[0], to_text(doc), trace, config=EngineConfig(tick=1), origin=origin,
                  end=max(e.time for e in trace))


Path_ = Callable[[ast.Document, list[Event]], Signature]


def path_named(name: str, extra: dict[str, Any]) -> Path_:
    """The path ``name`` (``engine``, ``oracle:G``, ``runner:G``, ``via:G``, ``federated``,
    ``spark``) as a function of the document and trace, giving what to compare."""
    kind, _, group = name.partition(":")
    exact = keyed if group == "cg5" else signature
    if kind == "engine":
        return lambda doc, trace: signature(engine_path(doc, trace))
    if kind == "oracle":
        return lambda doc, trace: signature(oracle_path(group, doc, trace))
    if kind == "runner":
        return lambda doc, trace: exact(runner_path(group, doc, trace))
    if kind == "via":
        return lambda doc, trace: exact(via_path(group, doc, trace))
    if kind == "federated":
        services = [ServiceInfo(s["name"], s["group"], PRESETS[s["group"]],
                                Coverage(tuple(s["sources"]), tuple(s["types"])))
                    for s in extra["services"]]
        cg5 = any(s.group == "cg5" for s in services)
        return lambda doc, trace: (keyed if cg5 else signature)(
            federated_path(services, extra["sizes"], doc, trace))
    if kind == "spark":
        return lambda doc, trace: [(line,) for line in spark_lines(doc, trace)]
    raise ValueError(f"no path {name!r}")


def want_for(name: str, doc: ast.Document, trace: list[Event], extra: dict[str, Any]
             ) -> Signature:
    """What the path must give: the reference's answer, in the path's terms (Spark: the
    lines of the engine, itself compared with the reference as path ``engine``)."""
    kind, _, group = name.partition(":")
    if kind == "spark":
        return [(json.dumps(to_cloudevent(n)),) for n in engine_path(doc, trace)]
    want = evaluate(doc, trace, tick=1)
    cg5 = (group == "cg5" and kind in ("runner", "via")) or (kind == "federated"
                             and any(s["group"] == "cg5" for s in extra["services"]))
    return keyed(want) if cg5 else signature(want)


def disagrees(name: str, doc: ast.Document, trace: list[Event], extra: dict[str, Any]) -> str:
    """Why path ``name`` disagrees with the reference on this example ("" if it agrees)."""
    try:
        got = path_named(name, extra)(doc, trace)
    except Exception as exc:  # a crash is a disagreement too
        return f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
    want = want_for(name, doc, trace, extra)
    if got == want:
        return ""
    missing = [x for x in want if x not in got][:2]
    extra_ = [x for x in got if x not in want][:2]
    return f"missing {missing}, extra {extra_}" if missing or extra_ else "same set, other order"


# ------------------------------------------------------------------ shrinking


def smaller_exprs(expr: ast.Expr) -> Iterator[ast.Expr]:
    """Simpler expressions: an operand instead of the node, or the node with simpler
    parameters, or one child simplified (recursively)."""
    kids = ast.children(expr)
    yield from kids
    if isinstance(expr, ast.Binary):
        if expr.left.dup != ast.ALL:
            yield replace(expr, left=replace(expr.left, dup=ast.ALL))
        if expr.right.dup != ast.ALL:
            yield replace(expr, right=replace(expr.right, dup=ast.ALL))
        for smaller in smaller_exprs(expr.left.expr):
            yield replace(expr, left=replace(expr.left, expr=smaller))
        for smaller in smaller_exprs(expr.right.expr):
            yield replace(expr, right=replace(expr.right, expr=smaller))
        if expr.pairs is not ast.Pairs.ALL:
            yield replace(expr, pairs=ast.Pairs.ALL)
        if isinstance(expr, (ast.Conjunction, ast.Sequence)) and expr.span is not None:
            yield replace(expr, span=None)
    elif isinstance(expr, (ast.Selection, ast.Negation)):
        for smaller in smaller_exprs(expr.expr):
            yield replace(expr, expr=smaller)


def shrink(name: str, doc: ast.Document, trace: list[Event], extra: dict[str, Any],
           budget: float = 60.0) -> tuple[ast.Document, list[Event]]:
    """A minimal example on which ``name`` still disagrees (greedy, within ``budget`` s)."""
    deadline = time.monotonic() + budget
    profile = doc.profiles[0]
    per, eoi = profile.per is not None, profile.evaluation is ast.Evaluation.END_OF_INTERVAL
    expr = profile.expr

    def fails(e: ast.Expr, p: bool, o: bool, t: list[Event]) -> bool:
        try:
            return bool(disagrees(name, document(e, p, o), t, extra))
        except Exception:  # a smaller expression the parser refuses: not a candidate
            return False

    changed = True
    while changed and time.monotonic() < deadline:
        changed = False
        for i in range(len(trace)):
            fewer = trace[:i] + trace[i + 1:]
            if fewer and fails(expr, per, eoi, fewer):
                trace, changed = fewer, True
                break
        if changed:
            continue
        for p, o in ((False, eoi), (per, False)):
            if (p, o) != (per, eoi) and fails(expr, p, o, trace):
                per, eoi, changed = p, o, True
                break
        if changed:
            continue
        for smaller in smaller_exprs(expr):
            if fails(smaller, per, eoi, trace):
                expr, changed = smaller, True
                break
    return document(expr, per, eoi), trace


def case(name: str, doc: ast.Document, trace: list[Event], extra: dict[str, Any],
         why: str) -> dict[str, Any]:
    """A disagreement as a test case (tests/test_fidelity.py replays the recorded ones)."""
    return {"path": name, "profile": to_text(ast.Document((), doc.profiles)).strip(),
            "events": [[e.id, e.source, e.type, e.time, e.data.get("k")] for e in trace],
            "extra": extra, "found": why}


def from_case(record: dict[str, Any]) -> tuple[ast.Document, list[Event]]:
    doc = parse(CLASSES + record["profile"] + "\n")
    trace = [Event(i, s, kind, t, seq, {"k": k})
             for seq, (i, s, kind, t, k) in enumerate(record["events"])]
    return doc, trace


# ------------------------------------------------------------------ the search


@dataclass
class Tally:
    examples: Counter[str] = field(default_factory=Counter)  # per path
    skipped: int = 0
    found: list[dict[str, Any]] = field(default_factory=list)
    seen: set[tuple[str, str]] = field(default_factory=set)  # (path, shrunk profile)

    @property
    def total(self) -> int:
        return sum(self.examples.values())


SAMPLED = {"via": 50, "federated": 4, "spark": 500}
"""One example in this many runs the slow paths (per profile and trace)."""


def search(rng: random.Random, tally: Tally, deadline: float, target: int,
           sampled: dict[str, int], record: Path | None, max_events: int = MAX_EVENTS) -> None:
    round_ = 0
    started = report = time.monotonic()
    while tally.total < target and time.monotonic() < deadline:
        round_ += 1
        if time.monotonic() >= report + 60:  # a line a minute: how far it is
            report = time.monotonic()
            print(f"… {tally.total:,} examples in {report - started:,.0f} s, "
                  f"{len(tally.found)} disagreements", flush=True)
        doc, trace = random_doc(rng), random_trace(rng, max_events)
        try:
            want = evaluate(doc, trace, tick=1)
        except RecursionError:
            tally.skipped += 1
            continue
        if len(want) > MAX_COMPOSITES:
            tally.skipped += 1
            continue
        names = ["engine", *(f"{kind}:{g}" for g in GROUPS for kind in ("oracle", "runner"))]
        extra: dict[str, Any] = {}
        if round_ % sampled["via"] == 0:
            names.append(f"via:{rng.choice(GROUPS)}")
        if round_ % sampled["federated"] == 0:
            services = random_services(rng)
            extra = {"services": [{"name": s.name, "group": s.group,
                                   "sources": list(s.coverage.sources),
                                   "types": list(s.coverage.types)} for s in services],
                     "sizes": [rng.randint(1, 6) for _ in range(rng.randint(1, 3))]}
            names.append("federated")
        if sampled["spark"] and round_ % sampled["spark"] == 0 and trace:
            names.append("spark")
        for name in names:
            tally.examples[name.partition(":")[0]] += 1
            why = disagrees(name, doc, trace, extra)
            if not why:
                continue
            small_doc, small_trace = shrink(name, doc, trace, extra)
            found = case(name, small_doc, small_trace, extra,
                         disagrees(name, small_doc, small_trace, extra) or why)
            key = (name.partition(":")[0], found["profile"])
            if key in tally.seen:
                continue
            tally.seen.add(key)
            tally.found.append(found)
            print(f"DISAGREEMENT {json.dumps(found)}", flush=True)
            if record is not None:
                cases = json.loads(record.read_text()) if record.exists() else []
                cases.append(found)
                record.write_text(json.dumps(cases, indent=1) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--examples", type=int, default=100_000)
    parser.add_argument("--minutes", type=float, default=60.0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--record", type=Path, default=None,
                        help="append each shrunk disagreement to this JSON file")
    parser.add_argument("--max-events", type=int, default=MAX_EVENTS,
                        help="the longest trace drawn")
    parser.add_argument("--no-spark", action="store_true", help="leave the Spark path out")
    parser.add_argument("--no-via", action="store_true",
                        help="leave the real base services (gRPC) out")
    args = parser.parse_args()
    sampled = dict(SAMPLED)
    if args.no_spark:
        sampled["spark"] = 0
    if args.no_via:
        sampled["via"] = 10**12
    rng = random.Random(args.seed)
    tally = Tally()
    start = time.monotonic()
    try:
        search(rng, tally, start + args.minutes * 60, args.examples, sampled, args.record,
               args.max_events)
    except KeyboardInterrupt:
        pass
    except Exception:
        traceback.print_exc()
    finally:
        SERVICES.stop()
    took = time.monotonic() - start
    print(f"{tally.total:,} examples in {took:,.0f} s ({tally.total / max(took, 1e-9):,.0f}/s); "
          f"per path: {dict(sorted(tally.examples.items()))}; {tally.skipped:,} profiles skipped "
          f"(reference answer > {MAX_COMPOSITES} composites); "
          f"{len(tally.found)} disagreements (shrunk, distinct)")
    sys.exit(1 if tally.found else 0)


if __name__ == "__main__":
    main()
