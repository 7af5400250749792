"""The processes the live demo starts — mosquitto, base services, the mediator — each in its own
process group with its output in a log file (a reader of the demo sees the demo, not Spark's or
a server's start-up lines), and all stopped at the end, also after Ctrl-C."""

from __future__ import annotations

import contextlib
import getpass
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

MARKER = "EVAMED_DEMO_RUN"


class DemoError(RuntimeError):
    """Something the demo needs did not start; the message says what and where to look."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def evamed() -> str:
    """The ``evamed`` script beside this interpreter (the one the demo runs under)."""
    found = Path(sys.executable).with_name("evamed")
    return str(found) if found.exists() else shutil.which("evamed") or "evamed"


class Child:
    """One started process: output to ``log``, its own process group (Ctrl-C in the terminal
    reaches the demo, which stops its children in order)."""

    def __init__(self, name: str, argv: list[str], logs: Path) -> None:
        self.name = name
        self.log = logs / f"{name}.log"
        self._out = open(self.log, "w", encoding="utf-8")  # noqa: SIM115 (closed by stop)
        self._drain: threading.Thread | None = None
        # MARKER names the run in each child's environment: what a test looks for to prove
        # nothing was left running.
        try:
            self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=self._out,
                                         text=True, start_new_session=True,
                                         env={**os.environ, "PYTHONUNBUFFERED": "1",
                                              MARKER: str(logs.parent)})
        except OSError:
            self._out.close()
            raise
        self.address = ""

    def serving(self, timeout: float) -> str:
        """Wait for the "serving … on HOST:PORT" line an evamed server prints once it answers."""
        assert self.proc.stdout is not None
        deadline = time.monotonic() + timeout
        line = ""
        while time.monotonic() < deadline and not line:
            line = self.proc.stdout.readline()
            if not line and self.proc.poll() is not None:
                break
        if not line.startswith("serving "):
            tail = self.log.read_text(encoding="utf-8", errors="replace")[-1500:]
            raise DemoError(f"{self.name} did not start (log {self.log}):\n{line}{tail}")
        self.address = line.split()[-1]
        # What it prints later goes to its log (a full pipe would block it).
        self._drain = threading.Thread(target=self._copy, daemon=True, name=f"demo-{self.name}")
        self._drain.start()
        return self.address

    def _copy(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._out.write(line)

    def stop(self) -> None:
        """SIGTERM to the process itself (a mediator stops its Spark jobs in order), then to
        its whole group if it has not ended within 15 s."""
        if self.proc.poll() is None:
            try:
                self.proc.terminate()
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        with contextlib.suppress(ProcessLookupError):  # what it left in its group (Spark's JVM)
            os.killpg(self.proc.pid, signal.SIGKILL)
        if self._drain is not None:
            self._drain.join(timeout=5)
        self._out.close()


def mosquitto(directory: Path, logs: Path, stack: Stack) -> int:
    """Debian's mosquitto on a free loopback port (``make demo`` installs it when missing)."""
    binary = shutil.which("mosquitto") or shutil.which("mosquitto", path="/usr/sbin")
    if binary is None:
        raise DemoError("mosquitto is not installed: `make demo` installs it (Debian: apt-get "
                        "install mosquitto)")
    port = free_port()
    config = directory / "mosquitto.conf"
    config.write_text("\n".join([
        f"listener {port} 127.0.0.1",
        f"user {getpass.getuser()}",  # started as root it would switch to a user who cannot log here
        "allow_anonymous true",
        "persistence false",
        f"log_dest file {logs / 'mosquitto.log'}",
    ]) + "\n")
    child = stack.add(Child("mosquitto-stdout", [binary, "-c", str(config)], logs))
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return port
        if child.proc.poll() is not None:
            break
        time.sleep(0.05)
    raise DemoError(f"mosquitto did not start on port {port} (log {logs / 'mosquitto.log'})")


class Stack:
    """What the demo started, stopped in reverse order."""

    def __init__(self) -> None:
        self.children: list[Child] = []

    def add(self, child: Child) -> Child:
        self.children.append(child)
        return child

    def stop(self) -> None:
        for child in reversed(self.children):
            child.stop()
        self.children = []
