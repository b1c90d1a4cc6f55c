"""Where this machine's fedauc folder and MLflow store are, read without importing MLflow: ``fedauc compare``
reads an MLflow server over HTTP with the standard library (pipelines/mlflow_rest.py), and MLflow's import
alone takes over a second.

The folder (``fedauc_home``) holds what a machine's commands share: its MLflow store (``mlruns.db`` and
``mlartifacts/``), Prefect's home (``.prefect``), the UIs' logs and the demo's site files and data. It is
$FEDAUC_HOME, else the checkout fedauc is installed from; every command finds it, and the store in it, the same
way, so ``FEDAUC_HOME=/tmp/try fedauc demo`` and then ``FEDAUC_HOME=/tmp/try fedauc ui`` show that demo."""

from __future__ import annotations

import os
from pathlib import Path

from common.home import CHECKOUT, fedauc_home
from common.home import HOME_ENV as HOME_ENV

PROJECT_DIR = CHECKOUT  # the checkout, where fedauc's own files are (the demo's site files among them)


def default_tracking_uri(project_dir: Path | None = None) -> str:
    return f"sqlite:///{(Path(project_dir or fedauc_home()) / 'mlruns.db').resolve()}"


def tracking_uri(project_dir: Path | None = None) -> str:
    """Where this process records: MLFLOW_TRACKING_URI, else the embedded SQLite store of ``project_dir``
    (default: ``fedauc_home()``). Read only."""
    return os.environ.get("MLFLOW_TRACKING_URI") or default_tracking_uri(project_dir)
