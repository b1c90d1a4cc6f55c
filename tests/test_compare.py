"""`fedauc compare` on a real MLflow store: which federation and sites each training used, its status,
whole run names, unfinished runs hidden unless --all, CSV and HTML copies."""

import mlflow
import pandas as pd
import pytest
from mlflow import MlflowClient
from typer.testing import CliRunner

from pipelines import tracking
from pipelines.cli import app
from pipelines.compare import compare_runs

LONG_NAME = "codasca-I8-lr1.0-T0-160-nightly-2026-11-23-with-a-name-longer-than-any-column"


def _training(client, experiment, name, federation, sites, status, auc):
    run = client.create_run(experiment, run_name=name, tags={"fedauc_role": "federated-training",
                                                              "federation": federation})
    for key, value in {"algorithm": name.split("-")[0], "local_steps": 8, "rounds": 40, "federation": federation,
                       "sites": ",".join(sites)}.items():
        client.log_param(run.info.run_id, key, str(value))
    if status == "FINISHED":
        client.log_metric(run.info.run_id, "bytes_sent_cumulative", 2e6)
    if auc is not None:  # a FAILED run's: its last evaluation before it failed
        client.log_metric(run.info.run_id, "test/pooled/auc_macro", auc)
        client.log_metric(run.info.run_id, "test/pooled/auc/Edema", auc)
    client.set_terminated(run.info.run_id, status=status)


@pytest.fixture()
def store(tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlruns.db'}")
    tracking.configure()
    client = MlflowClient()
    experiment = tracking.experiment_id("chest-xray")
    four, five = ["stanford", "nih", "san-juan", "hanoi"], ["stanford", "nih", "san-juan", "hanoi", "oslo"]
    _training(client, experiment, LONG_NAME, "demo-chest", four, "FINISHED", 0.771)
    _training(client, experiment, "fedavg-I8", "chest-5", five, "FINISHED", 0.806)
    _training(client, experiment, "codsca-I8", "chest-5", five, "FAILED", 0.912)
    yield tmp_path
    mlflow.set_tracking_uri(None)


def test_compare_shows_federation_sites_status_and_whole_names(store):
    result = CliRunner().invoke(app, ["compare", "--experiment", "chest-xray"])
    assert result.exit_code == 0, result.output
    assert "demo-chest" in result.output and "chest-5" in result.output
    assert max(len(line) for line in result.output.splitlines()) <= 100  # a 100-column terminal's summary
    assert "oslo" not in result.output and "Edema" not in result.output
    result = CliRunner().invoke(app, ["compare", "--experiment", "chest-xray", "--wide"])
    assert LONG_NAME in result.output
    assert "stanford, nih, san-juan, hanoi, oslo" in result.output and "Edema" in result.output
    assert "FINISHED" in result.output and "FAILED" not in result.output and "codsca-I8" not in result.output
    assert "1 unfinished training(s) hidden" in result.output
    assert result.output.index("fedavg-I8") < result.output.index(LONG_NAME)  # best pooled AUC first


def test_compare_all_lists_failed_runs(store):
    result = CliRunner().invoke(app, ["compare", "--experiment", "chest-xray", "--all", "--wide"])
    assert result.exit_code == 0, result.output
    assert "codsca-I8" in result.output and "FAILED" in result.output
    assert "hidden" not in result.output
    # Its last evaluation during training is not shown as its result, and it is listed after the results.
    assert "0.912" not in result.output and result.output.index("codsca-I8") > result.output.index(LONG_NAME)


def test_compare_writes_csv_and_html(store):
    csv, page = store / "runs.csv", store / "runs.html"
    result = CliRunner().invoke(app, ["compare", "--experiment", "chest-xray", "--federation", "chest-5",
                                      "--csv", str(csv), "--html", str(page)])
    assert result.exit_code == 0, result.output
    table = pd.read_csv(csv)
    assert table["run"].tolist() == ["fedavg-I8"]
    assert table.loc[0, "AUC macro"] == pytest.approx(0.806) and table.loc[0, "MB sent"] == pytest.approx(2.0)
    assert "<td>fedavg-I8</td>" in page.read_text() and "0.806" in page.read_text()
    assert LONG_NAME not in page.read_text()


def test_compare_refuses_an_unknown_file_type(store):
    result = CliRunner().invoke(app, ["compare", "--experiment", "chest-xray", "--csv", str(store / "x.xlsx")])
    assert result.exit_code == 1
    assert "name the file .csv or .html" in result.output


def test_a_resumed_trainings_totals_cover_the_runs_it_continues(store):
    client = MlflowClient()
    experiment = tracking.experiment_id("chest-xray")
    failed = client.search_runs([experiment], "attributes.run_name = 'codsca-I8'")[0]
    client.log_metric(failed.info.run_id, "bytes_sent_cumulative", 1.5e6)
    resumed = client.create_run(experiment, run_name="codsca-I8", tags={
        "fedauc_role": "federated-training", "federation": "chest-5", "fedauc.continues": failed.info.run_id})
    for key, value in {"algorithm": "codasca", "local_steps": 8, "rounds": 40}.items():
        client.log_param(resumed.info.run_id, key, str(value))
    client.log_metric(resumed.info.run_id, "test/pooled/auc_macro", 0.7)
    client.log_metric(resumed.info.run_id, "bytes_sent_cumulative", 2e6)
    client.set_terminated(resumed.info.run_id, status="FINISHED")
    table = compare_runs("chest-xray")
    row = table[table["run"] == "codsca-I8"].iloc[0]
    assert row["MB sent"] == pytest.approx(3.5)  # its own 2 MB and the failed run's 1.5 MB
