"""``evamed clients add|list|revoke``: the operator's bootstrap of trust.

These commands open the mediator's store directly (``--store URL``, or the ``store`` of a
``--config`` file, or ``EVAMED_STORE``) rather than calling the mediator: a token is what any
call needs, so the first one cannot be asked for over the API. Whoever can write the store is
the operator. They work while the mediator runs (both stores take concurrent writers); a token
is usable at once and a revoked one is refused at its next call.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from mediator.cli.common import fail, print_table, remarks
from mediator.cli.remote import Listing, when

if TYPE_CHECKING:
    from mediator.store.base import Store

app = typer.Typer(no_args_is_help=True, help=(
    "Issue, list and revoke the bearer tokens of subscription clients (opens the store "
    "directly: --store URL, --config FILE or EVAMED_STORE)."))

StoreUrl = Annotated[str | None, typer.Option(
    "--store", show_default=False,
    help="The store URL (sqlite:///abs/path.db, redis://host:port/0).")]
ConfigFile = Annotated[Path | None, typer.Option(
    "--config", show_default=False, help="The mediator's TOML file: use its store.")]


@contextmanager
def _opened(store: str | None, config: Path | None) -> Iterator[Store]:
    """The store named by --store, else --config's (with EVAMED_* over it), else EVAMED_STORE
    or the default ./evamed.db — the one `evamed serve` would open."""
    from mediator.config import ConfigError, load
    from mediator.store import StoreError, open_store

    if store is not None and config is not None:
        fail("--store and --config exclude each other")
    if store is None:
        try:
            store = load(config).store
        except ConfigError as exc:
            fail(str(exc), one_line=True)
    try:
        opened = open_store(store)
    except (ValueError, StoreError) as exc:
        fail(str(exc), code=1, one_line=True)
    try:
        yield opened
    except StoreError as exc:
        fail(str(exc), code=1, one_line=True)
    finally:
        opened.close()


@app.command()
def add(
    name: Annotated[str, typer.Argument(help="The client's name (letters, digits, . _ @ -).",
                                        show_default=False)],
    inherit: Annotated[bool, typer.Option(
        help="Reissue a revoked client's name that still owns subscriptions: the same client "
             "(a token rotation), which reads them.")] = False,
    save: Annotated[bool, typer.Option(
        "--save", help="Also save the token for this machine's user, under the mediator's "
                       "address: the commands that talk to it (in any shell) and "
                       "MediatorClient then need no token.")] = False,
    server: Annotated[str | None, typer.Option(
        "--server", show_default=False,
        help="With --save: the address clients reach the mediator at (default: its listen "
             "address from --config or EVAMED_LISTEN, 127.0.0.1:50060).")] = None,
    operator: Annotated[bool, typer.Option(
        help="An operator: sees every dead letter (not only its own publishes'), may "
             "republish any (evamed dead-letters) and may send advance_to_us "
             "(publish --advance-to).")] = False,
    sources: Annotated[list[str] | None, typer.Option(
        "--sources", show_default=False,
        help="The event sources it may publish under: fnmatch patterns, separated by spaces "
             "or commas, or the option repeated (default: NAME and NAME/*; an operator's: "
             "every source).")] = None,
    store: StoreUrl = None, config: ConfigFile = None,
) -> None:
    """Register a client and print its bearer token, once.

    Only the token's hash is stored. Give the token to the client (EVAMED_TOKEN, or
    MediatorClient(address, token)), or save it here with --save.

    Example: export EVAMED_TOKEN=$(evamed clients add alice --store sqlite:///var/lib/evamed/evamed.db)

    Example: evamed clients add alice --save

    Example: evamed clients add plant --sources 'plant/* urn:plant:*'
    """
    from mediator import credentials
    from mediator.security import add_client

    address = None
    if save:
        address = server or credentials.local_address(_listen(config))
    elif server is not None:
        fail("--server says where --save saves the token for: give --save too")
    with _opened(store, config) as opened:
        try:
            token = add_client(opened, name, inherit=inherit, operator=operator,
                               sources=sources or ())
        except ValueError as exc:
            fail(str(exc), code=1, one_line=True)
    remarks.print(f"{'operator' if operator else 'client'} {name} added; its token (shown "
                  "only now):")
    print(token, flush=True)
    if address is not None:
        try:
            where = credentials.save(address, name, token)
        except (OSError, ValueError) as exc:
            fail(f"the token was not saved: {exc}", code=1, one_line=True)
        remarks.print(f"saved for {address} in {where}: evamed commands for that address need "
                   "no --token", soft_wrap=True, highlight=False)


def _listen(config: Path | None) -> str:
    """The listen address of --config (with EVAMED_* over it), or the default."""
    from mediator.config import ConfigError, load

    try:
        return load(config).listen
    except ConfigError as exc:
        fail(str(exc), one_line=True)


@app.command("list")
def list_(
    format: Annotated[Listing, typer.Option(help="A table, or JSON.")] = Listing.table,
    store: StoreUrl = None, config: ConfigFile = None,
) -> None:
    """List the clients: name, when added, whether revoked.

    Never a token: none is stored.

    Example: evamed clients list --config mediator.toml
    """
    from rich.markup import escape
    from rich.table import Table

    with _opened(store, config) as opened:
        records = opened.clients()
    if format is Listing.json:
        print(json.dumps([{**{k: v for k, v in asdict(r).items() if k != "token_hash"},
                           "sources": list(r.granted)} for r in records], indent=2))
        return
    table = Table("name", "added", "state", "sources")
    for record in records:
        table.add_row(record.name, when(record.created_us),
                      "[red]revoked[/]" if record.revoked else
                      "active, operator" if record.operator else "active",
                      escape(" ".join(record.granted)))
    print_table(table)


@app.command()
def revoke(
    name: Annotated[str, typer.Argument(help="The client's name.", show_default=False)],
    store: StoreUrl = None, config: ConfigFile = None,
) -> None:
    """Revoke a client's token: its next call is refused.

    Its calls get UNAUTHENTICATED; its subscriptions stay until removed. `evamed clients add
    NAME` again issues a new token.

    Example: evamed clients revoke alice --store redis://127.0.0.1:6379/0
    """
    from mediator.security import revoke_client

    with _opened(store, config) as opened:
        if not revoke_client(opened, name):
            fail(f"no active client {name!r} in the store", code=1)
    print(f"revoked {name}")
