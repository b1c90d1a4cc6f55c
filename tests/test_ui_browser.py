"""``fedauc ui``'s links in a real browser (issue 47): Debian's Chromium and its chromedriver (the Makefile's
SYSTEM_PACKAGES; nothing is downloaded at run time) open the MLflow UI that ``fedauc ui`` starts, on a store with
two trainings, and find the answer to "which method won, by how much, which version is champion" one click from
each link; the descriptions are read back through MLflow's REST API as any client would."""

from __future__ import annotations

import json
import urllib.parse
import urllib.request

import pytest
from browser import WAIT_S, chromium, needs_chromium
from mlflow import MlflowClient

from federated.schema import CHAMPION_ALIAS, HEADLINE_METRIC, ROLE_TAG, TRAINING_ROLE, registered_model_name
from pipelines.servers import UI_LOG_LIMIT, free_port, start_server, stop_server, ui_servers
from pipelines.ui_views import task_links

pytest.importorskip("selenium.webdriver")
pytestmark = needs_chromium
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402

TASK, RUNS = "melanoma", {"ui-fedavg": ("fedavg", {}), "ui-codasca": ("codasca", {"T0": 4})}


@pytest.fixture(scope="module")
def trained(evaluable_melanoma):
    from pipelines.runs import train_tracked
    from preprocessing.federation import load_federation

    root, federation_yaml = evaluable_melanoma
    for name, (algorithm, params) in RUNS.items():
        train_tracked(load_federation(federation_yaml), root / "shards",
                      {"algorithm": algorithm, "params": params, "rounds": 1, "local_steps": 2, "batch_size": 16,
                       "lr": 0.05, "eval_every": 1}, run_name=name)


@pytest.fixture(scope="module")
def mlflow_ui(trained, tmp_path_factory):
    """The MLflow server exactly as `fedauc ui` starts it, and the links it prints."""
    port = free_port()
    ui = ui_servers(port, free_port())["MLflow"]
    url = ui.url
    server = start_server("MLflow UI", ui.command, url, port, tmp_path_factory.mktemp("logs") / "mlflow-ui.log",
                          env=ui.env, log_limit=UI_LOG_LIMIT)
    try:
        (links,) = [link for link in task_links(url, "http://127.0.0.1:4200") if link.task == TASK]
        yield url, links
    finally:
        stop_server(server)


@pytest.fixture
def browser():
    with chromium() as driver:
        yield driver


def _grid_rows(driver, column: str) -> list[tuple[str, str]]:
    """(run name, ``column``'s text) per row of the runs table, top to bottom (ag-grid renders the pinned name
    and the other cells as two rows with one row-index); read in one script, as the table re-renders."""
    cells = driver.execute_script(
        "return Array.from(document.querySelectorAll('[role=row][row-index] [col-id]'), c => "
        "[c.closest('[role=row]').getAttribute('row-index'), c.getAttribute('col-id'), c.innerText.trim()])")
    # The name cell also holds the run's colour ("#3ba65e") for its colour picker, on a line of its own.
    names = {int(i): text.splitlines()[-1] for i, col, text in cells if col == "attributes.`Run Name`" and text}
    values = {int(i): text for i, col, text in cells if col == column}
    return [(names[i], values.get(i, "")) for i in sorted(names)]


def test_the_trainings_link_lists_only_trainings_best_pooled_test_auc_first(mlflow_ui, browser):
    _, links = mlflow_ui
    client = MlflowClient()
    experiment = client.get_experiment_by_name(TASK).experiment_id
    trainings = client.search_runs([experiment], f"tags.{ROLE_TAG} = '{TRAINING_ROLE}'")
    column = f"metrics.`{HEADLINE_METRIC}`"
    browser.get(links.trainings)
    WebDriverWait(browser, WAIT_S).until(lambda d: set(RUNS) <= {name for name, _ in _grid_rows(d, column)})
    header = browser.find_element(By.CSS_SELECTOR, f"[role=columnheader][col-id='{column}']")
    assert header.is_displayed() and HEADLINE_METRIC in header.text
    rows = _grid_rows(browser, column)
    assert {name for name, _ in rows} == {run.info.run_name for run in trainings}  # no site runs, no evaluations
    shown = [float(value) for _, value in rows if value]
    assert shown == sorted(shown, reverse=True) and len(shown) >= len(RUNS)
    recorded = {run.info.run_name: run.data.metrics[HEADLINE_METRIC] for run in trainings
                if HEADLINE_METRIC in run.data.metrics}
    assert [name for name, value in rows if value] == sorted(recorded, key=lambda name: -recorded[name])


def test_the_champion_link_shows_its_algorithm_and_diseases(mlflow_ui, browser):
    _, links = mlflow_ui
    client = MlflowClient()
    champion = client.get_model_version_by_alias(registered_model_name(TASK), CHAMPION_ALIAS)
    algorithm = client.get_run(champion.run_id).data.params["algorithm"]
    assert links.champion.split("?")[0].endswith(f"/versions/{champion.version}")
    browser.get(links.champion)
    WebDriverWait(browser, WAIT_S).until(lambda d: "Diseases (outputs, in order): Melanoma" in d.page_source)
    page = browser.find_element(By.TAG_NAME, "body").text
    assert f"{algorithm} on {TASK}" in page and "champion" in page and "Operating points" in page


def test_a_click_on_an_experiment_opens_its_training_runs(mlflow_ui, browser):
    """MLflow's default on a first visit is its GenAI view, where the click lands on "Overview" (0 traces)."""
    url, _ = mlflow_ui
    experiment = MlflowClient().get_experiment_by_name(TASK).experiment_id
    browser.get(f"{url}/#/experiments")
    link = WebDriverWait(browser, WAIT_S).until(
        lambda d: d.find_elements(By.CSS_SELECTOR, f"a[href$='/experiments/{experiment}']"))[0]
    link.click()
    WebDriverWait(browser, WAIT_S).until(
        lambda d: d.find_elements(By.CSS_SELECTOR, "[role=columnheader][col-id='attributes.`Run Name`']"))
    assert f"/experiments/{experiment}/runs" in browser.current_url
    assert "Overview" not in browser.find_element(By.TAG_NAME, "body").text


def test_the_rest_api_returns_the_descriptions(mlflow_ui):
    url, _ = mlflow_ui

    def get(path: str, **query) -> dict:
        with urllib.request.urlopen(f"{url}/api/2.0/mlflow/{path}?{urllib.parse.urlencode(query)}") as response:
            return json.load(response)

    client = MlflowClient()
    name = registered_model_name(TASK)
    for run in client.search_runs([client.get_experiment_by_name(TASK).experiment_id],
                                  f"tags.{ROLE_TAG} = '{TRAINING_ROLE}' and attributes.run_name LIKE 'ui-%'"):
        tags = {t["key"]: t["value"] for t in get("runs/get", run_id=run.info.run_id)["run"]["data"]["tags"]}
        assert tags["mlflow.note.content"].startswith("**Pooled test macro AUC ")
        assert f"Algorithm **{RUNS[run.info.run_name][0]}**" in tags["mlflow.note.content"]
    model = get("registered-models/get", name=name)["registered_model"]
    assert "pooled **validation** macro AUC" in model["description"] and "**champion**" in model["description"]
    for version in client.search_model_versions(f"name = '{name}'"):
        description = get("model-versions/get", name=name, version=version.version)["model_version"]["description"]
        assert "Diseases (outputs, in order): Melanoma." in description and "Provenance:" in description


def test_the_champions_card_is_one_click_from_its_version_page(mlflow_ui, browser, evaluable_melanoma):
    """Issue 55: after an evaluation, the champion's version page links its model card; one click shows the card
    (MLflow's artifact viewer renders the HTML page) with its per-site rows."""
    from pipelines.evaluations import evaluate_registered
    from preprocessing.federation import load_federation

    root, federation_yaml = evaluable_melanoma
    (evaluated,) = evaluate_registered(load_federation(federation_yaml), root / "shards")
    _, links = mlflow_ui
    browser.get(links.champion)
    link = WebDriverWait(browser, WAIT_S).until(lambda d: d.find_elements(By.PARTIAL_LINK_TEXT, "model card"))[0]
    link.click()  # MLflow opens a description's links in a new tab
    WebDriverWait(browser, WAIT_S).until(lambda d: len(d.window_handles) > 1 or "artifactPath" in d.current_url)
    browser.switch_to.window(browser.window_handles[-1])
    WebDriverWait(browser, WAIT_S).until(lambda d: d.find_elements(By.TAG_NAME, "iframe"))
    browser.switch_to.frame(browser.find_element(By.TAG_NAME, "iframe"))
    WebDriverWait(browser, WAIT_S).until(lambda d: "By site" in d.find_element(By.TAG_NAME, "body").text)
    card = browser.find_element(By.TAG_NAME, "body").text
    assert f"Model card: {registered_model_name(TASK)} version {evaluated['model_version']}" in card
    assert "The champion." in card and evaluated["run_id"] in card
    assert browser.find_elements(By.CSS_SELECTOR, "img[src^='data:image/png']")  # the forest plot
