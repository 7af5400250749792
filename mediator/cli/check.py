"""``evamed check``: parse and validate a profile file; a summary of what it holds, or a line
per profile (``--verbose``, or a file of at most ``TABLE_AT_MOST`` profiles)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from mediator.cli.common import counted, err, load, out_console, print_table

if TYPE_CHECKING:
    from eva import ast

COLUMNS = ("profile", "classes", "operators", "per", "evaluation", "retention")
TABLE_AT_MOST = 20
"""Profiles a file may have for the table to be shown without ``--verbose``: a table of
thousands of rows is read by nobody and took most of check's time (rich lays out every row)."""
NAMED = 5
"""Unbounded profiles named in the summary (then "and N more")."""


def check(file: Annotated[Path, typer.Argument(help="A profile file.")],
          verbose: Annotated[bool, typer.Option(
              "--verbose", "-v", help="A line per profile (the default up to "
              f"{TABLE_AT_MOST} profiles).")] = False) -> None:
    """Parse and validate a profile file; summarise what it holds (each profile with
    --verbose). An error names the line and column, what was found and what was expected.
    A profile whose composites can grow exponentially is warned about on stderr.

    Example: evamed check examples/logistics/profiles.eva
    """
    from rich.markup import escape
    from rich.table import Table

    doc = load(file)
    order = {c.name: i for i, c in enumerate(doc.classes)}  # a profile's classes in file order
    rows = [_row(order, profile) for profile in doc.profiles]
    title = (f"{file}: {counted(len(doc.classes), 'class', 'classes')}, "
             f"{counted(len(doc.profiles), 'profile')}")
    console = out_console()
    console.print(escape(title), highlight=False, soft_wrap=True)
    if verbose or len(rows) <= TABLE_AT_MOST:
        table = Table()
        for column in COLUMNS:
            table.add_column(column)
        for row in rows:
            table.add_row(*(escape(cell) for cell in row))
        print_table(table, console)
    else:
        for line in _summary(rows):
            console.print("  " + escape(line), highlight=False, soft_wrap=True)
    for line in warnings(doc):
        err.print(escape(line), highlight=False, soft_wrap=True)


def warnings(doc: ast.Document) -> list[str]:
    """A line for each profile whose composites can grow exponentially (eva.retention.growth):
    nested operators that each pair a new occurrence with everything they stored."""
    from eva.engine import COMPOSITE_LIMIT
    from eva.retention import growth

    out = []
    for profile in doc.profiles:
        nested = growth(profile.expr)
        if nested >= 2:
            out.append(f"warning: profile {profile.name}: its composites can grow exponentially: "
                       f"{nested} nested operators pair each new occurrence with every one "
                       "they stored (no span, all_pairs or all_dup), so after k events one "
                       f"event can make about k^{nested} composites; evaluation makes at most "
                       f"{COMPOSITE_LIMIT:,} per operator and event (the composite limit) and "
                       "the mediator suspends the subscription beyond it — set a span, or "
                       "select first_dup/last_dup with unique_pairs")
    return out


def _summary(rows: list[tuple[str, ...]]) -> list[str]:
    """The table's columns counted: operators, partitioning, evaluation, retention."""
    operators: Counter[str] = Counter()
    for row in rows:
        operators.update(set(row[2].split(", ")))
    evaluations = Counter(row[4] for row in rows)
    unbounded = [row for row in rows if row[5].startswith("unbounded")]
    per = sum(1 for row in rows if row[3] != "-")
    out = ["operators: " + _counts(operators) + " (profiles using each)",
           f"partitioned (per): {per:,}",
           "evaluation: " + _counts(evaluations)]
    if unbounded:
        named = "; ".join(f"{row[0]} {row[5].removeprefix('unbounded ')}"
                          for row in unbounded[:NAMED])
        more = f"; and {len(unbounded) - NAMED:,} more" if len(unbounded) > NAMED else ""
        out.append(f"retention: {len(rows) - len(unbounded):,} bounded, {len(unbounded):,} "
                   f"unbounded: {named}{more}")
    else:
        out.append(f"retention: all {len(rows):,} bounded")
    out.append("(--verbose: a line per profile)")
    return out


def _counts(counter: Counter[str]) -> str:
    return ", ".join(f"{name} {count:,}" for name, count in counter.most_common())


def _row(order: dict[str, int], profile: ast.Profile) -> tuple[str, ...]:
    """A profile's line of the table, in the order of COLUMNS (``order``: each class's
    position in the file)."""
    from eva import ast
    from eva.retention import retention
    from eva.units import format_span

    nodes = list(ast.walk(profile.expr))
    used = {n.name for n in nodes if isinstance(n, ast.Prim)}
    operators = {ast.Disjunction: "disjunction", ast.Conjunction: "conjunction",
                 ast.Sequence: "sequence", ast.Negation: "negation", ast.Selection: "selection"}
    r = retention(profile.expr)
    kept = format_span(r.horizon) if r.horizon is not None else f"unbounded ({r.reason})"
    return (profile.name, ", ".join(sorted((name for name in used if name in order),
                                           key=order.__getitem__)),
            ", ".join(operators[type(n)] for n in nodes if type(n) in operators) or "primitive",
            profile.per or "-", str(profile.evaluation), kept)
