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

# The modules a command starts in: CLI commands; the flows, and the tasks that are the entry of a process of
# their own (the demo's process pool); ``python -m`` and script mains. Within them only the entry function
# itself may set process-wide state (``entry_functions``): a helper it calls may run on another thread (the
# demo's data thread onboarded sites by writing ``os.environ`` while its trainings started).
ENTRY_POINTS = ("pipelines/cli/", "pipelines/flows.py", "pipelines/demo.py", "federated/distributed.py",
                "benchmarks/", "docs/make_readme_figures.py")
# Prefect tasks that are the entry of a process of their own (a process pool's worker runs them: the demo's
# trainings), named here since nothing in their source says where they will run.
PROCESS_TASKS = {"pipelines/flows.py": ("train_task", "evaluate_task")}
# The setters the entry points call: they alone write what they own (Prefect's settings, read from the
# environment when Prefect is imported; MLflow's tracking URI).
SETTERS = {"pipelines/prefect_env.py": "configure_prefect_env", "pipelines/tracking.py": "configure"}
_ENV_METHODS = {"update", "setdefault", "pop", "popitem", "clear", "__setitem__", "__delitem__"}
# A command's entry: Typer's ``@app.command(...)``/``@app.callback()``, Prefect's ``@flow``.
_ENTRY_DECORATORS = {"command", "callback", "flow"}
MODULE = "<module>"  # what runs on import: never an entry


def _is_environ(node: ast.AST) -> bool:
    return (isinstance(node, ast.Attribute) and node.attr == "environ") or (
        isinstance(node, ast.Name) and node.id == "environ")


def _called_name(node: ast.Call) -> str | None:
    func = node.func
    return func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None


def _what(node: ast.AST) -> str | None:
    """The process-wide write ``node`` makes, if any."""
    if isinstance(node, (ast.Name, ast.Attribute, ast.alias)):
        name = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else node.name
        if name in ("redirect_stdout", "redirect_stderr"):
            return f"swaps sys output ({name})"
    if isinstance(node, (ast.Assign, ast.AugAssign, ast.Delete)):
        targets = node.targets if isinstance(node, (ast.Assign, ast.Delete)) else [node.target]
        if any(isinstance(t, ast.Subscript) and _is_environ(t.value) for t in targets):
            return "writes os.environ"
    if isinstance(node, ast.Call):
        name = _called_name(node)
        if isinstance(node.func, ast.Attribute) and _is_environ(node.func.value) and name in _ENV_METHODS:
            return f"writes os.environ ({name})"
        if name in ("putenv", "unsetenv"):
            return f"writes the environment ({name})"
        if name in ("set_tracking_uri", "set_registry_uri"):
            return f"sets MLflow's URI ({name})"
        if name == "configure_prefect_env" or (name == "configure" and _from_tracking(node.func)):
            return f"{name}: an entry-only setter"
    return None


def side_effects(source: str, where: str = "<source>") -> list[tuple[int, str, str]]:
    """(line, what, function) for each process-wide write in ``source``: output swapped, environment written,
    MLflow's tracking URI set, an entry-only setter called (``what`` starts with the setter's name); ``function``
    is the innermost function around it (a closure is not its enclosing function: it may run on another
    thread), ``MODULE`` at import, ``"__main__"`` in a script's main guard."""
    found = []

    def visit(node: ast.AST, function: str) -> None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            function = node.name
        elif isinstance(node, ast.If) and _is_main_guard(node.test):
            function = "__main__"
        what = _what(node)
        if what:
            found.append((getattr(node, "lineno", 0), what, function))
        for child in ast.iter_child_nodes(node):
            visit(child, function)

    visit(ast.parse(source, where), MODULE)
    return sorted(found)


def _is_main_guard(test: ast.expr) -> bool:
    return (isinstance(test, ast.Compare) and isinstance(test.left, ast.Name) and test.left.id == "__name__"
            and any(isinstance(c, ast.Constant) and c.value == "__main__" for c in test.comparators))


def _from_tracking(func: ast.expr) -> bool:
    """``tracking.configure(...)`` or a bare ``configure(...)`` (as ``from pipelines.tracking import configure``
    names it: no other ``configure`` is imported bare in fedauc)."""
    return isinstance(func, ast.Name) or (isinstance(func.value, ast.Name) and func.value.id == "tracking")


def _decorator_name(node: ast.expr) -> str | None:
    node = node.func if isinstance(node, ast.Call) else node
    return _called_name(ast.Call(func=node, args=[], keywords=[])) if isinstance(node, (ast.Name, ast.Attribute)) \
        else None


def entry_functions(source: str, registered: frozenset[str] = frozenset()) -> set[str]:
    """The functions of a module that are a command's entry: decorated as a CLI command or a flow, named in
    ``registered`` (commands put on the app elsewhere: ``app.command("train")(training.train_command)``), or
    called in the module's main guard (a script's ``main``)."""
    tree = ast.parse(source)
    entries = {node.name for node in ast.walk(tree) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
               and (node.name in registered or any(_decorator_name(d) in _ENTRY_DECORATORS
                                                   for d in node.decorator_list))}
    for guard in (n for n in tree.body if isinstance(n, ast.If) and _is_main_guard(n.test)):
        entries |= {_called_name(call) for call in ast.walk(guard) if isinstance(call, ast.Call)}
    return entries


def registered_commands(root: Path = ROOT) -> frozenset[str]:
    """Functions put on the CLI by ``<app>.command(...)(<module>.<function>)``."""
    names = set()
    for path in (root / "pipelines" / "cli").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Call)
                    and _called_name(node.func) == "command" and node.args):
                names |= {_called_name(ast.Call(func=node.args[0], args=[], keywords=[]))}
    return frozenset(names)


def allowed(path: str, what: str, function: str, entries: set[str] = frozenset()) -> bool:
    if path.startswith(ENTRY_POINTS) and function in entries | {"__main__"}:
        return not what.startswith("sets MLflow") and not what.startswith("swaps")
    setter = SETTERS.get(path)
    if setter != function:
        return False
    if setter == "configure":
        return what.startswith("sets MLflow")
    return what.startswith("writes os.environ")


def violations(root: Path = ROOT) -> list[str]:
    found = []
    registered = registered_commands(root)
    for folder in SCANNED:
        for path in sorted((root / folder).rglob("*.py")):
            relative = path.relative_to(root).as_posix()
            source = path.read_text()
            entries = entry_functions(source, registered) | set(PROCESS_TASKS.get(relative, ()))
            for line, what, function in side_effects(source, relative):
                if not allowed(relative, what, function, entries):
                    found.append(f"{relative}:{line}: {what} in {function}")
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
    for path, tasks in PROCESS_TASKS.items():
        for task in tasks:
            assert f"def {task}(" in (ROOT / path).read_text(), (path, task)
    assert {"train_command", "evaluate_command", "demo", "preprocess"} <= registered_commands()


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
    module = "<module>"
    assert side_effects(source) == [
        (2, "swaps sys output (redirect_stderr)", module), (5, "swaps sys output (redirect_stdout)", module),
        (6, "writes os.environ", module), (7, "writes os.environ (update)", module),
        (8, "writes os.environ (setdefault)", module), (9, "writes os.environ", module),
        (10, "writes the environment (putenv)", module), (11, "sets MLflow's URI (set_tracking_uri)", module),
        (12, "configure: an entry-only setter", module), (13, "configure: an entry-only setter", module)]
    assert allowed("pipelines/cli/data.py", "writes os.environ (update)", "preprocess", {"preprocess"})
    assert allowed("pipelines/flows.py", "configure: an entry-only setter", "train_task", {"train_task"})
    assert not allowed("pipelines/cli/data.py", "swaps sys output (redirect_stdout)", "preprocess", {"preprocess"})
    assert not allowed("pipelines/site_params.py", "writes os.environ", "sites_env", {"sites_env"})
    assert not allowed("pipelines/runs.py", "configure: an entry-only setter", "train_tracked")
    assert allowed("pipelines/tracking.py", "sets MLflow's URI (set_tracking_uri)", "configure")
    assert not allowed("pipelines/tracking.py", "sets MLflow's URI (set_tracking_uri)", "experiment_id")
    assert not allowed("pipelines/tracking.py", "writes os.environ", "configure")
    assert allowed("pipelines/prefect_env.py", "writes os.environ", "configure_prefect_env")
    assert not allowed("pipelines/prefect_env.py", "sets MLflow's URI (set_tracking_uri)", "configure_prefect_env")


def test_only_the_entry_function_of_an_entry_module_may_write():
    """Per function, not per file: in an entry point's module a helper, a closure (which may run on another
    thread, as the demo's data thread did) or the module's import may not write what its entry may."""
    source = ("import os\n"
              "from prefect import flow\n"
              "os.environ.setdefault('ON_IMPORT', '1')\n"
              "def helper():\n"
              "    os.environ['HELPER'] = '1'\n"
              "@flow(name='demo')\n"
              "def demo():\n"
              "    os.environ['ENTRY'] = '1'\n"
              "    def on_a_thread():\n"
              "        os.environ['CLOSURE'] = '1'\n"
              "def main():\n"
              "    os.environ['MAIN'] = '1'\n"
              "if __name__ == '__main__':\n"
              "    os.environ['GUARD'] = '1'\n"
              "    main()\n")
    entries = entry_functions(source)
    assert entries == {"demo", "main"}
    judged = {line: allowed("pipelines/demo.py", what, function, entries)
              for line, what, function in side_effects(source)}
    assert judged == {3: False, 5: False, 8: True, 10: False, 12: True, 14: True}
    assert not any(allowed("pipelines/runs.py", what, function, entries) for _, what, function in side_effects(source))
    assert entry_functions("@app.command('x')\ndef x(): ...\ndef y(): ...\n") == {"x"}
    assert entry_functions("def y(): ...\n", frozenset({"y"})) == {"y"}
