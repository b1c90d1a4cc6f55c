"""`fedauc compare` against a real `mlflow server` (MLflow's basic-auth app, as a centre would guard it): the
REST reader (pipelines/mlflow_rest.py, no MLflow imported) and MLflow's client on the same store give the same
table, paged or not, the command prints the same, and the server's errors (no credentials, no server, no
experiment) are one line with the fix."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from mlflow import MlflowClient
from typer.testing import CliRunner

from pipelines import compare, mlflow_rest, tracking
from pipelines.cli import app
from pipelines.servers import free_port, server_env, start_server, stop_server

ADMIN, PASSWORD = "admin", "compare-test-secret"
REPO = Path(__file__).resolve().parents[1]


def _training(client, experiment, name, status, metrics, tags=None):
    run = client.create_run(experiment, run_name=name, tags={"fedauc_role": "federated-training",
                                                              "federation": "chest-5", **(tags or {})})
    for key, value in {"algorithm": name.split("-")[0], "local_steps": 8, "rounds": 40,
                       "sites": "stanford,nih,oslo"}.items():
        client.log_param(run.info.run_id, key, str(value))
    for key, value in metrics.items():
        client.log_metric(run.info.run_id, key, value)
    if status != "RUNNING":
        client.set_terminated(run.info.run_id, status=status)
    return run.info.run_id


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """A SQLite store of trainings (finished, failed and resumed, running, a NaN metric, a site run that is no
    training) served by `mlflow server --app-name basic-auth`: (the store's URI, the server's URL)."""
    work = tmp_path_factory.mktemp("compare-server")
    store = tracking.default_tracking_uri(work)
    client = MlflowClient(tracking_uri=store)
    experiment = client.create_experiment("chest-xray", artifact_location=(work / "mlartifacts").as_uri())
    pooled = "test/pooled/"
    for i, auc in enumerate((0.71, 0.83, 0.77, 0.83)):
        _training(client, experiment, f"fedavg-I{i}", "FINISHED", {
            f"{pooled}auc_macro": auc, f"{pooled}auc/Edema": auc - 0.01, f"{pooled}auc_ci95_low_macro": auc - 0.05,
            f"{pooled}auc_ci95_high_macro": auc + 0.04, f"{pooled}pauc_fpr0.3_mcclish_macro": math.nan,
            "bytes_sent_cumulative": 1e6 * (i + 1)})
    failed = _training(client, experiment, "codasca-I8", "FAILED", {f"{pooled}auc_macro": 0.9,
                                                                     "bytes_sent_cumulative": 1.5e6})
    _training(client, experiment, "codasca-I8", "FINISHED", {f"{pooled}auc_macro": 0.8, "bytes_sent_cumulative": 2e6},
              tags={"fedauc.continues": failed})
    _training(client, experiment, "codasca-I4", "RUNNING", {f"{pooled}auc_macro": 0.6})
    client.create_run(experiment, run_name="site-stanford", tags={"fedauc_role": "site"})
    (work / "auth.ini").write_text(f"[mlflow]\ndefault_permission = READ\ndatabase_uri = sqlite:///{work / 'auth.db'}\n"
                                   f"admin_username = {ADMIN}\n"
                                   "authorization_function = mlflow.server.auth:authenticate_request_basic_auth\n")
    port = free_port()
    server = start_server(
        "MLflow", [str(Path(sys.executable).parent / "mlflow"), "server", "--app-name", "basic-auth",
                   "--backend-store-uri", store, "--host", "127.0.0.1", "--port", str(port), "--workers", "1"],
        f"http://127.0.0.1:{port}/health", port, work / "mlflow.log", timeout_s=300,
        env={**server_env("MLflow"), "MLFLOW_AUTH_CONFIG_PATH": str(work / "auth.ini"),
             "MLFLOW_AUTH_ADMIN_PASSWORD": PASSWORD, "MLFLOW_FLASK_SERVER_SECRET_KEY": "compare-test-csrf"})
    yield store, f"http://127.0.0.1:{port}"
    stop_server(server)


@pytest.fixture()
def admin(monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", ADMIN)
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", PASSWORD)


@pytest.mark.parametrize("page", [mlflow_rest.SEARCH_PAGE, 2])
def test_the_server_and_the_client_give_the_same_table(served, admin, monkeypatch, page):
    store, url = served
    monkeypatch.setattr(mlflow_rest, "SEARCH_PAGE", page)  # 2: both readers page through the 7 trainings
    for unfinished in (False, True):
        over_http = compare.compare_runs("chest-xray", include_unfinished=unfinished, uri=url)
        on_file = compare.compare_runs("chest-xray", include_unfinished=unfinished, uri=store)
        pd.testing.assert_frame_equal(over_http, on_file)
        assert over_http.attrs == on_file.attrs == {"hidden": 0 if unfinished else 2}
    assert len(over_http) == 7 and "site-stanford" not in set(over_http["run"])
    resumed = over_http[(over_http["run"] == "codasca-I8") & (over_http["status"] == "FINISHED")].iloc[0]
    assert resumed["MB sent"] == pytest.approx(3.5) and math.isnan(resumed["pAUC0.3 macro"])


def _fedauc(uri: str, *args: str, **env: str) -> subprocess.CompletedProcess:
    """`fedauc compare` in a fresh interpreter; its last stderr line says whether it imported MLflow, pandas."""
    script = ("import sys\nfrom pipelines.cli import app\ntry:\n    app(sys.argv[1:], prog_name='fedauc')\n"
              "finally:\n    print('imported:', 'mlflow' in sys.modules, 'pandas' in sys.modules, file=sys.stderr)")
    return subprocess.run([sys.executable, "-c", script, "compare", "--experiment", "chest-xray", *args],
                          env={**os.environ, "MLFLOW_TRACKING_URI": uri, "COLUMNS": "240", "PYTHONPATH": str(REPO),
                               **env}, capture_output=True, text=True, timeout=300, cwd=REPO)


def test_the_command_prints_the_same_over_http_without_importing_mlflow(served):
    store, url = served
    credentials = {"MLFLOW_TRACKING_USERNAME": ADMIN, "MLFLOW_TRACKING_PASSWORD": PASSWORD}
    over_http = _fedauc(url, "--all", "--wide", **credentials)
    on_file = _fedauc(store, "--all", "--wide")
    assert over_http.returncode == on_file.returncode == 0, over_http.stderr + on_file.stderr
    assert over_http.stdout == on_file.stdout and "codasca-I4" in over_http.stdout
    assert over_http.stderr.strip().endswith("imported: False False")  # neither MLflow nor pandas
    assert on_file.stderr.strip().endswith("imported: True True")


def test_the_servers_refusals_are_one_line(served, tmp_path, monkeypatch):
    _, url = served
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.mlflow/credentials of the user's
    monkeypatch.setenv("MLFLOW_TRACKING_URI", url)
    for name in ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD", "MLFLOW_TRACKING_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    refused = CliRunner().invoke(app, ["compare", "--experiment", "chest-xray"])
    assert refused.exit_code == 1 and "Traceback" not in refused.output
    assert f"error: MLflow server {url} refused experiments/get-by-name: HTTP 401" in refused.output
    assert "fix: set MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD" in refused.output
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", "wrong")
    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", ADMIN)
    assert "HTTP 401" in CliRunner().invoke(app, ["compare", "--experiment", "chest-xray"]).output
    # The credentials file MLflow's client reads, when the environment has none.
    monkeypatch.delenv("MLFLOW_TRACKING_USERNAME")
    monkeypatch.delenv("MLFLOW_TRACKING_PASSWORD")
    (tmp_path / ".mlflow").mkdir()
    (tmp_path / ".mlflow" / "credentials").write_text(
        f"[mlflow]\nmlflow_tracking_username = {ADMIN}\nmlflow_tracking_password = {PASSWORD}\n")
    missing = CliRunner().invoke(app, ["compare", "--experiment", "no-such"])
    assert missing.exit_code == 1 and f"no MLflow experiment named 'no-such' at {url}" in missing.output
    assert CliRunner().invoke(app, ["compare", "--experiment", "chest-xray"]).exit_code == 0
    nobody = f"http://127.0.0.1:{free_port()}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", nobody)
    down = CliRunner().invoke(app, ["compare", "--experiment", "chest-xray"])
    assert down.exit_code == 1 and "Traceback" not in down.output
    assert f"error: MLflow server {nobody} did not answer experiments/get-by-name" in down.output


def test_credentials_are_sent_as_mlflows_client_sends_them(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    assert mlflow_rest.request_headers({"MLFLOW_TRACKING_TOKEN": "t0k"})["Authorization"] == "Bearer t0k"
    both = {"MLFLOW_TRACKING_TOKEN": "t0k", "MLFLOW_TRACKING_USERNAME": "u", "MLFLOW_TRACKING_PASSWORD": "p"}
    assert mlflow_rest.request_headers(both)["Authorization"] == "Basic dTpw"  # base64("u:p"): basic wins
    assert "Authorization" not in mlflow_rest.request_headers({"MLFLOW_TRACKING_USERNAME": "u"})
    assert mlflow_rest.request_headers({"MLFLOW_WORKSPACE": " team "})["X-MLFLOW-WORKSPACE"] == "team"
    # An auth plugin only MLflow can sign with: MLflow's client reads the server.
    assert mlflow_rest.reads_over_http("https://centre:5000", {})
    assert not mlflow_rest.reads_over_http("https://centre:5000", {"MLFLOW_TRACKING_AUTH": "my-plugin"})
    assert not mlflow_rest.reads_over_http("https://u:p@centre:5000", {})  # never printed in an error
    assert not mlflow_rest.reads_over_http("sqlite:///x.db", {})
    with pytest.raises(mlflow_rest.TrackingServerError, match="set only one of them"):
        mlflow_rest.tls_context({"MLFLOW_TRACKING_INSECURE_TLS": "true", "MLFLOW_TRACKING_SERVER_CERT_PATH": "ca.pem"})
