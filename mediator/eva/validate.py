"""Static checks after parsing: names resolve, no cycles, time classes used as events only."""

from __future__ import annotations

from mediator.eva import ast


def refs(pred: ast.Predicate) -> list[str]:
    if isinstance(pred, ast.ClassRef):
        return [pred.name]
    if isinstance(pred, (ast.And, ast.Or)):
        return refs(pred.left) + refs(pred.right)
    if isinstance(pred, ast.Not):
        return refs(pred.operand)
    return []


def validate(doc: ast.Document) -> tuple[str, int, int] | None:
    """The first problem as (message, line, column), or None."""
    seen: dict[str, tuple[int, int]] = {}
    items: list[ast.ClassDef | ast.Profile] = [*doc.classes, *doc.profiles]
    for item in items:
        if item.name in seen:
            line, col = seen[item.name]
            return (f"{item.name!r} is defined twice (first at line {line}:{col}), "
                    "expected a unique name", item.line, item.column)
        seen[item.name] = (item.line, item.column)
    classes = doc.class_map()
    for cls in doc.classes:
        if isinstance(cls.body, ast.Every):
            problem = anchor_problem(cls.body.anchor)
            if problem:
                return (problem, cls.line, cls.column)
            continue
        for ref in refs(cls.body):
            if ref not in classes:
                return (f"found unknown class {ref!r}, expected a defined event class",
                        cls.line, cls.column)
            if isinstance(classes[ref].body, ast.Every):
                return (f"time class {ref!r} cannot be combined logically, expected an "
                        "attribute class", cls.line, cls.column)
    for cls in doc.classes:
        if _cyclic(cls.name, classes, ()):
            return (f"class {cls.name!r} refers to itself, expected an acyclic definition",
                    cls.line, cls.column)
    for profile in doc.profiles:
        for node in ast.walk(profile.expr):
            if isinstance(node, ast.Prim) and node.name not in classes:
                return (f"found unknown class {node.name!r}, expected a defined event class",
                        node.line or profile.line, node.column or profile.column)
    return None


def _cyclic(name: str, classes: dict[str, ast.ClassDef], path: tuple[str, ...]) -> bool:
    if name in path:
        return True
    body = classes[name].body
    if isinstance(body, ast.Every):
        return False
    return any(_cyclic(r, classes, (*path, name)) for r in refs(body) if r in classes)


def anchor_problem(anchor: str | None) -> str | None:
    """``from "HH:MM[:SS]"`` (a time of day, UTC) or ``from "<RFC 3339 instant>"``."""
    if anchor is None:
        return None
    parts = anchor.split(":")
    if "T" not in anchor and "-" not in anchor and 2 <= len(parts) <= 3:
        if all(p.isdigit() for p in parts):
            h, m, s = ([int(p) for p in parts] + [0])[:3]
            if h < 24 and m < 60 and s < 60:
                return None
        return f"found time of day {anchor!r}, expected HH:MM or HH:MM:SS (UTC)"
    from mediator.eva.events import EventError, parse_time

    try:
        parse_time(anchor)
    except EventError:
        return f"found {anchor!r} after 'from', expected a time of day or an RFC 3339 instant"
    return None
