"""Planning speed (issue 3): time to plan N random profiles for the six language groups.

The paper found subscription time grows with profiles × services; the bar is 10,000 profiles
for 6 services in under 10 s on this machine.

    python benchmarks/planning.py [--profiles 10000]
"""

from __future__ import annotations

import argparse
import random
import time

from eva import ast
from eva.parser import parse
from transforms.capability import PRESETS
from transforms.planner import plan

CLASSES = ['class A = type == "a"', 'class B = type == "b"', 'class C = type == "c"',
           'class T = every 10s']
DUPS = [ast.FIRST, ast.LAST, ast.ALL, ast.nth(2)]


def random_expr(rng: random.Random, depth: int) -> ast.Expr:
    if depth == 0 or rng.random() < 0.25:
        return ast.Prim(rng.choice("ABC"))
    kind = rng.choice(["disj", "conj", "seq", "seq", "neg", "sel"])
    pairs = rng.choice(list(ast.Pairs))
    span = rng.choice([1_000_000, 5_000_000, 60_000_000, None])
    if kind == "neg":
        return ast.Negation(random_expr(rng, depth - 1), 5_000_000, pairs)
    if kind == "sel":
        return ast.Selection(random_expr(rng, depth - 1), rng.randint(1, 3), pairs)
    left = ast.Operand(rng.choice(DUPS), random_expr(rng, depth - 1))
    right = ast.Operand(rng.choice(DUPS), random_expr(rng, depth - 1))
    if kind == "disj":
        return ast.Disjunction(left, right, pairs)
    if kind == "conj":
        return ast.Conjunction(left, right, span, pairs)
    return ast.Sequence(left, right, span, pairs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profiles", type=int, default=10_000)
    args = parser.parse_args()
    rng = random.Random(3)
    doc = parse("\n".join(CLASSES) + "\n")
    profiles = [ast.Profile(f"P{i}", random_expr(rng, 3)) for i in range(args.profiles)]
    doc = ast.Document(doc.classes, tuple(profiles))
    t0 = time.perf_counter()
    plans = [plan(p, doc, cap) for p in profiles for cap in PRESETS.values()]
    elapsed = time.perf_counter() - t0
    kinds: dict[str, int] = {}
    for p in plans:
        kinds[str(p.kind)] = kinds.get(str(p.kind), 0) + 1
    print(f"planned {args.profiles:,} profiles × {len(PRESETS)} groups = {len(plans):,} plans "
          f"in {elapsed:.2f} s ({len(plans) / elapsed:,.0f} plans/s)")
    print("plan kinds:", ", ".join(f"{k} {v:,}" for k, v in sorted(kinds.items())))


if __name__ == "__main__":
    main()
