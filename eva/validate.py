"""Static checks after parsing: names resolve, no cycles, time classes used as events only, and
the size limits of docs/language.md (Limits).

The limits exist because the engine, the reference evaluator, the planner, the dialects and the
printer walk predicates and expressions recursively (and a frozen dataclass hashes and compares
recursively): below them every stage stays far inside Python's default recursion limit of 1000
frames. The checks here run before anything recursive, so they walk the tree with explicit
stacks and accept documents of any depth built by other front ends too.
"""

from __future__ import annotations

import re

from eva import ast

MAX_PREDICATE_DEPTH = 100
"""Levels of and/or/not and class references on a path through a class's predicate, with the
classes it refers to written out (the stages use at most three frames per level)."""
MAX_PREDICATE_TERMS = 1_000
"""Comparisons in a class's predicate with the classes it refers to written out (each
reference is a copy: without a bound, a few lines of classes that refer twice to the previous
one would stand for billions of comparisons)."""
MAX_EXPRESSION_DEPTH = 50
"""Operators nested in a profile's expression (the stages use at most four frames per level)."""
MAX_EXPRESSION_OPERATORS = 1_000
"""Operators in a profile's expression: every partition of the profile holds one node per
operator."""
MAX_IN_VALUES = 10_000
"""Values in one ``in [...]`` list: a larger set is data, better kept in a class per group or in
the events themselves (a 2.4 MB list took 6.9 s and 288 MB to read)."""
MAX_DOCUMENT_BYTES = 16 * 1024 * 1024
"""A profile document's size, checked before parsing: reading takes about 120 bytes of memory
per byte of text, so this bounds one file at about 2 GB; 16 MiB holds over 10^5 profiles."""


_TWO_DIGITS = re.compile(r"[0-9]{1,2}")  # ASCII only: str.isdigit() also takes '²'


def _pred_children(pred: ast.Predicate) -> tuple[ast.Predicate, ...]:
    if isinstance(pred, (ast.And, ast.Or)):
        return (pred.left, pred.right)
    if isinstance(pred, ast.Not):
        return (pred.operand,)
    return ()


def refs(pred: ast.Predicate) -> list[str]:
    """The class names a predicate refers to, in source order (with repetitions)."""
    out: list[str] = []
    stack = [pred]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.ClassRef):
            out.append(node.name)
        stack.extend(reversed(_pred_children(node)))
    return out


def _long_list(pred: ast.Predicate) -> int:
    """The length of the longest ``in [...]`` list in a predicate (0 if none)."""
    longest = 0
    stack = [pred]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.Compare) and node.op == "in" and isinstance(node.value, tuple):
            longest = max(longest, len(node.value))
        stack.extend(_pred_children(node))
    return longest


def _measure(pred: ast.Predicate, inlined: dict[str, tuple[int, int]]) -> tuple[int, int]:
    """(depth, comparisons) of a predicate; a class reference is one level above the measure
    of its class in ``inlined`` (a class missing there counts as a leaf)."""
    depth, terms = 0, 0
    stack: list[tuple[ast.Predicate, int]] = [(pred, 0)]
    while stack:
        node, level = stack.pop()
        if isinstance(node, ast.ClassRef):
            below, count = inlined.get(node.name, (0, 0))
            depth, terms = max(depth, level + 1 + below), terms + count
            continue
        if isinstance(node, ast.Compare):
            terms += 1
        depth = max(depth, level)
        stack.extend((child, level + 1) for child in _pred_children(node))
    return depth, terms


def _limits(name: str, depth: int, terms: int) -> str | None:
    if depth > MAX_PREDICATE_DEPTH:
        return (f"found the predicate of class {name!r} nested {depth} levels deep (each and, or, "
                "not and class reference is a level, with the classes it refers to written out), "
                f"expected at most {MAX_PREDICATE_DEPTH}: split a long and/or chain into classes "
                "(A = B or C), or test one attribute against many values with 'in [...]'")
    if terms > MAX_PREDICATE_TERMS:
        count = f"{terms:,}" if terms < 10**9 else "over a billion"
        return (f"found {count} comparisons in class {name!r} with the classes it refers to "
                f"written out, expected at most {MAX_PREDICATE_TERMS}")
    return None


def _cycle(classes: dict[str, ast.ClassDef],
           deps: dict[str, list[str]]) -> tuple[list[str], list[str]]:
    """(classes in dependency order, the first cycle found or [])."""
    order: list[str] = []
    done: set[str] = set()
    for root in classes:
        if root in done:
            continue
        path = [root]
        on_path = {root}
        stack = [iter(deps[root])]
        while stack:
            ref = next(stack[-1], None)
            if ref is None:
                stack.pop()
                finished = path.pop()
                on_path.discard(finished)
                done.add(finished)
                order.append(finished)
            elif ref in on_path:
                return order, [*path[path.index(ref):], ref]
            elif ref not in done:
                path.append(ref)
                on_path.add(ref)
                stack.append(iter(deps[ref]))
    return order, []


Problem = tuple[str, int, int]
"""(message, line, column)."""


def validate(doc: ast.Document) -> Problem | None:
    """The first problem as (message, line, column), or None."""
    classes = doc.class_map()
    deps: dict[str, list[str]] = {}
    return (_unique_names(doc) or _class_problems(doc, classes, deps)
            or _cycle_and_size(doc, classes, deps) or _profile_problems(doc, classes))


def _unique_names(doc: ast.Document) -> Problem | None:
    seen: dict[str, tuple[int, int]] = {}
    items: list[ast.ClassDef | ast.Profile] = [*doc.classes, *doc.profiles]
    for item in items:
        if item.name in seen:
            line, col = seen[item.name]
            return (f"found {item.name!r} defined twice (first at line {line}:{col}), "
                    "expected a unique name", item.line, item.column)
        seen[item.name] = (item.line, item.column)
    return None


def _class_problems(doc: ast.Document, classes: dict[str, ast.ClassDef],
                    deps: dict[str, list[str]]) -> Problem | None:
    """Each class on its own: anchors, limits, the classes it refers to (into ``deps``)."""
    for cls in doc.classes:
        if isinstance(cls.body, ast.Every):
            problem = anchor_problem(cls.body.anchor)
            if problem:
                return (problem, cls.line, cls.column)
            deps[cls.name] = []
            continue
        problem = _limits(cls.name, *_measure(cls.body, {}))
        if problem:
            return (problem, cls.line, cls.column)
        values = _long_list(cls.body)
        if values > MAX_IN_VALUES:
            return (f"found an 'in' list of {values:,} values in class {cls.name!r}, expected at "
                    f"most {MAX_IN_VALUES:,}", cls.line, cls.column)
        names = refs(cls.body)
        for ref in names:
            if ref not in classes:
                return (f"found unknown class {ref!r}, expected a defined event class",
                        cls.line, cls.column)
            if isinstance(classes[ref].body, ast.Every):
                return (f"found time class {ref!r} in a predicate, expected an attribute "
                        "class: a time class is an event, it cannot be combined logically",
                        cls.line, cls.column)
        deps[cls.name] = list(dict.fromkeys(names))
    return None


def _cycle_and_size(doc: ast.Document, classes: dict[str, ast.ClassDef],
                    deps: dict[str, list[str]]) -> Problem | None:
    """No class refers to itself; each stays within the limits with its references written out."""
    order, cycle = _cycle(classes, deps)
    if cycle:
        first = min(cycle[:-1], key=[c.name for c in doc.classes].index)
        at = classes[first]
        return (f"found class {first!r}, which refers to itself ({' → '.join(cycle)}), "
                "expected an acyclic definition", at.line, at.column)
    inlined: dict[str, tuple[int, int]] = {}
    for name in order:  # a class after the classes it refers to
        body = classes[name].body
        inlined[name] = (0, 0) if isinstance(body, ast.Every) else _measure(body, inlined)
    for cls in doc.classes:
        problem = _limits(cls.name, *inlined[cls.name])
        if problem:
            return (problem, cls.line, cls.column)
    return None


def _profile_problems(doc: ast.Document, classes: dict[str, ast.ClassDef]) -> Problem | None:
    for profile in doc.profiles:
        nodes = ast.walk(profile.expr)
        depth, operators = ast.depth(profile.expr), sum(1 for n in nodes if ast.children(n))
        if depth > MAX_EXPRESSION_DEPTH:
            return (f"found operators nested {depth} deep in profile {profile.name!r}, expected "
                    f"at most {MAX_EXPRESSION_DEPTH}", profile.line, profile.column)
        if operators > MAX_EXPRESSION_OPERATORS:
            return (f"found {operators} operators in profile {profile.name!r}, expected at most "
                    f"{MAX_EXPRESSION_OPERATORS}", profile.line, profile.column)
        for node in nodes:
            if isinstance(node, ast.Prim) and node.name not in classes:
                return (f"found unknown class {node.name!r}, expected a defined event class",
                        node.line or profile.line, node.column or profile.column)
    return None


def anchor_problem(anchor: str | None) -> str | None:
    """``from "HH:MM[:SS]"`` (a time of day, UTC) or ``from "<RFC 3339 instant>"``."""
    if anchor is None:
        return None
    parts = anchor.split(":")
    if "T" not in anchor and "-" not in anchor and 2 <= len(parts) <= 3:
        if all(_TWO_DIGITS.fullmatch(p) for p in parts):
            h, m, s = ([int(p) for p in parts] + [0])[:3]
            if h < 24 and m < 60 and s < 60:
                return None
        return f"found time of day {anchor!r}, expected HH:MM or HH:MM:SS (UTC)"
    from eva.events import EventError, parse_time

    try:
        parse_time(anchor)
    except EventError:
        return f"found {anchor!r} after 'from', expected a time of day or an RFC 3339 instant"
    return None
