"""MLflow's store: where runs are recorded, their experiments per task, and the process that owns each run.

Embedded default: a SQLite store and an artifact folder inside the project directory, so nothing needs a
server. Any tracking URI (a PostgreSQL-backed MLflow server) is used instead when MLFLOW_TRACKING_URI is set.

Runs carry the host and process that own them (``owner_tags``), so a run left RUNNING by a process that was
killed is closed as KILLED by the next start (``close_abandoned_runs``); a training that fails says why on its
runs (``record_failure``). The registry and its champion: pipelines/registry.py; plots: pipelines/plots.py;
the runs compared: pipelines/compare.py; tag names and metric keys: federated/schema.py.
"""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

import mlflow
from mlflow import MlflowClient
from mlflow.entities import RunStatus

from common.lifetime import start_time
from federated.schema import (
    DESCRIPTION_TAG,
    END_REASON_TAG,
    EXPERIMENT_KIND_TAG,
    FAILED_SITE_TAG,
    FAILURE_TAG,
    MODEL_TRAINING_KIND,
    OWNER_HOST_TAG,
    OWNER_PID_TAG,
    OWNER_STARTED_TAG,
)

# Where the store is, read without MLflow (pipelines/store_uri.py); exported here too, where callers look for it.
from pipelines.store_uri import PROJECT_DIR as PROJECT_DIR
from pipelines.store_uri import default_tracking_uri as default_tracking_uri
from pipelines.store_uri import fedauc_home
from pipelines.store_uri import tracking_uri as tracking_uri


def configure(project_dir: Path | None = None) -> str:
    """Point this process's MLflow at ``tracking_uri()``; return the URI. Process-wide, so called once at a
    command's entry only: a CLI command, a flow or a task that runs in a process of its own, a script's main
    (tests/test_side_effects.py names the modules); everything below reads MLflow's URI as the entry set it."""
    uri = tracking_uri(project_dir)
    mlflow.set_tracking_uri(uri)
    return uri


def run_outputs_dir(project_dir: Path | None = None) -> Path:
    """Where a training's files other than MLflow's go (``checkpoints/<run>/``): beside the embedded SQLite
    store, so that one folder holds the runs and what resumes them; with an MLflow server, the project folder.
    Never the folder a command runs in (a checkout would show them in ``git status``)."""
    uri = tracking_uri(project_dir)
    if uri.startswith("sqlite:///"):
        return Path(uri.removeprefix("sqlite:///")).parent
    return Path(project_dir or fedauc_home())


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
    # Tagged as a model-training experiment for MLflow clients that read the kind; MLflow 3.17's UI picks its
    # view from ?workflowType= or the browser's stored choice instead, which `fedauc ui`'s server sets
    # (pipelines/mlflow_ui.py).
    return client.create_experiment(name, artifact_location=artifact_location,
                                    tags={EXPERIMENT_KIND_TAG: MODEL_TRAINING_KIND})


def owner_tags() -> dict[str, str]:
    """Tags naming this process as the owner of a run it starts."""
    return {OWNER_HOST_TAG: socket.gethostname(), OWNER_PID_TAG: str(os.getpid()),
            OWNER_STARTED_TAG: repr(start_time(os.getpid()))}


def _owner_gone(tags: dict[str, str]) -> bool:
    """True when the run's owning process ran on this host and no longer exists (its pid is free or now
    belongs to a process started later). A run owned elsewhere, or without owner tags, is not judged."""
    if tags.get(OWNER_HOST_TAG) != socket.gethostname() or OWNER_PID_TAG not in tags:
        return False
    started = start_time(int(tags[OWNER_PID_TAG]))
    if started is None:
        return True
    return abs(started - float(tags[OWNER_STARTED_TAG])) > 1e-3


def close_abandoned_runs(experiment: str) -> list[str]:
    """Mark KILLED every run of ``experiment`` still RUNNING whose owning process on this host is gone (killed,
    out of memory, power cut: nothing in it could close the run); returns their ids. Called when a training or
    evaluation starts."""
    client = MlflowClient()
    runs = client.search_runs([experiment], filter_string="attributes.status = 'RUNNING'", max_results=10_000)
    closed = []
    for run in runs:
        if _owner_gone(run.data.tags):
            client.set_tag(run.info.run_id, END_REASON_TAG,
                           f"process {run.data.tags[OWNER_PID_TAG]} on {run.data.tags[OWNER_HOST_TAG]} ended without "
                           f"closing the run; marked KILLED at {time.strftime('%Y-%m-%d %H:%M:%S %Z')}")
            client.set_terminated(run.info.run_id, status=RunStatus.to_string(RunStatus.KILLED))
            closed.append(run.info.run_id)
    return closed


def record_failure(client: MlflowClient, run_ids: list[str], error: BaseException) -> None:
    """Why a training failed, on each of its runs: the error (``FAILURE_TAG``; its first line as the run's
    description) and the site it names (``FAILED_SITE_TAG``, where the error has a ``site``)."""
    reason = (str(error).splitlines() or [type(error).__name__])[0]
    site = getattr(error, "site", None)
    tags = {FAILURE_TAG: str(error)[:5000] or type(error).__name__,
            DESCRIPTION_TAG: f"FAILED{f' at site {site}' if site else ''}: {reason}"}
    if site:
        tags[FAILED_SITE_TAG] = site
    for run_id in run_ids:
        for key, value in tags.items():
            client.set_tag(run_id, key, value)
