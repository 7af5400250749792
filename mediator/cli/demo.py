"""``evamed demo``: the whole system live on this machine (mediator.demo)."""

from __future__ import annotations

import signal
import tempfile
from enum import StrEnum
from pathlib import Path
from types import FrameType
from typing import Annotated

import typer

from mediator.cli.common import fail, require_spark


class Composer(StrEnum):
    spark = "spark"
    inprocess = "inprocess"


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
"""Each stops the demo and everything it started: Ctrl-C, a kill, the terminal closing."""


def demo(
    composer: Annotated[Composer, typer.Option(
        help="Where the mediator composes: the Spark streaming job (the default here: the "
             "demo shows the whole system; needs the spark extra and Java 17), or in process "
             "(`evamed serve`'s default).")] = Composer.spark,
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
    Ctrl-C, SIGTERM or SIGHUP (a second one: killed at once), and dies with the demo if it is
    killed outright. Needs mosquitto (`make demo` installs it) and, for the Spark composer,
    Java 17.

    Example: evamed demo --seconds 20
    """
    import subprocess

    from mediator.client import MediatorError
    from mediator.demo import DemoError, Stopped, run

    if composer is Composer.spark:
        require_spark("evamed demo with the Spark composer (--composer inprocess runs without)")
    if workdir is None:
        workdir = Path(tempfile.mkdtemp(prefix="evamed-demo-"))
    elif workdir.exists() and (not workdir.is_dir() or any(workdir.iterdir())):
        fail(f"--workdir {workdir} is not an empty directory: give a new or empty one")

    def stop(signum: int, frame: FrameType | None) -> None:
        raise Stopped(signum)

    for sig in STOP_SIGNALS:
        signal.signal(sig, stop)
    try:
        workdir.mkdir(parents=True, exist_ok=True)
        ok = run(workdir, composer=str(composer), seconds=seconds)
    except DemoError as exc:
        fail(str(exc))
    except (OSError, subprocess.CalledProcessError, MediatorError) as exc:
        fail(f"the demo stopped: {exc} (the servers' logs are in {workdir / 'logs'}; "
             "everything started was stopped)", one_line=True)
    except (Stopped, KeyboardInterrupt) as exc:
        signum = exc.signum if isinstance(exc, Stopped) else signal.SIGINT
        for sig in STOP_SIGNALS:  # the message is printed whatever comes now
            signal.signal(sig, signal.SIG_IGN)
        print(f"stopped by {signal.Signals(signum).name}: everything the demo started was "
              "stopped", flush=True)
        raise typer.Exit(128 + signum) from None
    raise typer.Exit(0 if ok else 1)
