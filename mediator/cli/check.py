"""``evamed check``: parse and validate a profile file, and summarise each profile."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from mediator.cli.common import load

if TYPE_CHECKING:
    from eva import ast

COLUMNS = ("profile", "classes", "operators", "per", "evaluation", "retention")


def check(file: Annotated[Path, typer.Argument(help="A profile file.")]) -> None:
    """Parse and validate a profile file; summarise each profile."""
    from rich.console import Console
    from rich.table import Table

    doc = load(file)
    table = Table(title=f"{file}: {len(doc.classes)} classes, {len(doc.profiles)} profiles")
    for column in COLUMNS:
        table.add_column(column)
    for profile in doc.profiles:
        table.add_row(*_row(doc, profile))
    Console().print(table)


def _row(doc: ast.Document, profile: ast.Profile) -> tuple[str, ...]:
    """A profile's line of the summary, in the order of COLUMNS."""
    from eva import ast
    from eva.retention import retention
    from eva.units import format_span

    nodes = list(ast.walk(profile.expr))
    used = {n.name for n in nodes if isinstance(n, ast.Prim)}
    operators = {ast.Disjunction: "disjunction", ast.Conjunction: "conjunction",
                 ast.Sequence: "sequence", ast.Negation: "negation", ast.Selection: "selection"}
    r = retention(profile.expr)
    kept = format_span(r.horizon) if r.horizon is not None else f"unbounded ({r.reason})"
    return (profile.name, ", ".join(c.name for c in doc.classes if c.name in used),
            ", ".join(operators[type(n)] for n in nodes if type(n) in operators) or "primitive",
            profile.per or "-", str(profile.evaluation), kept)
