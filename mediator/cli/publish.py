"""``evamed publish``: send a file of CloudEvents to a running mediator, with a progress bar."""

from __future__ import annotations

import itertools
from array import array
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Annotated

import typer

from mediator.cli.common import counted, err, event_lines, fail, remarks, time_option
from mediator.cli.remote import DEFAULT_SERVER, Server, TlsCa, Token, connected


def publish(
    events: Annotated[Path, typer.Argument(
        help="CloudEvents JSON lines, in arrival order; '-': standard input.",
        show_default=False)],
    batch: Annotated[int, typer.Option(min=1, max=100_000,
                                       help="Events per Publish message.")] = 500,
    advance_to: Annotated[str | None, typer.Option(
        help="Afterwards no event at or before this RFC 3339 time will come (a watermark: "
             "what waits on an absence of events is decided). An operator's right "
             "(evamed clients add NAME --operator).")] = None,
    server: Server = DEFAULT_SERVER, token: Token = None, tls_ca: TlsCa = None,
) -> None:
    """Publish a file of CloudEvents to the mediator, with a progress bar.

    The events go in one call, batch by batch. An event is accepted once it is durably in
    the mediator's event log; a malformed, duplicate or late one is dead-lettered, and
    listed with its line and reason.

    Example: evamed publish examples/logistics/day.jsonl --batch 1000
    """
    from rich.markup import escape
    from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn, TimeElapsedColumn

    watermark = time_option(advance_to, "advance-to")
    size: int | None = None
    if str(events) != "-":
        try:
            size = events.stat().st_size
        except OSError as exc:
            fail(f"cannot read {events}: {exc.strerror}")
    numbers = array("q")  # the file line of each event sent: dead letters name lines, not indexes
    progress = Progress(TextColumn("publishing"), BarColumn(), TaskProgressColumn(),
                        TextColumn("{task.fields[count]:,} events"), TimeElapsedColumn(),
                        console=remarks, transient=True, disable=bool(remarks.quiet))
    task = progress.add_task("publish", total=size, count=0)

    def lines(first: tuple[int, bytes] | None, rest: Iterator[tuple[int, bytes]]
              ) -> Iterator[bytes]:
        for number, line in itertools.chain([first] if first else [], rest):
            numbers.append(number)
            progress.update(task, advance=len(line), count=len(numbers))
            yield line

    with ExitStack() as stack, connected(server, token, tls_ca) as client:
        source = event_lines(events, stack)
        first = next(source, None)  # opens the file here: gRPC's thread reads the rest
        stack.enter_context(progress)
        try:
            result = client.publish(lines(first, source), batch=batch, advance_to=watermark)
        except KeyboardInterrupt:
            fail(f"interrupted after sending {counted(len(numbers), 'event')}; those the mediator "
                 "accepted stay in its log (publishing them again dead-letters them as "
                 "duplicates)", code=130)
    print(f"accepted {result.accepted:,}, dead-lettered {result.dead_lettered:,}")
    for dead in result.dead_letters:
        where = f"line {numbers[dead.index]}" if 0 <= dead.index < len(numbers) else \
            f"event {dead.index + 1}"
        named = f" (id {dead.id})" if dead.id else ""
        err.print(f"  {where}{named}: {escape(dead.reason)}", soft_wrap=True)
    if result.dead_lettered > len(result.dead_letters):
        err.print(f"  … and {result.dead_lettered - len(result.dead_letters):,} more "
                  "(the mediator lists the first 100)")
