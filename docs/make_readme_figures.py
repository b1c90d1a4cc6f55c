"""Regenerate the README's figures from the MLflow store a `make demo` left behind.

- docs/mlflow_runs.png: the chest-xray experiment in the MLflow UI, captured by headless Chromium
  (`apt-get install chromium`), the page a user opens with `fedauc ui`;
- docs/roc_chest.png: the pooled test ROC curves of the chest-xray champion, as logged to its run.

Run: `.venv/bin/python docs/make_readme_figures.py` after `make demo`.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path

import mlflow
from mlflow import MlflowClient

from federated import schema
from pipelines import tracking
from pipelines.servers import mlflow_runs_url, ui_commands, wait_for

DOCS = Path(__file__).resolve().parent
PORT = 5077


def champion_roc(task: str, out: Path) -> None:
    client = MlflowClient()
    champion = client.get_model_version_by_alias(schema.registered_model_name(task), schema.CHAMPION_ALIAS)
    local = mlflow.artifacts.download_artifacts(run_id=champion.run_id, artifact_path="roc_test_pooled.png",
                                                dst_path=tempfile.mkdtemp())
    shutil.copyfile(local, out)


def mlflow_screenshot(experiment: str, out: Path) -> None:
    command, url = ui_commands(PORT, PORT + 1)["MLflow"]
    server = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        wait_for(url, server)
        experiment_id = MlflowClient().get_experiment_by_name(experiment).experiment_id
        with tempfile.TemporaryDirectory() as profile:
            subprocess.run(
                ["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 f"--user-data-dir={profile}", "--hide-scrollbars", "--window-size=1800,850",
                 "--virtual-time-budget=20000", f"--screenshot={out}", mlflow_runs_url(url, experiment_id)],
                check=True, capture_output=True, timeout=180,
            )
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=30)


if __name__ == "__main__":
    tracking.configure()
    champion_roc("chest-xray", DOCS / "roc_chest.png")
    mlflow_screenshot("chest-xray", DOCS / "mlflow_runs.png")
    print(f"wrote {DOCS / 'roc_chest.png'} and {DOCS / 'mlflow_runs.png'}")
