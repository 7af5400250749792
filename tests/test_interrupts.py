"""Interrupts are safe (issue 29, item 6): Ctrl-C (SIGINT, sent to a real process) ends
`evamed replay`, `evamed check` and `evamed serve` within a second, by their normal exit path,
never by an abort. The replay is caught in a long clock-driven stretch of the compiled engine,
where an exception raised from a signal handler aborted the process (`fatal: out of memory`,
SIGABRT, 3 of 3) — now the handler asks for a stop the engine honours between two instants."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EVAMED = str(Path(sys.executable).with_name("evamed"))
BOUND = 3.0  # seconds: the 1 s, with slack for a loaded machine


AS_FROM_A_TERMINAL = ("import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); "
                      "os.execv(sys.argv[1], sys.argv[1:])")
"""Ctrl-C's disposition as in a terminal: a test run started in the background by a shell
(`make test &`, nohup) inherits SIGINT ignored, and Python then installs no handler in the
child — `check` ran to its end, status 0. The child starts with it set back to the default."""


def start(*args: str, cwd: Path) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-c", AS_FROM_A_TERMINAL, EVAMED, *args], cwd=cwd,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})


def interrupted(process: subprocess.Popen[str]) -> tuple[int, float, str]:
    """SIGINT; (status, seconds until it ended, standard error)."""
    assert process.poll() is None, "it ended before the signal: give it more work"
    sent = time.monotonic()
    process.send_signal(signal.SIGINT)
    try:
        _, err = process.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        process.kill()
        raise AssertionError("still running 30 s after SIGINT") from None
    return process.returncode, time.monotonic() - sent, err


def test_ctrl_c_ends_a_replay_in_the_compiled_engines_clock_loop(tmp_path: Path) -> None:
    (tmp_path / "p.eva").write_text('class A = type == "a"\nclass T = every 1ms\n'
                                    "profile P = ((all_dup(T); all_dup(A))_1ms)_all_pairs\n")
    (tmp_path / "e.jsonl").write_text("".join(
        json.dumps({"specversion": "1.0", "id": f"a{n}", "source": "s", "type": "a",
                    "time": f"2026-01-0{n}T00:00:00Z"}) + "\n" for n in (1, 2)))
    replay = start("replay", "--profiles", "p.eva", "--events", "e.jsonl", cwd=tmp_path)
    time.sleep(3.0)  # a day of 1 ms ticks: minutes of work inside one engine call
    status, took, err = interrupted(replay)
    assert "fatal" not in err and "Traceback" not in err, err
    assert status == 130 and "interrupted" in err, (status, err)
    assert took < BOUND, took


def test_ctrl_c_ends_check(tmp_path: Path) -> None:
    (tmp_path / "big.eva").write_text('class A = type == "a"\n' + "".join(
        f"profile P{i} = ((all_dup(A), all_dup(A))_{i + 1}s)_all_pairs\n"
        for i in range(100_000)))
    check = start("check", "big.eva", cwd=tmp_path)
    time.sleep(1.5)
    status, took, err = interrupted(check)
    assert "fatal" not in err and "Traceback" not in err, err
    assert status == 130, (status, err)
    assert took < BOUND, took


def test_ctrl_c_stops_serve_gracefully(tmp_path: Path) -> None:
    serve = start("serve", "--listen", "127.0.0.1:0", "--store", "sqlite://m.db",
                  cwd=tmp_path)
    assert serve.stdout is not None
    line = serve.stdout.readline()
    assert line.startswith("serving on"), line
    status, took, err = interrupted(serve)
    assert status == 0 and "stopped" in err, (status, err)
    assert took < BOUND, took
