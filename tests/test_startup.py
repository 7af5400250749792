"""Start-up (docs/performance.md, Start-up): what a command loads, not how long it takes.

``evamed --help`` and ``evamed check`` must not pay for what only other commands use — Spark,
gRPC, sqlglot, the base services — and the profile grammar is built on the first parse, not at
import. Each check runs in a fresh interpreter, the only place where "what is
imported" means anything.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# Packages the light commands must not import (each costs 50 ms to seconds).
HEAVY = ("pyspark", "py4j", "pandas", "grpc", "sqlglot", "adapters", "spark_jobs", "transforms")

PROFILE = 'class A = type == "a"\nprofile P = A\n'


def _python(code: str, cache: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``code`` run by a fresh interpreter with its grammar cache under ``cache``."""
    env = {**os.environ, "XDG_CACHE_HOME": str(cache)}
    return subprocess.run([sys.executable, "-c", code, *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)


def _heavy_after(code: str, cache: Path, *args: str) -> list[str]:
    """The heavy packages loaded once ``code`` has run."""
    report = ("\nimport sys\nprint(json.dumps(sorted({m.split('.')[0] for m in sys.modules})))")
    out = _python("import json\n" + code + report, cache, *args)
    assert out.returncode == 0, out.stderr
    loaded = json.loads(out.stdout.splitlines()[-1])
    return [name for name in HEAVY if name in loaded]


def test_importing_the_cli_loads_no_backend_spark_grpc_or_sqlglot(tmp_path: Path) -> None:
    assert _heavy_after("import mediator.cli", tmp_path) == []


def test_help_and_check_load_no_backend_spark_grpc_or_sqlglot(tmp_path: Path) -> None:
    profiles = tmp_path / "one.eva"
    profiles.write_text(PROFILE)
    run = ("import sys\nfrom mediator.cli import app\n"
           "for argv in (['--help'], ['check', sys.argv[1]]):\n"
           "    try:\n        app(argv)\n    except SystemExit as exit:\n"
           "        assert exit.code == 0, exit.code\n")
    assert _heavy_after(run, tmp_path, str(profiles)) == []


def test_importing_the_parser_builds_no_grammar(tmp_path: Path) -> None:
    """The tables are built by the first parse, not at import."""
    code = ("import lark.lark\n"
            "lark.lark.Lark.__init__ = lambda *a, **k: sys.exit('a grammar was built')\n"
            "import sys, eva.parser\n")
    out = _python(code, tmp_path)
    assert (out.returncode, out.stderr) == (0, "")


def test_no_grammar_is_saved_or_loaded_between_runs(tmp_path: Path) -> None:
    """The grammar is built in each process, never unpickled from a directory another process
    could write (lark's serialisation is a pickle: a planted file would run its code). Two runs
    in a row neither save nor load a parser, and leave the cache directory empty."""
    code = ("import sys, lark\n"
            "lark.Lark.load = lambda *a, **k: sys.exit('a parser was loaded')\n"
            "lark.Lark.save = lambda *a, **k: sys.exit('a parser was saved')\n"
            "from eva.parser import parse\n"
            "print(parse(sys.argv[1]).profiles[0].name)\n")
    for _ in range(2):
        out = _python(code, tmp_path, PROFILE)
        assert (out.returncode, out.stdout, out.stderr) == (0, "P\n", "")
    assert list(tmp_path.iterdir()) == []
