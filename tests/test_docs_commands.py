"""The README is executable truth (issue 52, item 3): every `fedauc` command that README.md, CONTRIBUTING.md,
the package READMEs and docs/ show, and those the Makefile, the systemd units and infra/prefect.yaml run or
quote, is one the command line accepts: its subcommands exist, its options are that command's, a Choice
option's value is one of its choices. Read against the real Typer application's Click tree; nothing runs.
The reading itself is checked on small Markdown texts, so the check cannot pass by finding nothing."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import typer
from doc_commands import DocCommand, commands_in_config, commands_in_markdown, documented_commands, problems_of

from pipelines.cli import app

REPO = Path(__file__).resolve().parents[1]
# The documents issue 52 names; the check reads every Markdown file of the repository, these included.
NAMED_DOCUMENTS = ["README.md", "CONTRIBUTING.md", "infra/README.md", "federated/README.md", "pipelines/README.md"]
# Code spans that start with "fedauc" and name something else than a command, with what they name.
NOT_COMMANDS = {
    "fedauc scores <model> v<version>": "the series description of the SR that `fedauc pacs` stores",
    "fedauc model output": "the root concept of that SR (docs/deploy.md section 2)",
}


@pytest.fixture(scope="module")
def cli():
    return typer.main.get_command(app)


def markdown_files() -> list[Path]:
    """The repository's Markdown files as git lists them (tracked, or new and not ignored): a user's output
    folders (a site's `qc/report.md`) and the virtualenv are not documentation."""
    listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "*.md"], cwd=REPO,
                            capture_output=True, text=True, check=True).stdout.split()
    return sorted(REPO / name for name in listed)


def config_files() -> list[Path]:
    return [REPO / "Makefile", REPO / "infra" / "prefect.yaml", *sorted((REPO / "infra" / "systemd").glob("*"))]


def report(problems: dict[DocCommand, list[str]]) -> str:
    return "\n".join(f"{command}\n    " + "\n    ".join(found) for command, found in problems.items())


def test_every_documented_command_is_one_the_cli_accepts(cli):
    files = markdown_files()
    assert {REPO / name for name in NAMED_DOCUMENTS} <= set(files)
    assert len([f for f in files if f.parent == REPO / "docs"]) >= 10
    commands = [c for c in documented_commands(REPO, files, config_files()) if c.text not in NOT_COMMANDS]
    # The documents show about 220; far fewer means the reading broke, not that the docs shrank.
    assert len(commands) >= 150, f"only {len(commands)} commands found"
    assert {"README.md", "docs/consortium.md", "infra/README.md", "Makefile",
            "infra/systemd/fedauc-site.service"} <= {c.source for c in commands}
    problems = {c: found for c in commands if (found := problems_of(c, cli))}
    if problems:
        pytest.fail("commands the docs show and the CLI does not accept:\n" + report(problems), pytrace=False)


def test_every_command_of_the_cli_is_shown_somewhere(cli):
    """The other direction: a command nobody documented is one no user finds."""
    shown = set()
    for command in documented_commands(REPO, markdown_files(), config_files()):
        words = [arg for arg in command.args if not arg.startswith("-")]
        shown.update(" ".join(words[:depth]) for depth in (1, 2))
    context = cli.context_class(cli)
    commands = []
    for name in cli.list_commands(context):
        sub = cli.get_command(context, name)
        if hasattr(sub, "list_commands"):
            commands += [f"{name} {leaf}" for leaf in sub.list_commands(context)]
        else:
            commands.append(name)
    assert not set(commands) - shown, f"fedauc commands no document shows: {sorted(set(commands) - shown)}"


PLANTED = """\
# Onboarding

```bash
fedauc sites validate sites/my-hospital.yaml
fedauc train --federation sites/my-federation.yaml --algoritm codasca   # misspelt
```
"""


def test_a_planted_wrong_option_fails_naming_file_line_and_option(cli):
    commands = commands_in_markdown(PLANTED, "GUIDE.md")
    assert [c.text for c in commands] == ["fedauc sites validate sites/my-hospital.yaml",
                                         "fedauc train --federation sites/my-federation.yaml --algoritm codasca"]
    problems = {c: found for c in commands if (found := problems_of(c, cli))}
    assert list(problems) == [commands[1]]
    message = report(problems)
    assert message.startswith("GUIDE.md:5: fedauc train --federation sites/my-federation.yaml --algoritm codasca\n")
    assert message.endswith("\n    `fedauc train` has no option --algoritm (did you mean --algorithm?)")


READING = """\
Start with `fedauc sites new north --format chexpert
--root /data/north` (the span runs over a line break), then

```
$ FEDAUC_SITES=/opt/sites .venv/bin/fedauc preprocess sites/my-hospital.yaml \\
    --workers 2   # a comment with `fedauc ui` in it
fedauc compare --experiment chest-xray | head -n 5 && python -m pipelines.cli ui --mlflow-port 5001
/usr/bin/time -v fedauc demo; sudo -u postgres createdb -O fedauc mlflow
```

| command | what |
|---|---|
| `fedauc train ... --backend flare --flare-env sim\\|poc` | a table cell |

```python
subprocess.run(["fedauc", "train", "--no-such-option"])
```
``error: ... run `fedauc preprocess <the site's yaml> --out shards` `` and `fedauc_role: evaluation`
"""


def test_commands_are_read_as_a_shell_and_a_reader_would():
    found = [(c.line, c.args) for c in commands_in_markdown(READING, "R.md")]
    assert found == [
        (1, ("sites", "new", "north", "--format", "chexpert", "--root", "/data/north")),
        (5, ("preprocess", "sites/my-hospital.yaml", "--workers", "2")),
        (6, ("ui",)),
        (7, ("compare", "--experiment", "chest-xray")),
        (7, ("ui", "--mlflow-port", "5001")),
        (8, ("demo",)),
        (13, ("train", "...", "--backend", "flare", "--flare-env", "sim|poc")),
        (18, ("preprocess", "<the_site_s_yaml>", "--out", "shards")),
    ]


def test_config_files_exec_lines_recipes_and_quoted_commands():
    unit = ("# stop it with `fedauc consortium stop-server --kit <admin kit>`\n[Service]\n"
            "ExecStart=/opt/fedauc/.venv/bin/fedauc consortium start-site /kit --shards /data\n")
    makefile = "demo: setup\n\t$(VENV)/bin/fedauc demo \\\n\t  --rounds 2\n"
    assert [(c.line, c.args) for c in commands_in_config(unit, "u")] == [
        (1, ("consortium", "stop-server", "--kit", "<admin_kit>")),
        (3, ("consortium", "start-site", "/kit", "--shards", "/data"))]
    assert [c.args for c in commands_in_config(makefile, "Makefile")] == [("demo", "--rounds", "2")]


@pytest.mark.parametrize(("shown", "problem"), [
    ("fedauc trian --rounds 2", "`fedauc` has no command 'trian' (did you mean train?)"),
    ("fedauc sites remove x.yaml", "`fedauc sites` has no command 'remove'"),
    ("fedauc train --backend gpu", "`fedauc train` option --backend takes one of inprocess, torchrun, flare, not 'gpu'"),
    ("fedauc train --flare-env=sim|cloud", "option --flare-env takes one of sim, poc, prod, not 'cloud'"),
    ("fedauc train --rounds two", "`fedauc train` option --rounds takes int values, not 'two'"),
    ("fedauc train --resume=yes", "`fedauc train` option --resume is a flag and takes no value"),
    ("fedauc inspect a.dcm b.dcm", "`fedauc inspect` takes 1 argument(s), the docs give 2"),
    ("fedauc --verbose train", "`fedauc` has no option --verbose (it has: --debug, --help, --install-completion"),
    ("fedauc train -J 8", "`fedauc train` has no option -J"),
])
def test_what_the_cli_does_not_accept_is_named(cli, shown, problem):
    [command] = commands_in_markdown(f"`{shown}`", "D.md")
    assert any(problem in found for found in problems_of(command, cli)), problems_of(command, cli)


@pytest.mark.parametrize("shown", [
    "fedauc train --federation <yaml> -I8 --lr 1.0 --backend=flare --flare-env sim|poc|prod [--kit <admin kit>]",
    "fedauc train ... --backend <kind>", "fedauc evaluate --model-version N ... --wide", "fedauc --debug ...", "fedauc evaluate --eval-noise-multiplier S_e",
    "fedauc consortium start-site KIT ...", "fedauc <command> --help", "fedauc prune --older-than-days --dry-run",
])
def test_what_documentation_writes_for_a_reader_passes(cli, shown):
    [command] = commands_in_markdown(f"`{shown}`", "D.md")
    assert problems_of(command, cli) == []
