"""The layout's one rule: imports point one way, eva ← transforms ← adapters ← spark_jobs ← mediator.

A package may import those to its left and never those to its right, so the algebra can be read
(and compiled, and shipped to Spark workers) without the service, and the service can be added
on top without reaching into the middle. Checked on the source, by walking every module's AST:
an import inside a function counts as much as one at the top.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LAYERS = ("eva", "transforms", "adapters", "spark_jobs", "mediator")


def _imported(tree: ast.Module, module: str) -> set[str]:
    """The project packages a module imports (absolute and relative imports alike)."""
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")[: -node.level]
                names = [".".join([*base, node.module] if node.module else base)]
            else:
                names = [node.module or ""]
        else:
            continue
        out.update(name.split(".")[0] for name in names if name.split(".")[0] in LAYERS)
    return out


def _modules(package: str) -> list[Path]:
    return sorted(p for p in (ROOT / package).rglob("*.py") if "_proto" not in p.parts)


@pytest.mark.parametrize("package", LAYERS)
def test_imports_point_one_way(package: str) -> None:
    allowed = set(LAYERS[: LAYERS.index(package) + 1])
    wrong = []
    for path in _modules(package):
        module = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        for target in sorted(_imported(ast.parse(path.read_text()), module) - allowed):
            wrong.append(f"{path.relative_to(ROOT)} imports {target}")
    assert wrong == [], f"{package} may import only {sorted(allowed)}"


def test_the_walk_sees_every_kind_of_import() -> None:
    tree = ast.parse("import mediator.cli\nfrom adapters import client\n"
                     "def f():\n    from spark_jobs.session import x\nfrom . import y\n")
    assert _imported(tree, "transforms.runner") == {"mediator", "adapters", "spark_jobs",
                                                    "transforms"}


def test_every_layer_has_modules() -> None:
    assert all(_modules(package) for package in LAYERS)


def test_the_package_apis_are_functions_even_after_every_submodule_is_imported() -> None:
    """`eva.compile`, `transforms.plan` and `transforms.explain` name functions: no submodule
    of the same name rebinds them when it is imported (the modules are compiler, plans and
    explanation for that reason)."""
    import importlib

    import eva
    import transforms

    for package in ("eva", "transforms"):
        for path in _modules(package):
            importlib.import_module(".".join(path.relative_to(ROOT).with_suffix("").parts))
    doc = eva.parse('class A = type == "A"\nclass B = type == "B"\n'
                    "profile P = ((all_dup(A); all_dup(B))_5s)_all_pairs\n")
    from transforms.capability import CG1

    assert callable(eva.compile) and callable(transforms.plan) and callable(transforms.explain)
    plan = transforms.plan(doc.profiles[0], doc, CG1)
    assert transforms.explain(plan).label
    assert eva.compile(doc.profiles[0], doc.class_map()).root is not None
