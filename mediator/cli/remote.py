"""What the commands that talk to a running mediator share: the options that say where it is
and who is asking (``--server``/``--token`` or ``EVAMED_SERVER``/``EVAMED_TOKEN``, else the token
saved for that address by ``evamed clients add NAME --save``: mediator/credentials.py), and the
one-line error — exit 1 when the mediator refuses a call or cannot be reached (exit 2 stays
for a wrong command line or a file that cannot be read, mediator/cli/common.py).

Light at import, as every command module: mediator.client (grpc) is imported when a command
runs.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from mediator.cli.common import fail, read_head

if TYPE_CHECKING:
    from mediator.client import MediatorClient

DEFAULT_SERVER = "127.0.0.1:50060"
"""``evamed serve``'s default listen address (mediator.config.DEFAULT_LISTEN)."""

Server = Annotated[str, typer.Option(
    "--server", envvar="EVAMED_SERVER", help="The mediator's host:port.")]
Token = Annotated[str | None, typer.Option(
    "--token", envvar="EVAMED_TOKEN", show_default=False,
    help="Bearer token from `evamed clients add NAME` (default: the one `clients add --save` "
         "saved for --server).")]
TlsCa = Annotated[Path | None, typer.Option(
    "--tls-ca", envvar="EVAMED_TLS_CA",
    help="PEM file of the CA that signed the mediator's certificate (TLS; none: plaintext).")]


class Listing(StrEnum):
    """How a listing is printed."""

    table = "table"
    json = "json"


class Output(StrEnum):
    """How one record is printed."""

    text = "text"
    json = "json"


@contextmanager
def connected(server: str, token: str | None, tls_ca: Path | None,
              document: Path | None = None) -> Iterator[MediatorClient]:
    """A client of the mediator at ``server``; a refused or failed call exits 1 with its
    message (never a traceback), a bad profile's position prefixed with ``document``."""
    from rich.markup import escape

    from mediator.client import MediatorClient, MediatorError

    if not token:
        from mediator import credentials

        try:
            token = credentials.token_for(server)
        except ValueError as exc:
            fail(str(exc), one_line=True)
    if not token:
        fail(f"no token for {server}: give --token, set EVAMED_TOKEN, or save one with "
             "`evamed clients add NAME --save` (an operator issues tokens)", one_line=True)
    if tls_ca is not None and not tls_ca.is_file():
        fail(f"--tls-ca {tls_ca}: no such file")
    try:
        with MediatorClient(server, token, tls_ca=tls_ca) as client:
            yield client
    except MediatorError as exc:
        where = f"{document}: " if document is not None and exc.violations else ""
        # Escaped: a message may quote the profile's brackets, which rich would read as markup.
        fail(escape(where + str(exc)), code=1, one_line=True)


def read_text(path: Path) -> str:
    """A profile document as text; exit 2 if it cannot be read or is not UTF-8."""
    from eva.validate import MAX_DOCUMENT_BYTES

    data = read_head(path, MAX_DOCUMENT_BYTES)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        fail(f"{path}: byte {exc.start} is not UTF-8; expected a UTF-8 profile document")


def when(us: int) -> str:
    """A time in µs as RFC 3339 UTC to the second (0: empty)."""
    if not us:
        return ""
    return datetime.fromtimestamp(us / 1e6, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
