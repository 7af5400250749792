"""What every ``evamed`` command shares: the error exit, reading files, and options checked
the same way everywhere.

Light on purpose: the commands import this at start-up, so it imports nothing of the engine,
the backends, sqlglot, grpc or Spark (tests/test_startup.py); each helper imports what it
needs when it runs.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import typer
from rich.console import Console
from rich.markup import escape

if TYPE_CHECKING:
    from rich.table import Table

    from eva import ast

err = Console(stderr=True)
"""Errors (:func:`fail`): always shown."""
remarks = Console(stderr=True)
"""What a command says besides its output — progress, what it waits for, where it wrote a
file: silenced by ``evamed --quiet``. Its output (stdout) and its errors never are."""


def counted(n: int, noun: str, plural: str | None = None) -> str:
    """``1 profile``, ``2 profiles``, ``1,000 classes`` (``plural``: when not noun + s)."""
    return f"{n:,} {noun if n == 1 else plural or noun + 's'}"


def set_quiet(value: bool) -> None:
    """``evamed --quiet``: notes and progress bars off."""
    remarks.quiet = value


def quiet() -> bool:
    return bool(remarks.quiet)


def out_console() -> Console:
    """The console of a command's output: the terminal's width (or ``COLUMNS``), and no width
    at all when piped (a line cut at 80 columns is hard to grep and to read in a file)."""
    if sys.stdout.isatty() or os.environ.get("COLUMNS"):
        return Console(highlight=False)
    return Console(width=10_000, soft_wrap=True, highlight=False)


def print_table(table: Table, console: Console | None = None) -> None:
    """A table that never cuts a word: each column at least as wide as its longest word (an
    identifier is one), wider up to its longest line where the terminal has room, the rest of
    the text wrapped at spaces; a table that does not fit even so is printed wider than the
    terminal (which wraps its lines) rather than cut. Rich alone shrinks every column in
    proportion and cuts what no longer fits with an ellipsis (``BackInT…``)."""
    from rich.text import Text

    console = console or out_console()
    least, most = [], []
    for column in table.columns:
        cells = [Text.from_markup(c) if isinstance(c, str) else c for c in column._cells]
        lines = [str(column.header)] + [line for cell in cells if isinstance(cell, Text)
                                       for line in cell.plain.splitlines()]
        least.append(max((len(word) for line in lines for word in line.split()), default=1))
        most.append(max((len(line) for line in lines), default=1))
    frame = table._extra_width + sum(table._get_padding_width(i)
                                     for i in range(len(table.columns)))
    room = console.width - frame
    widths = most
    if sum(most) > room:
        spare = max(room - sum(least), 0)
        wanted = [m - n for m, n in zip(most, least, strict=True)]
        total = sum(wanted) or 1
        widths = [n + min(w, spare * w // total) for n, w in zip(least, wanted, strict=True)]
    for column, width in zip(table.columns, widths, strict=True):
        column.width = width
    print_wide(console, table, frame + sum(widths))


def print_wide(console: Console, renderable: Any, width: int) -> None:
    """Print at least ``width`` columns wide: wider than the terminal if need be (it wraps the
    line) rather than cut (rich clamps a print's width to the console's)."""
    if width <= console.width:
        console.print(renderable)
        return
    console.width, given = width, console.width
    try:
        console.print(renderable)
    finally:
        console.width = given


@contextmanager
def interruptible() -> Iterator[None]:
    """Ctrl-C (SIGINT) and SIGTERM while the command runs: inside ``eva.interrupt.held()`` (the
    compiled engine at work) they only ask for a stop, which the engine's instant loop and the
    command's loop honour between steps (eva.interrupt: an exception raised from a handler
    inside the compiled engine aborted the process); elsewhere they raise KeyboardInterrupt
    as usual. A second signal while a stop is pending ends the process at once, with status
    128 + its number."""
    from eva import interrupt

    def handler(signum: int, frame: Any) -> None:
        if interrupt.asked():
            os._exit(128 + signum)
        if interrupt.HELD[0]:
            interrupt.ask()
            return
        raise KeyboardInterrupt

    signals = (signal.SIGINT, signal.SIGTERM)
    previous = {s: signal.signal(s, handler) for s in signals}
    try:
        yield
    finally:
        for s, old in previous.items():
            signal.signal(s, old)
        interrupt.clear()


def fail(message: str, *, one_line: bool = False, plain: bool = False, code: int = 2) -> NoReturn:
    """Exit 2 with ``error: message`` on stderr: a user error, never a traceback (``code`` 1:
    the mediator refused a call or could not be reached, mediator/cli/remote.py). ``one_line``:
    not wrapped at the terminal's width (messages that name a path or a command to run).
    ``plain``: the message as given, neither prefixed nor wrapped nor read as markup — the
    parsers' messages, which carry their own position and caret."""
    if plain:
        print(message, file=sys.stderr)
    else:
        # escape: a message quoting a TOML table ([limits]) or a list ([]) is not markup
        err.print(f"[red]error:[/] {escape(message)}", soft_wrap=one_line)
    raise typer.Exit(code) from None


def read_head(path: Path, limit: int) -> bytes:
    """A file's bytes, at most ``limit`` + 1 of them: one byte past the limit is enough for the
    parser to refuse the file without reading it whole. Bytes: the parser reports one that is
    not UTF-8 at its line and column. Exit 2 if the file cannot be read."""
    try:
        with path.open("rb") as file:
            return file.read(limit + 1)
    except OSError as exc:
        fail(f"cannot read {path}: {exc.strerror}")


def load(path: Path) -> ast.Document:
    """A profile file, parsed and validated; exit 2 with the parser's message."""
    from eva.parser import ProfileError, parse
    from eva.validate import MAX_DOCUMENT_BYTES

    source = read_head(path, MAX_DOCUMENT_BYTES)
    try:
        return parse(source, str(path))
    except ProfileError as exc:
        fail(str(exc), plain=True)


def known_profiles(doc: ast.Document, wanted: list[str] | None, path: Path) -> list[str]:
    """The document's profile names; exit 2 if ``--profile`` names one it does not have."""
    names = [p.name for p in doc.profiles]
    for name in wanted or []:
        if name not in names:
            fail(f"no profile {name!r} in {path}; expected one of: {', '.join(names)}")
    return names


def span_option(text: str | None, name: str) -> int | None:
    """``--name``'s span in µs (None if not given); exit 2 if it is not a finite span."""
    if text is None:
        return None
    from eva.units import parse_span

    try:
        value = parse_span(text)
    except (KeyError, ValueError):
        value = None
    if value is None:
        fail(f"--{name} {text!r}: expected a finite span such as 1s or 500ms")
    return value


def time_option(text: str | None, name: str) -> int | None:
    """``--name``'s RFC 3339 time in µs (None if not given); exit 2 if it is not one."""
    if text is None:
        return None
    from eva.events import EventError, parse_time

    try:
        return parse_time(text)
    except EventError as exc:
        fail(f"--{name}: {exc}")


def group_option(value: str | None, name: str) -> None:
    """Exit 2 unless ``--name`` is absent or one of the groups cg0 … cg5."""
    if value is None:
        return
    from transforms.dialects import GROUPS

    if value not in GROUPS:
        fail(f"--{name} {value!r}: expected one of {', '.join(GROUPS)}")


def require_extra(extra: str, feature: str) -> None:
    """Exit 2 with the one line that names the extra to install, if ``feature`` needs one that
    is not (mediator/extras.py)."""
    from mediator.extras import missing

    needed = missing(extra, feature)
    if needed is not None:
        fail(needed, one_line=True)


def require_spark(feature: str) -> None:
    """Exit 2 with what to install, before Spark starts: the spark extra, then Java."""
    require_extra("spark", feature)
    from spark_jobs.session import java_missing

    missing = java_missing()
    if missing is not None:
        fail(missing, one_line=True)


def event_lines(path: Path, stack: ExitStack) -> Iterator[tuple[int, bytes]]:
    """(line number, line) of a JSON-lines file or stdin ('-'), blank lines skipped; exit 2 if
    the file cannot be read. Bytes: each line is decoded on its own (events.from_json_line), so
    one that is not UTF-8 is a dead letter, not the end of the run — the same from a file and
    from stdin (whose text layer would turn such bytes into lone surrogates)."""
    try:
        handle = sys.stdin.buffer if str(path) == "-" else stack.enter_context(
            open(path, "rb"))  # noqa: SIM115 - the caller's ExitStack closes it
    except OSError as exc:
        fail(f"cannot read {path}: {exc.strerror}")
    for number, line in enumerate(handle, start=1):
        if not line.isspace():  # (a line read is never empty; strip() made a copy of each)
            yield number, line
