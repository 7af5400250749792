"""Wheel builds compile the engine core with mypyc; everything else is in pyproject.toml.

A wheel carries the engine-side modules (``eva/native.py``: ``MODULES``) compiled for
its platform (several times faster: docs/performance.md), beside their ``.py`` source. Where
they cannot be compiled — no C compiler, mypyc not installed, or ``EVAMED_PURE=1`` — the wheel
is built without them and runs the same source as pure Python; ``evamed --version`` says which.
An editable install (``pip install -e``) never compiles: ``make native`` compiles in place for
development (``tools/build_native.py``), so the source tree holds no extensions it did not ask for.
"""

from __future__ import annotations

import os
import runpy
import sys
from pathlib import Path
from typing import Any

from setuptools import Extension, setup  # type: ignore[import-untyped]
from setuptools.command.build_ext import build_ext  # type: ignore[import-untyped]
from setuptools.errors import CCompilerError, ExecError, PlatformError  # type: ignore[import-untyped]

HERE = Path(__file__).resolve().parent
# Read without importing the package: native.py needs only the standard library.
NATIVE: dict[str, Any] = runpy.run_path(str(HERE / "eva" / "native.py"))


def _warn(reason: str) -> None:
    print(f"warning: evamed: {reason}; this wheel runs the engine as pure Python, several times "
          "slower (docs/performance.md)", file=sys.stderr)


def _engine() -> list[Extension]:
    """The compiled engine modules, or none (pure Python) when they cannot be made."""
    # Only a build compiles: reading the metadata (egg_info, dist_info) or an editable install
    # (editable_wheel) must not pay for mypyc's type check, nor put extensions in the tree.
    if not {"bdist_wheel", "build", "build_ext"} & set(sys.argv[1:]):
        return []
    if os.environ.get("EVAMED_PURE") == "1":
        _warn("EVAMED_PURE=1")
        return []
    try:
        from mypyc.build import mypycify
    except ImportError:
        _warn("mypyc (the mypy package) is not installed")
        return []
    # mypyc type-checks the modules first: a type error fails the build, as in `make typecheck`.
    return mypycify([f"eva/{name}.py" for name in NATIVE["MODULES"]],
                    group_name=NATIVE["GROUP"], opt_level="3")


class BuildEngine(build_ext):  # type: ignore[misc]
    """``build_ext`` that falls back to a pure-Python wheel when the C compiler fails."""

    def run(self) -> None:
        try:
            super().run()
        except (CCompilerError, ExecError, PlatformError) as exc:
            # All or nothing: the per-module shims import the group's shared library, so a
            # partial set would fail at import. Remove what was built and ship the source.
            for path in self.get_outputs():
                Path(path).unlink(missing_ok=True)
            self.extensions: list[Extension] = []
            _warn(f"the engine core could not be compiled ({exc})")


setup(ext_modules=_engine(), cmdclass={"build_ext": BuildEngine})
