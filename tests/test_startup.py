"""Start-up (docs/performance.md, Start-up): what a command loads, not how long it takes.

``evamed --help`` and ``evamed check`` must not pay for what only other commands use — Spark,
gRPC, sqlglot, the base services — and the profile grammar is built once per installation,
not once per run. Each check runs in a fresh interpreter, the only place where "what is
imported" means anything.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

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
    """The tables are built (or loaded) by the first parse, not at import."""
    code = ("import lark.lark\n"
            "lark.lark.Lark.__init__ = lambda *a, **k: sys.exit('a grammar was built')\n"
            "import sys, eva.parser\n")
    out = _python(code, tmp_path)
    assert (out.returncode, out.stderr) == (0, "")


PARSE = ("import sys\nfrom eva.parser import ProfileError, parse\n"
         "print(parse(sys.argv[1]).profiles[0].name)\n"
         "try:\n    parse(sys.argv[2])\nexcept ProfileError as exc:\n    print(exc)\n")
# A parser loaded from the cache must answer what a built one answers, errors included (they
# ask the LALR tables what would have been accepted).
ARGS = (PROFILE, 'class A = type = "a"\n')


def test_the_grammar_is_built_once_then_loaded_from_the_cache(tmp_path: Path) -> None:
    built = _python(PARSE, tmp_path, *ARGS)
    assert built.returncode == 0, built.stderr
    assert built.stdout.startswith("P\n<profiles>:1:16: error: found '='")
    (cached,) = (tmp_path / "evamed").iterdir()  # one file, no leftover of its writing
    assert cached.name.startswith("grammar-")
    no_build = "import lark.lark\nlark.lark.Lark._build_parser = None\n"  # a rebuild would fail
    loaded = _python(no_build + PARSE, tmp_path, *ARGS)
    assert (loaded.returncode, loaded.stdout, loaded.stderr) == (0, built.stdout, "")


@pytest.mark.parametrize("spoil", ["unwritable", "corrupt"])
def test_a_cache_that_cannot_be_used_costs_only_the_build(tmp_path: Path, spoil: str) -> None:
    reference = _python(PARSE, tmp_path / "fresh", *ARGS)
    if spoil == "unwritable":  # the cache "directory" is a file: nothing can be made under it
        cache = tmp_path / "file"
        cache.write_text("")
    else:  # a truncated cache file, as a crash while writing it would leave
        cache = tmp_path / "fresh"
        (cached,) = (cache / "evamed").iterdir()
        cached.write_bytes(cached.read_bytes()[:100])
    out = _python(PARSE, cache, *ARGS)
    assert (out.returncode, out.stdout, out.stderr) == (0, reference.stdout, "")
