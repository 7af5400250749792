"""``evamed status``: a running mediator at a glance — what an operator checks first."""

from __future__ import annotations

import json
import time
from dataclasses import asdict
from typing import TYPE_CHECKING, Annotated

import typer

from mediator.cli.remote import DEFAULT_SERVER, Output, Server, TlsCa, Token, connected, when

if TYPE_CHECKING:
    from rich.console import Console

    from mediator.client import MediatorStatus


def status(
    format: Annotated[Output, typer.Option(help="Text, or JSON.")] = Output.text,
    server: Server = DEFAULT_SERVER, token: Token = None, tls_ca: TlsCa = None,
) -> None:
    """Show a running mediator's state: health, composer, each input with its watermark, the
    services and sources with their state, your subscriptions with their logs and lag, and
    the events taken in and refused since it started.

    Exit status 0 while it serves, 1 when it does not (its pipeline stopped) or cannot be
    reached.

    Example: evamed status --server mediator.example:50060
    """
    from mediator.cli.common import out_console

    with connected(server, token, tls_ca) as client:
        found = client.status()
    if format is Output.json:
        print(json.dumps(asdict(found), indent=2, ensure_ascii=False))
    else:
        show(found, server, out_console())
    if found.health != "SERVING":
        raise typer.Exit(1)


def show(s: MediatorStatus, server: str, console: Console) -> None:
    """The status as text: a headline, then a table per part."""
    from rich.markup import escape
    from rich.table import Table

    from mediator.cli.common import print_table

    colour = "green" if s.health == "SERVING" else "red"
    up = _duration(time.time() - s.started_us / 1e6) if s.started_us else "?"
    console.print(f"mediator {escape(server)}: [{colour}]{s.health}[/] — {escape(s.version)}, "
                  f"composer {s.composer}, up {up}", soft_wrap=True)
    if s.error:
        console.print(f"[red]{escape(s.error)}[/]", soft_wrap=True)
    console.print(f"event log: {_count(s.event_log_head, 'event')}; since the start: "
                  f"{_count(sum(s.events_in.values()), 'event')} accepted, "
                  f"{_count(sum(s.dead_letters.values()), 'dead letter')}, "
                  f"{_count(s.composites_out, 'composite')} composed", soft_wrap=True)

    console.print("[bold]inputs[/] (the watermark: every instant up to it reported)")
    inputs = Table("input", "watermark", "state", "read / head", box=None)
    for i in s.inputs:
        state = "[yellow]idle[/] (holds nothing back)" if i.idle else "live"
        inputs.add_row(escape(i.name), _time(i.watermark_us), state, f"{i.position} / {i.head}")
    print_table(inputs, console)

    services = Table("service", "mode", "group", "address", "status", "queries", box=None)
    for v in s.services:
        tint = "green" if v.status == "SERVING" else "yellow"
        services.add_row(escape(v.name), v.mode, v.group, escape(v.address),
                         f"[{tint}]{v.status}[/]", str(v.subscriptions) if v.mode != "source"
                         else "")
    if s.services:
        console.print("[bold]services and sources[/]")
        print_table(services, console)
    else:
        console.print("services: none (every profile is evaluated at the mediator, over the "
                      "events published to it)", soft_wrap=True)

    mine = Table("subscription", "profiles", "log", "lag", "composed by", box=None)
    for sub in s.subscriptions:
        log = f"{sub.log_first}–{sub.log_head}" if sub.log_head else "empty"
        lag = "?" if sub.lag < 0 else str(sub.lag)
        composers = ", ".join(sorted(set(sub.composers.values()))) or "-"
        mine.add_row(escape(sub.name), escape(", ".join(sub.profiles)), log, lag, composers)
    if s.subscriptions:
        console.print(f"[bold]your subscriptions[/] ({len(s.subscriptions)} of "
                      f"{s.subscriptions_total} at this mediator; lag: entries not yet sent to "
                      "you, ? before anything since the start)")
        print_table(mine, console)
    else:
        console.print(f"your subscriptions: none ({s.subscriptions_total} at this mediator)")
    letters = ", ".join(f"{escape(reason)} {n:,}" for reason, n in s.dead_letters.items())
    console.print(f"dead letters since the start: {letters or 'none'}", soft_wrap=True)


def _count(n: int, noun: str) -> str:
    return f"{n:,} {noun}{'' if n == 1 else 's'}"


def _time(us: int) -> str:
    return when(us) if us else "nothing yet"


def _duration(seconds: float) -> str:
    seconds = max(int(seconds), 0)
    if seconds < 120:
        return f"{seconds} s"
    if seconds < 7200:
        return f"{seconds // 60} min"
    return f"{seconds // 3600} h {seconds % 3600 // 60} min"
