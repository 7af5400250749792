"""``evamed subscribe``: tail a subscription's composites live, resuming after a disconnect."""

from __future__ import annotations

import json
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict
from enum import StrEnum
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Annotated, Any

import typer

from mediator.cli.common import err, fail
from mediator.cli.remote import DEFAULT_SERVER, Server, TlsCa, Token, connected, read_text

if TYPE_CHECKING:
    from mediator.client import Notification


class Shape(StrEnum):
    """How each composite is printed."""

    json = "json"        # one JSON object a line: for programs
    table = "table"      # a row a composite: for people
    compact = "compact"  # one short line a composite


_COLUMNS = (("time", 20), ("profile", 8), ("id", 24), ("sources", 2), ("services", 1))
"""Each column and its width; the last two share what remains of the line, 2 : 1 (at least 8
each). A value too wide for its column is cut with an ellipsis."""


def _row(note: Notification, expand: bool) -> list[str]:
    events = _described(note) if expand else note.sources
    return [str(note.cloudevent.get("time", "")), note.profile, note.id,
            ", ".join(events), ", ".join(note.services)]


def _described(note: Notification) -> list[str]:
    return [f"{e.get('type', e['id'])}@{e.get('source', '?')} {e.get('time', '')}".strip()
            for e in _events(note)]


def _events(note: Notification) -> list[dict[str, Any]]:
    """The contributing events as --expand shows them: id, type, source, time (what the
    mediator still knew of each when it logged the composite)."""
    from eva.events import format_time

    ids = note.cloudevent.get("data", {}).get("constituents", [])
    out = []
    for at, ident in enumerate(ids):
        event: dict[str, Any] = {"id": ident}
        kind = note.types[at] if at < len(note.types) else ""
        when = note.times_us[at] if at < len(note.times_us) else 0
        if kind:
            event["type"] = kind
        if at < len(note.sources) and note.sources[at]:
            event["source"] = note.sources[at]
        if when:
            event["time"] = format_time(when)
        out.append(event)
    return out


def _compact(note: Notification, expand: bool) -> str:
    data = note.cloudevent.get("data", {})
    partition = f" {json.dumps(data['partition'], ensure_ascii=False)}" if "partition" in data \
        else ""
    events = _described(note) if expand else [str(i) for i in data.get("constituents", [])]
    return (f"{note.cloudevent.get('time', '')} {note.profile}{partition} ({', '.join(events)})"
            f" via {', '.join(note.services)}")


def subscribe(
    name: Annotated[str | None, typer.Argument(
        help="A subscription registered before (`evamed profile add`), or the name to give "
             "--file's.", show_default=False)] = None,
    file: Annotated[Path | None, typer.Option(
        "--file", help="Register this profile document and tail it.")] = None,
    format: Annotated[Shape, typer.Option(
        help="JSON lines, a table, or a short line each.")] = Shape.json,
    expand: Annotated[bool, typer.Option(
        help="Show each composite's contributing events (type, source, time), not only "
             "their ids.")] = False,
    resume: Annotated[str | None, typer.Option(
        help="Start after this notification's resume token (default: the oldest the log "
             "keeps).")] = None,
    server: Server = DEFAULT_SERVER, token: Token = None, tls_ca: TlsCa = None,
) -> None:
    """Tail a subscription's composites live, resuming after a disconnect.

    A lost connection is retried with back-off and resumed where it stopped: nothing is
    missed, nothing printed twice. Ctrl-C stops and prints the token to resume with.

    Example: evamed subscribe --file examples/logistics/profiles.eva --format compact --expand
    """
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    if name is None and file is None:
        fail("give a subscription NAME, or --file with a profile document")
    text = read_text(file) if file is not None else None
    console = Console(highlight=False)
    last: Notification | None = None

    def reconnecting(reason: str, wait: float) -> None:
        err.print(f"[yellow]disconnected[/] ({escape(reason)}); reconnecting in {wait:.1f} s")

    fixed = sum(width for _, width in _COLUMNS[:3]) + 2 * (len(_COLUMNS) - 1)
    rest = max(16, console.width - fixed)
    widths = [width for _, width in _COLUMNS[:3]] + [rest * 2 // 3, rest - rest * 2 // 3]

    def table() -> Table:
        grid = Table(box=None, show_header=last is None, pad_edge=False)
        for (column, _), width in zip(_COLUMNS, widths, strict=True):
            grid.add_column(column, width=width, no_wrap=True, overflow="ellipsis")
        return grid

    with connected(server, token, tls_ca, document=file) as client, _deferred_interrupt() as shield:
        notes = client.subscribe(profile_text=text, name=name, resume_token=resume,
                                 on_reconnect=reconnecting)
        try:
            for note in notes:
                with shield:  # printed and remembered together: the token names the last shown
                    if format is Shape.json:
                        record = asdict(note)
                        if expand:
                            record["events"] = _events(note)
                        print(json.dumps(record, ensure_ascii=False), flush=True)
                    elif format is Shape.compact:
                        console.print(escape(_compact(note, expand)), soft_wrap=True)
                    else:
                        row = table()
                        row.add_row(*map(escape, _row(note, expand)))
                        console.print(row)
                    last = note
        except KeyboardInterrupt:
            notes.close()
            if last is not None:
                err.print(f"stopped; resume with: evamed subscribe {last.subscription} "
                          f"--resume {last.resume_token}", soft_wrap=True)


class _Shield:
    """While entered, Ctrl-C waits: it is raised on leaving."""

    def __init__(self) -> None:
        self.inside = False
        self.pending = False

    def __enter__(self) -> None:
        self.inside = True

    def __exit__(self, *_: object) -> None:
        self.inside = False
        if self.pending:
            self.pending = False
            raise KeyboardInterrupt

    def interrupt(self, signum: int, frame: FrameType | None) -> None:
        if self.inside:
            self.pending = True
        else:
            raise KeyboardInterrupt


@contextmanager
def _deferred_interrupt() -> Iterator[_Shield]:
    """SIGINT handled by a :class:`_Shield` (restored afterwards)."""
    shield = _Shield()
    previous = signal.signal(signal.SIGINT, shield.interrupt)
    try:
        yield shield
    finally:
        signal.signal(signal.SIGINT, previous)
