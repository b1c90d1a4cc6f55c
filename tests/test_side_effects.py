"""No process-wide state set as a side effect (issue 43 item 2).

A command resolves its MLflow store and its environment once, at its entry (a CLI command, a Prefect flow or a
task that is the entry of a process of its own, a script's ``main``), and passes them down; nothing below sets
them on the way. NVIDIA FLARE's and MLflow's chatter is silenced per logger (or a child process's output goes
to a file), never by swapping ``sys.stdout``/``sys.stderr``: another thread printing meanwhile would lose its
lines, or write them into the file (the class of bug that broke a CI run).

Read from the source with ``ast``, like tests/test_imports.py: a new ``redirect_stdout``/``redirect_stderr``
anywhere, a write to ``os.environ`` (``os.environ[...] =``, ``del``, ``update``, ``setdefault``, ``pop``,
``putenv``...) or ``mlflow.set_tracking_uri`` outside the entry points, or a call of the entry-only setters
(``pipelines.tracking.configure``, ``pipelines.prefect_env.configure_prefect_env``) from elsewhere, fails.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCANNED = ("common", "preprocessing", "models", "federated", "pipelines", "benchmarks", "docs")

# Where a command starts: CLI commands; the flows, and the tasks that are the entry of a process of their own
# (the demo's process pool); ``python -m`` and script mains.
ENTRY_POINTS = ("pipelines/cli/", "pipelines/flows.py", "pipelines/demo.py", "federated/distributed.py",
                "benchmarks/", "docs/make_readme_figures.py")
# The setters the entry points call: they alone write what they own (Prefect's settings, read from the
# environment when Prefect is imported; MLflow's tracking URI).
SETTERS = {"pipelines/prefect_env.py": "configure_prefect_env", "pipelines/tracking.py": "configure"}
_ENV_METHODS = {"update", "setdefault", "pop", "popitem", "clear", "__setitem__", "__delitem__"}


def _is_environ(node: ast.AST) -> bool:
    return (isinstance(node, ast.Attribute) and node.attr == "environ") or (
        isinstance(node, ast.Name) and node.id == "environ")


def _called_name(node: ast.Call) -> str | None:
    func = node.func
    return func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None


def side_effects(source: str, where: str = "<source>") -> list[tuple[int, str]]:
    """(line, what) for each process-wide write in ``source``: output swapped, environment written, MLflow's
    tracking URI set, an entry-only setter called (``what`` starts with the setter's name)."""
    found = []
    for node in ast.walk(ast.parse(source, where)):
        if isinstance(node, (ast.Name, ast.Attribute, ast.alias)):
            name = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else node.name
            if name in ("redirect_stdout", "redirect_stderr"):
                found.append((node.lineno if hasattr(node, "lineno") else 0, f"swaps sys output ({name})"))
        if isinstance(node, (ast.Assign, ast.AugAssign, ast.Delete)):
            targets = node.targets if isinstance(node, (ast.Assign, ast.Delete)) else [node.target]
            if any(isinstance(t, ast.Subscript) and _is_environ(t.value) for t in targets):
                found.append((node.lineno, "writes os.environ"))
        if isinstance(node, ast.Call):
            name = _called_name(node)
            if isinstance(node.func, ast.Attribute) and _is_environ(node.func.value) and name in _ENV_METHODS:
                found.append((node.lineno, f"writes os.environ ({name})"))
            elif name in ("putenv", "unsetenv"):
                found.append((node.lineno, f"writes the environment ({name})"))
            elif name in ("set_tracking_uri", "set_registry_uri"):
                found.append((node.lineno, f"sets MLflow's URI ({name})"))
            elif name == "configure_prefect_env" or (
                    name == "configure" and _from_tracking(node.func)):
                found.append((node.lineno, f"{name}: an entry-only setter"))
    return sorted(found)


def _from_tracking(func: ast.expr) -> bool:
    """``tracking.configure(...)`` or a bare ``configure(...)`` (as ``from pipelines.tracking import configure``
    names it: no other ``configure`` is imported bare in fedauc)."""
    return isinstance(func, ast.Name) or (isinstance(func.value, ast.Name) and func.value.id == "tracking")


def allowed(path: str, what: str) -> bool:
    if path.startswith(ENTRY_POINTS):
        return not what.startswith("sets MLflow") and not what.startswith("swaps")
    setter = SETTERS.get(path)
    if setter == "configure":
        return what.startswith("sets MLflow")
    return setter is not None and what.startswith("writes os.environ")


def violations(root: Path = ROOT) -> list[str]:
    found = []
    for folder in SCANNED:
        for path in sorted((root / folder).rglob("*.py")):
            relative = path.relative_to(root).as_posix()
            for line, what in side_effects(path.read_text(), relative):
                if not allowed(relative, what):
                    found.append(f"{relative}:{line}: {what}")
    return found


def test_no_process_wide_state_set_outside_the_entry_points():
    found = violations()
    assert not found, ("process-wide state set as a side effect (resolve it at the command's entry and pass it "
                       "down; silence a library per logger):\n" + "\n".join(found))


def test_the_entry_points_and_setters_named_exist():
    """A renamed entry point or setter fails here rather than silently widening nothing."""
    for entry in ENTRY_POINTS:
        assert (ROOT / entry).exists(), entry
    for path, setter in SETTERS.items():
        assert f"def {setter}(" in (ROOT / path).read_text(), (path, setter)


def test_the_scan_names_each_kind_of_side_effect():
    source = ("import contextlib, io, os, mlflow\n"
              "from contextlib import redirect_stderr\n"
              "from pipelines import tracking\n"
              "from pipelines.tracking import configure\n"
              "with contextlib.redirect_stdout(io.StringIO()):\n"
              "    os.environ['A'] = '1'\n"
              "os.environ.update(B='2')\n"
              "os.environ.setdefault('C', '3')\n"
              "del os.environ['A']\n"
              "os.putenv('D', '4')\n"
              "mlflow.set_tracking_uri('sqlite:///x.db')\n"
              "tracking.configure()\n"
              "configure()\n"
              "os.environ.get('E')\n"
              "value = os.environ['F']\n"
              "logger.configure()\n")
    assert side_effects(source) == [
        (2, "swaps sys output (redirect_stderr)"), (5, "swaps sys output (redirect_stdout)"),
        (6, "writes os.environ"), (7, "writes os.environ (update)"), (8, "writes os.environ (setdefault)"),
        (9, "writes os.environ"), (10, "writes the environment (putenv)"),
        (11, "sets MLflow's URI (set_tracking_uri)"), (12, "configure: an entry-only setter"),
        (13, "configure: an entry-only setter")]
    assert allowed("pipelines/cli/data.py", "writes os.environ (update)")
    assert allowed("pipelines/flows.py", "configure: an entry-only setter")
    assert not allowed("pipelines/cli/data.py", "swaps sys output (redirect_stdout)")
    assert not allowed("pipelines/site_params.py", "writes os.environ")
    assert not allowed("pipelines/runs.py", "configure: an entry-only setter")
    assert allowed("pipelines/tracking.py", "sets MLflow's URI (set_tracking_uri)")
    assert not allowed("pipelines/tracking.py", "writes os.environ")
    assert allowed("pipelines/prefect_env.py", "writes os.environ")
    assert not allowed("pipelines/prefect_env.py", "sets MLflow's URI (set_tracking_uri)")
