"""`make demo`'s job end to end, as a newcomer runs it, at a small scale in a folder of its own (issue 52):
``fedauc demo`` in a fresh fedauc folder ($FEDAUC_HOME) with no MLflow or Prefect variable set, through the
same code path as `make demo` (both federations generated, onboarded from the data task, preprocessed; the six
trainings in the process pool; the champions evaluated; new studies scored; the tables and the time profile
printed), then ``fedauc ui`` as a user runs it, whose per-task links open in a real browser.

tests/test_demo.py checks the demo's design with stub jobs; this runs it. README.md's "what you will see" is
checked against what this run printed."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from browser import WAIT_S, chromium, needs_chromium

from federated.schema import CHAMPION_ALIAS, registered_model_name
from pipelines.demo import DEMO_TRAININGS, SHOWN
from pipelines.prefect_env import PROJECT_ROOT
from pipelines.servers import free_port, stop_server

pytestmark = pytest.mark.slow

SCALE, ROUNDS = 0.05, 2
TASKS = ("chest-xray", "melanoma")
FEDAUC = str(Path(sys.executable).parent / "fedauc")
# What would point a command at another store or server than its fedauc folder's.
STORE_VARIABLES = ("MLFLOW_TRACKING_URI", "MLFLOW_REGISTRY_URI", "PREFECT_HOME", "PREFECT_API_URL")


def _as_a_user(home: Path, cache: Path) -> dict[str, str]:
    env = {name: value for name, value in os.environ.items() if name not in STORE_VARIABLES}
    return {**env, "FEDAUC_HOME": str(home), "FEDAUC_CACHE": str(cache)}


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory, public_metadata):
    """``fedauc demo`` in a fresh folder, from another folder (where nothing may be written). The public
    metadata the phantoms' labels come from is the session's, fetched before the checkout is listed: on a
    fresh clone that fetch creates the checkout's ``.cache``, which is the test run's doing, not the demo's."""
    home, cwd = tmp_path_factory.mktemp("fedauc-home"), tmp_path_factory.mktemp("where-the-user-is")
    cache = public_metadata.parent.parent
    checkout_before = {path.name for path in PROJECT_ROOT.iterdir()}
    started = time.monotonic()
    result = subprocess.run([FEDAUC, "demo", "--scale", str(SCALE), "--rounds", str(ROUNDS)], cwd=cwd,
                            env=_as_a_user(home, cache), capture_output=True, text=True, timeout=1200)
    assert result.returncode == 0, f"{result.stdout[-4000:]}\n{result.stderr[-6000:]}"
    return {"home": home, "cwd": cwd, "cache": cache, "out": result.stdout, "seconds": time.monotonic() - started,
            "checkout_before": checkout_before}


def test_it_prints_each_tasks_trainings_new_studies_and_the_time_profile(demo_run):
    out = demo_run["out"]
    for task in TASKS:
        section = out.split(f"## {task}\n", 1)[1]
        header = next(line for line in section.splitlines() if line.startswith("| run |"))
        assert [c.strip() for c in header.strip("|").split("|")][:4] == list(SHOWN[:4])
        assert {"pAUC0.3 macro", "MB sent", "minutes", "AUC macro"} <= {c.strip() for c in header.split("|")}
        rows = section.split(header, 1)[1].split("\n\n", 1)[0].strip().splitlines()[1:]
        runs = {row.split("|")[1].strip() for row in rows}
        assert runs == {name for name, federation, *_ in DEMO_TRAININGS if task.split("-")[0] in federation.stem}
        assert f"## {task}: new studies scored by the champion" in out
    scored = re.findall(r"^\| [^|]+ \| (scored|refused[^|]*) \|", out, flags=re.MULTILINE)
    assert scored and "scored" in scored
    assert "Where the time went:" in out and "evaluate both champions, compare" in out
    assert f"FEDAUC_HOME={demo_run['home']} fedauc ui" in out


def test_it_records_in_its_own_folder_and_nowhere_else(demo_run):
    home = demo_run["home"]
    assert (home / "mlruns.db").is_file() and (home / ".prefect").is_dir() and (home / "demo_data" / "shards").is_dir()
    assert not list(demo_run["cwd"].iterdir())  # no mlflow.db, mlruns/ or anything else where the user stood
    assert {path.name for path in PROJECT_ROOT.iterdir()} - demo_run["checkout_before"] <= {".pytest_cache"}


def test_each_task_has_a_champion(demo_run):
    from mlflow import MlflowClient

    client = MlflowClient(f"sqlite:///{demo_run['home'] / 'mlruns.db'}")
    for task in TASKS:
        champion = client.get_model_version_by_alias(registered_model_name(task), CHAMPION_ALIAS)
        assert client.get_run(champion.run_id).data.params["algorithm"] in {a for _, _, a, *_ in DEMO_TRAININGS}


@pytest.fixture(scope="module")
def ui_links(demo_run, tmp_path_factory):
    """``fedauc ui`` as a user runs it after the demo (no MLflow variable, its fedauc folder's store)."""
    log = tmp_path_factory.mktemp("ui") / "fedauc-ui.out"
    ports = [free_port(), free_port()]
    with open(log, "w") as out:
        ui = subprocess.Popen([FEDAUC, "ui", "--mlflow-port", str(ports[0]), "--prefect-port", str(ports[1])],
                              cwd=demo_run["cwd"], env=_as_a_user(demo_run["home"], demo_run["cache"]), stdout=out,
                              stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 300
        while "Ctrl-C stops both." not in log.read_text() and ui.poll() is None and time.monotonic() < deadline:
            time.sleep(1)
        printed = log.read_text()
        assert "Ctrl-C stops both." in printed, printed
        yield printed
    finally:
        ui.send_signal(signal.SIGTERM)
        stop_server(ui)
    assert not list(demo_run["cwd"].iterdir())


def _links(printed: str, task: str) -> dict[str, str]:
    block = printed.split(f"{task}:\n", 1)[1].splitlines()[:3]
    return dict(line.strip().split(": ", 1) for line in block)


def test_ui_prints_every_tasks_links(ui_links):
    assert "No training recorded yet" not in ui_links
    for task in TASKS:
        links = _links(ui_links, task)
        assert re.fullmatch(r"http://127\.0\.0\.1:\d+/#/experiments/\d+/runs\?viewStateShareKey=fedauc-trainings&"
                            r"workflowType=machine_learning", links["trainings, best pooled test AUC first"])
        assert re.fullmatch(rf"http://127\.0\.0\.1:\d+/#/models/fedauc-{task}/versions/\d+\?workflowType="
                            r"machine_learning", links["champion (chosen on validation)"])
        assert re.fullmatch(rf"http://127\.0\.0\.1:\d+/runs\?flow-run-search={task}&task-run-search={task}",
                            links["Prefect flow runs"])


@needs_chromium
def test_the_links_open_the_trainings_the_champion_and_the_named_prefect_runs(ui_links):
    pytest.importorskip("selenium.webdriver")
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    def body(driver) -> str:
        return driver.find_element(By.TAG_NAME, "body").text

    links = _links(ui_links, "chest-xray")
    with chromium() as driver:
        driver.get(links["trainings, best pooled test AUC first"])
        WebDriverWait(driver, WAIT_S).until(lambda d: all(name in body(d) for name, *_ in DEMO_TRAININGS))
        assert "evaluate-v" not in body(driver)  # the shared view lists trainings only
        driver.get(links["champion (chosen on validation)"])
        WebDriverWait(driver, WAIT_S).until(lambda d: "Diseases (outputs, in order): Cardiomegaly" in d.page_source)
        assert "champion" in body(driver)
        driver.get(links["Prefect flow runs"])
        # Named from each run's own parameters, the evaluation a flow run of the demo flow's.
        WebDriverWait(driver, WAIT_S).until(lambda d: "evaluate chest-xray champion" in body(d))


def _readme_block(marker: str) -> str:
    """The part of README.md between ``<!-- marker -->`` and ``<!-- /marker -->``."""
    text = (PROJECT_ROOT / "README.md").read_text()
    assert f"<!-- {marker} -->" in text, f"README.md lost its {marker} markers"
    return text.split(f"<!-- {marker} -->", 1)[1].split(f"<!-- /{marker} -->", 1)[0]


def _sections_and_columns(text: str) -> list[str]:
    """The headings and each table's header row, in order: what a reader of the output looks for."""
    lines = [line.strip() for line in text.splitlines()]
    return [line for i, line in enumerate(lines) if line.startswith("## ") or (
        line.startswith("|") and i + 1 < len(lines) and lines[i + 1].startswith("|---"))]


def _link_forms(text: str) -> set[str]:
    """Each printed URL line with its ports, ids and versions as N, its task as <task> (the README shows the
    first task's) and its log folder as …"""
    forms = set()
    for line in text.splitlines():
        if "://127.0.0.1:" in line:
            for task in TASKS:
                line = line.replace(task, "<task>")
            forms.add(re.sub(r"\d+", "N", re.sub(r"\(log: \S*/logs/", "(log: …/logs/", line.strip())))
    return forms


def test_the_readme_shows_what_the_demo_printed(demo_run):
    assert _sections_and_columns(_readme_block("demo-output")) == _sections_and_columns(demo_run["out"])


def test_the_readme_shows_the_links_ui_printed(ui_links):
    assert _link_forms(_readme_block("ui-output")) == _link_forms(ui_links)
