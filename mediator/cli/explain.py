"""``evamed explain``: how each profile is planned for each language group."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from mediator.cli.common import fail, known_profiles, load
from mediator.cli.remote import Output, TlsCa, Token, connected, read_text

if TYPE_CHECKING:
    from eva import ast
    from transforms.plans import Remote


def explain(
    profiles: Annotated[Path | None, typer.Option(
        help="Profile file (with --server: instead of --name).", show_default=False)] = None,
    profile: Annotated[list[str] | None, typer.Option(help="Only this profile (repeatable).")] = None,
    group: Annotated[list[str] | None, typer.Option(
        help="Language group cg0 … cg5 (any case; CG-3 too; repeatable); default: all groups.",
        show_default=False)] = None,
    all_groups: Annotated[bool, typer.Option(help="Every group (the default).")] = False,
    format: Annotated[Output, typer.Option(help="Text, or JSON.")] = Output.text,
    server: Annotated[str | None, typer.Option(
        help="Ask the mediator at host:port instead: the plan over the services it is "
             "connected to (EVAMED_SERVER is not read here, so explain stays offline unless "
             "asked).", show_default=False)] = None,
    name: Annotated[str | None, typer.Option(
        help="With --server: a subscription registered before.", show_default=False)] = None,
    config: Annotated[Path | None, typer.Option(
        help="Plan over the services of this mediator configuration (TOML), offline: which "
             "service evaluates which subtree, and why — what `evamed serve --config` would "
             "subscribe.", show_default=False)] = None,
    plot: Annotated[Path | None, typer.Option(
        help="Also draw each plan as a tree (PNG): to this file when there is one plan, else "
             "to FILE-PROFILE-GROUP.png beside it.", show_default=False)] = None,
    token: Token = None, tls_ca: TlsCa = None,
) -> None:
    """Show how each profile is planned for each language group: rules, kinds, post-filters,
    and what runs at the mediator.

    With --server: how the running mediator plans it over the services it is connected to —
    which service evaluates which subtree, and why.

    Example: evamed explain --profiles examples/logistics/profiles.eva --profile P1 --group cg2

    Example: evamed explain --server 127.0.0.1:50060 --name P1

    Example: evamed explain --profiles examples/logistics/profiles.eva --config mediator.toml

    Example: evamed explain --profiles examples/logistics/profiles.eva --profile P6 --group cg1 --plot p6.png
    """
    if server is not None and config is not None:
        fail("--server asks a running mediator, --config plans offline: give one of them")
    if server is not None:
        if group or all_groups or profile or plot:
            fail("--group, --all-groups, --profile and --plot are for explaining offline; with "
                 "--server the mediator plans the whole document over its services")
        _explain_at(server, profiles, name, format, token, tls_ca)
        return
    if profiles is None:
        fail("give --profiles (or --server with --profiles or --name)")
    if name is not None:
        fail("--name names a subscription at a mediator: give --server too")
    from transforms.capability import PRESETS
    from transforms.explanation import LEGEND, as_json, explain, renderer
    from transforms.planner import plan

    doc = load(profiles)
    known_profiles(doc, profile, profiles)
    if config is not None:
        if group or all_groups:
            fail("--group and --all-groups plan for one group; --config plans over the "
                 "configured services")
        _explain_over(config, doc, profile, format, plot)
        return
    groups = [group_name(g) for g in group or []] or list(PRESETS)
    if group and all_groups:
        fail("--group and --all-groups exclude each other")
    plans = [(g, plan(p, doc, PRESETS[g], refuses=group_refuses(g, doc))) for p in doc.profiles
             if not profile or p.name in profile for g in groups]
    if plot is not None:
        _plot([(f"{p.profile.name}-{g}", p) for g, p in plans], plot)
    if format is Output.json:
        print(json.dumps([as_json(p, renderer(g, doc)) for g, p in plans], indent=2,
                         ensure_ascii=False))
        return
    console = wide_console()
    for g, p in plans:
        console.print(explain(p, renderer(g, doc)))
    console.print(LEGEND, style="dim")


def group_refuses(group: str, doc: ast.Document) -> Callable[[Remote, ast.Profile, bool], str]:
    """Why group ``group``'s language would refuse the query for a remote (its limits), as
    ``replay --via`` plans: such a subtree is composed at the mediator, and explain says so."""
    from adapters.backends.registry import language
    from adapters.federation import language_refuses
    from transforms.capability import PRESETS
    from transforms.federated import ServiceInfo

    check = language_refuses(doc, {group: language(group)})
    info = ServiceInfo(group, group, PRESETS[group])
    return lambda remote, profile, root_eoi: check(info, remote, profile, root_eoi)


def group_name(text: str) -> str:
    """A language group as given (``cg3``, ``CG3``, ``CG-3``) → its preset's key."""
    from transforms.capability import PRESETS

    key = text.strip().lower().replace("-", "").replace("_", "")
    if key not in PRESETS:
        fail(f"no group {text!r}; expected one of: {', '.join(PRESETS)} (any case, CG-3 too)")
    return key


def wide_console() -> Any:
    """A console that wraps at the terminal's width, and not at all when piped (a plan line
    cut at 80 columns is hard to grep and to read in a file)."""
    from mediator.cli.common import out_console

    return out_console()


def _explain_at(server: str, profiles: Path | None, name: str | None, format: Output,
                token: str | None, tls_ca: Path | None) -> None:
    """``explain --server``: the running mediator's plan over its services."""
    if (profiles is None) == (name is None):
        fail("with --server give --profiles FILE or --name SUBSCRIPTION (one of them)")
    text = read_text(profiles) if profiles is not None else None
    with connected(server, token, tls_ca, document=profiles) as client:
        explanation = client.explain(profile_text=text, name=name)
    if format is Output.json:
        print(json.dumps(explanation.json, indent=2, ensure_ascii=False))
    else:
        print(explanation.text, end="" if explanation.text.endswith("\n") else "\n")


def _plot(plans: list[tuple[str, Any]], path: Path) -> None:
    """Each plan as a tree: to ``path`` when there is one, else beside it, named by plan."""
    from mediator.cli.common import require_extra

    require_extra("plots", "--plot")
    from mediator.plots import PlotError, plan_tree

    for label, p in plans:
        target = path if len(plans) == 1 else path.with_name(f"{path.stem}-{label}{path.suffix}")
        try:
            plan_tree(p, target)
        except PlotError as exc:
            fail(str(exc), one_line=True)
        print(f"plan of {label.replace('-', ' on ', 1)} drawn in {target}", file=sys.stderr)


def _explain_over(path: Path, doc: Any, only: list[str] | None, format: Output,
                  plot: Path | None) -> None:
    """``explain --config``: the federated plans over the configured services (as a running
    mediator plans them: live, each subtree at a service that covers it)."""
    from mediator.config import ConfigError
    from mediator.config import load as load_config
    from mediator.server import link_infos
    from transforms.explanation import LEGEND, as_json, explain, service_renderer
    from transforms.federated import plan_federated

    try:
        services = link_infos(load_config(path))  # the brokers' sources too
    except (ConfigError, OSError) as exc:
        fail(str(exc), one_line=True)
    plans = [plan_federated(p, doc, services, live=True) for p in doc.profiles
             if not only or p.name in only]
    if plot is not None:
        _plot([(f"{p.profile.name}-services", p) for p in plans], plot)
    render = service_renderer(((s.name, s.group) for s in services), doc)
    if format is Output.json:
        print(json.dumps([as_json(p, render) for p in plans], indent=2, ensure_ascii=False))
        return
    if not services:
        print("no services configured: every profile is evaluated at the mediator")
    console = wide_console()
    for p in plans:
        console.print(explain(p, render))
    console.print(LEGEND, style="dim")
