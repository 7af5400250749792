"""``evamed replay``: the options checked, the files opened, then one of the four modes of
:mod:`mediator.cli.runs`."""

from __future__ import annotations

import sys
from collections import Counter
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TextIO

import typer

from mediator.cli.common import (
    counted,
    err,
    event_lines,
    fail,
    group_option,
    interruptible,
    known_profiles,
    load,
    print_table,
    read_head,
    remarks,
    require_extra,
    require_spark,
    span_option,
    time_option,
)


class Shape(StrEnum):
    """How composites are printed (mediator.cli.runs.SHAPES)."""

    json = "json"
    table = "table"
    compact = "compact"


if TYPE_CHECKING:
    from eva import ast
    from eva.engine import EngineConfig
    from mediator.cli import runs


def replay(
    events: Annotated[Path, typer.Option(help="CloudEvents, one JSON object per line ('-': stdin).")],
    profiles: Annotated[Path | None, typer.Option(help="Profile file.")] = None,
    profile: Annotated[list[str] | None, typer.Option(help="Only this profile (repeatable).")] = None,
    dead_letter: Annotated[Path | None, typer.Option(help="Write dead letters here (JSON lines) "
                                                          "instead of stderr.")] = None,
    tick: Annotated[str, typer.Option(help="Default clock granularity for negations.")] = "1s",
    lateness: Annotated[str, typer.Option(
        help="Allowed lateness: how much older than the newest event an event may be and "
             "still count (taken in time order); an older one is a dead letter (late). The "
             "mediator's rule (eva/admission.py).")] = "0s",
    horizon: Annotated[str, typer.Option(help="How far ahead of the newest event time an event "
                                              "may lie; a further one is held until the next "
                                              "event (or --until) confirms the jump, else it "
                                              "is a dead letter (future). 'inf': no limit.")
                       ] = "1d",
    until: Annotated[str | None, typer.Option(help="End of the trace (RFC 3339); default: the "
                                                   "last event's time.")] = None,
    composite_limit: Annotated[int, typer.Option(
        help="Composites each operator of a profile reports per event at most; beyond it no "
             "more are made and the event is a dead letter (composite_limit). 0: no limit.")
                               ] = 10_000,
    summary: Annotated[bool, typer.Option(help="Print a count per profile to stderr.")] = False,
    via: Annotated[str | None, typer.Option(
        help="Through the whole transformation path to group cg0 … cg5's base service: plan, "
             "render, native evaluation, post-filter (prints what plain replay prints).")] = None,
    native: Annotated[str | None, typer.Option(
        help="Evaluate a native query (--query) with group cg0 … cg5's own semantics.")] = None,
    query: Annotated[Path | None, typer.Option(help="The native query for --native.")] = None,
    service: Annotated[str | None, typer.Option(
        help="With --via/--native: a running base service (host:port) instead of the in-process "
             "one.")] = None,
    engine_name: Annotated[str, typer.Option("--engine", help="inprocess (the incremental engine) "
                                             "or spark (the same engine in Spark tasks, local "
                                             "mode unless --master).")] = "inprocess",
    master: Annotated[str, typer.Option(help="Spark master for --engine spark.")] = "local[2]",
    format: Annotated[Shape, typer.Option(
        help="json: CloudEvents JSON lines; table: aligned columns; compact: a line each.")
                      ] = Shape.json,
    expand: Annotated[bool, typer.Option(
        help="Inline each composite's contributing events (type, source, time); keeps the "
             "trace's events in memory.")] = False,
    plot: Annotated[Path | None, typer.Option(
        help="Also draw the trace and its composites (PNG): a row per event type, each "
             "composite an arc over its constituents; keeps the trace in memory.",
        show_default=False)] = None,
) -> None:
    """Evaluate profiles over a trace; composites go to stdout as CloudEvents JSON lines.

    With --native G --query FILE, evaluate one native query of group G's language instead;
    its notifications go to stdout as JSON lines.

    Example: evamed replay --profiles examples/logistics/profiles.eva --events day.jsonl
    --format compact --expand
    """
    tick_us = span_option(tick, "tick") or 0
    if tick_us <= 0:
        fail(f"--tick {tick!r}: expected a positive span such as 1s")
    end = time_option(until, "until")
    group_option(via, "via")
    group_option(native, "native")
    if native is not None:
        if query is None or profiles is not None or via is not None:
            fail("--native takes --query (and no --profiles or --via)")
        if format is not Shape.json or expand or plot:
            fail("--format, --expand and --plot are for composites: not with --native")
        _native(native, query, events, end, tick_us, service)
        return
    if profiles is None:
        fail("--profiles is required (or --native G --query FILE)")
    if plot is not None:
        require_extra("plots", "--plot")
        from mediator.plots import PlotError, check_path

        try:
            check_path(plot)  # before the trace is read, not after
        except PlotError as exc:
            fail(str(exc), one_line=True)
    if engine_name not in ("inprocess", "spark"):
        fail(f"--engine {engine_name!r}: expected inprocess or spark")
    if engine_name == "spark" and via is not None:
        fail("--engine spark and --via exclude each other")
    if engine_name == "spark":
        require_spark("--engine spark")
        if plot is not None:
            fail("--plot draws what the in-process engine (or --via) computes: drop --engine spark")
    doc = load(profiles)
    names = known_profiles(doc, profile, profiles)
    wanted = profile or None
    if composite_limit < 0:
        fail(f"--composite-limit {composite_limit}: expected 0 (no limit) or more")
    config = _config(doc, wanted, tick_us, lateness, horizon, composite_limit or None)

    from mediator.cli import runs
    from mediator.cli.serve import tune_gc

    # Each line makes a few short-lived containers: a young collection every 700 of them
    # cost 15 % of a replay (docs/performance.md, "End to end").
    tune_gc()
    out = sys.stdout
    from eva import interrupt

    with ExitStack() as stack:
        # Signals ask for a stop, honoured between steps: what was found is written, then
        # status 130 (an exception raised inside the compiled engine aborted the process).
        stack.enter_context(interruptible())
        stack.enter_context(interrupt.held())
        stack.callback(_stopped_if_asked, interrupt)
        sink: TextIO = sys.stderr
        if dead_letter:
            sink = stack.enter_context(open(dead_letter, "w", encoding="utf-8"))
        dead = runs.DeadLetters(sink)
        lines = event_lines(events, stack)
        emit = runs.Composites(out, str(format), {} if expand or plot else None,
                               [] if plot else None)
        if via is not None:
            counts = _via(via, doc, wanted, lines, config, end, service, out, dead, emit)
        elif engine_name == "spark":
            from spark_jobs.session import SparkStartError

            try:
                with _spinning(f"evaluating in Spark ({master})"):
                    counts = runs.replay_spark(profiles.read_text(encoding="utf-8"), wanted,
                                               lines, config, end, master, out, dead,
                                               None if emit.events is None
                                               and format is Shape.json else emit)
            except SparkStartError as exc:  # before any composite: no Java, a bad --master
                fail(str(exc), one_line=True)
        else:
            counts = runs.replay_plain(doc, wanted, lines, config, end, out, dead, emit)
    if plot is not None and emit.notes is not None and emit.events is not None:
        _plot(plot, emit.events, emit.notes)
    if summary:
        _summary(profile or names, counts, dead.count)


def _stopped_if_asked(interrupt: Any) -> None:
    """Ctrl-C during the replay: written so far is written; one line, status 130."""
    if interrupt.asked():
        sys.stdout.flush()
        err.print("interrupted: the composites found until then were written")
        raise typer.Exit(130)


def _config(doc: ast.Document, wanted: list[str] | None, tick: int, lateness: str,
            horizon: str, composite_limit: int | None) -> EngineConfig:
    """The admitting engine's configuration; exit 2 if --horizon or --lateness is not a span."""
    from eva.engine import EngineConfig
    from eva.retention import longest, retention

    horizon_us = None if horizon == "inf" else span_option(horizon, "horizon") or 0
    if horizon_us is not None and horizon_us <= 0:
        fail(f"--horizon {horizon!r}: expected a positive span such as 1d, or inf")
    # Ids are remembered for the profiles' retention even when they are evaluated elsewhere
    # (--via, --engine spark), so every path refuses the same duplicates.
    return EngineConfig(tick=tick, allowed_lateness=span_option(lateness, "lateness") or 0,
                        remember=longest(retention(p.expr).horizon for p in doc.profiles
                                         if not wanted or p.name in wanted),
                        horizon=horizon_us, composite_limit=composite_limit)


def _summary(names: list[str], counts: Counter[str], letters: int) -> None:
    """--summary: the composites of each profile replayed, and the dead letters, to stderr."""
    from rich.table import Table

    table = Table(title="composites per profile")
    table.add_column("profile")
    table.add_column("composites", justify="right")
    for name in names:
        table.add_row(name, str(counts[name]))
    table.add_row("dead letters", str(letters))
    print_table(table, err)


@contextmanager
def _spinning(what: str) -> Iterator[None]:
    """A status line on stderr while something long runs (on a terminal only)."""
    if not remarks.is_terminal or remarks.quiet:
        yield
        return
    with remarks.status(what):
        yield


def _plot(path: Path, events: dict[str, Any], notes: list[Any]) -> None:
    """--plot: the trace and its composites as a picture (mediator.plots.timeline)."""
    from mediator.plots import PlotError, timeline

    trace = sorted(events.values(), key=lambda e: e.key)
    try:
        timeline(trace, notes, path)
    except PlotError as exc:
        fail(str(exc), one_line=True)
    remarks.print(f"{counted(len(trace), 'event')} and {counted(len(notes), 'composite')} drawn "
               f"in {path}", soft_wrap=True)


def _via(group: str, doc: ast.Document, wanted: list[str] | None, lines: runs.Lines,
         config: EngineConfig, end: int | None, address: str | None, out: TextIO,
         dead: runs.DeadLetters, emit: runs.Composites) -> Counter[str]:
    """:func:`runs.replay_via`; exit 2 if the service cannot be reached or refuses a query."""
    from rich.markup import escape

    from adapters.backends.native import Exhausted
    from adapters.federation import PushRefused
    from mediator.cli import runs

    try:
        return runs.replay_via(group, doc, wanted, lines, config, end, address, out, dead, emit)
    except (ConnectionError, Exhausted) as exc:  # (a query past the service's limits)
        fail(str(exc))
    except PushRefused as exc:  # a limit of the native language: one line, no traceback
        fail(escape(str(exc)), one_line=True)


def _native(group: str, query_file: Path, events_file: Path, end: int | None, tick: int,
            address: str | None) -> None:
    """:func:`runs.replay_native` of the query in ``query_file``, checked first: exit 2 with
    the parser's message if it is not UTF-8 or not a query of the group's language."""
    from adapters.backends.native import MAX_QUERY_BYTES, Exhausted, NativeQueryError
    from adapters.backends.registry import language
    from eva.parser import ProfileError, decode
    from mediator.cli import runs

    data = read_head(query_file, MAX_QUERY_BYTES)
    try:
        # Past the limit the parser refuses the size, whatever the cut left of a character.
        text = data.decode("utf-8", "replace") if len(data) > MAX_QUERY_BYTES else decode(
            data, str(query_file))
    except ProfileError as exc:  # the position of the first byte that is not UTF-8
        fail(str(exc), plain=True)
    try:
        language(group, tick).parse(text)
    except NativeQueryError as exc:
        fail(str(exc).replace(" query:", f" query {query_file}:", 1), plain=True)
    with ExitStack() as stack:
        try:
            runs.replay_native(group, text, event_lines(events_file, stack), end, tick, address,
                               sys.stdout, sys.stderr)
        except (ConnectionError, Exhausted) as exc:  # (a query past the service's limits)
            fail(str(exc))
