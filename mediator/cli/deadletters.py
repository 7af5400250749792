"""``evamed dead-letters``: what the mediator refused, and publishing it again once fixed
(docs/operations.md, "Dead letters").

``evamed dead-letters`` lists the letters you may see (an operator: all) — one line each, or
JSON lines — oldest first, the newest ``--last`` of them (50) unless ``--after`` says where to
start; ``--follow`` goes on with each letter as it is kept. ``evamed dead-letters republish ID``
publishes one again, as it was, as corrected in ``$EDITOR`` (``--edit``) or from a file.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from mediator.cli.common import err, fail
from mediator.cli.remote import DEFAULT_SERVER, Listing, Server, TlsCa, Token, connected, when

if TYPE_CHECKING:
    from mediator.client import KeptLetter

app = typer.Typer(invoke_without_command=True, help=(
    "The dead-letter log: every input the mediator refused, with its reason — yours, or every "
    "one for an operator (address and token: --server/--token or EVAMED_SERVER/EVAMED_TOKEN)."))

REASONS = ("malformed", "too_large", "duplicate", "late", "future", "misrouted", "forbidden",
           "state_cap", "composite_limit", "service_limit", "payload", "time", "id", "topic", "attribute",
           "deleted")
"""eva.admission.Reason's values (not imported: the command line starts without the engine)."""


@app.callback(invoke_without_command=True)
def list_(
    ctx: typer.Context,
    reason: Annotated[str, typer.Option(help=f"Only this reason: {', '.join(REASONS)}.")] = "",
    source: Annotated[str, typer.Option(
        help="Only from here: publish, a configured source's name, mediator (the event log's "
             "reader) or a service.")] = "",
    client: Annotated[str, typer.Option(help="An operator: only this client's publishes.")] = "",
    after: Annotated[int, typer.Option(help="The letters after this position.")] = 0,
    last: Annotated[int, typer.Option(help="Only the newest this many (0: all after --after; "
                                           "default 50 without --after).")] = -1,
    follow: Annotated[bool, typer.Option(help="Go on with each letter as it is kept.")] = False,
    format: Annotated[Listing, typer.Option(
        help="table: a line per letter; json: a JSON object per line.")] = Listing.table,
    server: Server = DEFAULT_SERVER, token: Token = None, tls_ca: TlsCa = None,
) -> None:
    """List the dead letters: position, time, reason, where it came in, why.

    Example: evamed dead-letters --reason late --follow
    """
    if ctx.invoked_subcommand is not None:
        return
    if reason and reason not in REASONS:
        fail(f"--reason {reason!r}: expected one of {', '.join(REASONS)}")
    if last < -1 or after < 0:
        fail("--last and --after are positions and counts: 0 or more")
    newest = (50 if not after else 0) if last == -1 else last
    shown = 0
    with connected(server, token, tls_ca) as mediator:
        try:
            for letter in mediator.dead_letters(reason=reason, source=source, client=client,
                                                after=after, last=newest, follow=follow):
                print(_json(letter) if format is Listing.json else _line(letter), flush=True)
                shown += 1
        except KeyboardInterrupt:
            pass
    if not shown and not follow and format is Listing.table:
        err.print("no dead letters" + (" match" if reason or source or client else ""))


def _line(letter: KeptLetter) -> str:
    who = f" client {letter.client}" if letter.client else ""
    at = f" {letter.where}" if letter.where else ""
    ident = f" id {letter.id}" if letter.id else ""
    again = f" (republished {when(letter.republished_us)})" if letter.republished_us else ""
    return (f"#{letter.position} {when(letter.time_us)} {letter.reason} {letter.source}{who}"
            f"{at}{ident}: {letter.detail}{again}")


def _json(letter: KeptLetter) -> str:
    from dataclasses import asdict

    body = asdict(letter)
    body["raw"] = letter.raw.decode("utf-8", "backslashreplace")
    return json.dumps(body, ensure_ascii=False)


@app.command()
def republish(
    position: Annotated[int, typer.Argument(help="The letter (its #position in the listing).",
                                            show_default=False)],
    edit: Annotated[bool, typer.Option(help="Correct it in $EDITOR first.")] = False,
    file: Annotated[Path | None, typer.Option(
        help="Publish this corrected input instead ('-': stdin): a CloudEvent, or for a "
             "broker's payload a payload its source's rules map.", show_default=False)] = None,
    server: Server = DEFAULT_SERVER, token: Token = None, tls_ca: TlsCa = None,
) -> None:
    """Publish a dead letter again, as it was or corrected.

    It goes through the same door as Publish, in the lane it came in (a broker's letter is
    mapped again by its source's rules). Exit 1 if it is refused again (the new letter says
    why).

    Example: evamed dead-letters republish 12 --edit
    """
    if edit and file is not None:
        fail("--edit and --file exclude each other")
    replacement: bytes | None = None
    if file is not None:
        try:
            replacement = sys.stdin.buffer.read() if str(file) == "-" else file.read_bytes()
        except OSError as exc:
            fail(f"--file {file}: {exc.strerror}")
    with connected(server, token, tls_ca) as mediator:
        if edit:
            found = next(iter(mediator.dead_letters(after=position - 1, last=0)), None)
            if found is None or found.position != position:
                fail(f"no dead letter {position} of yours is kept", code=1)
            replacement = _edited(found.raw)
        result = mediator.republish(position, replacement)
    if result.accepted:
        print(f"republished dead letter {position}: accepted")
        return
    why = result.dead_letters[0].reason if result.dead_letters else "refused"
    fail(f"dead letter {position} refused again: {why} (kept as a new dead letter)", code=1,
         one_line=True)


def _edited(raw: bytes) -> bytes:
    """``raw`` as the user leaves it in $VISUAL or $EDITOR (default vi)."""
    editor = os.environ.get("VISUAL") or os.environ.get("EDITOR") or "vi"
    with tempfile.NamedTemporaryFile("wb", suffix=".json", delete=False) as handle:
        handle.write(raw)
        path = Path(handle.name)
    try:
        if subprocess.call([*shlex.split(editor), str(path)]) != 0:
            fail(f"{editor} exited with an error: nothing republished", code=1)
        return path.read_bytes().strip()
    finally:
        path.unlink(missing_ok=True)
