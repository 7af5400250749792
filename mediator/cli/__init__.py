"""The ``evamed`` command line: check profiles, replay traces, explain plans, run the
composition job and the base services — one module per command, over
:mod:`mediator.cli.runs` (functions of an event iterator and sinks) and
:mod:`mediator.cli.common` (``fail`` and the options every command checks alike).

Every user error exits with status 2 and a message that says where and what; never a traceback.
A command imports what it runs when it runs: ``evamed --help`` and ``evamed check`` load
neither the engine's backends nor sqlglot, grpc or Spark (docs/performance.md, Start-up;
tests/test_startup.py).
"""

from __future__ import annotations

from typing import Annotated

import typer

from mediator.cli import (
    check,
    clients,
    compose,
    deadletters,
    demo,
    explain,
    profile,
    publish,
    replay,
    serve,
    services,
    status,
    subscribe,
)
from mediator.cli.common import fail, set_quiet

app = typer.Typer(no_args_is_help=True, rich_markup_mode="markdown", help=(
    "The EVA event mediator: check and explain profiles, replay event traces, run the "
    "mediator and its base services, and talk to a running one (subscribe, publish, status). "
    "Shell completion: `evamed --install-completion` (bash, zsh, fish, PowerShell)."))


def _print_version(wanted: bool) -> None:
    if not wanted:
        return
    from importlib.metadata import PackageNotFoundError, version

    from eva.native import engine_kind

    try:
        number = version("evamed")
    except PackageNotFoundError:  # run from a source tree that was never installed
        number = "(not installed)"
    print(f"evamed {number} ({engine_kind()})")
    raise typer.Exit()


@app.callback()
def _options(
    show_version: Annotated[bool, typer.Option(
        "--version", is_eager=True, callback=_print_version,
        help="Print the version and whether the engine runs compiled or as pure Python.")] = False,
    quiet: Annotated[bool, typer.Option(
        "--quiet", "-q", help="Only the output and errors: no progress bars, no notes on "
                              "standard error (`serve`: warnings and errors only in its log).")]
        = False,
) -> None:
    set_quiet(quiet)


app.command()(check.check)
app.command()(replay.replay)
app.command()(explain.explain)
app.command()(compose.compose)
app.command("base-service")(services.base_service)
app.command()(serve.serve)
app.command()(demo.demo)
app.add_typer(profile.app, name="profile")
app.command()(subscribe.subscribe)
app.command()(publish.publish)
app.add_typer(services.app, name="services")
app.command()(status.status)
app.add_typer(clients.app, name="clients")
app.add_typer(deadletters.app, name="dead-letters")


def main() -> None:
    app()


__all__ = ["app", "fail", "main"]
