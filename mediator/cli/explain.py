"""``evamed explain``: how each profile is planned for each language group."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from mediator.cli.common import fail, known_profiles, load

if TYPE_CHECKING:
    pass


def explain(
    profiles: Annotated[Path, typer.Option(help="Profile file.")],
    profile: Annotated[list[str] | None, typer.Option(help="Only this profile (repeatable).")] = None,
    group: Annotated[list[str] | None, typer.Option(
        help="Language group cg0 … cg5 (repeatable); default: all groups.")] = None,
    all_groups: Annotated[bool, typer.Option(help="Every group (the default).")] = False,
    format: Annotated[str, typer.Option(help="text or json.")] = "text",
) -> None:
    """Show how each profile is planned for each language group: rules, kinds, post-filters,
    and what runs at the mediator."""
    from rich.console import Console

    from transforms.capability import PRESETS
    from transforms.explanation import as_json, explain, renderer
    from transforms.planner import plan

    doc = load(profiles)
    known_profiles(doc, profile, profiles)
    for g in group or []:
        if g not in PRESETS:
            fail(f"no group {g!r}; expected one of: {', '.join(PRESETS)}")
    if format not in ("text", "json"):
        fail(f"--format {format!r}: expected text or json")
    if group and all_groups:
        fail("--group and --all-groups exclude each other")
    groups = group or list(PRESETS)
    plans = [(g, plan(p, doc, PRESETS[g])) for p in doc.profiles
             if not profile or p.name in profile for g in groups]
    if format == "json":
        print(json.dumps([as_json(p, renderer(g, doc)) for g, p in plans], indent=2,
                         ensure_ascii=False))
        return
    console = Console()
    for g, p in plans:
        console.print(explain(p, renderer(g, doc)))

