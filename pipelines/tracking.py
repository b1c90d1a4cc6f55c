"""MLflow tracking: experiments per task, runs per training, the model registry and its champion.

Embedded default: a SQLite store and an artifact folder inside the project directory, so nothing needs a
server. Any tracking URI (a PostgreSQL-backed MLflow server) is used instead when MLFLOW_TRACKING_URI is set.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import mlflow
import numpy as np
import pandas as pd
import torch
from mlflow import MlflowClient
from sklearn.metrics import roc_curve

from models.metrics import roc_auc

PROJECT_DIR = Path(__file__).resolve().parents[1]
CHAMPION_ALIAS = "champion"
# The model-version tag the champion comparison reads; written when a version is registered.
SELECTION_METRIC_TAG = "pooled_valid_macro_auc"


def registered_model_name(task: str) -> str:
    return f"fedauc-{task}"


def default_tracking_uri(project_dir: Path = PROJECT_DIR) -> str:
    return f"sqlite:///{(Path(project_dir) / 'mlruns.db').resolve()}"


def configure(project_dir: Path = PROJECT_DIR) -> str:
    """Point MLflow at MLFLOW_TRACKING_URI, or at the project's embedded SQLite store; return the URI."""
    uri = os.environ.get("MLFLOW_TRACKING_URI") or default_tracking_uri(project_dir)
    mlflow.set_tracking_uri(uri)
    return uri


def experiment_id(name: str) -> str:
    """The experiment's id, created on first use. With a SQLite store the artifacts go beside the database
    (``mlartifacts/<experiment>``), so an embedded store is one self-contained folder."""
    client = MlflowClient()
    existing = client.get_experiment_by_name(name)
    if existing is not None:
        return existing.experiment_id
    artifact_location = None
    uri = mlflow.get_tracking_uri()
    if uri.startswith("sqlite:///"):
        database = Path(uri.removeprefix("sqlite:///"))
        artifact_location = (database.parent / "mlartifacts" / name).resolve().as_uri()
    # Tagged as a model-training experiment, so the MLflow UI opens on its runs, not the GenAI overview.
    return client.create_experiment(name, artifact_location=artifact_location,
                                    tags={"mlflow.experimentKind": "custom_model_development"})


def roc_figure(y_true: np.ndarray, y_score: np.ndarray, diseases: tuple[str, ...], title: str):
    """One ROC curve per disease; NaN labels are missing and left out; undefined diseases are listed."""
    fig, ax = plt.subplots(figsize=(5.5, 5))
    for column, disease in enumerate(diseases):
        labelled = ~np.isnan(y_true[:, column])
        labels, scores = y_true[labelled, column], y_score[labelled, column]
        if len(np.unique(labels)) < 2:
            ax.plot([], [], " ", label=f"{disease}: undefined ({'no labels' if len(labels) == 0 else 'one class'})")
            continue
        fpr, tpr, _ = roc_curve(labels, scores)
        ax.plot(fpr, tpr, lw=1.5, label=f"{disease}: AUC {roc_auc(labels, scores):.3f}")
    ax.plot([0, 1], [0, 1], color="grey", lw=0.8, ls="--")
    ax.axvspan(0, 0.3, color="tab:blue", alpha=0.06, label="pAUC region (FPR <= 0.3)")
    ax.set(xlabel="False positive rate", ylabel="True positive rate", title=title, xlim=(0, 1), ylim=(0, 1.01))
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    return fig


def register_model(
    model,
    task: str,
    input_example: np.ndarray,
    selection_metric: float,
) -> tuple[str, bool]:
    """Log ``model`` into the active run, register it as ``fedauc-<task>`` and move the champion alias to it
    when its pooled validation macro-AUC beats the current champion's. Returns (version, promoted).

    The model is exported in eval mode (torch.export, MLflow's pt2 format) so that BatchNorm uses its running
    statistics when the registered model is loaded; the example batch has two rows because torch.export
    freezes a batch dimension of size one.
    """
    if input_example.shape[0] < 2:
        raise ValueError("input_example needs at least 2 rows: torch.export treats a batch of 1 as static")
    model.eval()
    name = registered_model_name(task)
    # Stated, not inferred: inference would pin the local "+cpu" build label, which no index serves.
    requirements = [f"torch=={torch.__version__.split('+')[0]}", f"numpy=={np.__version__}"]
    info = mlflow.pytorch.log_model(
        model, name="model", input_example=input_example, registered_model_name=name, serialization_format="pt2",
        pip_requirements=requirements,
    )
    version = str(info.registered_model_version)
    client = MlflowClient()
    client.set_model_version_tag(name, version, SELECTION_METRIC_TAG, repr(float(selection_metric)))
    promoted = _beats_champion(client, name, selection_metric)
    if promoted:
        client.set_registered_model_alias(name, CHAMPION_ALIAS, version)
    return version, promoted


def _beats_champion(client: MlflowClient, name: str, selection_metric: float) -> bool:
    """The first model is champion whatever its metric (there is nothing to beat, and evaluation needs a
    champion); after that a model must score higher, and an undefined score never wins."""
    try:
        champion = client.get_model_version_by_alias(name, CHAMPION_ALIAS)
    except mlflow.exceptions.MlflowException:
        return True
    if math.isnan(selection_metric):
        return False
    current = float(champion.tags.get(SELECTION_METRIC_TAG, "nan"))
    return math.isnan(current) or selection_metric > current


def compare_runs(experiment: str, sort_by: str = "AUC macro") -> pd.DataFrame:
    """The experiment's federated trainings (parent runs), best first: algorithm, I, per-disease pooled test
    AUC and pAUC (FPR <= 0.3, McClish), macro means, bytes communicated and minutes."""
    client = MlflowClient()
    found = client.get_experiment_by_name(experiment)
    if found is None:
        raise ValueError(f"no MLflow experiment named {experiment!r} at {mlflow.get_tracking_uri()}")
    runs = client.search_runs(
        [found.experiment_id], filter_string="tags.fedauc_role = 'federated-training'", max_results=10_000
    )
    rows = []
    for run in runs:
        metrics, params = run.data.metrics, run.data.params
        row = {
            "run": run.info.run_name,
            "algorithm": params.get("algorithm"),
            "I": int(params.get("local_steps", 0)),
            "rounds": int(params.get("rounds", 0)),
        }
        for prefix, short in (("test/pooled/auc", "AUC"), ("test/pooled/pauc_fpr0.3_mcclish", "pAUC0.3")):
            row[f"{short} macro"] = metrics.get(f"{prefix}_macro", float("nan"))
            row.update({f"{short} {key.rsplit('/', 1)[1]}": value for key, value in sorted(metrics.items())
                        if key.startswith(prefix + "/")})
        row["MB sent"] = metrics.get("bytes_sent_cumulative", float("nan")) / 1e6
        row["minutes"] = (run.info.end_time - run.info.start_time) / 60_000 if run.info.end_time else float("nan")
        rows.append(row)
    table = pd.DataFrame(rows)
    if table.empty:
        return table
    if sort_by not in table:
        raise ValueError(f"cannot sort by {sort_by!r}; columns are {list(table.columns)}")
    return table.sort_values(sort_by, ascending=False, na_position="last").reset_index(drop=True)
