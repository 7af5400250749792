"""Package exports that load on first use (PEP 562), so that ``import eva`` or ``import
transforms`` costs a few milliseconds and a command imports only what it runs."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any


def exports(package: str, table: dict[str, tuple[str, str | None]],
            namespace: dict[str, Any]) -> Callable[[str], Any]:
    """A module ``__getattr__`` for ``package``: ``table`` maps an exported name to (module,
    attribute; None for the module itself); the value is bound in ``namespace`` on first use,
    so the next access is a plain global."""

    def __getattr__(name: str) -> Any:
        found = table.get(name)
        if found is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        module = importlib.import_module(found[0])
        value = module if found[1] is None else getattr(module, found[1])
        namespace[name] = value
        return value

    return __getattr__
