"""Which engine modules run compiled (mypyc), and whether a compiled module is stale.

``make native`` compiles the engine-side modules in place, and a wheel build compiles them for
its platform (``setup.py``); Python then imports the extension instead of the ``.py`` next to
it. An extension older than its source would silently run old code, so the test suite refuses
to start when :func:`stale` is not empty. ``setup.py`` reads ``MODULES`` and ``GROUP`` from this
file without importing the package, so it imports only the standard library.
"""

from __future__ import annotations

import importlib
import importlib.machinery
from pathlib import Path

MODULES = ("events", "semantics", "classes", "state", "nodes", "compiler", "engine", "notify",
           "admission")
GROUP = "eva._engine"
"""mypyc's shared runtime goes inside the package, so the extensions import from anywhere."""
_HERE = Path(__file__).parent


def _extension(name: str) -> Path | None:
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        path = _HERE / f"{name}{suffix}"
        if path.exists():
            return path
    return None


def compiled() -> list[str]:
    return [name for name in MODULES if _extension(name) is not None]


def stale() -> list[str]:
    out = []
    for name in MODULES:
        ext = _extension(name)
        if ext is not None and (_HERE / f"{name}.py").stat().st_mtime > ext.stat().st_mtime:
            out.append(name)
    return out


def running() -> list[str]:
    """The engine modules this interpreter runs compiled: those imported from an extension."""
    out = []
    for name in MODULES:
        module = importlib.import_module(f"eva.{name}")
        if str(module.__file__).endswith(tuple(importlib.machinery.EXTENSION_SUFFIXES)):
            out.append(name)
    return out


def engine_kind() -> str:
    """``compiled engine``, ``pure Python engine`` or which modules are compiled."""
    compiled_now = running()
    if not compiled_now:
        return "pure Python engine"
    if len(compiled_now) == len(MODULES):
        return "compiled engine"
    return f"engine partly compiled: {', '.join(compiled_now)}"
