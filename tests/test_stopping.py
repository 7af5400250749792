"""``evamed serve`` stops on SIGINT, SIGTERM and SIGHUP — while it serves and while it starts —
and leaves nothing behind: its children (the readers of profile documents) end with it, also
when it is killed outright. (The demo's processes: tests/test_demo.py.)"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from mediator.client import MediatorClient
from tests.servers import free_port
from tests.test_service_e2e import EVAMED, Process, cli

MARKER = "EVAMED_STOPPING_TEST"
"""Set in the mediator's environment, inherited by its children: what is looked for."""

PROFILE = 'class J = type == "traffic.jam"\nprofile P = J\n'
READ_APART = PROFILE + " " * 5000 + "\n"
"""A document over 4 KiB (mediator.service.SMALL_DOCUMENT): read in a reader process, which the
mediator starts then — a child that must stop with it (a smaller one is read in-thread)."""


def running(tag: str) -> list[int]:
    """Processes whose environment carries ``MARKER=tag``."""
    needle = f"{MARKER}={tag}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if needle in (entry / "environ").read_bytes().split(b"\0"):
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def gone(tag: str, seconds: float) -> list[int]:
    deadline = time.monotonic() + seconds
    while (found := running(tag)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return found


def serve(config: Path, tag: str) -> subprocess.Popen[str]:
    return subprocess.Popen([EVAMED, "serve", "--config", str(config)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1", MARKER: tag})


def configured(tmp_path: Path, services: str = "") -> Path:
    config = tmp_path / "mediator.toml"
    config.write_text(f'listen = "127.0.0.1:{free_port()}"\n'
                      f'store = "sqlite:///{tmp_path / "m.db"}"\nlog_level = "INFO"\n' + services)
    return config


@pytest.mark.xdist_group("service")
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP],
                         ids=lambda s: s.name)
def test_each_stop_signal_stops_a_serving_mediator_and_its_children(tmp_path: Path,
                                                                    sig: signal.Signals) -> None:
    """With defaults but the store and port (the in-process composer). The profile read
    started a reader process: it goes too."""
    config = configured(tmp_path)
    token = cli("clients", "add", "alice", "--config", str(config)).strip()
    tag = str(tmp_path)
    mediator = serve(config, tag)
    try:
        assert mediator.stdout is not None
        line = mediator.stdout.readline()
        assert line.startswith("serving on 127.0.0.1:"), line
        with MediatorClient(line.split()[-1], token) as client:
            client.add_profile(READ_APART)
        assert len(running(tag)) >= 2  # the mediator and its reader
        sent = time.monotonic()
        mediator.send_signal(sig)
        _, stderr = mediator.communicate(timeout=30)
        assert mediator.returncode == 0, stderr[-2000:]
        assert time.monotonic() - sent < 10
        assert "stopped" in stderr
        assert gone(tag, 5) == []
    finally:
        if mediator.poll() is None:
            mediator.kill()


@pytest.mark.xdist_group("service")
def test_a_killed_mediator_leaves_no_child_running(tmp_path: Path) -> None:
    config = configured(tmp_path)
    token = cli("clients", "add", "alice", "--config", str(config)).strip()
    tag = str(tmp_path)
    mediator = serve(config, tag)
    assert mediator.stdout is not None
    line = mediator.stdout.readline()
    with MediatorClient(line.split()[-1], token) as client:
        client.add_profile(READ_APART)
    assert len(running(tag)) >= 2
    mediator.kill()
    mediator.communicate(timeout=30)
    assert gone(tag, 10) == []


@pytest.mark.xdist_group("service")
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP],
                         ids=lambda s: s.name)
def test_a_signal_while_starting_ends_the_start(tmp_path: Path, sig: signal.Signals) -> None:
    """A stored subscription uses a fed service that is down: the start gives it a moment to
    connect (and says so), and a signal meanwhile ends the process within seconds, status
    128 + the signal's number — nothing was accepted yet, nothing is lost."""
    service = Process("base-service", "--group", "cg2", "--listen", "127.0.0.1:0")
    try:
        config = configured(tmp_path, f'[[services]]\nname = "traffic"\ngroup = "cg2"\n'
                                      f'address = "{service.address}"\ntypes = ["traffic.*"]\n'
                                      'mode = "fed"\n')
        token = cli("clients", "add", "alice", "--config", str(config)).strip()
        first = Process("serve", "--config", str(config))
        with MediatorClient(first.address, token) as client:
            assert client.add_profile(PROFILE).plans == ("P: equivalent, traffic",)
        first.stop()
    finally:
        service.kill()
    tag = str(tmp_path)
    mediator = serve(config, tag)
    try:
        assert mediator.stderr is not None
        deadline = time.monotonic() + 60
        waiting = ""
        while "restoring 1 subscription at 1 service" not in waiting:
            waiting = mediator.stderr.readline()
            assert waiting and time.monotonic() < deadline, waiting
        time.sleep(0.3)  # in the wait for the fed service (mediator.pipeline.FED_GRACE)
        assert mediator.poll() is None
        sent = time.monotonic()
        mediator.send_signal(sig)
        out, _ = mediator.communicate(timeout=30)
        assert time.monotonic() - sent < 10
        assert mediator.returncode == 128 + sig
        assert "serving" not in out
        assert gone(tag, 5) == []
    finally:
        if mediator.poll() is None:
            mediator.kill()
