"""Parsing memory bounded as documented (issue 29, item 7; docs/language.md, "Limits": about
120 bytes of memory per byte of text): documents of 1 MB that are refused — an unterminated
string after a list of 500,000 values (lark's tree of it took ~500 bytes per byte, 5 MB:
2.5 GB), an operand without its duplicate selection after such a list, a bare unterminated
string — each read in a fresh process, its peak measured against its size (a ratio)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SIZE = 1_000_000
DOCUMENTED = 120  # bytes of memory per byte of text

MEASURE = """
import resource, sys
from eva import parser
from eva.parser import ProfileError, parse
parser._parser(); getattr(parser, "_checker", lambda: None)()  # tables built before
size = int(sys.argv[2])
text = {
    "list, then an unterminated string": 'class A = data.x in [' + ','.join(['1'] * (size // 2))
        + ',"x',
    "list, then an operand without its selection": 'class A = data.x in ['
        + ','.join(['1'] * (size // 2)) + ']\\nprofile P = ((A, A)_1s)_all_pairs\\n',
    "an unterminated string": 'class A = type == "' + 'x' * size,
}[sys.argv[1]]
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
try:
    parse(text)
    print("accepted")
except ProfileError as exc:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print((peak - before) * 1024 / len(text), str(exc).splitlines()[0])
"""


@pytest.mark.parametrize("shape", ["list, then an unterminated string",
                                   "list, then an operand without its selection",
                                   "an unterminated string"])
def test_a_refused_document_takes_the_documented_memory_per_byte(shape: str) -> None:
    done = subprocess.run([sys.executable, "-c", MEASURE, shape, str(SIZE)], cwd=ROOT,
                          capture_output=True, text=True, timeout=300,
                          env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr
    ratio, _, message = done.stdout.strip().partition(" ")
    assert "error:" in message, done.stdout
    print(f"\n{shape}: {float(ratio):.0f} bytes per byte ({message[:70]})")
    assert float(ratio) <= DOCUMENTED, (shape, ratio)
