"""Table 2 of EVA as a product order on (anterior EIS, posterior EIS, EIC) settings.

EIS: first, last and <i> each select a subset of all, and are mutually incomparable. EIC:
unique pairs select a subset of all pairs. Moving a setting up in every dimension is positive
(more answers, a post-filter restores the original), down is negative (never used), anything
else mixed (treated as negative).

research/transforms.md §7.2 derived the table for *batch* repetition. DESIGN pins incremental
repetition, under which (S, unique) ⊄ (S, repeated) and even (first, last, repeated) ⊄
(all, last, repeated): a ``repeated_pairs`` setting only ever moves to all duplicates with all
pairs. Every claim here is checked on our semantics by tests/test_transforms.py.
"""

from __future__ import annotations

from eva import ast

Setting = tuple[ast.Dup, ast.Dup, ast.Pairs]


def _eis_up(source: ast.Dup, target: ast.Dup) -> bool:
    return source == target or target.kind == "all"


def positive(source: Setting, target: Setting) -> bool:
    """Whether evaluating at ``target`` returns a superset of the ``source`` answer."""
    if source == target:
        return False
    (sl, sr, sp), (tl, tr, tp) = source, target
    if not (_eis_up(sl, tl) and _eis_up(sr, tr)):
        return False
    if sp is ast.Pairs.REPEATED or tp is ast.Pairs.REPEATED:
        # Repetition consumes as it goes: selecting more consumes more and can lose a later
        # match (first/last/repeated ⊄ all/last/repeated). Only set semantics is larger.
        return tp is ast.Pairs.ALL and tl.kind == "all" and tr.kind == "all"
    return sp == tp or (sp is ast.Pairs.UNIQUE and tp is ast.Pairs.ALL)


def relation(source: Setting, target: Setting) -> str:
    """``equivalent``, ``positive``, ``negative`` or ``mixed`` (Table 2's ↔, +, − and ×)."""
    if source == target:
        return "equivalent"
    if positive(source, target):
        return "positive"
    if positive(target, source):
        return "negative"
    return "mixed"


def settings_of(dups: list[ast.Dup]) -> list[Setting]:
    return [(left, right, pairs) for left in dups for right in dups for pairs in ast.Pairs]
