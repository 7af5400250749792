"""``evamed demo``: the whole system live on this machine (mediator.demo)."""

from __future__ import annotations

import tempfile
from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer

from mediator.cli.common import fail


class Composer(StrEnum):
    spark = "spark"
    inprocess = "inprocess"


def demo(
    composer: Annotated[Composer, typer.Option(
        help="Where the mediator composes: the Spark streaming job (the default, as `evamed "
             "serve` does), or in process.")] = Composer.spark,
    seconds: Annotated[float, typer.Option(
        min=1, help="How long the day takes to play (the trucks' ten hours, compressed).")] = 30.0,
    workdir: Annotated[Path | None, typer.Option(
        help="Where the logs, the configuration and the store go (a new or empty directory; "
             "default: a new temporary one).", show_default=False)] = None,
) -> None:
    """Run the whole system live: mosquitto, five base services (each a company's existing
    service with producers of its own), the mediator with its Spark composer, and four clients
    subscribing the paper's profiles, while the logistics day is played — truck locations over
    MQTT to the mediator, every other event by its producer to its own service.

    Each composite is shown as it arrives, with its contributing events, the services they
    came through and what the mediator did; then a summary and a check against `evamed replay`
    over the merged trace of all producers. Everything started is stopped at the end, also on
    Ctrl-C. Needs mosquitto (`make demo` installs it) and, for the Spark composer, Java 17.

    Example: evamed demo --seconds 20
    """
    import subprocess

    from mediator.client import MediatorError
    from mediator.demo import DemoError, run

    if workdir is None:
        workdir = Path(tempfile.mkdtemp(prefix="evamed-demo-"))
    elif workdir.exists() and (not workdir.is_dir() or any(workdir.iterdir())):
        fail(f"--workdir {workdir} is not an empty directory: give a new or empty one")
    try:
        workdir.mkdir(parents=True, exist_ok=True)
        ok = run(workdir, composer=str(composer), seconds=seconds)
    except DemoError as exc:
        fail(str(exc))
    except (OSError, subprocess.CalledProcessError, MediatorError) as exc:
        fail(f"the demo stopped: {exc} (the servers' logs are in {workdir / 'logs'}; "
             "everything started was stopped)", one_line=True)
    except KeyboardInterrupt:
        print("interrupted: everything the demo started was stopped")
        raise typer.Exit(130) from None
    raise typer.Exit(0 if ok else 1)
