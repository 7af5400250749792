"""``evamed serve``: run the mediator (docs/operations.md, Run)."""

from __future__ import annotations

import gc
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from mediator.cli.common import fail, require_java

if TYPE_CHECKING:
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

    spark = "spark"          # the Spark streaming composer fed the event log (the default)
    inprocess = "inprocess"  # in the mediator's process: the lowest latency, no Java


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
        help="spark or inprocess. [default: spark]", show_default=False)] = None,
) -> None:
    """Run the mediator: the eva.mediator.v1 API (subscriptions, Publish), standard health
    checking and server reflection, and the pipeline over the configured services.
    SIGTERM or SIGINT: health says NOT_SERVING, streams end (clients resume with their
    tokens), calls in flight and the pipeline get the configured drain (3 s) to finish.

    Examples:

      evamed serve                                   # SQLite at ./evamed.db, port 50060

      evamed serve --config /etc/evamed/mediator.toml

      EVAMED_STORE=redis://127.0.0.1:6379/0 evamed serve --listen 0.0.0.0:50060
    """
    import asyncio

    from mediator import logs
    from mediator.config import ConfigError, load
    from mediator.server import run
    from mediator.store import StoreError

    options = {"listen": listen, "store": store,
               "composer": composer.value if composer is not None else None}
    try:
        settings = load(config, options={k: v for k, v in options.items() if v is not None})
    except ConfigError as exc:
        fail(str(exc), one_line=True)
    if settings.composer == "spark":
        require_java()  # the pipeline starts Spark before it serves
    logs.setup(settings.log_json, settings.log_level)

    def ready(served: Served) -> None:
        host = settings.listen.rsplit(":", 1)[0]
        print(f"serving on {host}:{served.port}", flush=True)

    from spark_jobs.session import SparkStartError  # the standard library only: cheap

    tune_gc()
    try:
        asyncio.run(run(settings, ready))
    except (OSError, ValueError, StoreError, SparkStartError) as exc:  # a port taken, a TLS
        fail(str(exc), one_line=True)  # file, the store, Spark's JVM
