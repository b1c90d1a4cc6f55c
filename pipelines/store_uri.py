"""Where MLflow's store is, read without importing MLflow: ``fedauc compare`` reads an MLflow server over HTTP
with the standard library (pipelines/mlflow_rest.py), and MLflow's import alone takes over a second."""

from __future__ import annotations

import os
from pathlib import Path

PROJECT_DIR = Path(__file__).resolve().parents[1]


def default_tracking_uri(project_dir: Path = PROJECT_DIR) -> str:
    return f"sqlite:///{(Path(project_dir) / 'mlruns.db').resolve()}"


def tracking_uri(project_dir: Path = PROJECT_DIR) -> str:
    """Where this process records: MLFLOW_TRACKING_URI, else the project's embedded SQLite store. Read only."""
    return os.environ.get("MLFLOW_TRACKING_URI") or default_tracking_uri(project_dir)
