"""The README's tour runs as written: each block marked ``<!-- tour… -->`` is run from the
README's own text, in order, in a fresh directory — the profile written, checked, explained
and replayed; then the three shells of step 5 (the mediator with no configuration, a client
that saves its token and tails its subscription, a third shell that publishes and looks
around) and the Python snippet of step 6. (As tests/test_recipes.py does for docs/language.md.)

Two things differ from a person's run, and only these: the mediator listens on a free port
(``EVAMED_LISTEN``, ``EVAMED_SERVER``, and the address the text spells out replaced by it: the
machine runs other tests), and the token is saved under a temporary configuration directory
(``XDG_CONFIG_HOME``). ``.venv/bin`` is on the ``PATH`` as the tour asks (the interpreter
running the tests)."""

from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.servers import free_port

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")
BLOCKS = re.findall(r"<!-- tour(?:: ([\w ]+))? -->\n```(\w+)\n(.*?)```", README, re.S)
ADDRESS = "127.0.0.1:50060"
"""The address the tour spells out (evamed serve's default)."""


def test_the_tour_has_its_steps() -> None:
    assert [label for label, _, _ in BLOCKS] == ["", "", "", "", "shell 1", "shell 2",
                                                "shell 3", "python"]


def _commands(block: str) -> list[str]:
    """A block's command lines, comments after them kept (bash reads them)."""
    return [line for line in block.splitlines() if line.strip()]


class Tour:
    def __init__(self, directory: Path) -> None:
        self.cwd = directory
        port = free_port()
        self.address = f"127.0.0.1:{port}"
        self.env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
                    "PYTHONPATH": str(ROOT), "XDG_CONFIG_HOME": str(directory / "config"),
                    "EVAMED_LISTEN": self.address, "EVAMED_SERVER": self.address,
                    "PYTHONUNBUFFERED": "1"}
        self.env.pop("COLUMNS", None)
        self.env.pop("EVAMED_TOKEN", None)
        self.env.pop("EVAMED_CREDENTIALS", None)
        (directory / "examples").symlink_to(ROOT / "examples")

    def text(self, block: str) -> str:
        return block.replace(ADDRESS, self.address)

    def run(self, block: str) -> str:
        out = subprocess.run(["bash", "-e", "-c", self.text(block)], cwd=self.cwd, env=self.env,
                             capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, f"{block}\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
        return out.stdout

    def start(self, line: str) -> subprocess.Popen[str]:
        return subprocess.Popen(["bash", "-c", f"exec {self.text(line)}"], cwd=self.cwd,
                                env=self.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)


_LINES: dict[int, queue.Queue[str]] = {}


def _line(process: subprocess.Popen[str], seconds: float) -> str:
    """The next line of its output, or "" after ``seconds`` (read by a thread: a select on the
    pipe would not see the lines a readline has already buffered)."""
    if process.pid not in _LINES:
        lines: queue.Queue[str] = queue.Queue()
        _LINES[process.pid] = lines

        def read() -> None:
            assert process.stdout is not None
            for line in process.stdout:
                lines.put(line)
        threading.Thread(target=read, daemon=True).start()
    try:
        return _LINES[process.pid].get(timeout=seconds)
    except queue.Empty:
        return ""


@pytest.mark.xdist_group("service")
def test_the_tour_of_the_readme_runs_as_written(tmp_path: Path) -> None:
    steps = iter(block for _, _, block in BLOCKS)
    tour = Tour(tmp_path)

    tour.run(next(steps))  # 1. write the profile
    assert (tmp_path / "late.eva").read_text().startswith("class Depart")
    checked = tour.run(next(steps))  # 2. check it
    assert "late.eva: 2 classes, 1 profile" in checked and "BackInTime" in checked
    explained = tour.run(next(steps))  # 3. explain it: CG-2 leaves the location to the mediator
    assert "BackInTime on CG-2" in explained and "BackInTime on CG-3" in explained
    assert ('the mediator re-applies (the native query leaves it out): Return: '
            'data.location == "garage"') in explained
    replayed = tour.run(next(steps))  # 4. replay: three trips back in time, then the paper's
    assert replayed.count('"profile": "BackInTime"') == 3, replayed[:2000]
    assert '"profile": "P1"' in replayed

    # 5. shell 1: the mediator with no configuration
    (serve,) = _commands(next(steps))
    started = time.monotonic()
    mediator = tour.start(serve)
    try:
        assert _line(mediator, 60) == f"serving on {tour.address}\n"
        serving = time.monotonic() - started
        # shell 2: a client saves its token and tails its subscription
        add, tail = _commands(next(steps))
        token = tour.run(add).strip()
        assert token.startswith("evm_")
        assert token in (tmp_path / "config" / "evamed" / "credentials.toml").read_text()
        subscriber = tour.start(tail)
        try:
            time.sleep(1.0)  # registered before the day is published
            shell3 = _commands(next(steps))
            publish, looks = shell3[0], "\n".join(shell3[1:])
            sent = time.monotonic()
            assert tour.run(publish) == "accepted 304, dead-lettered 0\n"
            header = _line(subscriber, 30)
            assert header.split() == ["time", "profile", "id", "sources", "services"], header
            rows = [_line(subscriber, 30)]
            delivered = time.monotonic() - sent
            while len([r for r in rows if " BackInTime " in r]) < 3 and rows[-1]:
                rows.append(_line(subscriber, 30))  # a row's sources wrap onto a second line
            trips = [r for r in rows if " BackInTime " in r]
            assert len(trips) == 3 and all(r.rstrip().endswith("mediator") for r in trips), rows
            around = tour.run(looks)
            assert f"mediator {tour.address}: SERVING" in around  # status
            assert re.search(r"\n late +BackInTime +1–3 +0 +inprocess", around), around
            assert "late" in around and "BackInTime: decompose, mediator" in around  # profiles
            assert "composed by: inprocess" in around  # explain --server --name late
        finally:
            subscriber.send_signal(signal.SIGINT)
            subscriber.wait(timeout=30)
            said = subscriber.stderr.read() if subscriber.stderr is not None else ""
        assert subscriber.returncode == 0, said
        assert "stopped; resume with: evamed subscribe late --resume " in said

        # 6. from Python: the subscription's log from the oldest kept, then live
        snippet = subprocess.Popen([sys.executable, "-c", tour.text(next(steps))], cwd=tmp_path,
                                   env=tour.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                   text=True)
        try:
            printed = [_line(snippet, 30) for _ in range(3)]
        finally:
            snippet.kill()
            snippet.wait(timeout=30)
            stderr = snippet.stderr.read() if snippet.stderr is not None else ""
        assert all(re.fullmatch(r"BackInTime \['ev-\d+', 'ev-\d+'\] \('mediator',\)\n", p)
                   for p in printed), (printed, stderr[-2000:])
    finally:
        mediator.send_signal(signal.SIGINT)
        mediator.wait(timeout=30)
        stderr = mediator.stderr.read() if mediator.stderr is not None else ""
    assert mediator.returncode == 0, stderr[-2000:]
    print(f"\ntour: serving {serving:.1f} s after `evamed serve`; the first composite printed "
          f"{delivered:.1f} s after `evamed publish` started (its CLI's start included)")
    assert serving < 30
