"""Coverage-guided fuzzing of every reader (fuzz/targets.py) with atheris (libFuzzer for
Python): ``python -m fuzz.run --seconds 600``.

Each target runs in its own process for its share of the time, over a corpus kept in
build/fuzz/corpus/NAME (so a campaign resumes where the last one left off: a standing
campaign); what a finding is (an exception other than the reader's own refusal, or an input that
takes longer than ``--timeout``) is written to build/fuzz/findings/NAME/ by libFuzzer and the
target is started again for the rest of its time, so one finding does not end the campaign.
The counts go to build/fuzz/report.json and to standard output.

A ``timeout`` or ``slow-unit`` input is re-run once, uninstrumented, in a fresh process: one
that takes less than :data:`SLOW_CPU` of CPU there was slow only under the instrumentation and
the machine's load (libFuzzer's timeout is wall time), and is moved to
findings/NAME/unconfirmed/ and counted apart, not as a finding. SIGINT or SIGTERM stops the
campaign: the running target is stopped too (its counts kept), and what was done is reported."""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import FrameType

from fuzz.targets import ROOT, TARGETS

OUT = ROOT / "build" / "fuzz"
INSTRUMENTED = ["eva", "adapters", "mediator", "transforms", "lark", "sqlglot"]
"""The packages whose Python code atheris instruments for coverage (compiled modules are not)."""
NOT_INSTRUMENTED = ["eva.parser"]
"""atheris 2.3's rewriting of Python 3.11 bytecode breaks eva/parser.py's direct reader (a method
gets a ``str`` for ``self``); that module runs as it is, guided by the coverage of lark below.
(Instrumenting the standard library's tomllib crashes the interpreter: it is left out too.)"""

SLOW_CPU = 1.0
"""CPU seconds one input may take uninstrumented before a timeout found under the fuzzer is
confirmed: the readers are linear in inputs of at most 64 KiB."""
REPLAY_SECONDS = 120
"""Wall seconds the re-run of a slow input is given (beyond: confirmed)."""

_EXECUTED = re.compile(rb"stat::number_of_executed_units:\s*(\d+)")
_CPU = re.compile(r"in ([0-9.]+) s of CPU")
_RUNS = re.compile(rb"#(\d+)\s+(?:DONE|INITED|NEW|REDUCE|pulse|RELOAD)")


def worker(name: str, seconds: int, timeout: int, max_len: int) -> None:
    """One target under atheris in this process (the parent starts one per target)."""
    import atheris

    target = TARGETS[name]
    corpus, findings = OUT / "corpus" / name, OUT / "findings" / name
    corpus.mkdir(parents=True, exist_ok=True)
    findings.mkdir(parents=True, exist_ok=True)
    with atheris.instrument_imports(include=INSTRUMENTED, exclude=NOT_INSTRUMENTED):
        seeds = target.seeds()
        for seed in seeds:  # imports what the target reads with, instrumented
            target.run(seed)
    if not any(corpus.iterdir()):
        for i, seed in enumerate(seeds):
            (corpus / f"seed-{i}").write_bytes(seed)

    def one(data: bytes) -> None:
        target.run(data)

    atheris.Setup([sys.argv[0], f"-max_total_time={seconds}", f"-timeout={timeout}",
                   f"-max_len={max_len}", "-rss_limit_mb=6144", "-print_final_stats=1",
                   f"-artifact_prefix={findings}/", str(corpus)], one)
    atheris.Fuzz()


class Interrupted(Exception):
    """SIGINT or SIGTERM reached the campaign while a worker ran."""


_STOP: list[str] = []  # the signal that stopped the campaign, once one came
_WAITING: list[bool] = [False]  # a worker is being waited for: the signal interrupts the wait


def _interrupt(signum: int, frame: FrameType | None) -> None:
    _STOP.append(signal.Signals(signum).name)
    if _WAITING[0]:
        raise Interrupted(_STOP[0])


def campaign(names: list[str], seconds: int, timeout: int, max_len: int
             ) -> tuple[dict[str, dict[str, int]], str | None]:
    """Each target for ``seconds``, started again after each finding until its time is up;
    the report, and the signal that stopped the campaign early (None: it ran its time)."""
    report: dict[str, dict[str, int]] = {}
    stopped: str | None = None
    for name in names:
        findings = OUT / "findings" / name
        before = _artifacts(findings)
        executed = starts = 0
        log = b""
        deadline = time.monotonic() + seconds
        while not _STOP and (left := int(deadline - time.monotonic())) > 0:
            starts += 1
            code, log = _run_worker(
                [sys.executable, "-m", "fuzz.run", "--worker", name, "--seconds", str(left),
                 "--timeout", str(timeout), "--max-len", str(max_len)])
            (OUT / f"{name}.log").write_bytes(log[-200_000:])
            # (the final stats; without them — a stop — the last progress line's count)
            counts = _EXECUTED.findall(log) or _RUNS.findall(log)[-1:]
            executed += int(counts[-1]) if counts else 0
            if code == 0 or starts >= 50:  # (50: a target that cannot start, said below)
                break
        stopped = _STOP[0] if _STOP else None
        new = sorted(_artifacts(findings) - before)
        unconfirmed = [p for p in new if p.startswith(("timeout-", "slow-unit-"))
                       and not _confirmed(name, findings / p)]
        found = [p for p in new if p not in unconfirmed]
        report[name] = {"executed": executed, "starts": starts, "findings": len(found),
                        "unconfirmed": len(unconfirmed)}
        if not executed and stopped is None:
            print(f"{name}: ran no input; the end of its log ({OUT / name}.log):\n"
                  + log[-2000:].decode("utf-8", "replace"), file=sys.stderr)
        print(f"{name:12} {executed:>10,} inputs  {len(found)} findings"
              + (f" ({', '.join(found[:3])}…)" if found else "")
              + (f"  {len(unconfirmed)} slow only under the fuzzer (findings/{name}/unconfirmed/)"
                 if unconfirmed else ""), flush=True)
        if stopped is not None:
            break
    return report, stopped


def _artifacts(findings: Path) -> set[str]:
    return {p.name for p in findings.iterdir() if p.is_file()} if findings.exists() else set()


def _run_worker(command: list[str]) -> tuple[int, bytes]:
    """A worker's exit code and output. A stop signal while it runs stops it with SIGINT
    (libFuzzer prints its counts and exits)."""
    proc = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        _WAITING[0] = True
        try:
            if _STOP:  # (came between the loop's check and here)
                raise Interrupted(_STOP[0])
            out: bytes | None = None
            while out is None:
                try:  # (with a timeout, what was read before an interruption is kept)
                    out, _ = proc.communicate(timeout=60)
                except subprocess.TimeoutExpired:
                    continue
        finally:
            _WAITING[0] = False
        return proc.returncode, out
    except Interrupted:
        proc.send_signal(signal.SIGINT)
        try:
            out, _ = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, _ = proc.communicate()
        return proc.returncode, out


def _confirmed(name: str, path: Path) -> bool:
    """Whether a slow input is slow uninstrumented too (:data:`SLOW_CPU`); one that is not
    is moved to findings/NAME/unconfirmed/."""
    try:
        done = subprocess.run([sys.executable, "-m", "fuzz.run", "--replay", name, str(path)],
                              cwd=ROOT, capture_output=True, text=True, timeout=REPLAY_SECONDS,
                              env={**os.environ, "PYTHONPATH": str(ROOT)})
    except subprocess.TimeoutExpired:
        return True
    cpu = _CPU.search(done.stdout)
    if done.returncode != 0 or cpu is None or float(cpu.group(1)) >= SLOW_CPU:
        return True
    aside = path.parent / "unconfirmed"
    aside.mkdir(exist_ok=True)
    path.rename(aside / path.name)
    return False


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=int, default=60, help="per target")
    parser.add_argument("--targets", default="all",
                        help=f"comma-separated, of: {', '.join(TARGETS)}")
    parser.add_argument("--timeout", type=int, default=10,
                        help="seconds one input may take before it is a finding")
    parser.add_argument("--max-len", type=int, default=1 << 16, help="bytes per input")
    parser.add_argument("--replay", nargs=2, metavar=("TARGET", "FILE"),
                        help="run one input (a finding) through a target, showing what it raises")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    os.chdir(ROOT)
    if args.replay:
        name, path = args.replay
        data = Path(path).read_bytes()
        began = time.process_time()
        TARGETS[name].run(data)
        print(f"{path}: accepted or refused as {name} should, in "
              f"{time.process_time() - began:.3f} s of CPU")
        return
    if args.worker:
        worker(args.worker, args.seconds, args.timeout, args.max_len)
        return
    names = list(TARGETS) if args.targets == "all" else args.targets.split(",")
    unknown = [n for n in names if n not in TARGETS]
    if unknown:
        parser.error(f"unknown target(s) {', '.join(unknown)}; known: {', '.join(TARGETS)}")
    OUT.mkdir(parents=True, exist_ok=True)
    for stop in (signal.SIGINT, signal.SIGTERM):
        signal.signal(stop, _interrupt)
    started = time.monotonic()
    report, stopped = campaign(names, args.seconds, args.timeout, args.max_len)
    total = sum(r["executed"] for r in report.values())
    found = sum(r["findings"] for r in report.values())
    (OUT / "report.json").write_text(json.dumps(report, indent=1) + "\n")
    print(f"{total:,} inputs over {len(report)} readers in {time.monotonic() - started:.0f} s; "
          f"{found} findings (build/fuzz/findings/)"
          + (f"; stopped early by {stopped}" if stopped else ""))
    sys.exit(1 if found else 130 if stopped else 0)


if __name__ == "__main__":
    main()
