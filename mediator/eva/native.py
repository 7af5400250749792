"""Which engine modules run compiled (mypyc), and whether a compiled module is stale.

``make native`` compiles the engine-side modules in place; Python then imports the extension
instead of the ``.py`` next to it. An extension older than its source would silently run old
code, so the test suite refuses to start when :func:`stale` is not empty.
"""

from __future__ import annotations

import importlib.machinery
from pathlib import Path

MODULES = ("events", "semantics", "classes", "nodes", "engine")
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
