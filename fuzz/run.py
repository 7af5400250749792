"""Coverage-guided fuzzing of every reader (fuzz/targets.py) with atheris (libFuzzer for
Python): ``python -m fuzz.run --seconds 600``.

Each target runs in its own process for its share of the time, over a corpus kept in
build/fuzz/corpus/NAME (so a campaign resumes where the last one left off: a standing
campaign); what a finding is (an exception other than the reader's own refusal, or an input that
takes longer than ``--timeout``) is written to build/fuzz/findings/NAME/ by libFuzzer and the
target is started again for the rest of its time, so one finding does not end the campaign.
The counts go to build/fuzz/report.json and to standard output."""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

from fuzz.targets import ROOT, TARGETS

OUT = ROOT / "build" / "fuzz"
INSTRUMENTED = ["eva", "adapters", "mediator", "transforms", "lark", "sqlglot"]
"""The packages whose Python code atheris instruments for coverage (compiled modules are not)."""
NOT_INSTRUMENTED = ["eva.parser"]
"""atheris 2.3's rewriting of Python 3.11 bytecode breaks eva/parser.py's direct reader (a method
gets a ``str`` for ``self``); that module runs as it is, guided by the coverage of lark below.
(Instrumenting the standard library's tomllib crashes the interpreter: it is left out too.)"""

_EXECUTED = re.compile(rb"stat::number_of_executed_units:\s*(\d+)")
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


def campaign(names: list[str], seconds: int, timeout: int, max_len: int) -> dict[str, dict[str, int]]:
    """Each target for ``seconds``, started again after each finding until its time is up."""
    report: dict[str, dict[str, int]] = {}
    for name in names:
        findings = OUT / "findings" / name
        before = set(findings.iterdir()) if findings.exists() else set()
        executed = starts = 0
        deadline = time.monotonic() + seconds
        while (left := int(deadline - time.monotonic())) > 0:
            starts += 1
            done = subprocess.run(
                [sys.executable, "-m", "fuzz.run", "--worker", name, "--seconds", str(left),
                 "--timeout", str(timeout), "--max-len", str(max_len)],
                cwd=ROOT, capture_output=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
            log = done.stdout + done.stderr
            (OUT / f"{name}.log").write_bytes(log[-200_000:])
            counts = _EXECUTED.findall(log) or [m[0] for m in _RUNS.findall(log)[-1:]]
            executed += int(counts[-1]) if counts else 0
            if done.returncode == 0:
                break
            if starts >= 50:  # a target that cannot start: stop, say so below
                break
        found = sorted(p.name for p in set(findings.iterdir()) - before) if findings.exists() \
            else []
        report[name] = {"executed": executed, "starts": starts, "findings": len(found)}
        if not executed:
            print(f"{name}: ran no input; the end of its log ({OUT / name}.log):\n"
                  + log[-2000:].decode("utf-8", "replace"), file=sys.stderr)
        print(f"{name:12} {executed:>10,} inputs  {len(found)} findings"
              + (f" ({', '.join(found[:3])}…)" if found else ""), flush=True)
    return report


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
        TARGETS[name].run(Path(path).read_bytes())
        print(f"{path}: accepted or refused as {name} should")
        return
    if args.worker:
        worker(args.worker, args.seconds, args.timeout, args.max_len)
        return
    names = list(TARGETS) if args.targets == "all" else args.targets.split(",")
    unknown = [n for n in names if n not in TARGETS]
    if unknown:
        parser.error(f"unknown target(s) {', '.join(unknown)}; known: {', '.join(TARGETS)}")
    OUT.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    report = campaign(names, args.seconds, args.timeout, args.max_len)
    total = sum(r["executed"] for r in report.values())
    found = sum(r["findings"] for r in report.values())
    (OUT / "report.json").write_text(json.dumps(report, indent=1) + "\n")
    print(f"{total:,} inputs over {len(report)} readers in {time.monotonic() - started:.0f} s; "
          f"{found} findings (build/fuzz/findings/)")
    sys.exit(1 if found else 0)


if __name__ == "__main__":
    main()
