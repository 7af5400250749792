"""The processes the live demo starts — mosquitto, base services, the mediator — each in its own
process group with its output in a log file (a reader of the demo sees the demo, not Spark's or
a server's start-up lines), and all stopped at the end, also after Ctrl-C, SIGTERM or SIGHUP
(mediator/cli/demo.py turns those into :class:`Stopped`). Each child also dies with the demo:
on Linux it is started with a parent-death signal (``prctl(PR_SET_PDEATHSIG, SIGTERM)``), so a
demo killed outright (SIGKILL, a crash) leaves nothing running under PID 1 either."""

from __future__ import annotations

import contextlib
import ctypes
import getpass
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

MARKER = "EVAMED_DEMO_RUN"


class DemoError(RuntimeError):
    """Something the demo needs did not start; the message says what and where to look."""


class Stopped(BaseException):
    """A signal asked the demo to stop (SIGINT, SIGTERM, SIGHUP): raised where the demo is, so
    what it started is stopped on the way out. A BaseException, as KeyboardInterrupt: no
    ``except Exception`` on the way swallows it."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


PR_SET_PDEATHSIG = 1


def _parent_death_signal() -> Callable[[], None] | None:
    """What a child runs between fork and exec so that it gets SIGTERM when the demo dies:
    Linux's parent-death signal through libc's ``prctl`` (looked up now, in the parent: the
    child only calls it). None elsewhere."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    parent = os.getpid()

    def arm() -> None:
        prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
        if os.getppid() != parent:  # the demo died before the signal was armed
            os._exit(1)
    return arm


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
                                         preexec_fn=_parent_death_signal(),
                                         env={**os.environ, "PYTHONUNBUFFERED": "1",
                                              MARKER: str(logs.parent)})
        except OSError:
            self._out.close()
            raise
        self.address = ""

    def serving(self, timeout: float, waiting: Callable[[str], None] | None = None) -> str:
        """Wait for the "serving … on HOST:PORT" line an evamed server prints once it answers;
        meanwhile ``waiting`` is told each step ``evamed serve`` says it waits for (its "… "
        lines, in its log)."""
        assert self.proc.stdout is not None
        deadline = time.monotonic() + timeout
        line = ""
        done = threading.Event()
        if waiting is not None:
            threading.Thread(target=self._steps, args=(waiting, done), daemon=True,
                             name=f"demo-{self.name}-steps").start()
        try:
            while time.monotonic() < deadline and not line:
                line = self.proc.stdout.readline()
                if not line and self.proc.poll() is not None:
                    break
        finally:
            done.set()
        if not line.startswith("serving "):
            tail = self.log.read_text(encoding="utf-8", errors="replace")[-1500:]
            raise DemoError(f"{self.name} did not start (log {self.log}):\n{line}{tail}")
        self.address = line.split()[-1]
        # What it prints later goes to its log (a full pipe would block it).
        self._drain = threading.Thread(target=self._copy, daemon=True, name=f"demo-{self.name}")
        self._drain.start()
        return self.address

    def _steps(self, waiting: Callable[[str], None], done: threading.Event) -> None:
        """Each "… step" line the server writes to its log, as it comes, until ``done``."""
        seen = 0
        while not done.wait(0.3):
            try:
                lines = self.log.read_text(encoding="utf-8", errors="replace").splitlines()
            except OSError:
                continue
            for text in lines[seen:]:
                if text.startswith("… "):
                    waiting(text.removeprefix("… "))
            seen = len(lines)

    def _copy(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._out.write(line)

    def terminate(self) -> None:
        """SIGTERM to the process itself (a mediator stops its Spark jobs in order)."""
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.terminate()

    def stop(self, deadline: float) -> None:
        """Wait for it to end until the monotonic ``deadline`` (after :meth:`terminate`), then
        SIGKILL its whole group — also what it left there when it ended (Spark's JVM)."""
        if self.proc.poll() is None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=max(deadline - time.monotonic(), 0.1))
        self.kill()

    def kill(self) -> None:
        """SIGKILL to its whole group, at once; its log closed."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
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


STOP_SECONDS = 15.0
"""How long a child may take to stop after SIGTERM before its group is killed (a mediator:
its drain, 3 s, and its Spark jobs; a base service: 3 s)."""


class Stack:
    """What the demo started: stopped newest first — the mediator, so that it does not see its
    services go away under it — then all the others together (one SIGTERM each, then one wait:
    not a base service's three seconds after another's)."""

    def __init__(self) -> None:
        self.children: list[Child] = []

    def add(self, child: Child) -> Child:
        self.children.append(child)
        return child

    def stop(self) -> None:
        """Every child stopped (SIGTERM, then SIGKILL to its group after ``STOP_SECONDS``).
        A signal meanwhile (:class:`Stopped`, KeyboardInterrupt) kills what is left at once
        and is raised again."""
        try:
            children = list(reversed(self.children))
            for batch in (children[:1], children[1:]):
                for child in batch:
                    child.terminate()
                deadline = time.monotonic() + STOP_SECONDS
                for child in batch:
                    child.stop(deadline)
                    self.children.remove(child)
        except BaseException:
            self.kill()
            raise

    def kill(self) -> None:
        """SIGKILL to every child's group, at once."""
        for child in self.children:
            child.kill()
        self.children = []
