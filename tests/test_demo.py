"""The live demo (``evamed demo``) with real processes: mosquitto, five base services, the
mediator and its clients; its composites equal replay's, and everything it started is stopped,
also when it is interrupted."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from mediator.demo.processes import MARKER
from tests.test_service_e2e import EVAMED


def left_running(workdir: Path) -> list[int]:
    """Processes whose environment names this run."""
    found = []
    needle = f"{MARKER}={workdir}".encode()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if needle in (entry / "environ").read_bytes().split(b"\0"):
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


@pytest.mark.xdist_group("service")
def test_the_demo_plays_the_day_and_agrees_with_replay(tmp_path: Path) -> None:
    workdir = tmp_path / "run"
    out = subprocess.run([EVAMED, "demo", "--composer", "inprocess", "--seconds", "3",
                          "--workdir", str(workdir)], capture_output=True, text=True,
                         timeout=300, env={**os.environ, "COLUMNS": "100"})
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert ("the 58 live composites are exactly what `evamed replay` computes over the merged "
            "trace of all producers") in out.stdout
    assert "P6 \"T1\"  through mediator; composed at the mediator" in out.stdout
    assert "P8 \"C\"  through orders, warehouse; composed at the mediator" in out.stdout
    assert "P1  through traffic, mediator; composed at the mediator" in out.stdout
    assert "truck.location  mqtt://fleet-radio/T1" in out.stdout  # the events, not only ids
    assert "every service a plan assigns is subscribed there" in out.stdout
    assert "dead letters: none" in out.stdout
    assert out.stderr == ""  # the servers' lines went to their logs
    assert (workdir / "logs" / "mediator.log").exists()
    assert left_running(workdir) == []


@pytest.mark.xdist_group("service")
def test_an_interrupted_demo_stops_everything_it_started(tmp_path: Path) -> None:
    workdir = tmp_path / "run"
    demo = subprocess.Popen([EVAMED, "demo", "--composer", "inprocess", "--seconds", "60",
                             "--workdir", str(workdir)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    assert demo.stdout is not None
    deadline = time.monotonic() + 120
    for line in demo.stdout:
        if "the day" in line or time.monotonic() > deadline:
            break
    # mosquitto, five base services, the mediator and its reader of profile documents
    assert len(left_running(workdir)) == 8
    demo.send_signal(signal.SIGINT)
    rest, _ = demo.communicate(timeout=60)
    assert demo.returncode == 130, rest[-2000:]
    assert "everything the demo started was stopped" in rest
    assert left_running(workdir) == []


# With the other Spark tests (one JVM at a time): the demo as `make demo` runs it.
@pytest.mark.xdist_group("spark")
def test_the_demo_with_the_default_spark_composer_agrees_with_replay(tmp_path: Path) -> None:
    workdir = tmp_path / "run"
    out = subprocess.run([EVAMED, "demo", "--seconds", "5", "--workdir", str(workdir)],
                         capture_output=True, text=True, timeout=600,
                         env={**os.environ, "COLUMNS": "100"})
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "composer spark" in out.stdout
    assert "the 58 live composites are exactly what `evamed replay` computes" in out.stdout
    assert "every service a plan assigns is subscribed there" in out.stdout
    assert out.stderr == ""  # Spark's lines went to its log
    assert (workdir / "evamed.db.spark" / "spark.log").exists()
    assert left_running(workdir) == []
