"""MLflow tracking: experiments per task, runs per training, the model registry and its champion.

Embedded default: a SQLite store and an artifact folder inside the project directory, so nothing needs a
server. Any tracking URI (a PostgreSQL-backed MLflow server) is used instead when MLFLOW_TRACKING_URI is set.

Runs carry the host and process that own them (``owner_tags``), so a run left RUNNING by a process that was
killed is closed as KILLED by the next start (``close_abandoned_runs``). The champion alias moves by a
compare-and-set loop (``promote_best``), so racing trainings cannot both win, and only between versions scored
on the same evaluation (the same sites with the same shards).
"""

from __future__ import annotations

import math
import os
import socket
import time
from collections.abc import Callable
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import mlflow
import numpy as np
import pandas as pd
import psutil
import torch
from mlflow import MlflowClient
from mlflow.entities import RunStatus

# histogram_roc: the exact ROC points at the bin edges, the curve the histogram metrics integrate.
from models.metrics import histogram_auc, histogram_roc

PROJECT_DIR = Path(__file__).resolve().parents[1]
CHAMPION_ALIAS = "champion"
# The model-version tag with the pooled valid macro AUC its training measured; written when a version is registered.
SELECTION_METRIC_TAG = "pooled_valid_macro_auc"
# A registered version whose scores were constant on a split (federated/health.py's neighbour here: a training
# that ran to the end but learnt nothing): recorded, never champion.
COLLAPSED_TAG = "collapsed"
# What that was measured on: the fingerprint of the sites and their shards (pipelines.evaluations.fingerprint).
SELECTION_EVALUATION_TAG = "selection_evaluation"
# "pooled_valid_macro_auc.<fingerprint>": a version's pooled valid macro AUC on that evaluation, what the champion
# comparison reads: its training's own, or a champion's re-evaluation on another federation's sites.
SCORE_TAG_PREFIX = SELECTION_METRIC_TAG + "."
# The process that owns a run: host name, pid and the process's start time (a pid alone can be reused).
OWNER_HOST_TAG, OWNER_PID_TAG, OWNER_STARTED_TAG = "fedauc.owner.host", "fedauc.owner.pid", "fedauc.owner.started"
END_REASON_TAG = "fedauc.end_reason"
FAILURE_TAG = "failure_reason"  # why a training failed: its error (site, round, what, fix)
FAILED_SITE_TAG = "fedauc.failed_site"
DESCRIPTION_TAG = "mlflow.note.content"  # the run's description in the MLflow UI


def registered_model_name(task: str) -> str:
    return f"fedauc-{task}"


def default_tracking_uri(project_dir: Path = PROJECT_DIR) -> str:
    return f"sqlite:///{(Path(project_dir) / 'mlruns.db').resolve()}"


def configure(project_dir: Path = PROJECT_DIR) -> str:
    """Point MLflow at MLFLOW_TRACKING_URI, or at the project's embedded SQLite store; return the URI."""
    uri = os.environ.get("MLFLOW_TRACKING_URI") or default_tracking_uri(project_dir)
    mlflow.set_tracking_uri(uri)
    return uri


def run_outputs_dir(project_dir: Path = PROJECT_DIR) -> Path:
    """Where a training's files other than MLflow's go (``checkpoints/<run>/``): beside the embedded SQLite
    store, so that one folder holds the runs and what resumes them; with an MLflow server, the project folder.
    Never the folder a command runs in (a checkout would show them in ``git status``)."""
    uri = os.environ.get("MLFLOW_TRACKING_URI") or default_tracking_uri(project_dir)
    if uri.startswith("sqlite:///"):
        return Path(uri.removeprefix("sqlite:///")).parent
    return Path(project_dir)


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
    # view from ?workflowType= instead, which the link `fedauc ui` prints carries (pipelines/servers.py).
    return client.create_experiment(name, artifact_location=artifact_location,
                                    tags={"mlflow.experimentKind": "custom_model_development"})


def owner_tags() -> dict[str, str]:
    """Tags naming this process as the owner of a run it starts."""
    process = psutil.Process()
    return {OWNER_HOST_TAG: socket.gethostname(), OWNER_PID_TAG: str(process.pid),
            OWNER_STARTED_TAG: repr(process.create_time())}


def _owner_gone(tags: dict[str, str]) -> bool:
    """True when the run's owning process ran on this host and no longer exists (its pid is free or now
    belongs to a process started later). A run owned elsewhere, or without owner tags, is not judged."""
    if tags.get(OWNER_HOST_TAG) != socket.gethostname() or OWNER_PID_TAG not in tags:
        return False
    try:
        started = psutil.Process(int(tags[OWNER_PID_TAG])).create_time()
    except psutil.NoSuchProcess:
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


def roc_figure(histograms: np.ndarray, diseases: tuple[str, ...], title: str):
    """One ROC curve per disease from score histograms (C, 2, B: positives, negatives; e.g. summed over sites
    by site-local evaluation), no per-image score needed; the legend gives the histogram AUC and its bound,
    undefined diseases are listed with the reason."""
    fig, ax = plt.subplots(figsize=(5.5, 5))
    for column, disease in enumerate(diseases):
        positives, negatives = histograms[column]
        area = histogram_auc(positives, negatives)
        if np.isnan(area.value):
            ax.plot([], [], " ", label=f"{disease}: undefined ({area.value.reason})")
            continue
        fpr, tpr = histogram_roc(np.asarray(positives, float), np.asarray(negatives, float))
        ax.plot(fpr, tpr, lw=1.5, label=f"{disease}: AUC {float(area.value):.3f} (±{area.bound:.1e})")
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
    collapsed: list[str] = (),
    evaluation: str | None = None,
    score_missing: Callable[[str], float] | None = None,
    contract=None,
) -> tuple[str, bool]:
    """Log ``model`` into the active run, register it as ``fedauc-<task>`` and move the champion alias to the
    version with the best pooled validation macro-AUC on the same evaluation (``promote_best``). Returns
    (version, promoted). ``collapsed``: the splits on which the model's scores were constant
    (:func:`collapsed_splits`); such a version is tagged with them and never becomes champion. ``evaluation``:
    the fingerprint of the sites and shards ``selection_metric`` was measured on; ``score_missing(version)``:
    that score for a champion that has none on this evaluation (its re-evaluation on these sites' validation
    splits). ``contract`` (a ``pipelines.hospital.contract.ModelContract``): what the model says about itself;
    with it the model is also a pyfunc model that scores image files (``pipelines.hospital.flavor``), without
    it (the registry's own tests) the bare program is logged.

    ``input_example`` is stored with the model (``input_example.json`` and torch.export's sample inputs), at the
    centre: a synthetic batch of the right shape and dtype, never a patient's images.

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
    if contract is not None:
        from pipelines.hospital.flavor import log_model

        info = log_model(model, contract, input_example, requirements, name)
    else:
        info = mlflow.pytorch.log_model(
            model, name="model", input_example=input_example, registered_model_name=name, serialization_format="pt2",
            pip_requirements=requirements,
        )
    version = str(info.registered_model_version)
    client = MlflowClient()
    client.set_model_version_tag(name, version, SELECTION_METRIC_TAG, repr(float(selection_metric)))
    if collapsed:
        client.set_model_version_tag(name, version, COLLAPSED_TAG, ",".join(collapsed))
    if evaluation is not None:
        client.set_model_version_tag(name, version, SELECTION_EVALUATION_TAG, evaluation)
        client.set_model_version_tag(name, version, SCORE_TAG_PREFIX + evaluation, repr(float(selection_metric)))
    return version, promote_best(client, name, version, evaluation, score_missing)


def collapsed_splits(metrics: dict[str, float]) -> list[str]:
    """The splits on which every defined pooled AUC is exactly 0.5: nothing separates positives from negatives,
    as when a diverged model scores every image the same (a saturated sigmoid)."""
    out = []
    for split in ("valid", "test"):
        aucs = [v for k, v in metrics.items() if k.startswith(f"{split}/pooled/auc/") and not math.isnan(v)]
        if aucs and all(v == 0.5 for v in aucs):
            out.append(split)
    return out


def _best_version(client: MlflowClient, name: str, evaluation: str | None = None) -> str | None:
    """The registered version with the highest selection metric (with ``evaluation``: its score there, among the
    versions scored on it); an undefined one (NaN, untagged) never beats a defined one, and ties go to the
    earlier version, so the first model is champion whatever its metric (there is nothing to beat, and
    evaluation needs a champion) and a later one must score higher. A collapsed version is never a candidate,
    even the first (None when there is no other)."""
    key = SELECTION_METRIC_TAG if evaluation is None else SCORE_TAG_PREFIX + evaluation

    def rank(version) -> tuple[bool, float, int]:
        metric = float(version.tags.get(key, "nan"))
        return (not math.isnan(metric), -math.inf if math.isnan(metric) else metric, -int(version.version))

    candidates = [v for v in client.search_model_versions(f"name = '{name}'") if COLLAPSED_TAG not in v.tags]
    scored = [v for v in candidates if evaluation is None or key in v.tags]
    return str(max(scored or candidates, key=rank).version) if candidates else None


def promote_best(client: MlflowClient, name: str, version: str, evaluation: str | None = None,
                 score_missing: Callable[[str], float] | None = None) -> bool:
    """Point the champion alias at the best registered version; True when that is ``version``.

    With ``evaluation`` (the fingerprint of the sites and shards ``version`` was scored on) only versions scored
    on that same evaluation compete, and the current champion always does: without a score there, it is
    scored first (``score_missing(champion)``, tagged ``SCORE_TAG_PREFIX + evaluation``), so a model trained
    on three sites is never compared with one trained on four by their own federations' numbers.

    A compare-and-set loop, since MLflow has no conditional alias update: read the alias and the best version,
    set the alias only when they differ, then read again, until they agree. Every version's metric tag is
    written before its promotion starts, so the last write of any racing promotion is made after the best
    version's tag is visible, and the alias ends on it: two racing trainings cannot both win, and the worse one
    cannot overwrite the better one. (A champion set by hand is replaced by the best version.)
    """
    while True:
        try:
            current = str(client.get_model_version_by_alias(name, CHAMPION_ALIAS).version)
        except mlflow.exceptions.MlflowException:
            current = None
        if evaluation is not None and current is not None and current != version:
            key = SCORE_TAG_PREFIX + evaluation
            if key not in client.get_model_version(name, current).tags:
                score = score_missing(current) if score_missing is not None else float("nan")
                client.set_model_version_tag(name, current, key, repr(float(score)))
        best = _best_version(client, name, evaluation)
        if current == best or best is None:
            return best == version
        client.set_registered_model_alias(name, CHAMPION_ALIAS, best)


def compare_runs(experiment: str, sort_by: str = "AUC macro", include_unfinished: bool = False) -> pd.DataFrame:
    """The experiment's federated trainings (parent runs), best first: federation, sites and status, algorithm,
    I, per-disease pooled test AUC and pAUC (FPR <= 0.3, McClish), macro means, bytes communicated and
    minutes, then the bounds of each AUC's 95 % interval (``AUC <x> low`` / ``high``; ``tables.fold_intervals``
    shows them inside the AUC cells). Runs that did not finish (failed, killed, still running) have no test metrics and are left out
    unless ``include_unfinished``; ``frame.attrs["hidden"]`` counts them."""
    client = MlflowClient()
    found = client.get_experiment_by_name(experiment)
    if found is None:
        raise ValueError(f"no MLflow experiment named {experiment!r} at {mlflow.get_tracking_uri()}")
    runs = client.search_runs(
        [found.experiment_id], filter_string="tags.fedauc_role = 'federated-training'", max_results=10_000
    )
    rows, hidden = [], 0
    for run in runs:
        if run.info.status != "FINISHED" and not include_unfinished:
            hidden += 1
            continue
        metrics, params = run.data.metrics, run.data.params
        row = {
            "run": run.info.run_name,
            "federation": run.data.tags.get("federation", params.get("federation")),
            "sites": params.get("sites", "").replace(",", ", "),
            "status": run.info.status,
            "algorithm": params.get("algorithm"),
            "I": int(params.get("local_steps", 0)),
            "rounds": int(params.get("rounds", 0)),
        }
        for prefix, short in (("test/pooled/auc", "AUC"), ("test/pooled/pauc_fpr0.3_mcclish", "pAUC0.3")):
            row[f"{short} macro"] = metrics.get(f"{prefix}_macro", float("nan"))
            row.update({f"{short} {key.rsplit('/', 1)[1]}": value for key, value in sorted(metrics.items())
                        if key.startswith(prefix + "/")})
        for end in ("low", "high"):  # the 95 % interval of each pooled AUC (federated.evaluation.pooled_auc_intervals)
            row[f"AUC macro {end}"] = metrics.get(f"test/pooled/auc_ci95_{end}_macro", float("nan"))
            row.update({f"AUC {key.rsplit('/', 1)[1]} {end}": value for key, value in sorted(metrics.items())
                        if key.startswith(f"test/pooled/auc_ci95_{end}/")})
        row["MB sent"] = metrics.get("bytes_sent_cumulative", float("nan")) / 1e6
        row["minutes"] = (run.info.end_time - run.info.start_time) / 60_000 if run.info.end_time else float("nan")
        rows.append(row)
    table = pd.DataFrame(rows)
    if not table.empty:
        if sort_by not in table:
            raise ValueError(f"cannot sort by {sort_by!r}; columns are {list(table.columns)}")
        table = table.sort_values(sort_by, ascending=False, na_position="last").reset_index(drop=True)
    table.attrs["hidden"] = hidden
    return table
