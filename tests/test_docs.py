"""The repository stands alone: every cited document and section exists in it, every Markdown link
resolves, and the algorithm lists of README.md and federated/README.md match the registry; every MLflow name
used in code comes from federated/schema.py."""

from __future__ import annotations

import ast
import functools
import importlib.util
import re
import subprocess
from pathlib import Path

from federated.registry import algorithm_names, get_algorithm

REPO = Path(__file__).resolve().parents[1]
SKIPPED_DIRS = {"__pycache__", "build", "demo_data", "mlartifacts", "mlruns", "node_modules"}
TEXT_SUFFIXES = {".py", ".md", ".yaml", ".yml", ".toml", ".txt", ".cfg", ".sh"}

# "docs/algorithms.md section 3", "docs/algorithms.md sections 1.2 and 5", "`docs/datasets.md` section 2"
CITATION = re.compile(r"(?P<path>[\w./-]+\.md)`?\s+sections?\s+(?P<numbers>\d+(?:\.\d+)?(?:(?:,\s*|,?\s+and\s+|-)\d+(?:\.\d+)?)*)")
MENTION = re.compile(r"(?<![\w./-])(?P<path>[\w./-]*[\w-]\.md)\b")
LINK = re.compile(r"!?\[[^\]]*\]\((?P<target>[^)\s]+)\)|<img\s[^>]*src=\"(?P<src>[^\"]+)\"")


def shipped_algorithms() -> list[str]:
    """The registry's algorithms from federated/algorithms/: tests register their own probes beside them,
    and which of those a worker has imported depends on the test order."""
    return sorted(n for n in algorithm_names() if get_algorithm(n).__module__.startswith("federated.algorithms."))


HEADING = re.compile(r"^#{1,6}\s+(?P<number>\d+(?:\.\d+)?)[.\s]", re.MULTILINE)


@functools.cache
def text_files() -> tuple[Path, ...]:
    """The repository's text files: git's view (tracked, or untracked and not ignored) in a checkout, so a
    user's virtualenv or output folder is never read; a walk that skips the usual outputs elsewhere."""
    try:
        listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                                capture_output=True, text=True, check=True).stdout.splitlines()
        candidates = [REPO / name for name in listed]
    except (OSError, subprocess.CalledProcessError):
        candidates = [p for p in REPO.rglob("*") if not any(
            part.startswith(".") or part in SKIPPED_DIRS or part.endswith(".egg-info")
            for part in p.relative_to(REPO).parts)]
    this = Path(__file__).resolve()  # this file's examples are not citations
    return tuple(sorted(p for p in candidates if p.is_file() and p.resolve() != this
                        and (p.suffix in TEXT_SUFFIXES or p.name == "Makefile")))


def documents() -> set[str]:
    """Lower-case names of the repository's Markdown files: a mention of one must resolve to it (other
    .md names, such as the QC report's ``qc/report.md``, are outputs the code writes)."""
    return {path.name.lower() for path in text_files() if path.suffix == ".md"}


def resolve(mention: str, where: Path) -> Path | None:
    """A cited path, from the repository root or from the citing file's folder."""
    for base in (REPO, where.parent):
        candidate = (base / mention).resolve()
        if candidate.is_file() and REPO in candidate.parents:
            return candidate
    return None


def section_numbers(document: Path) -> set[str]:
    return {m["number"] for m in HEADING.finditer(document.read_text())}


def cited_numbers(text: str) -> list[str]:
    return re.findall(r"\d+(?:\.\d+)?", text)


def test_citation_patterns_read_what_the_code_writes():
    cited = [(m["path"], cited_numbers(m["numbers"])) for m in CITATION.finditer(
        "docs/algorithms.md section 3; `docs/algorithms.md` sections 1.2 and 5; docs/datasets.md sections 2, 3 and 10")]
    assert cited == [("docs/algorithms.md", ["3"]), ("docs/algorithms.md", ["1.2", "5"]),
                     ("docs/datasets.md", ["2", "3", "10"])]
    assert section_numbers(REPO / "docs" / "algorithms.md") >= {"0", "1", "1.5", "3", "10"}
    assert [m["path"] for m in MENTION.finditer("see algorithms.md and docs/shards.md, not x.mdx")] == [
        "algorithms.md", "docs/shards.md"]


def test_every_cited_document_and_section_exists():
    problems, names = [], documents()
    for path in text_files():
        text = path.read_text(errors="replace")
        where = path.relative_to(REPO)
        for m in MENTION.finditer(text):
            cites_a_document = Path(m["path"]).name.lower() in names or m["path"].startswith("docs/")
            if cites_a_document and resolve(m["path"], path) is None:
                line = text.count("\n", 0, m.start()) + 1
                problems.append(f"{where}:{line}: {m['path']} is not a file of this repository")
        for m in CITATION.finditer(text):
            document = resolve(m["path"], path)
            if document is None:
                continue  # reported above
            known = section_numbers(document)
            for number in cited_numbers(m["numbers"]):
                if number not in known:
                    line = text.count("\n", 0, m.start()) + 1
                    problems.append(f"{where}:{line}: {m['path']} has no section {number}")
    assert not problems, "\n".join(problems)


def test_every_markdown_link_resolves():
    problems = []
    for path in text_files():
        if path.suffix != ".md":
            continue
        text = path.read_text()
        for m in LINK.finditer(text):
            target = (m["target"] or m["src"]).split("#")[0]
            if not target or re.match(r"[a-z]+:", target):  # an anchor, or http:, mailto:
                continue
            if not (path.parent / target).exists():
                line = text.count("\n", 0, m.start()) + 1
                problems.append(f"{path.relative_to(REPO)}:{line}: link to {target} does not resolve")
    assert not problems, "\n".join(problems)


def test_nothing_refers_outside_the_repository():
    outside = ".." + "/shared"  # spelled in two parts so that this file does not match itself
    offenders = [f"{path.relative_to(REPO)}:{n}" for path in text_files()
                 for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1)
                 if outside in line or "shared/docs" in line]
    assert not offenders, "references to a folder outside the repository:\n" + "\n".join(offenders)


# --- algorithm lists against the registry --------------------------------------------------------


def backticked(text: str) -> set[str]:
    return set(re.findall(r"`([a-z0-9_]+)`", text))


def test_federated_readme_lists_every_registered_algorithm_once():
    text = (REPO / "federated" / "README.md").read_text()
    table = text[text.index("## Shipped here"):]
    rows = re.findall(r"^\| `([a-z0-9_]+)` \| (\S+) \| (sections? [^|]+) \|", table, re.MULTILINE)
    assert sorted(name for name, _, _ in rows) == shipped_algorithms()
    known = section_numbers(REPO / "docs" / "algorithms.md")
    for name, file, sections in rows:
        assert (REPO / "federated" / "algorithms" / file).is_file(), f"{name}: {file} does not exist"
        assert set(cited_numbers(sections)) <= known, f"{name}: docs/algorithms.md has no {sections}"


def test_readme_names_every_registered_algorithm():
    text = (REPO / "README.md").read_text()
    paragraph = text[text.index("Algorithms (`federated/algorithms/`"):]
    paragraph = paragraph[: paragraph.index("\n\n")]
    assert backticked(paragraph) >= set(shipped_algorithms())
    unknown = {name for name in backticked(paragraph) if name.islower() and "/" not in name} - set(shipped_algorithms())
    assert not unknown, f"README names algorithms that are not registered: {sorted(unknown)}"


def test_site_yaml_examples_name_real_files():
    """``sites/x.yaml`` is the command-line help's placeholder, and the README's onboarding walkthrough
    creates ``sites/my-hospital.yaml`` and ``sites/my-federation.yaml`` (tests/test_onboarding.py runs it);
    every other example must exist."""
    placeholders = {"sites/x.yaml", "sites/my-hospital.yaml", "sites/my-federation.yaml"}
    problems = [f"{path.relative_to(REPO)}: {mention}" for path in text_files()
                for mention in re.findall(r"sites/[\w/.-]+\.yaml", path.read_text(errors="replace"))
                if mention not in placeholders and not (REPO / mention).is_file()]
    assert not problems, "site files that do not exist:\n" + "\n".join(problems)


# --- modules --------------------------------------------------------------------------------------

PY_MENTION = re.compile(r"(?<![\w./-])(?P<path>(?:[\w-]+/)+[\w-]+\.py)\b")
MAX_MODULE_LINES = 400  # COORD/CONTRIBUTING: a longer module holds several concerns; split it along them


def installed_elsewhere(cited: str) -> bool:
    """A file of an installed package that is not part of this repository (``nvflare/fuel/sec/authz.py``)."""
    top = cited.split("/", 1)[0]
    return not (REPO / top).exists() and importlib.util.find_spec(top) is not None


def test_every_cited_module_exists():
    """A module named by path (``pipelines/flows.py``) is a file of the repository: a split or a move updates
    the docs and docstrings that cite it."""
    problems = []
    for path in text_files():
        text = path.read_text(errors="replace")
        for m in PY_MENTION.finditer(text):
            if resolve(m["path"], path) is None and not installed_elsewhere(m["path"]):
                line = text.count("\n", 0, m.start()) + 1
                problems.append(f"{path.relative_to(REPO)}:{line}: {m['path']} is not a file of this repository")
    assert not problems, "\n".join(problems)


def test_no_module_outside_tests_is_over_400_lines():
    too_long = [f"{path.relative_to(REPO)}: {lines} lines" for path in text_files()
                if path.suffix == ".py" and path.relative_to(REPO).parts[0] != "tests"
                and (lines := len(path.read_text().splitlines())) > MAX_MODULE_LINES]
    assert not too_long, f"over {MAX_MODULE_LINES} lines (split along the concerns):\n" + "\n".join(too_long)


FOLDER_HEADING = re.compile(r"^#{2,3} `(?P<folder>[\w/]+)/`", re.MULTILINE)


def undocumented_modules(package: str) -> list[str]:
    """The modules of ``package`` its README.md names nowhere a reader looks for them: a table row with its path
    from the package (`flare/site/job.py`), its name in the section headed by its folder (`## `hospital/``), a
    top-level module's name outside those sections, or a row for a folder of like modules without a section of
    its own (`cli/`, one module per command group)."""
    text = (REPO / package / "README.md").read_text()
    cuts = [(m.start(), m.group("folder")) for m in FOLDER_HEADING.finditer(text)] + [(len(text), None)]
    top = text[:cuts[0][0]]
    sections = {folder: text[start:end] for (start, folder), (end, _) in zip(cuts, cuts[1:])}
    rows = "\n".join(line for line in text.splitlines() if line.startswith("|"))
    missing = []
    for path in sorted((REPO / package).rglob("*.py")):
        relative = path.relative_to(REPO / package)
        if path.name == "__init__.py" or "__pycache__" in relative.parts:
            continue
        folder = relative.parent.as_posix()
        name = f"`{path.name}`"
        folder_rows = [f"| `{'/'.join(relative.parts[:i])}/` |" for i in range(1, len(relative.parts))
                       if "/".join(relative.parts[:i]) not in sections]
        if (f"`{relative.as_posix()}`" in rows or any(row in top for row in folder_rows)
                or (name in sections.get(folder, "") if folder != "." else name in top)):
            continue
        missing.append(f"{package}/{relative.as_posix()}")
    return missing


def test_every_module_is_in_its_packages_readme():
    missing = [m for package in ("federated", "pipelines") for m in undocumented_modules(package)]
    assert not missing, f"modules their package's README.md does not list: {missing}"


# --- MLflow's names come from federated/schema.py ---------------------------------------------------------------
# Where each MLflow call takes the name it records under: the positional index (a fluent ``mlflow.`` call, a client
# call taking the run, or the model's name and version, first) or keyword; ``*`` a dict whose keys are the names.
_FLUENT_KEY = {"log_metric": 0, "log_param": 0, "set_tag": 0, "delete_tag": 0, "log_metrics": "*0", "log_params": "*0",
               "set_tags": "*0", "log_dict": 1, "log_text": 1, "log_figure": 1, "log_image": 1, "log_table": 1}
_CLIENT_KEY = {"log_metric": 1, "log_param": 1, "set_tag": 1, "delete_tag": 1, "log_dict": 2, "log_text": 2,
               "log_figure": 2, "log_image": 2, "log_table": 2, "set_model_version_tag": 2,
               "set_registered_model_tag": 1, "set_experiment_tag": 1, "Metric": 0, "Param": 0, "RunTag": 0}
_KEYWORD_KEY = {"key": "", "artifact_file": "", "artifact_path": "", "tags": "*"}
_KEYED_CALLS = set(_FLUENT_KEY) | set(_CLIENT_KEY) | {"start_run", "create_run", "create_experiment", "log_artifact",
                                                      "log_artifacts", "log_model"}


def _literal_parts(node: ast.AST) -> list[str]:
    """The string literals in ``node``, but a "/" or "." joining a folder and a name, or a prefix and a name (both
    from the schema), and what an f-string's fields compute (``report['site']`` is a value, not a name)."""
    if isinstance(node, ast.FormattedValue):
        return []
    if isinstance(node, ast.Constant):
        return [node.value] if isinstance(node.value, str) and node.value.strip("/.") else []
    return [part for child in ast.iter_child_nodes(node) for part in _literal_parts(child)]


# What a scope binds each variable to: (value, "=") for ``x = value``; (key, "") for ``x[key] = ...``,
# ``x.setdefault(key, ...)`` and a keyword of ``x.update(k=...)``; (dict, "*") for ``x.update(dict)`` and for the key
# a loop or a comprehension takes from ``dict`` (``for k, v in d.items()``).
Bindings = dict[str, list[tuple[ast.AST, str]]]


class _NameScan:
    """The names an MLflow call records under, followed through the variables and the module's own functions
    that build them: a name put in a dict before the call, or returned by a helper, is as much a name."""

    def __init__(self, tree: ast.Module):
        self.functions = {n.name: n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
        self.module = self.bindings(ast.Module(body=[n for n in tree.body if not isinstance(
            n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))], type_ignores=[]))

    def bindings(self, scope: ast.AST, outer: Bindings | None = None) -> Bindings:
        local: Bindings = {}
        for node in ast.walk(scope):
            if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
                for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                    if isinstance(target, ast.Name):
                        local.setdefault(target.id, []).append((node.value, "="))
                    elif isinstance(target, ast.Subscript) and isinstance(target.value, ast.Name):
                        local.setdefault(target.value.id, []).append((target.slice, ""))
            elif isinstance(node, ast.For):
                for name, source in _iterated(node):
                    local.setdefault(name, []).append((source, "*"))
            elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                  and isinstance(node.func.value, ast.Name) and node.func.attr in ("update", "setdefault")):
                variable = local.setdefault(node.func.value.id, [])
                if node.func.attr == "setdefault":
                    variable += [(node.args[0], "")] if node.args else []
                else:
                    variable += [(arg, "*") for arg in node.args]
                    variable += [(ast.Constant(k.arg), "") for k in node.keywords if k.arg]
        return {**(outer or {}), **local}

    def named(self, node: ast.AST, how: str, bound: Bindings, depth: int = 0) -> list[ast.AST]:
        """The nodes that spell a name in ``node`` (``how``: "" the node itself, "*" the keys of a dict)."""
        if depth > 8:
            return []
        if isinstance(node, ast.Name):
            return [part for value, value_how in bound.get(node.id, ())
                    for part in self.named(value, how if value_how == "=" else value_how, bound, depth + 1)]
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in self.functions:
            helper = self.functions[node.func.id]
            inner = self.bindings(helper, self.module)
            return [part for ret in ast.walk(helper) if isinstance(ret, ast.Return) and ret.value is not None
                    for part in self.named(ret.value, how, inner, depth + 1)]
        if not how.startswith("*"):
            return [node]
        if isinstance(node, ast.Dict):
            return [part for key, value in zip(node.keys, node.values, strict=True)
                    for part in ([key] if key is not None else self.named(value, "*", bound, depth + 1))]
        if isinstance(node, ast.DictComp):
            return self.named(node.key, "", {**bound, **_comprehended(node)}, depth + 1)
        return []


def _iterated(loop: ast.For | ast.comprehension) -> list[tuple[str, ast.Name]]:
    """The key variable a loop takes from a dict it names (``for k, v in d.items()``, ``for k in d``)."""
    source = loop.iter
    if isinstance(source, ast.Call) and isinstance(source.func, ast.Attribute) and source.func.attr == "items":
        source = source.func.value
    key = loop.target.elts[0] if isinstance(loop.target, ast.Tuple) else loop.target
    return [(key.id, source)] if isinstance(key, ast.Name) and isinstance(source, ast.Name) else []


_COMPREHENSIONS = (ast.ListComp, ast.SetComp, ast.GeneratorExp, ast.DictComp)


def _comprehended(node: ast.ListComp | ast.SetComp | ast.GeneratorExp | ast.DictComp) -> Bindings:
    """What a comprehension binds, for its own body only (each comprehension is a scope of its own)."""
    return {name: [(source, "*")] for generator in node.generators for name, source in _iterated(generator)}


def literal_mlflow_names(source: str) -> list[tuple[int, str]]:
    """(line, literal) for each string literal (or literal part of an f-string or a sum) in the name an MLflow
    call records under: a metric, param or tag key, an artifact's file or folder; a variable passed as the name
    (or the dict of names) is followed to what its function, else the module, binds it to, and a call of one of
    the module's functions to what that returns."""
    tree = ast.parse(source)
    scan = _NameScan(tree)
    found: dict[tuple[int, str], None] = {}  # in the order met, once

    def visit(node: ast.AST, bound: Bindings) -> None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            bound = scan.bindings(node, scan.module)
        elif isinstance(node, _COMPREHENSIONS):
            bound = {**bound, **_comprehended(node)}
        elif isinstance(node, ast.Call):
            check(node, bound)
        for child in ast.iter_child_nodes(node):
            visit(child, bound)

    def check(node: ast.Call, bound: Bindings) -> None:
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None
        if name not in _KEYED_CALLS:
            return
        fluent = isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id == "mlflow"
        position = (_FLUENT_KEY if fluent else _CLIENT_KEY).get(name)
        named = []
        if position is not None:
            index = int(str(position).lstrip("*"))
            if index < len(node.args) and not isinstance(node.args[index], ast.Starred):
                named += scan.named(node.args[index], str(position), bound)
        named += [part for keyword in node.keywords if keyword.arg in _KEYWORD_KEY
                  for part in scan.named(keyword.value, _KEYWORD_KEY[keyword.arg], bound)]
        found.update(dict.fromkeys((node.lineno, literal) for part in named for literal in _literal_parts(part)))

    visit(tree, scan.module)
    return sorted(found, key=lambda item: item[0])


def test_every_mlflow_name_in_code_comes_from_the_schema():
    """A metric, param or tag key, or an artifact's name, written in a module is a name the next reader
    (the comparison table, the privacy allow-list, docs/privacy.md) cannot find: they live in federated/schema.py."""
    found = [f"{path.relative_to(REPO)}:{line}: {literal!r}"
             for package in ("common", "federated", "pipelines", "preprocessing", "models")
             for path in sorted((REPO / package).rglob("*.py")) if path != REPO / "federated" / "schema.py"
             for line, literal in literal_mlflow_names(path.read_text())]
    assert not found, "MLflow names written outside federated/schema.py:\n" + "\n".join(found)


def test_the_mlflow_name_scan_finds_keys_artifacts_and_tag_dicts():
    source = ("mlflow.log_metric('loss', 1.0)\n"
              "mlflow.set_tag(ROLE_TAG, 'training')\n"
              "client.log_metric(run_id, f'site/{site}/auc', 0.5)\n"
              "client.log_dict(run_id, summary, FOLDER + '/summary.json')\n"
              "mlflow.log_metrics({'a': 1.0, KEY: 2.0, **more})\n"
              "mlflow.start_run(run_name='free text', tags={ROLE_TAG: 'x', 'mlflow.parentRunId': run})\n"
              "client.set_model_version_tag(name, version, SCORE_TAG_PREFIX + evaluation, 'free value')\n"
              "mlflow.log_figure(figure, artifact_file='roc.png')\n"
              "Param(k, 'value')\n")
    assert literal_mlflow_names(source) == [(1, "loss"), (3, "site/"), (3, "/auc"), (4, "/summary.json"), (5, "a"),
                                            (6, "mlflow.parentRunId"), (8, "roc.png")]


def test_the_mlflow_name_scan_follows_names_built_before_the_call():
    """A name put in a dict, a subscript, an ``update`` or a helper's return before the call is found, at the
    call; a value computed in an f-string's field, a parameter and a loop over schema names are not names."""
    source = ("RELIABILITY = 'reliability.png'\n"
              "def params(config):\n"
              "    out = {'federation': config.name, **{f'algo.{k}': v for k, v in config.params.items()}}\n"
              "    return {key: str(value) for key, value in out.items()}\n"
              "def record(site, day, summary, key, names):\n"
              "    tags = {ROLE_TAG: SCORING_ROLE, 'site': site}\n"
              "    tags.update(day=day)\n"
              "    counts = {'scored': summary['scored'], **{f'refused/{k}': v for k, v in summary.items()}}\n"
              "    metrics = {k: n for k, n in counts.items() if n}\n"
              "    metrics[f'psi/{site}'] = 0.1\n"
              "    mlflow.start_run(run_name='free text', tags=tags)\n"
              "    mlflow.log_metrics({k: float(v) for k, v in metrics.items()})\n"
              "    mlflow.log_params(params(config))\n"
              "    mlflow.log_figure(figure, RELIABILITY)\n"
              "    client.log_batch(run, params=[Param(k, str(v)) for k, v in metrics.items()])\n"
              "    mlflow.set_tag(key, 'value')\n"
              "    mlflow.log_params({f\"{SHARD_HASH_PREFIX}{r['site']}\": r['hash'] for r in summary})\n"
              "    for name in names:\n"
              "        mlflow.set_tag(name, 'value')\n")
    assert literal_mlflow_names(source) == [
        (11, "site"), (11, "day"), (12, "scored"), (12, "refused/"), (12, "psi/"), (13, "federation"), (13, "algo."),
        (14, "reliability.png"), (15, "scored"), (15, "refused/"), (15, "psi/")]
