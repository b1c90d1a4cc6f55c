"""No import circles among fedauc's product modules (common, preprocessing, models, federated, pipelines),
each package importing only those beneath it (``common`` nothing of fedauc), and the roles of federated/flare/
kept apart: a site's, the server's or the centre's module imports only the shared ones.

The graph is read from the source with ``ast``, not by importing: every ``import`` and ``from ... import``
anywhere in a module (at its top, in a function, under ``if TYPE_CHECKING``), relative imports resolved
against the module's package, and ``from package import name`` an edge to ``package.name`` where that is a
module, else to the package. A function-level import is how a circle usually hides: it runs, later, and the
two modules still cannot be read or changed one without the other.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("common", "preprocessing", "models", "federated", "pipelines")
# The packages each package may import besides itself: ``common`` is the ground every layer stands on and stands
# on nothing of fedauc; the data (``preprocessing``) and the AUC objectives, metrics and networks (``models``)
# know nothing of each other or of training; the engine (``federated``) knows no MLflow, Prefect or command line.
BENEATH = {"common": set(), "preprocessing": {"common"}, "models": {"common"},
           "federated": {"common", "preprocessing", "models"},
           "pipelines": {"common", "preprocessing", "models", "federated"}}


def modules(root: Path, packages: tuple[str, ...]) -> dict[str, Path]:
    """Every module of ``packages`` under ``root`` by its dotted name (a package by its own name)."""
    found = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def imported(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The known modules that module ``name`` (its source at ``path``) imports."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    targets: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[:len(package.split(".")) - (node.level - 1)]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module
            for alias in node.names:
                target = f"{source}.{alias.name}"
                targets.add(target if target in known else source)
    return {target for target in targets if target in known and target != name}


def import_graph(root: Path = ROOT, packages: tuple[str, ...] = PACKAGES) -> dict[str, set[str]]:
    known = modules(root, packages)
    return {name: imported(name, path, known) for name, path in known.items()}


def _shortest_circle(graph: dict[str, set[str]], start: str, within: set[str]) -> list[str]:
    paths = {start: [start]}
    frontier = [start]
    while frontier:  # breadth first: the shortest way back to start
        following = []
        for node in frontier:
            for succ in sorted(graph[node] & within):
                if succ == start:
                    return [*paths[node], start]
                if succ not in paths:
                    paths[succ] = [*paths[node], succ]
                    following.append(succ)
        frontier = following
    raise AssertionError(f"{start} is on no circle within {sorted(within)}")


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The circles of ``graph`` (each ``[a, b, ..., a]``): per strongly connected component (Tarjan), the
    shortest circle through each of its modules that no circle listed before passes through, so every
    module on a circle is named on one."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[set[str]] = []

    def connect(node: str) -> None:  # recursive: a few hundred modules, far below Python's limit
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for succ in sorted(graph[node]):
            if succ not in index:
                connect(succ)
                low[node] = min(low[node], low[succ])
            elif succ in on_stack:
                low[node] = min(low[node], index[succ])
        if low[node] == index[node]:
            component = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.add(member)
                if member == node:
                    break
            if len(component) > 1:
                components.append(component)

    for node in sorted(graph):
        if node not in index:
            connect(node)
    found = []
    for component in components:
        named: set[str] = set()
        for start in sorted(component):
            if start not in named:
                circle = _shortest_circle(graph, start, component)
                named.update(circle)
                found.append(circle)
    return sorted(found)


def describe(found: list[list[str]]) -> str:
    return "\n".join(" -> ".join(circle) for circle in found)


def test_no_import_circle_among_product_modules():
    graph = import_graph()
    assert len(graph) > 100 and "federated.engine" in graph["federated.flare.site.job"]
    found = cycles(graph)
    assert not found, "import circles among product modules:\n" + describe(found)


def upward_imports(graph: dict[str, set[str]], beneath: dict[str, set[str]]) -> set[tuple[str, str]]:
    """Every import of a package that ``beneath`` does not put below it."""
    return {(name, target) for name, targets in graph.items() for target in targets
            if target.split(".")[0] not in beneath[name.split(".")[0]] | {name.split(".")[0]}}


def test_each_package_imports_only_the_packages_beneath_it():
    graph = import_graph()
    assert set(BENEATH) == set(PACKAGES) and "common.errors" in graph["federated.registry"]
    found = upward_imports(graph, BENEATH)
    assert not found, "imports of a package not beneath the importer:\n" + "\n".join(
        f"{name} -> {target}" for name, target in sorted(found))


def test_the_layer_check_names_an_import_of_a_package_above():
    graph = {"common.errors": {"common.formats"}, "common.formats": {"preprocessing.shards"},
             "federated.engine": {"common.errors", "models.networks", "pipelines.runs"},
             "pipelines.runs": {"federated.engine"}}
    assert upward_imports(graph, BENEATH) == {("common.formats", "preprocessing.shards"),
                                              ("federated.engine", "pipelines.runs")}


# The algorithms' registry loads every module of federated/algorithms/ by name, and each registers itself with it:
# one unit with the folder, though it stands beside it so that the algorithms import no package of their own.
JOINED = {"federated.registry": "federated.algorithms"}


def rooms(graph: dict[str, set[str]], joined: dict[str, str] = JOINED) -> dict[str, set[str]]:
    """``graph`` with each folder inside a package read as one unit, as a newcomer reads it (federated/privacy/
    is one room, federated/config.py another): an import between the units of two files of the same unit is
    dropped, and ``joined`` modules are read as the unit they name."""
    def unit(name: str) -> str:
        return joined.get(name) or ".".join(name.split(".")[:2])

    units: dict[str, set[str]] = {}
    for name, targets in graph.items():
        units.setdefault(unit(name), set()).update(unit(target) for target in targets)
    return {name: targets - {name} for name, targets in units.items()}


def test_no_import_runs_back_up_between_the_folders_of_a_package():
    """Nothing imports upward: a folder read as one unit is on no circle with the modules and folders beside it.
    A circle of whole files is caught above; this one is made of files that do not import each other (before
    issue 56, federated/config.py imported the privacy budget while the engine's DP hooks, in the same folder,
    imported the configuration and the algorithms)."""
    found = cycles(rooms(import_graph()))
    assert not found, "folders on an import circle with their neighbours:\n" + describe(found)


def test_the_privacy_budget_stands_below_the_configuration():
    """federated/privacy/ (policy, ledger, budget, accounting, meaning) is what the configuration checks a job
    against: it imports no other module of federated/; what spends the budget (federated/dp/) stands above the
    algorithms it wraps."""
    graph = import_graph()
    assert "federated.privacy.policy" in graph["federated.config"] | graph["federated.settings"]
    assert "federated.algorithms.base" in graph["federated.dp.site"]
    assert "federated.dp.site" in graph["federated.engine"]
    upward = sorted(f"{name} -> {target}" for name, targets in graph.items() if name.startswith("federated.privacy.")
                    for target in targets
                    if target.startswith("federated.") and not target.startswith("federated.privacy."))
    assert not upward, "federated/privacy/ imports the engine's modules:\n" + "\n".join(upward)


def test_the_folder_check_finds_a_circle_that_no_two_files_make():
    graph = {"pkg.config": {"pkg.privacy.budget"}, "pkg.privacy.budget": set(), "pkg.privacy.site": {"pkg.config"},
             "pkg.registry": {"pkg.algorithms"}, "pkg.algorithms": set(), "pkg.algorithms.a": {"pkg.registry"}}
    assert cycles(graph) == []
    assert describe(cycles(rooms(graph, {}))) == ("pkg.algorithms -> pkg.registry -> pkg.algorithms\n"
                                                   "pkg.config -> pkg.privacy -> pkg.config")
    joined = rooms(graph, {"pkg.registry": "pkg.algorithms"})
    assert describe(cycles(joined)) == "pkg.config -> pkg.privacy -> pkg.config"


def test_the_graph_sees_function_level_relative_and_from_package_imports(tmp_path):
    """The checker itself: a circle made of a function-level relative import, ``from package import
    module`` and a plain import is found and named; an import of a name (not a module) is an edge to its
    module only."""
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "sub" / "__init__.py").write_text("def helper():\n    pass\n")
    (package / "a.py").write_text("def later():\n    from .sub import c\n    return c\n")
    (package / "sub" / "c.py").write_text("import pkg.b\n")
    (package / "b.py").write_text("from . import a\nfrom pkg.sub import helper\n")
    graph = import_graph(tmp_path, ("pkg",))
    assert graph == {"pkg": set(), "pkg.a": {"pkg.sub.c"}, "pkg.b": {"pkg.a", "pkg.sub"},
                     "pkg.sub": set(), "pkg.sub.c": {"pkg.b"}}
    assert describe(cycles(graph)) == "pkg.a -> pkg.sub.c -> pkg.b -> pkg.a"
    (package / "b.py").write_text("from pkg.sub import helper\n")
    assert cycles(import_graph(tmp_path, ("pkg",))) == []


def test_the_flare_modules_import_at_a_hospital_without_mlflow_or_prefect():
    """A hospital installs fedauc to run its NVFlare client: every module of federated/flare/ imports with
    MLflow and Prefect absent (an import of either fails at once here)."""
    names = sorted(name for name in modules(ROOT, ("federated",)) if name.startswith("federated.flare"))
    script = ("import importlib, sys\n"
              "sys.modules.update({'mlflow': None, 'prefect': None, 'pipelines': None})\n"
              f"for name in {names!r}:\n"
              "    importlib.import_module(name)\n")
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert len(names) > 20


# --- federated/flare/ by role ---------------------------------------------------------------------------------

FLARE = "federated.flare"
# Each role's modules in its own folder: a hospital's (site), the coordinating centre's NVFlare server (server),
# the submitter and operator (centre).
FLARE_ROLES = ("site", "server", "centre")
# At federated/flare/ itself: what the roles agree on and what more than one of them runs; any role imports them.
FLARE_SHARED = frozenset({FLARE, *(f"{FLARE}.{name}" for name in ("protocol", "spec", "installed", "lockdown",
                                                                   "processes"))})
# The one module that runs all three roles: a whole consortium on one machine (``--flare-env poc``), its server
# and every site started as their operators start them.
FLARE_CROSSINGS = {(f"{FLARE}.centre.poc", f"{FLARE}.server.start"), (f"{FLARE}.centre.poc", f"{FLARE}.site.start")}


def flare_role(name: str) -> str | None:
    """The role folder of a module of federated/flare/ (None: one of its own modules)."""
    parts = name.split(".")
    return parts[2] if len(parts) > 3 or (len(parts) == 3 and parts[2] in FLARE_ROLES) else None


def role_crossings(graph: dict[str, set[str]]) -> set[tuple[str, str]]:
    """Every import of federated/flare/ that leaves its role: a role's module importing another role's, or a
    shared module importing any role's."""
    return {(name, target) for name, targets in graph.items() if name.startswith(FLARE)
            for target in targets if target.startswith(FLARE) and target not in FLARE_SHARED
            and flare_role(target) != flare_role(name)}


def test_every_flare_module_is_shared_or_in_its_roles_folder():
    names = [name for name in import_graph() if name == FLARE or name.startswith(FLARE + ".")]
    misplaced = [name for name in names if name not in FLARE_SHARED and flare_role(name) not in FLARE_ROLES]
    assert not misplaced, f"federated/flare/ modules outside site/, server/, centre/ and not shared: {misplaced}"
    assert {flare_role(name) for name in names} == {None, *FLARE_ROLES}


def test_a_flare_role_imports_only_the_shared_modules():
    """A newcomer names a module's role from its path, and changes one role's code without reading another's:
    the wire names are in protocol.py, not in the module of one role that another imports."""
    crossings = role_crossings(import_graph())
    assert crossings - FLARE_CROSSINGS == set(), "imports across roles:\n" + "\n".join(
        f"{name} -> {target}" for name, target in sorted(crossings - FLARE_CROSSINGS))
    assert crossings == FLARE_CROSSINGS, f"no longer needed, drop from FLARE_CROSSINGS: {FLARE_CROSSINGS - crossings}"


def test_the_role_check_names_a_crossing_and_a_shared_module_importing_a_role():
    graph = {f"{FLARE}.site.job": {f"{FLARE}.server.live", f"{FLARE}.protocol", f"{FLARE}.site.keys",
                                   "federated.engine"},
             f"{FLARE}.protocol": {f"{FLARE}.centre.feed"}, f"{FLARE}.server.live": {f"{FLARE}.spec"}}
    assert role_crossings(graph) == {(f"{FLARE}.site.job", f"{FLARE}.server.live"),
                                     (f"{FLARE}.protocol", f"{FLARE}.centre.feed")}
