"""CG-5: a peer mediator — EVA itself. The native query is an EVA profile document: the pushed
expression as profile ``R`` (with the profile's ``per`` and, at the plan's root, its evaluation
time) and the classes it uses. Every node is stated as it is.

A peer's notification is its composite: the constituents plus, in ``extra``, the occurrence as
the peer's engine knows it (identity, order key, report key, partition, constituent ids
including time events and absences), which the mediator takes over exactly.
"""

from __future__ import annotations

from typing import Any

from eva import ast
from eva.notify import tuples_from_json
from eva.printer import to_text
from eva.semantics import Occ, partition_key
from eva.validate import refs
from transforms.capability import CG5
from transforms.dialects.base import Detection, Dialect, ExprRule, Reading, Rendering, Scope
from transforms.plans import Remote


def _as_is(r: Rendering, expr: ast.Expr) -> ast.Expr:
    return expr


EXPRESSIONS: dict[type[ast.Expr], ExprRule] = dict.fromkeys(
    (ast.Prim, ast.External, ast.Disjunction, ast.Conjunction, ast.Sequence, ast.Negation,
     ast.Selection), _as_is)


def _document(r: Rendering, expr: ast.Expr, value: ast.Expr) -> str:
    """The profile with the classes it uses (and the classes those refer to)."""
    per = r.profile.per if r.profile is not None else None
    evaluation = ast.Evaluation.END_OF_INTERVAL if r.root_eoi else ast.Evaluation.CONTINUOUS
    profile = ast.Profile("R", value, per, evaluation)
    needed: set[str] = set()

    def need(name: str) -> None:
        if name in needed:
            return
        needed.add(name)
        body = r.classes[name].body
        if not isinstance(body, ast.Every):
            for ref in refs(body):
                need(ref)

    for node in ast.walk(profile.expr):
        if isinstance(node, ast.Prim):
            need(node.name)
    used = tuple(c for c in r.doc.classes if c.name in needed)
    return to_text(ast.Document(used, (profile,)))


def occurrence(extra: dict[str, Any]) -> tuple[tuple[int, int, Any], Occ]:
    """(report key, occurrence) of a peer notification's ``extra``."""
    key = tuples_from_json(extra["key"])
    occ = Occ(key[0], key, tuples_from_json(extra["ident"]), tuple(extra["events"]),
              tuples_from_json(extra.get("anchor")))
    return tuples_from_json(extra["emitted"]), occ


def _taken(detection: Detection, node: Remote, scope: Scope) -> Reading:
    """The peer's occurrence, taken over with its report key, when it is of the partition
    ``scope`` evaluates (none otherwise)."""
    want = partition_key(scope.partition) if scope.partition is not None else None
    value = detection.extra.get("partition")
    if (partition_key(value) if value is not None else None) != want:
        return Reading()
    return Reading(occurrences=(occurrence(detection.extra),))


def _always(node: Remote) -> bool:
    return True


PEER = Dialect("cg5", "eva", CG5, EXPRESSIONS, {}, _document, reader=_taken, exact=_always)
