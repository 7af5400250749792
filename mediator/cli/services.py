"""``evamed base-service``: run the reference base service of a language group;
``evamed services list``: the services a running mediator is connected to."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from mediator.cli.common import fail, group_option, print_table, span_option
from mediator.cli.remote import DEFAULT_SERVER, Listing, Server, TlsCa, Token, connected


def base_service(
    group: Annotated[str, typer.Option(help="Language group cg0 … cg5.")],
    listen: Annotated[str, typer.Option(help="host:port to serve gRPC on (port 0: any).")]
        = "127.0.0.1:50051",
    tick: Annotated[str, typer.Option(help="A peer mediator's (cg5) default clock.")] = "1s",
    queue_size: Annotated[int, typer.Option(help="Notifications buffered per subscriber.")] = 1024,
    max_advance: Annotated[str | None, typer.Option(
        help="How far one request may move a subscription's clock (default 86400 ticks: a day "
             "at 1s); farther is rejected, the client steps.")] = None,
    stall_timeout: Annotated[str, typer.Option(
        help="A subscriber that has read nothing this long with a full queue is dropped.")]
        = "10s",
    data: Annotated[Path | None, typer.Option(
        help="Directory of the event log and the durable sessions (SQLite): they survive a "
             "restart, a kill too. Without it, everything is in memory.")] = None,
    retention: Annotated[int, typer.Option(
        min=1, help="Unacknowledged messages a session may hold; one that would hold more is "
                    "dropped.")] = 100_000,  # adapters.backends.sessions.RETENTION
    session_timeout: Annotated[float, typer.Option(
        min=0.001, help="Seconds a session may go without an open stream before it is "
                        "dropped.")] = 86_400.0,  # sessions.SESSION_TIMEOUT (not imported:
    # the CLI loads no adapter until a command runs, tests/test_startup.py)
    work_limit: Annotated[int, typer.Option(
        min=1, help="Intermediate results a query's evaluation may make for one event; a "
                    "query past it is ended (RESOURCE_EXHAUSTED).")] = 100_000,  # native.WORK_LIMIT
    store_limit: Annotated[int, typer.Option(
        min=1, help="Results a query's evaluation may keep between events; a query past it "
                    "is ended (RESOURCE_EXHAUSTED).")] = 1_000_000,  # native.STORE_LIMIT
) -> None:
    """Run the reference base service of a language group: eva.base.v1.BaseService (native
    queries in, native notifications out; durable sessions for autonomous producers),
    standard health checking and server reflection. SIGTERM or SIGINT: health says
    NOT_SERVING for a second, then calls get 2 s to finish.

    Example: evamed base-service --group cg3 --listen 127.0.0.1:50053 --data /var/lib/cg3
    """
    import asyncio

    from adapters.backends import native
    from adapters.backends.service import run

    group_option(group, "group")
    # This process is one service: its evaluators read the limits when they are made.
    native.WORK_LIMIT, native.STORE_LIMIT = work_limit, store_limit
    tick_us = span_option(tick, "tick") or 1_000_000
    host = listen.rsplit(":", 1)[0]
    try:
        asyncio.run(run(group, listen, lambda port: print(f"serving {group} on {host}:{port}",
                                                          flush=True), tick_us, queue_size,
                        span_option(max_advance, "max-advance"),
                        stall_timeout=(span_option(stall_timeout, "stall-timeout") or 1) / 1e6,
                        data=data, retention=retention, session_timeout=session_timeout))
    except (OSError, RuntimeError) as exc:  # the port is taken (no sharing), --data unusable
        fail(str(exc))


app = typer.Typer(no_args_is_help=True, help=(
    "The services a running mediator is connected to (address and token: --server/--token "
    "or EVAMED_SERVER/EVAMED_TOKEN)."))


@app.command("list")
def list_(
    format: Annotated[Listing, typer.Option(help="A table, or JSON.")] = Listing.table,
    server: Server = DEFAULT_SERVER, token: Token = None, tls_ca: TlsCa = None,
) -> None:
    """List the services the mediator plans over.

    Each with its group, address, coverage (the sources and types it observes), state, and
    how many native queries are subscribed there.

    Example: evamed services list --server mediator.example:50060
    """
    import json
    from dataclasses import asdict

    from rich.table import Table

    with connected(server, token, tls_ca) as client:
        services = client.services()
    if format is Listing.json:
        print(json.dumps([asdict(s) for s in services], indent=2, ensure_ascii=False))
        return
    if not services:
        print("no services configured: every profile is evaluated at the mediator, over the "
              "events published to it")
        return
    table = Table("name", "group", "language", "address", "sources", "types", "status",
                  "queries")
    for s in services:
        colour = "green" if s.status == "SERVING" else "yellow"
        table.add_row(s.name, s.group, s.language, s.address, "\n".join(s.sources),
                      "\n".join(s.types), f"[{colour}]{s.status}[/]", str(s.subscriptions))
    print_table(table)
