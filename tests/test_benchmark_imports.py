"""Every name a benchmark (or the README's figure script) imports from fedauc exists.

The benchmarks are run by hand, not by the suite, and most import fedauc inside the function that needs it (a
peer's run, a fresh process per system): a module split or a moved name breaks them silently until someone
measures. Read from the source with ``ast``, each ``from <fedauc package> import name`` is resolved.
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PRODUCT = ("common", "federated", "pipelines", "preprocessing", "models")


def unresolved(path: Path) -> list[str]:
    missing = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if not (isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] in PRODUCT):
            continue
        module = importlib.import_module(node.module)
        for alias in node.names:
            if hasattr(module, alias.name):
                continue
            try:
                importlib.import_module(f"{node.module}.{alias.name}")
            except ModuleNotFoundError:
                missing.append(f"{path.relative_to(ROOT)}:{node.lineno}: {node.module}.{alias.name}")
    return missing


def test_every_fedauc_name_a_benchmark_imports_exists():
    scripts = sorted((ROOT / "benchmarks").rglob("*.py")) + [ROOT / "docs" / "make_readme_figures.py"]
    missing = [line for script in scripts for line in unresolved(script)]
    assert not missing, "benchmarks import names fedauc no longer has:\n" + "\n".join(missing)
