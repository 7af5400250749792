"""``evamed serve``: run the mediator (docs/operations.md, Run)."""

from __future__ import annotations

import gc
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from mediator.cli.common import fail, require_spark

if TYPE_CHECKING:
    from mediator.config import Config
    from mediator.server import Served


GC_THRESHOLD = (10_000, 10, 10)
"""The cyclic collector's thresholds while serving (Python's: 700, 10, 10): see
:func:`tune_gc`."""


def tune_gc() -> None:
    """A young collection every 10,000 net allocations rather than 700: a subscription's
    objects (its plans, runner and evaluators: thousands) live as long as it does, so each
    collection before they reach the old generation scans them in vain — ~5 % of registering
    10,000 profiles (docs/performance.md, "Registering profiles"). Nothing is frozen
    (``gc.freeze``): a subscription restored at start-up and removed later must still be
    collected."""
    gc.set_threshold(*GC_THRESHOLD)


class Composer(StrEnum):
    """Where composites are composed (mediator.config.COMPOSERS)."""

    inprocess = "inprocess"  # in the mediator's process (the default): milliseconds, no Java
    spark = "spark"          # the Spark streaming composer fed the event log: a cluster's scale


def serve(
    config: Annotated[Path | None, typer.Option(
        "--config", help="TOML configuration (docs/operations.md, Configure); EVAMED_* "
                         "environment variables override it, these options override both.",
        show_default=False)] = None,
    listen: Annotated[str | None, typer.Option(
        help="host:port to serve gRPC on (port 0: any free port). [default: 127.0.0.1:50060]",
        show_default=False)] = None,
    store: Annotated[str | None, typer.Option(
        help="The store: sqlite:///abs/path.db, sqlite://relative.db or "
             "redis://host:port/db. [default: sqlite://evamed.db]", show_default=False)] = None,
    composer: Annotated[Composer | None, typer.Option(
        help="inprocess (milliseconds, no Java) or spark (the Spark streaming job: needs "
             "the spark extra and Java 17). [default: inprocess]", show_default=False)] = None,
    check: Annotated[bool, typer.Option(
        "--check", help="Check the configuration and what it names (TLS files, the store's "
                        "directory, the composer's prerequisites), print what would run, and "
                        "exit: 0 if the mediator would start with it, 2 if not.")] = False,
) -> None:
    """Run the mediator: the eva.mediator.v1 API (subscriptions, Publish), standard health
    checking and server reflection, and the pipeline over the configured services.
    While it starts it says what it waits for (standard error); `serving on HOST:PORT` on
    standard output once it answers. SIGINT, SIGTERM or SIGHUP: health says NOT_SERVING,
    streams end (clients resume with their tokens), calls in flight and the pipeline get the
    configured drain (3 s) to finish; a second signal exits at once.

    Examples:

      evamed serve                                   # SQLite at ./evamed.db, port 50060

      evamed serve --config /etc/evamed/mediator.toml --check

      EVAMED_STORE=redis://127.0.0.1:6379/0 evamed serve --listen 0.0.0.0:50060
    """
    import asyncio
    import time

    from mediator import logs
    from mediator.cli.common import quiet, remarks
    from mediator.config import ConfigError, load
    from mediator.server import run
    from mediator.store import StoreError

    began = time.monotonic() - _running_for()
    options = {"listen": listen, "store": store,
               "composer": composer.value if composer is not None else None}
    try:
        settings = load(config, options={k: v for k, v in options.items() if v is not None})
    except ConfigError as exc:
        fail(str(exc), one_line=True)
    if settings.composer == "spark":
        require_spark('composer = "spark"')  # the pipeline starts Spark before it serves
    if check:
        for line in checked(settings, config):
            print(line)
        return
    logs.setup(settings.log_json, "WARNING" if quiet() and settings.log_level in (
        "DEBUG", "INFO") else settings.log_level)

    def progress(step: str) -> None:
        remarks.print(f"[dim]…[/] {escape(step)}", highlight=False, soft_wrap=True)

    def ready(served: Served) -> None:
        host = settings.listen.rsplit(":", 1)[0]
        print(f"serving on {host}:{served.port}", flush=True)
        remarks.print(f"[dim]ready in {time.monotonic() - began:.1f} s: composer "
                   f"{settings.composer}, store {escape(settings.store)}, "
                   f"{_count(len(settings.services), 'service')}; SIGINT, SIGTERM or SIGHUP "
                   "stops it[/]", highlight=False, soft_wrap=True)

    from rich.markup import escape

    from spark_jobs.session import SparkStartError  # the standard library only: cheap

    tune_gc()
    try:
        asyncio.run(run(settings, ready, progress))
    except (OSError, ValueError, StoreError, SparkStartError) as exc:  # a port taken, a TLS
        fail(str(exc), one_line=True)  # file, the store, Spark's JVM


def _running_for() -> float:
    """Seconds since this process started (Linux: /proc; elsewhere 0): what "ready in" counts
    includes the interpreter's start and the imports."""
    import os

    try:
        with open("/proc/self/stat", encoding="ascii") as stat:
            ticks = int(stat.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime", encoding="ascii") as uptime:
            since_boot = float(uptime.read().split()[0])
        return max(since_boot - ticks / os.sysconf("SC_CLK_TCK"), 0.0)
    except (OSError, ValueError, IndexError):
        return 0.0


def _count(n: int, noun: str) -> str:
    """``1 service``, ``2 services``."""
    return f"{n} {noun}{'' if n == 1 else 's'}"


def checked(settings: Config, path: Path | None) -> list[str]:
    """``serve --check``: what the mediator would run with ``settings``, after checking what
    the configuration names (exit 2 with the first problem): the TLS files (readable, a key
    that matches its certificate, a CA file), a SQLite store's directory (it must exist; the
    store is not opened, so nothing is created), the composer's prerequisites (checked by the
    caller). Redis, the services and the brokers are not contacted: they may be down while the
    configuration is right, and the mediator waits for them."""
    import ssl

    from eva.units import format_span
    from mediator.config import MqttSourceConfig
    from mediator.store import parse_store_url

    tls = settings.tls
    if tls.enabled:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        try:
            context.load_cert_chain(tls.cert, tls.key)
        except OSError as exc:
            fail(f"tls.cert {tls.cert} / tls.key {tls.key}: {exc.strerror or exc}", one_line=True)
        except ssl.SSLError as exc:
            fail(f"tls.cert {tls.cert} / tls.key {tls.key}: not a PEM certificate chain and its "
                 f"private key ({exc.reason or exc})", one_line=True)
        if tls.client_ca:
            try:
                context.load_verify_locations(tls.client_ca)
            except (OSError, ssl.SSLError) as exc:
                fail(f"tls.client_ca {tls.client_ca}: not a readable PEM CA file ({exc})",
                     one_line=True)
    url = parse_store_url(settings.store)
    if url.kind == "sqlite":
        folder = Path(url.target).expanduser().resolve().parent
        if not folder.is_dir():
            fail(f"store {settings.store}: the directory {folder} does not exist", one_line=True)
    where = str(path) if path is not None else "the defaults"
    security = ("TLS with client certificates" if tls.client_ca else "TLS") if tls.enabled \
        else "plaintext"
    lines = [f"configuration {where}: the mediator would start with it",
             f"  listen {settings.listen} ({security}), store {settings.store}"
             + (" (not contacted)" if url.kind == "redis" else ""),
             f"  composer {settings.composer}, tick {format_span(settings.tick)}, "
             f"drain {format_span(settings.drain)}"]
    for s in settings.services:
        mode = "autonomous" if s.autonomous else "fed"
        lines.append(f"  service {s.name}: {s.group}, {mode}, {s.address}, types "
                     f"{', '.join(s.types)}, sources {', '.join(s.sources)}")
    for source in settings.sources:
        kind = (f"mqtt {source.broker.host}:{source.broker.port}"
                if isinstance(source, MqttSourceConfig) else "redis")
        lines.append(f"  source {source.name}: {kind}")
    for sink in settings.sinks:
        lines.append(f"  sink {sink.name}: mqtt {sink.broker.host}:{sink.broker.port}, topic "
                     f"{sink.topic}")
    if not settings.services:
        lines.append("  no services: every profile is evaluated at the mediator")
    return lines
