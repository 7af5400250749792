"""``evamed profile add|list|show|rm``: a client's subscriptions at a running mediator."""

from __future__ import annotations

import json
import sys
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from mediator.cli.common import fail, print_table
from mediator.cli.remote import (
    DEFAULT_SERVER,
    Listing,
    Output,
    Server,
    TlsCa,
    Token,
    connected,
    read_text,
    when,
)

if TYPE_CHECKING:
    from mediator.client import ProfileInfo

app = typer.Typer(no_args_is_help=True, help=(
    "Register, list, show and cancel your profiles at a running mediator "
    "(address and token: --server/--token or EVAMED_SERVER/EVAMED_TOKEN)."))


def _log(info: ProfileInfo) -> str:
    return f"{info.log_first}–{info.log_head}" if info.log_head else "empty"


@app.command()
def add(
    files: Annotated[list[Path], typer.Argument(
        help="Profile documents (classes and profiles): one subscription each.",
        show_default=False)],
    name: Annotated[str | None, typer.Option(
        help="The subscription's name (default: the document's first profile; one document "
             "only).")] = None,
    server: Server = DEFAULT_SERVER, token: Token = None, tls_ca: TlsCa = None,
) -> None:
    """Register profile documents (without tailing them).

    The mediator plans each over its services and subscribes the native queries; its
    composites are logged until you read them with `evamed subscribe NAME`. Several documents
    go in one call: each is registered or refused on its own (exit 1 if any was refused).

    Example: evamed profile add examples/logistics/profiles.eva --name logistics
    """
    if name is not None and len(files) > 1:
        fail(f"--name names one subscription; {len(files)} documents were given (each is "
             "named after its first profile)")
    texts = [read_text(file) for file in files]
    if len(files) == 1:
        with connected(server, token, tls_ca, document=files[0]) as client:
            _added(client.add_profile(texts[0], name))
        return
    with connected(server, token, tls_ca) as client:
        results = client.add_profiles(texts)
    refused = 0
    for file, result in zip(files, results, strict=True):
        if isinstance(result, Exception):
            refused += 1
            print(f"refused {file}: {result}", file=sys.stderr)
        else:
            _added(result)
    if refused == len(files):
        fail(f"all {len(files)} documents refused", code=1)
    if refused:
        fail(f"{refused} of {len(files)} documents refused (the others were added)", code=1)


def _added(info: ProfileInfo) -> None:
    print(f"added {info.name}: {', '.join(info.profiles)}")
    for plan in info.plans:
        print(f"  {plan}")


@app.command("list")
def list_(
    format: Annotated[Listing, typer.Option(help="A table, or JSON.")] = Listing.table,
    server: Server = DEFAULT_SERVER, token: Token = None, tls_ca: TlsCa = None,
) -> None:
    """List your subscriptions: profiles, when added, where their logs stand.

    Example: evamed profile list --format json
    """
    from rich.table import Table

    with connected(server, token, tls_ca) as client:
        infos = client.profiles()
    if format is Listing.json:
        print(json.dumps([asdict(i) for i in infos], indent=2, ensure_ascii=False))
        return
    table = Table("name", "profiles", "created", "log", "plans")
    for info in infos:
        table.add_row(info.name, ", ".join(info.profiles), when(info.created_us), _log(info),
                      "\n".join(info.plans))
    print_table(table)


@app.command()
def show(
    name: Annotated[str, typer.Argument(help="The subscription's name.", show_default=False)],
    format: Annotated[Output, typer.Option(help="Text, or JSON.")] = Output.text,
    server: Server = DEFAULT_SERVER, token: Token = None, tls_ca: TlsCa = None,
) -> None:
    """Show one subscription: its document as written, its plans, its log.

    Example: evamed profile show P1
    """
    with connected(server, token, tls_ca) as client:
        info = client.profile(name)
    if format is Output.json:
        print(json.dumps(asdict(info), indent=2, ensure_ascii=False))
        return
    print(f"name:     {info.name}\nprofiles: {', '.join(info.profiles)}\n"
          f"created:  {when(info.created_us)}\nlog:      {_log(info)}")
    for plan in info.plans:
        print(f"plan:     {plan}")
    print()
    print(info.text, end="" if info.text.endswith("\n") else "\n")


@app.command()
def rm(
    name: Annotated[str, typer.Argument(help="The subscription's name.", show_default=False)],
    server: Server = DEFAULT_SERVER, token: Token = None, tls_ca: TlsCa = None,
) -> None:
    """Cancel a subscription and remove its log.

    Its native queries are unsubscribed at the services.

    Example: evamed profile rm P1
    """
    with connected(server, token, tls_ca) as client:
        found = client.unsubscribe(name)
    if not found:
        fail(f"no subscription {name!r} of yours at {server}", code=1)
    print(f"removed {name}")
