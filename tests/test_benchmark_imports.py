"""Every name a benchmark (or the README's figure script) imports from fedauc exists; the benchmarks are one
package, run as ``python -m benchmarks.<name>``, and ``make bench`` runs each entry point and nothing else.

The benchmarks are run by hand, not by the suite, and most import fedauc inside the function that needs it (a
peer's run, a fresh process per system): a module split or a moved name breaks them silently until someone
measures. Read from the source with ``ast``, each ``from <fedauc package> import name`` is resolved.
"""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PRODUCT = ("common", "federated", "pipelines", "preprocessing", "models", "benchmarks")
# Started by benchmarks.peers in the peers' own environments, never on their own.
PEER_RUNS = ROOT / "benchmarks" / "peers" / "systems"


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


def entry_points() -> set[str]:
    """``python -m`` names of the benchmarks' modules that run: a family's ``__main__`` or a module with a main
    guard, the peers' own runs left out."""
    found = set()
    for path in (ROOT / "benchmarks").rglob("*.py"):
        if PEER_RUNS in path.parents:
            continue
        name = ".".join(path.relative_to(ROOT / "benchmarks").with_suffix("").parts)
        if path.name == "__main__.py":
            found.add(name.removesuffix(".__main__"))
        elif 'if __name__ == "__main__":' in path.read_text():
            found.add(name)
    return found


def test_make_bench_runs_every_entry_point_and_nothing_else():
    listed = re.search(r"^BENCHMARKS :=(.*?)\n\n", (ROOT / "Makefile").read_text(), re.MULTILINE | re.DOTALL)
    assert listed, "Makefile: no BENCHMARKS list"
    assert set(listed.group(1).replace("\\", " ").split()) == entry_points()


def test_no_benchmark_edits_the_import_path():
    """They import one another as ``benchmarks.<family>.<module>`` (``python -m`` from the repository's root)."""
    edits = [f"{path.relative_to(ROOT)}:{node.lineno}" for path in sorted((ROOT / "benchmarks").rglob("*.py"))
             for node in ast.walk(ast.parse(path.read_text(), str(path)))
             if isinstance(node, ast.Attribute) and node.attr == "path" and isinstance(node.value, ast.Name)
             and node.value.id == "sys"]
    assert not edits, "sys.path used in the benchmarks: " + ", ".join(edits)


def test_benchmarks_is_this_repositorys_package():
    """Opacus installs a top-level ``benchmarks`` of its own: the repository's root comes first on the path."""
    import benchmarks

    assert Path(benchmarks.__file__).resolve() == ROOT / "benchmarks" / "__init__.py"


def _imported_packages(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module.split(".")[0])
    return found


def test_the_benchmarks_and_their_shared_support_import_nothing_of_the_tests():
    """What a benchmark shares with a test (a phantom federation, an Orthanc, a centre's records) lives in
    ``testbed/``, which both import: the suite is no library, testbed/ stands beneath the benchmarks, and the
    product imports none of the three."""
    wrong = [f"{path.relative_to(ROOT)} imports {package}"
             for folder, refused in (("benchmarks", {"tests"}), ("testbed", {"tests", "benchmarks"}),
                                     *((package, {"tests", "benchmarks", "testbed"}) for package in PRODUCT if package != "benchmarks"))
             for path in sorted((ROOT / folder).rglob("*.py")) for package in _imported_packages(path) & refused]
    assert not wrong, "\n".join(wrong)
    assert "testbed" in _imported_packages(ROOT / "benchmarks" / "throughput" / "flare.py")
