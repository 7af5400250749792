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

from mediator.cli.common import err, fail, print_wide, remarks
from mediator.cli.remote import DEFAULT_SERVER, Server, TlsCa, Token, connected, read_text

if TYPE_CHECKING:
    from mediator.client import Notification


class Shape(StrEnum):
    """How each composite is printed."""

    json = "json"        # one JSON object a line: for programs
    table = "table"      # a row a composite: for people
    compact = "compact"  # one short line a composite


_COLUMNS = (("time", 20), ("profile", 8), ("id", 24), ("sources", 2), ("services", 1))
"""Each column and its width; the last two share what remains of the line, 2 : 1. A row is
printed as it comes, so the widths stay the same from row to row — except that no value is
ever cut: a column is widened for a row whose value is longer (a profile's name), and the list
columns are at least as wide as their longest item, wrapping between items."""


def _widths(cells: list[str], width: int) -> list[int]:
    """The columns' widths for one row on a line of ``width`` (wider only if the row needs
    it: :data:`_COLUMNS`)."""
    fixed = [max(w, len(cell)) for (_, w), cell in zip(_COLUMNS[:3], cells, strict=False)]
    least = [max(8, *(len(word) for word in cell.split())) for cell in cells[3:]]
    rest = max(width - sum(fixed) - 2 * (len(_COLUMNS) - 1), sum(least))
    share = [rest * 2 // 3, rest - rest * 2 // 3]
    if share[0] < least[0] or share[1] < least[1]:
        share = [least[0], rest - least[0]] if share[0] < least[0] else [rest - least[1], least[1]]
    return fixed + share


def _row(note: Notification, expand: bool) -> list[str]:
    events = _described(note) if expand else note.sources
    return [str(note.cloudevent.get("time", "")), note.profile, note.id,
            ", ".join(events), ", ".join(note.services)]


def _described(note: Notification) -> list[str]:
    return [e["id"] if "type" not in e else
            f"{e['type']}@{e.get('source', '?')} {e.get('time', '')}".strip()
            for e in _events(note)]


def _events(note: Notification) -> list[dict[str, Any]]:
    """The contributing events as --expand shows them: id, type, source, time (what the
    mediator still knew of each when it logged the composite). A tick of a time class or an
    absence is shown by its id alone, ``tick:HalfHour@2026-03-02T10:30:00Z`` — the one
    spelling of a clock constituent everywhere (``data.constituents``, replay, the demo):
    ``eva.tick.HalfHour`` is only the type under which a base service is sent ticks."""
    from eva.events import clock_id, format_time

    ids = note.cloudevent.get("data", {}).get("constituents", [])
    out = []
    for at, ident in enumerate(ids):
        event: dict[str, Any] = {"id": ident}
        if clock_id(ident) is not None:
            out.append(event)
            continue
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
        remarks.print(f"[yellow]disconnected[/] ({escape(reason)}); reconnecting in {wait:.1f} s")

    def table(cells: list[str]) -> Table:
        widths = _widths(cells, console.width)
        grid = Table(box=None, show_header=last is None, pad_edge=False)
        for (column, _), width in zip(_COLUMNS, widths, strict=True):
            grid.add_column(column, width=width, overflow="fold")
        grid.add_row(*map(escape, cells))
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
                        cells = _row(note, expand)
                        row = table(cells)
                        print_wide(console, row, sum(c.width or 0 for c in row.columns)
                                   + 2 * (len(cells) - 1))
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
