"""``evamed compose``: the streaming composition job (Spark Structured Streaming)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from mediator.cli.common import fail, load, require_spark, span_option, time_option

if TYPE_CHECKING:
    from spark_jobs.job import StreamJob


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
    redis: Annotated[str | None, typer.Option(help="Redis URL: read the store's event log and "
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
    master: Annotated[str, typer.Option(help="Spark master: local[N], or a cluster's URL "
                                             "(spark://host:7077; docs/spark.md, \"On a "
                                             "cluster\").")] = "local[2]",
    once: Annotated[bool, typer.Option(help="Process what is there now, then stop.")] = False,
) -> None:
    """Run the streaming composition job (Spark Structured Streaming): profiles over a spool
    directory or the Redis notification log, until stopped (SIGINT/SIGTERM) or, with --once,
    until the input present at the start is processed.

    Example: evamed compose --profiles examples/logistics/profiles.eva --spool spool/ --out out/
    --checkpoint ckpt/ --once
    """
    import signal

    require_spark("evamed compose")  # before anything of Spark is imported
    from spark_jobs.job import start
    from spark_jobs.processor import refusal
    from spark_jobs.redis_io import redis_lines, redis_sink
    from spark_jobs.session import SparkStartError, build_session
    from spark_jobs.sinks import directory_sink

    if (profiles is None) == (table is None):
        fail("give --profiles or --table (one of them)")
    if (redis is None) == (spool is None) or (spool is not None and out is None):
        fail("give --spool with --out, or --redis")
    if buckets < 1:
        fail(f"--buckets {buckets}: expected a positive number")
    tick_us = span_option(tick, "tick") or 1_000_000
    late_us = span_option(lateness, "lateness") or 0
    delay = f"{late_us // 1000} milliseconds"  # Spark's watermark delay: the same lateness
    # Absolute: a cluster's executors run in directories of their own, where a relative path
    # (the profile table in the checkpoint) would name another file or none.
    checkpoint = checkpoint.resolve()
    spool, out, table = (None if p is None else p.resolve() for p in (spool, out, table))
    checkpoint.mkdir(parents=True, exist_ok=True)
    job = _job(checkpoint, profiles, table, since, tick_us, late_us, tuple(source or ()), buckets)
    try:
        spark = build_session(master, "evamed-compose", log=str(checkpoint / "spark.log"))
    except SparkStartError as exc:
        fail(str(exc), one_line=True)
    if redis is not None:
        query = start(spark, job, "", str(checkpoint / "spark"), redis_sink(redis),
                      lines=redis_lines(spark, redis), lateness=delay)
    else:
        assert spool is not None and out is not None
        query = start(spark, job, str(spool), str(checkpoint / "spark"),
                      directory_sink(str(out)), lateness=delay, max_files=max_files)
    try:
        with progress(query):
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
        fail(refused, one_line=True)


@contextmanager
def progress(query: Any) -> Iterator[None]:
    """On a terminal, a status line on stderr: the micro-batches done and the events they
    read, from the query's progress reports (Spark's own console bars are off)."""
    import threading

    from mediator.cli.common import err

    if not err.is_terminal:
        yield
        return
    done = threading.Event()

    def watch() -> None:
        seen: set[int] = set()
        events = 0
        with err.status("composing: waiting for the first micro-batch") as status:
            while not done.wait(1.0):
                for report in query.recentProgress or []:
                    batch = report.get("batchId") if isinstance(report, dict) else None
                    if isinstance(batch, int) and batch not in seen:
                        seen.add(batch)
                        events += int(report.get("numInputRows", 0) or 0)
                        status.update(f"composing: {len(seen)} micro-batches, {events:,} "
                                      "events read")

    watcher = threading.Thread(target=watch, daemon=True, name="evamed-compose-progress")
    watcher.start()
    try:
        yield
    finally:
        done.set()
        watcher.join(timeout=5)


def _job(checkpoint: Path, profiles: Path | None, table: Path | None, since: str | None,
         tick: int, lateness: int, sources: tuple[str, ...], buckets: int) -> StreamJob:
    """The job over the profile table: ``table``, or one written in the checkpoint for
    ``profiles`` (registered at ``since``); exit 2 if the profiles do not parse, the table is
    missing, or the checkpoint was written by a job of another layout."""
    from eva.engine import EngineConfig
    from spark_jobs.job import LayoutError, StreamJob, check_layout
    from spark_jobs.profiles import Registration, write_table

    if profiles is not None:
        load(profiles)  # exit 2 with the parser's message
        table = checkpoint / "profiles.json"
        registered = time_option(since, "since")  # None: at the job's first event
        write_table(str(table), [Registration(profiles.read_text(encoding="utf-8"), registered)])
    elif table is not None and not table.is_file():
        fail(f"no profile table at {table}")
    assert table is not None
    config = EngineConfig(tick=tick, allowed_lateness=lateness, sources=sources)
    job = StreamJob(str(table), config.to_json(), buckets)
    try:  # before Spark starts (start checks again, for its other callers)
        check_layout(str(checkpoint / "spark"), job)
    except LayoutError as exc:
        fail(str(exc), one_line=True)
    return job
