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


def _demo_until(workdir: Path, marker: str) -> subprocess.Popen[str]:
    """``evamed demo`` (in process, a day of a minute) read until a line holding ``marker``."""
    demo = subprocess.Popen([EVAMED, "demo", "--composer", "inprocess", "--seconds", "60",
                             "--workdir", str(workdir)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    assert demo.stdout is not None
    deadline = time.monotonic() + 120
    for line in demo.stdout:
        if marker in line or time.monotonic() > deadline:
            break
    assert demo.poll() is None, demo.communicate()
    return demo


def _gone(workdir: Path, seconds: float) -> list[int]:
    """What of the run is still running after up to ``seconds``."""
    deadline = time.monotonic() + seconds
    while (found := left_running(workdir)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return found


STARTING = "services (each with producers"  # the base services run, the mediator is starting
SUBSCRIBED = "subscriptions and their plans"  # the clients have registered their profiles
PLAYING = "the day"                           # the day plays


@pytest.mark.xdist_group("service")
@pytest.mark.parametrize(("sig", "moment"), [
    pytest.param(sig, moment, id=f"{sig.name}-{name}") for sig, moment, name in (
        (signal.SIGINT, PLAYING, "playing"), (signal.SIGTERM, PLAYING, "playing"),
        (signal.SIGTERM, STARTING, "starting"), (signal.SIGHUP, SUBSCRIBED, "subscribed"),
        (signal.SIGINT, STARTING, "starting"))])
def test_a_signalled_demo_stops_everything_it_started(tmp_path: Path, sig: signal.Signals,
                                                      moment: str) -> None:
    """SIGINT (Ctrl-C), SIGTERM or SIGHUP at any moment of the demo: it stops what it started
    and exits with 128 + the signal's number, saying so — within seconds, the children
    stopped together rather than one after the other."""
    workdir = tmp_path / "run"
    demo = _demo_until(workdir, moment)
    if moment == PLAYING:
        # mosquitto, five base services and the mediator (the demo's profile documents are
        # small: read in the registering thread, no reader process is started)
        assert len(left_running(workdir)) == 7
    sent = time.monotonic()
    demo.send_signal(sig)
    rest, _ = demo.communicate(timeout=60)
    print(f"{sig.name} at {moment!r}: stopped in {time.monotonic() - sent:.1f} s")
    assert demo.returncode == 128 + sig, rest[-2000:]
    assert f"stopped by {sig.name}: everything the demo started was stopped" in rest
    assert left_running(workdir) == []


@pytest.mark.xdist_group("service")
def test_a_second_signal_kills_what_is_left_at_once(tmp_path: Path) -> None:
    workdir = tmp_path / "run"
    demo = _demo_until(workdir, PLAYING)
    demo.send_signal(signal.SIGTERM)
    time.sleep(0.3)  # stopping the mediator: its drain
    sent = time.monotonic()
    demo.send_signal(signal.SIGINT)
    rest, _ = demo.communicate(timeout=30)
    assert time.monotonic() - sent < 10
    assert demo.returncode in (128 + signal.SIGINT, 128 + signal.SIGTERM), rest[-2000:]
    assert _gone(workdir, 5) == []


@pytest.mark.xdist_group("service")
def test_a_killed_demo_takes_its_children_with_it(tmp_path: Path) -> None:
    """SIGKILL leaves the demo no chance to stop anything: each child has the parent-death
    signal (SIGTERM) and stops by itself — nothing stays running under PID 1."""
    workdir = tmp_path / "run"
    demo = _demo_until(workdir, PLAYING)
    demo.kill()
    demo.communicate(timeout=30)
    assert _gone(workdir, 20) == []


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
