"""The ``evamed`` command line: check profiles, replay traces, run the composition job and
the base services.

Every user error exits with status 2 and a message that says where and what; never a traceback.
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import replace
from pathlib import Path
from typing import Annotated, Any, TextIO

import typer
from rich.console import Console
from rich.table import Table

from adapters.backends.registry import GROUPS
from eva import ast
from eva.engine import DeadLetter, Engine, EngineConfig
from eva.events import Event, EventError, format_time, from_json_line
from eva.notify import composite_line, dead_letter_record
from eva.parser import ProfileError, decode, parse
from eva.reference import Notification
from eva.retention import longest, retention
from eva.units import format_span, parse_span
from eva.validate import MAX_DOCUMENT_BYTES

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="The EVA event mediator: check profiles, replay event traces.")
err = Console(stderr=True)


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
) -> None:
    pass


def _read_head(path: Path, limit: int) -> bytes:
    """A file's bytes, at most ``limit`` + 1 of them: one byte past the limit is enough for the
    parser to refuse the file without reading it whole. Bytes: the parser reports one that is
    not UTF-8 at its line and column. Exit 2 if the file cannot be read."""
    try:
        with path.open("rb") as file:
            return file.read(limit + 1)
    except OSError as exc:
        err.print(f"[red]error:[/] cannot read {path}: {exc.strerror}")
        raise typer.Exit(2) from None


def _load(path: Path) -> ast.Document:
    source = _read_head(path, MAX_DOCUMENT_BYTES)
    try:
        return parse(source, str(path))
    except ProfileError as exc:
        print(str(exc), file=sys.stderr)
        raise typer.Exit(2) from None


def _known_profiles(doc: ast.Document, wanted: list[str] | None, path: Path) -> list[str]:
    """The document's profile names; exit 2 if ``--profile`` names one it does not have."""
    names = [p.name for p in doc.profiles]
    for name in wanted or []:
        if name not in names:
            err.print(f"[red]error:[/] no profile {name!r} in {path}; "
                      f"expected one of: {', '.join(names)}")
            raise typer.Exit(2)
    return names


def _classes_of(doc: ast.Document, profile: ast.Profile) -> list[str]:
    used = {n.name for n in ast.walk(profile.expr) if isinstance(n, ast.Prim)}
    return [c.name for c in doc.classes if c.name in used]


def _operators(expr: ast.Expr) -> list[str]:
    names = {ast.Disjunction: "disjunction", ast.Conjunction: "conjunction",
             ast.Sequence: "sequence", ast.Negation: "negation", ast.Selection: "selection"}
    return [names[type(n)] for n in ast.walk(expr) if type(n) in names]


@app.command()
def check(file: Annotated[Path, typer.Argument(help="A profile file.")]) -> None:
    """Parse and validate a profile file; summarise each profile."""
    doc = _load(file)
    table = Table(title=f"{file}: {len(doc.classes)} classes, {len(doc.profiles)} profiles")
    for column in ("profile", "classes", "operators", "per", "evaluation", "retention"):
        table.add_column(column)
    for profile in doc.profiles:
        r = retention(profile.expr)
        kept = format_span(r.horizon) if r.horizon is not None else f"unbounded ({r.reason})"
        table.add_row(profile.name, ", ".join(_classes_of(doc, profile)),
                      ", ".join(_operators(profile.expr)) or "primitive",
                      profile.per or "-", str(profile.evaluation), kept)
    Console().print(table)


def _span_option(text: str | None, name: str) -> int | None:
    if text is None:
        return None
    try:
        value = parse_span(text)
    except (KeyError, ValueError):
        value = None
    if value is None:
        err.print(f"[red]error:[/] --{name} {text!r}: expected a finite span such as 1s or 500ms")
        raise typer.Exit(2)
    return value


def _time_option(text: str | None, name: str) -> int | None:
    if text is None:
        return None
    from eva.events import parse_time

    try:
        return parse_time(text)
    except EventError as exc:
        err.print(f"[red]error:[/] --{name}: {exc}")
        raise typer.Exit(2) from None


@app.command()
def replay(
    events: Annotated[Path, typer.Option(help="CloudEvents, one JSON object per line ('-': stdin).")],
    profiles: Annotated[Path | None, typer.Option(help="Profile file.")] = None,
    profile: Annotated[list[str] | None, typer.Option(help="Only this profile (repeatable).")] = None,
    dead_letter: Annotated[Path | None, typer.Option(help="Write dead letters here (JSON lines) "
                                                          "instead of stderr.")] = None,
    tick: Annotated[str, typer.Option(help="Default clock granularity for negations.")] = "1s",
    lateness: Annotated[str, typer.Option(help="Allowed lateness per source.")] = "0s",
    horizon: Annotated[str, typer.Option(help="How far ahead of the newest event time an event "
                                              "may lie; a further one is held until the next "
                                              "event (or --until) confirms the jump, else it "
                                              "is a dead letter (future). 'inf': no limit.")
                       ] = "1d",
    until: Annotated[str | None, typer.Option(help="End of the trace (RFC 3339); default: the "
                                                   "last event's time.")] = None,
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
) -> None:
    """Evaluate profiles over a trace; composites go to stdout as CloudEvents JSON lines.

    With --native G --query FILE, evaluate one native query of group G's language instead;
    its notifications go to stdout as JSON lines."""
    tick_us = _span_option(tick, "tick") or 0
    if tick_us <= 0:
        err.print(f"[red]error:[/] --tick {tick!r}: expected a positive span such as 1s")
        raise typer.Exit(2)
    end = _time_option(until, "until")
    for option, value in (("via", via), ("native", native)):
        if value is not None and value not in GROUPS:
            err.print(f"[red]error:[/] --{option} {value!r}: expected one of {', '.join(GROUPS)}")
            raise typer.Exit(2)
    if native is not None:
        if query is None or profiles is not None or via is not None:
            err.print("[red]error:[/] --native takes --query (and no --profiles or --via)")
            raise typer.Exit(2)
        _replay_native(native, query, events, end, tick_us, service)
        return
    if profiles is None:
        err.print("[red]error:[/] --profiles is required (or --native G --query FILE)")
        raise typer.Exit(2)
    if engine_name not in ("inprocess", "spark"):
        err.print(f"[red]error:[/] --engine {engine_name!r}: expected inprocess or spark")
        raise typer.Exit(2)
    if engine_name == "spark" and via is not None:
        err.print("[red]error:[/] --engine spark and --via exclude each other")
        raise typer.Exit(2)
    if engine_name == "spark":
        _require_java()
    doc = _load(profiles)
    names = _known_profiles(doc, profile, profiles)
    horizon_us = None if horizon == "inf" else _span_option(horizon, "horizon") or 0
    if horizon_us is not None and horizon_us <= 0:
        err.print(f"[red]error:[/] --horizon {horizon!r}: expected a positive span such as 1d, "
                  "or inf")
        raise typer.Exit(2)
    # Ids are remembered for the profiles' retention even when they are evaluated elsewhere
    # (--via, --engine spark), so every path refuses the same duplicates.
    config = EngineConfig(tick=tick_us, allowed_lateness=_span_option(lateness, "lateness") or 0,
                          remember=_longest_retention(doc, profile))
    on_spark = engine_name == "spark"
    letters = 0
    sink: TextIO = sys.stderr

    def on_dead(letter: DeadLetter) -> None:
        nonlocal letters
        letters += 1
        sink.write(json.dumps(dead_letter_record(letter)) + "\n")

    # The horizon is an admission rule: engines that evaluate what this one admitted (Spark's,
    # one per bucket) must not apply it again to their own, partial, newest event time.
    engine = Engine(replace(config, horizon=horizon_us), on_dead)
    if via is None and not on_spark:  # otherwise it only admits events (watermarks, letters)
        engine.add_document(doc, profile or None)
    counts: Counter[str] = Counter()
    admitted: list[Event] = []
    if via is not None or on_spark:
        # Filled by the engine as it admits: an event held beyond the horizon is decided by
        # the next one, so "refused or not" is not known when a line is pushed.
        engine.admitted = admitted

    def emit(notifications: list[Notification]) -> None:
        for n in notifications:
            counts[n.profile] += 1
            sys.stdout.write(composite_line(n)[1] + "\n")

    with ExitStack() as stack:
        if dead_letter:
            sink = stack.enter_context(open(dead_letter, "w", encoding="utf-8"))
        for number, line in _event_lines(events, stack):
            try:
                event = from_json_line(line, seq=number)
            except EventError as exc:
                engine.malformed(f"line {number}: {exc}", _raw(line))
                continue
            emit(engine.push(event))
        emit(engine.close(end))
    # Numbered in arrival order, as the in-process engine numbers the events it admits.
    admitted = [replace(e, seq=seq) for seq, e in enumerate(admitted)]
    if via is not None:
        for n in _replay_via(via, doc, profile or None, admitted, config, engine.origin, end,
                             service):
            counts[n.profile] += 1
            sys.stdout.write(composite_line(n)[1] + "\n")
    if on_spark and admitted and engine.origin is not None:
        from spark_jobs.batch import replay as spark_replay
        from spark_jobs.session import build_session

        last = end if end is not None else max(e.time for e in admitted)
        for composite in spark_replay(build_session(master), profiles.read_text(encoding="utf-8"),
                                      admitted, config=config, origin=engine.origin, end=last,
                                      profiles=profile or None):
            counts[json.loads(composite)["subject"]] += 1
            sys.stdout.write(composite + "\n")
    if summary:
        table = Table(title="composites per profile")
        table.add_column("profile")
        table.add_column("composites", justify="right")
        for name in profile or names:
            table.add_row(name, str(counts[name]))
        table.add_row("dead letters", str(letters))
        err.print(table)


def _require_java() -> None:
    """Exit 2 with what to install, before Spark starts, if there is no Java."""
    from spark_jobs.session import java_missing

    missing = java_missing()
    if missing is not None:
        err.print(f"[red]error:[/] {missing}", soft_wrap=True)  # one line
        raise typer.Exit(2)


def _longest_retention(doc: ast.Document, wanted: list[str] | None) -> int | None:
    """The longest retention horizon of the profiles replayed; None if one is unbounded."""
    return longest(retention(p.expr).horizon for p in doc.profiles if not wanted or p.name in wanted)


def _raw(line: bytes) -> str:
    """A line as a dead letter's ``raw`` text: bytes that are not UTF-8 written as \\xNN."""
    return line.rstrip(b"\n").decode("utf-8", "backslashreplace")


def _event_lines(path: Path, stack: ExitStack) -> Iterator[tuple[int, bytes]]:
    """(line number, line) of a JSON-lines file or stdin ('-'), blank lines skipped; exit 2 if
    the file cannot be read. Bytes: each line is decoded on its own (events.from_json_line), so
    one that is not UTF-8 is a dead letter, not the end of the run — the same from a file and
    from stdin (whose text layer would turn such bytes into lone surrogates)."""
    try:
        handle = sys.stdin.buffer if str(path) == "-" else stack.enter_context(
            open(path, "rb"))  # noqa: SIM115 - the caller's ExitStack closes it
    except OSError as exc:
        err.print(f"[red]error:[/] cannot read {path}: {exc.strerror}")
        raise typer.Exit(2) from None
    for number, line in enumerate(handle, start=1):
        if line.strip():
            yield number, line


def _transport(group: str, tick: int, address: str | None) -> Any:
    from adapters.backends.registry import language
    from mediator.federation import in_process

    if address is None:
        return in_process(language(group, tick))
    from adapters.client import remote_transport

    return remote_transport(address, group)


def _replay_via(group: str, doc: ast.Document, profiles: list[str] | None, events: list[Event],
                config: EngineConfig, start: int | None, end: int | None,
                address: str | None) -> list[Notification]:
    """``start``: where the admitting engine's clock started, so both paths share it."""
    from rich.markup import escape

    from adapters.backends.registry import language
    from mediator.federation import PushRefused, via

    try:
        out, _, _ = via(language(group, config.tick), doc, events, profiles=profiles, start=start,
                        end=end, tick=config.tick,
                        transport=_transport(group, config.tick, address))
    except ConnectionError as exc:
        err.print(f"[red]error:[/] {exc}")
        raise typer.Exit(2) from None
    except PushRefused as exc:  # a limit of the native language: one line, no traceback
        err.print(f"[red]error:[/] {escape(str(exc))}", soft_wrap=True)
        raise typer.Exit(2) from None
    return out


def _replay_native(group: str, query_file: Path, events_file: Path, end: int | None, tick: int,
                   address: str | None) -> None:
    from adapters.backends.native import MAX_QUERY_BYTES, NativeQueryError
    from adapters.backends.registry import language

    data = _read_head(query_file, MAX_QUERY_BYTES)
    try:
        # Past the limit the parser refuses the size, whatever the cut left of a character.
        text = data.decode("utf-8", "replace") if len(data) > MAX_QUERY_BYTES else decode(
            data, str(query_file))
    except ProfileError as exc:  # the position of the first byte that is not UTF-8
        print(str(exc), file=sys.stderr)
        raise typer.Exit(2) from None
    try:
        language(group, tick).parse(text)
    except NativeQueryError as exc:
        print(str(exc).replace(" query:", f" query {query_file}:", 1), file=sys.stderr)
        raise typer.Exit(2) from None
    trace: list[Event] = []
    with ExitStack() as stack:
        for number, line in _event_lines(events_file, stack):
            try:
                trace.append(from_json_line(line, seq=len(trace)))
            except EventError as exc:
                sys.stderr.write(json.dumps({"reason": "malformed", "detail": f"line {number}: {exc}",
                                             "raw": _raw(line)}) + "\n")
    trace.sort(key=lambda e: e.key)
    last = end if end is not None else (trace[-1].time if trace else 0)
    try:
        detections = _transport(group, tick, address)(text, trace, last)
    except ConnectionError as exc:
        err.print(f"[red]error:[/] {exc}")
        raise typer.Exit(2) from None
    for d in detections:
        record: dict[str, Any] = {"group": group, "time": format_time(d.time), "detection": d.text,
                                  "constituents": [e.id for e in d.constituents]}
        if d.extra:
            record["extra"] = d.extra
        sys.stdout.write(json.dumps(record, ensure_ascii=False) + "\n")


@app.command()
def explain(
    profiles: Annotated[Path, typer.Option(help="Profile file.")],
    profile: Annotated[list[str] | None, typer.Option(help="Only this profile (repeatable).")] = None,
    group: Annotated[list[str] | None, typer.Option(
        help="Language group cg0 … cg5 (repeatable); default: all groups.")] = None,
    all_groups: Annotated[bool, typer.Option(help="Every group (the default).")] = False,
    format: Annotated[str, typer.Option(help="text or json.")] = "text",
) -> None:
    """Show how each profile is planned for each language group: rules, kinds, post-filters,
    and what runs at the mediator."""
    from transforms.capability import PRESETS
    from transforms.explain import as_json, tree
    from transforms.planner import plan

    doc = _load(profiles)
    _known_profiles(doc, profile, profiles)
    for g in group or []:
        if g not in PRESETS:
            err.print(f"[red]error:[/] no group {g!r}; expected one of: {', '.join(PRESETS)}")
            raise typer.Exit(2)
    if format not in ("text", "json"):
        err.print(f"[red]error:[/] --format {format!r}: expected text or json")
        raise typer.Exit(2)
    if group and all_groups:
        err.print("[red]error:[/] --group and --all-groups exclude each other")
        raise typer.Exit(2)
    groups = group or list(PRESETS)
    plans = [(g, plan(p, doc, PRESETS[g])) for p in doc.profiles
             if not profile or p.name in profile for g in groups]
    if format == "json":
        print(json.dumps([as_json(p, _renderer(g, doc)) for g, p in plans], indent=2,
                         ensure_ascii=False))
        return
    console = Console()
    for g, p in plans:
        console.print(tree(p, _renderer(g, doc)))


def _renderer(group: str, doc: ast.Document) -> Any:
    """A remote's target in the group's native language, as the service is asked for it."""
    from adapters.backends.native import Unrenderable, native_text
    from adapters.backends.registry import language
    from transforms.plan import Remote

    lang = language(group)

    def render(node: Remote) -> str:
        try:
            return native_text(lang, node.target, doc)
        except Unrenderable as exc:
            return f"(the mediator's own feed: {exc})"

    return render


@app.command()
def compose(
    checkpoint: Annotated[Path, typer.Option(help="Spark checkpoint directory: a restarted job "
                                                  "resumes from it, losing and repeating "
                                                  "nothing.")],
    profiles: Annotated[Path | None, typer.Option(help="Profile file, registered at --since.")]
        = None,
    table: Annotated[Path | None, typer.Option(help="A profile table kept by the mediator "
                                                    "(followed while the job runs), instead "
                                                    "of --profiles.")] = None,
    since: Annotated[str | None, typer.Option(
        help="Registration time of --profiles (RFC 3339): they see later events. Default: "
             "the first event, as replay registers (its time − lateness).")] = None,
    spool: Annotated[Path | None, typer.Option(help="Directory of CloudEvents JSON-lines "
                                                    "files, taken in modification order.")]
        = None,
    redis: Annotated[str | None, typer.Option(help="Redis URL: read the notification log and "
                                                   "write composites back, instead of "
                                                   "--spool/--out.")] = None,
    out: Annotated[Path | None, typer.Option(help="With --spool: composites and dead letters "
                                                  "here, a file per micro-batch.")] = None,
    tick: Annotated[str, typer.Option(help="Default clock granularity for negations.")] = "1s",
    lateness: Annotated[str, typer.Option(help="Allowed lateness per source.")] = "0s",
    source: Annotated[list[str] | None, typer.Option(
        help="Declare a source (repeatable): nothing is processed until each has reported, "
             "and each has its own watermark.")] = None,
    buckets: Annotated[int, typer.Option(help="Engines per profile (hash buckets of `per` "
                                              "partitions).")] = 16,
    max_files: Annotated[int | None, typer.Option(help="Spool files per micro-batch.")] = None,
    master: Annotated[str, typer.Option(help="Spark master.")] = "local[2]",
    once: Annotated[bool, typer.Option(help="Process what is there now, then stop.")] = False,
) -> None:
    """Run the streaming composition job (Spark Structured Streaming): profiles over a spool
    directory or the Redis notification log, until stopped (SIGINT/SIGTERM) or, with --once,
    until the input present at the start is processed."""
    import signal

    from spark_jobs.redis_io import redis_lines, redis_sink
    from spark_jobs.session import build_session
    from spark_jobs.streaming import (
        LayoutError,
        Registration,
        StreamJob,
        check_layout,
        config_tuple,
        directory_sink,
        refusal,
        start,
        write_table,
    )

    if (profiles is None) == (table is None):
        err.print("[red]error:[/] give --profiles or --table (one of them)")
        raise typer.Exit(2)
    if (redis is None) == (spool is None) or (spool is not None and out is None):
        err.print("[red]error:[/] give --spool with --out, or --redis")
        raise typer.Exit(2)
    if buckets < 1:
        err.print(f"[red]error:[/] --buckets {buckets}: expected a positive number")
        raise typer.Exit(2)
    _require_java()
    tick_us = _span_option(tick, "tick") or 1_000_000
    late_us = _span_option(lateness, "lateness") or 0
    config = EngineConfig(tick=tick_us, allowed_lateness=late_us, sources=tuple(source or ()))
    delay = f"{late_us // 1000} milliseconds"  # Spark's watermark delay: the same lateness
    checkpoint.mkdir(parents=True, exist_ok=True)
    if profiles is not None:
        _load(profiles)  # exit 2 with the parser's message
        table = checkpoint / "profiles.json"
        registered = _time_option(since, "since")  # None: at the job's first event
        write_table(str(table), [Registration(profiles.read_text(encoding="utf-8"), registered)])
    elif table is not None and not table.is_file():
        err.print(f"[red]error:[/] no profile table at {table}")
        raise typer.Exit(2)
    assert table is not None
    job = StreamJob(str(table), config_tuple(config), buckets)
    try:  # before Spark starts (start checks again, for its other callers)
        check_layout(str(checkpoint / "spark"), job)
    except LayoutError as exc:
        err.print(f"[red]error:[/] {exc}", soft_wrap=True)
        raise typer.Exit(2) from None
    spark = build_session(master, "evamed-compose")
    if redis is not None:
        query = start(spark, job, "", str(checkpoint / "spark"), redis_sink(redis),
                      lines=redis_lines(spark, redis), lateness=delay)
    else:
        assert spool is not None and out is not None
        query = start(spark, job, str(spool), str(checkpoint / "spark"),
                      directory_sink(str(out)), lateness=delay, max_files=max_files)
    try:
        if once:
            query.processAllAvailable()
            query.stop()
            return
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: query.stop())
        query.awaitTermination()
    except Exception as exc:  # the query failed in Spark: refused checkpoint state in one line
        refused = refusal(exc)
        if refused is None:
            raise
        err.print(f"[red]error:[/] {refused}", soft_wrap=True)
        raise typer.Exit(2) from None


@app.command("base-service")
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
) -> None:
    """Run the reference base service of a language group: eva.base.v1.BaseService (native
    queries in, native notifications out), standard health checking and server reflection.
    SIGTERM or SIGINT: health says NOT_SERVING for a second, then calls get 2 s to finish."""
    import asyncio

    from adapters.backends.service import run

    if group not in GROUPS:
        err.print(f"[red]error:[/] --group {group!r}: expected one of {', '.join(GROUPS)}")
        raise typer.Exit(2)
    tick_us = _span_option(tick, "tick") or 1_000_000
    host = listen.rsplit(":", 1)[0]
    try:
        asyncio.run(run(group, listen, lambda port: print(f"serving {group} on {host}:{port}",
                                                          flush=True), tick_us, queue_size,
                        _span_option(max_advance, "max-advance"),
                        stall_timeout=(_span_option(stall_timeout, "stall-timeout") or 1) / 1e6))
    except (OSError, RuntimeError) as exc:  # the port is taken (no sharing) or not ours
        err.print(f"[red]error:[/] {exc}")
        raise typer.Exit(2) from None


def main() -> None:
    app()


__all__ = ["app", "main"]
