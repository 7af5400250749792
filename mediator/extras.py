"""The optional parts of the package and what needs them (pyproject.toml, optional-dependencies).

The core install — the client, the CLI, the mediator with its in-process composer, the base
services — needs none of them. A feature that does names its extra in one line when it is
missing, rather than failing with an ImportError deep inside Spark or matplotlib:

>>> missing("plots", "--plot")                                       # doctest: +SKIP
"--plot needs the plots extra (matplotlib is not installed): pip install 'evamed[plots]'"

Standard library only: the CLI imports this at start-up.
"""

from __future__ import annotations

from importlib.util import find_spec

EXTRAS: dict[str, tuple[str, ...]] = {
    "spark": ("pyspark", "pandas", "pyarrow"),  # the Spark composer, replay --engine spark, compose
    "plots": ("matplotlib",),                   # --plot of replay and explain
}
"""Each extra and the modules it provides (what is looked for)."""


def missing(extra: str, feature: str) -> str | None:
    """None when ``extra`` is installed, else the one line that says what ``feature`` needs."""
    absent = [module for module in EXTRAS[extra] if find_spec(module) is None]
    if not absent:
        return None
    verb = "is" if len(absent) == 1 else "are"
    return (f"{feature} needs the {extra} extra ({', '.join(absent)} {verb} not installed): "
            f"pip install 'evamed[{extra}]'")


__all__ = ["EXTRAS", "missing"]
