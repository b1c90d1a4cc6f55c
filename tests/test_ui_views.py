"""What `fedauc ui` and MLflow's fields show, without a browser (issue 47; tests/test_ui_browser.py opens them in
Chromium): the MLflow server's page, the shared trainings view, the links, the descriptions' text, the names of
sites in what a training records, the ROC legend."""

from __future__ import annotations

import json

import numpy as np
from mlflow import MlflowClient

from federated.schema import HEADLINE_INTERVAL, HEADLINE_METRIC, ROLE_TAG, TRAINING_ROLE
from pipelines import descriptions, ui_views


def test_the_mlflow_ui_page_stores_the_training_view_unless_the_browser_chose_one():
    from pipelines.mlflow_ui import DEFAULT_VIEW_SCRIPT, flask_app

    page = flask_app.test_client().get("/")
    assert page.status_code == 200
    html = page.get_data(as_text=True)
    # Once, and before MLflow's own scripts, which read the choice as they start.
    assert html.count(DEFAULT_VIEW_SCRIPT) == 1 and html.index("<script") == html.index(DEFAULT_VIEW_SCRIPT)
    assert "localStorage.getItem(\"mlflow.workflowType_v1\")===null" in DEFAULT_VIEW_SCRIPT
    assert flask_app.test_client().get("/health").get_data(as_text=True) == "OK"  # other answers untouched


def test_the_trainings_view_filters_trainings_and_sorts_by_pooled_test_auc_descending():
    state = ui_views.trainings_view_state()
    assert state["searchFilter"] == f"tags.{ROLE_TAG} = '{TRAINING_ROLE}'"
    assert state["orderByKey"] == f"metrics.`{HEADLINE_METRIC}`" and state["orderByAsc"] is False
    shown = [f"metrics.`{key}`" for key in (HEADLINE_METRIC, *HEADLINE_INTERVAL)]
    assert all(key in state["selectedColumns"] and state["columnWidths"][key] >= 200 for key in shown)
    assert state["columnOrder"][:3] == ["attributes.`Run Name`", "params.`algorithm`", shown[0]]


def test_links_name_the_shared_view_the_champion_and_the_task(tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'links.db'}")
    client = MlflowClient(f"sqlite:///{tmp_path / 'links.db'}")
    assert ui_views.links_text(ui_views.task_links("http://m", "http://p", client)).startswith("No training")
    experiment = client.create_experiment("chest-xray")
    client.create_run(experiment, tags={ROLE_TAG: "evaluation"})
    assert ui_views.task_links("http://m", "http://p", client) == []  # an evaluation is not a training
    client.create_run(experiment, tags={ROLE_TAG: TRAINING_ROLE})
    (links,) = ui_views.task_links("http://m", "http://p", client)
    assert links.trainings == (f"http://m/#/experiments/{experiment}/runs?viewStateShareKey=fedauc-trainings"
                               "&workflowType=machine_learning")
    assert links.champion is None and links.flow_runs == ("http://p/runs?flow-run-search=chest-xray"
                                                             "&task-run-search=chest-xray")
    stored = client.get_experiment(experiment).tags["mlflow.sharedViewState.fedauc-trainings"]
    assert json.loads(stored) == ui_views.trainings_view_state()
    client.create_registered_model("fedauc-chest-xray")
    run = client.search_runs([experiment], f"tags.{ROLE_TAG} = '{TRAINING_ROLE}'")[0]
    client.create_model_version("fedauc-chest-xray", "runs:/x/model", run_id=run.info.run_id)
    client.set_registered_model_alias("fedauc-chest-xray", "champion", "1")
    (links,) = ui_views.task_links("http://m", "http://p", client)
    assert links.champion == "http://m/#/models/fedauc-chest-xray/versions/1?workflowType=machine_learning"


def test_a_training_description_leads_with_its_pooled_test_auc_and_interval():
    text = descriptions.training_description(
        {"algorithm": "codasca", "rounds": "5", "I": "8", "network": "small_resnet", "federation": "demo-chest",
         "K": "3", "sites": "hanoi,lyon,boston", "task": "chest-xray"},
        {HEADLINE_METRIC: 0.81234, HEADLINE_INTERVAL[0]: 0.7712, HEADLINE_INTERVAL[1]: 0.8534,
         "valid/pooled/auc_macro": 0.8}, "4", promoted=True)
    assert text.startswith("**Pooled test macro AUC 0.812 [0.771, 0.853]**")
    assert "Algorithm **codasca**" in text and "hanoi, lyon, boston" in text and "version 4: the champion" in text
    assert descriptions.headline({HEADLINE_METRIC: float("nan")}) == "n/a"


def test_the_suppression_record_names_sites():
    from pipelines.runs import named_sites

    record = {"valid/site/1/auc/Melanoma": "suppressed: fewer than 10 positives", "test/site/0/n_pos/Melanoma": "<10",
              "valid/site/lyon/auc_macro": "suppressed: fewer than 10 negatives"}
    assert named_sites(record, ["hanoi", "lyon"]) == {
        "valid/site/lyon/auc/Melanoma": "suppressed: fewer than 10 positives",
        "test/site/hanoi/n_pos/Melanoma": "<10", "valid/site/lyon/auc_macro": "suppressed: fewer than 10 negatives"}


def test_the_roc_legend_gives_the_interval_and_names_the_binning_bound():
    import matplotlib.pyplot as plt

    from pipelines.plots import roc_figure

    rng = np.random.default_rng(0)
    positives, negatives = np.histogram(rng.beta(3, 2, 200), 50, (0, 1))[0], np.histogram(rng.beta(2, 3, 800), 50,
                                                                                          (0, 1))[0]
    figure = roc_figure(np.array([[positives, negatives]]), ("Melanoma",), "t")
    (label, _) = [text.get_text() for text in figure.axes[0].get_legend().get_texts()]
    plt.close(figure)
    assert "95 % CI [" in label and "binning error <=" in label and "±" not in label
