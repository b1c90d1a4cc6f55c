"""What a centre keeps for ever and what ``fedauc prune`` removes after ``older_than_days`` (docs/consortium.md
"Running for a year", "Retention").

Kept for ever: trainings' parent runs and their site runs (the privacy spending is logged there), the
registered models, their versions' tags and the champion alias (the champion's history), the latest evaluation
of every version that is or was champion (its model card's per-site and subgroup evidence), and any run that
records privacy spending (a noised evaluation's ``privacy.<site>.*`` parameters). Pruned after the retention
period: the detail of evaluation and PACS-scoring runs (their metrics and figures; each day's scoring was
already read into the drift figure of the days after it), Prefect's finished flow runs, and in each
checkpoint folder of a training that ended, every round but the one ``LATEST`` names (what a resume or an
audit of the final model needs), and the finished jobs in the job store of each consortium the centre runs
(federated/flare/centre/prune.py says why all of them).

Each store is pruned through its own mechanism: MLflow runs are deleted through its client and then purged
with ``mlflow gc`` (runs, metrics and artifacts), SQLite's file then compacted with ``VACUUM``; Prefect flow
runs (with their logs and artifacts) through its API; checkpoint rounds are fedauc's own files; NVIDIA FLARE
jobs through its admin command ``delete_job`` with the consortium's admin kit. Logs are rotated by journald
(the systemd units), NVIDIA FLARE's rotating log handlers and, for ``fedauc ui``'s servers,
``pipelines.servers.UI_LOG_LIMIT``, not here. A plan names runs by id and name, flow runs by
name, checkpoints by their folder under ``checkpoints/``, NVIDIA FLARE jobs by id and name: nothing that
identifies a patient.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sqlite3
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from mlflow import MlflowClient
from mlflow.entities import ViewType

from federated.checkpoint import LATEST
from federated.flare.centre.prune import FinishedJob, delete_jobs, old_jobs, old_local_runs, remove_local_runs
from federated.schema import (
    CHAMPION_ALIAS,
    EVALUATION_ROLE,
    MODEL_URI_TAG,
    PRIVACY_PREFIX,
    ROLE_TAG,
    SCORING_ROLE,
    WAS_CHAMPION_TAG,
)

# One quarter: a quarter's drift and evaluations stay in MLflow for the quarterly review (and the drift
# figure, redrawn each day from the days before, shows them); a year of 8 sites' detail would otherwise be
# most of the MLflow store (docs/consortium.md "Retention").
RETENTION_DAYS = 90
PRUNED_ROLES = (EVALUATION_ROLE, SCORING_ROLE)
GC_BATCH = 500  # run ids per `mlflow gc` call: a command line well under any system's limit
PAGE = 5_000
PREFECT_BATCH = 200  # flow runs per request to Prefect's API


@dataclass
class Plan:
    """What a prune removes; printed by ``--dry-run`` and done by :func:`apply`."""

    older_than_days: int
    runs: list[tuple[str, str, str]] = field(default_factory=list)  # (run id, role, run name)
    kept_for_privacy: int = 0
    kept_as_evidence: int = 0  # the latest evaluation of each version that is or was champion
    flow_runs: list[tuple[str, str]] = field(default_factory=list)  # (flow run id, flow run name)
    checkpoint_rounds: list[Path] = field(default_factory=list)
    checkpoints_root: Path | None = None
    flare_jobs: dict[Path, list[FinishedJob]] = field(default_factory=dict)  # per consortium (its admin kit)
    flare_local_runs: dict[Path, list[Path]] = field(default_factory=dict)  # per --flare-workspace

    def lines(self) -> list[str]:
        """What would go, one line per item, after a line of counts."""
        freed = sum(_size(path) for path in self.checkpoint_rounds)
        head = (f"older than {self.older_than_days} days: {len(self.runs)} MLflow evaluation/scoring run(s), "
                f"{len(self.flow_runs)} Prefect flow run(s), {len(self.checkpoint_rounds)} checkpoint round(s) "
                f"({freed / 1e6:.1f} MB), {sum(map(len, self.flare_jobs.values()))} finished NVIDIA FLARE job(s), "
                f"{sum(map(len, self.flare_local_runs.values()))} NVIDIA FLARE simulator/POC workspace(s); "
                "kept: trainings, registered models, the champion's history"
                + (f" with the latest evaluation of each of its {self.kept_as_evidence} champion(s)"
                   if self.kept_as_evidence else "")
                + (f", {self.kept_for_privacy} run(s) recording privacy spending" if self.kept_for_privacy else ""))
        lines = [head]
        lines += [f"mlflow run {run_id} ({role}) {name}" for run_id, role, name in self.runs]
        lines += [f"prefect flow run {name}" for _, name in self.flow_runs]
        lines += [f"checkpoint {path.relative_to(self.checkpoints_root.parent)}" for path in self.checkpoint_rounds]
        lines += [f"nvflare job {job.job_id} ({job.status}) {job.name}" for jobs in self.flare_jobs.values()
                  for job in jobs]
        lines += [f"nvflare workspace {workspace.name}/{run.relative_to(workspace)}"
                  for workspace, runs in self.flare_local_runs.items() for run in runs]
        return lines


def _size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def records_privacy(run) -> bool:
    """A run that says what a job spent of a site's privacy budget: kept, whatever its age."""
    return (any(key.startswith(PRIVACY_PREFIX) for key in run.data.metrics)
            or any(key.startswith("privacy.") or key == "eval_noise_multiplier" for key in run.data.params)
            or any(key.startswith("privacy.") for key in run.data.tags))


def champions_evidence(client: MlflowClient, experiments: list[str]) -> set[str]:
    """The run ids of the latest evaluation of every registered version that is or was champion: its model card's
    per-site and subgroup figures (pipelines/model_card.py), kept for ever. A version was champion when it carries
    ``WAS_CHAMPION_TAG`` (set as it takes the alias), holds the alias now, or was evaluated as the champion (an
    evaluation's ``champion_at_evaluation`` tag: stores from before the version tag)."""
    champions: set[str] = set()  # model URIs, "models:/<name>/<version>"
    for model in client.search_registered_models():
        if CHAMPION_ALIAS in (model.aliases or {}):
            champions.add(f"models:/{model.name}/{model.aliases[CHAMPION_ALIAS]}")
        champions |= {f"models:/{model.name}/{v.version}" for v in client.search_model_versions(f"name = '{model.name}'")
                      if v.tags.get(WAS_CHAMPION_TAG) == "true"}
    latest: dict[str, tuple[int, str]] = {}
    token = None
    while experiments:
        page = client.search_runs(experiments, f"tags.{ROLE_TAG} = '{EVALUATION_ROLE}'", run_view_type=ViewType.ACTIVE_ONLY,
                                  max_results=PAGE, page_token=token)
        for run in page:
            uri = run.data.tags.get(MODEL_URI_TAG, "")
            if run.data.tags.get("champion_at_evaluation") == "true":
                champions.add(uri)
            if run.info.start_time >= latest.get(uri, (-1, ""))[0]:
                latest[uri] = (run.info.start_time, run.info.run_id)
        token = page.token
        if not token:
            break
    return {run_id for uri, (_, run_id) in latest.items() if uri in champions}


def old_runs(client: MlflowClient, cutoff_ms: int) -> tuple[list[tuple[str, str, str]], int, int]:
    """Evaluation and scoring runs of every experiment started before ``cutoff_ms``, but those recording
    privacy spending and the champions' latest evaluations (``champions_evidence``), whose counts are returned
    beside them. Filtered by role and time in the store's query."""
    experiments = [e.experiment_id for e in client.search_experiments()]
    evidence = champions_evidence(client, experiments)
    found, kept = [], 0
    for role in PRUNED_ROLES:
        token = None
        while experiments:
            page = client.search_runs(experiments, f"tags.{ROLE_TAG} = '{role}' and attributes.start_time < {cutoff_ms}",
                                      run_view_type=ViewType.ACTIVE_ONLY, max_results=PAGE, page_token=token)
            for run in page:
                if records_privacy(run):
                    kept += 1
                elif run.info.run_id not in evidence:
                    found.append((run.info.run_id, role, run.info.run_name or ""))
            token = page.token
            if not token:
                break
    return found, kept, len(evidence)


def old_checkpoint_rounds(checkpoints_root: Path, cutoff_s: float) -> list[Path]:
    """In each training's checkpoint folder whose ``LATEST`` was last written before ``cutoff_s`` (the
    training ended, or stopped long ago), every round folder but the one ``LATEST`` names."""
    rounds = []
    for folder in sorted(p for p in Path(checkpoints_root).glob("*") if (p / LATEST).is_file()):
        pointer = folder / LATEST
        if pointer.stat().st_mtime >= cutoff_s:
            continue
        final = pointer.read_text().strip()
        rounds += sorted(p for p in folder.glob("round_*") if p.is_dir() and p.name != final)
    return rounds


def old_flow_runs(cutoff_s: float) -> list[tuple[str, str]]:
    """Prefect's flow runs that entered a final state before ``cutoff_s`` (the server PREFECT_API_URL names).
    By their end, not their start: a run that started (or was due, and waited late) before the period and
    ended within it is kept for the whole period after its end, like any run that ended then."""
    from datetime import datetime, timezone

    from prefect import get_client
    from prefect.client.schemas.filters import (
        FlowRunFilter,
        FlowRunFilterEndTime,
        FlowRunFilterState,
        FlowRunFilterStateType,
    )
    from prefect.client.schemas.objects import StateType
    from prefect.client.schemas.sorting import FlowRunSort

    final = [StateType.COMPLETED, StateType.FAILED, StateType.CANCELLED, StateType.CRASHED]
    query = FlowRunFilter(end_time=FlowRunFilterEndTime(before_=datetime.fromtimestamp(cutoff_s, timezone.utc)),
                          state=FlowRunFilterState(type=FlowRunFilterStateType(any_=final)))
    found = []
    with get_client(sync_client=True) as client:
        while True:
            page = client.read_flow_runs(flow_run_filter=query, sort=FlowRunSort.ID_DESC, limit=PREFECT_BATCH,
                                         offset=len(found))
            found += [(str(run.id), run.name) for run in page]
            if len(page) < PREFECT_BATCH:
                return found


def delete_flow_runs(flow_run_ids: list[str]) -> None:
    """Delete the flow runs with their artifacts through Prefect's API. Prefect drops a deleted run's logs
    itself (a task of its server), not its artifacts (the evaluations' tables, the prune's own list): those
    would stay in its database, orphaned, for ever."""
    from uuid import UUID

    from prefect import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId
    from prefect.exceptions import ObjectNotFound

    with get_client(sync_client=True) as client:
        for start in range(0, len(flow_run_ids), PREFECT_BATCH):
            batch = [UUID(i) for i in flow_run_ids[start:start + PREFECT_BATCH]]
            query = ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=batch))
            while artifacts := client.read_artifacts(artifact_filter=query, limit=PREFECT_BATCH):
                for artifact in artifacts:
                    client.delete_artifact(artifact.id)
            for flow_run_id in batch:
                # One deleted since the plan (a prune from the command line meanwhile) is passed over.
                with contextlib.suppress(ObjectNotFound):
                    client.delete_flow_run(flow_run_id)


def plan(older_than_days: int = RETENTION_DAYS, checkpoints_root: Path | None = None, prefect: bool = True,
         now: float | None = None, kits: Sequence[Path] = (), flare_workspaces: Sequence[Path] = ()) -> Plan:
    """What a prune of the store MLflow is configured for (and Prefect's server, ``checkpoints_root``, the
    consortia the admin kits ``kits`` reach and the jobs run here in ``flare_workspaces``) would remove;
    changes nothing."""
    if older_than_days < 1:
        raise ValueError(f"--older-than-days must be at least 1, not {older_than_days}")
    cutoff_s = (time.time() if now is None else now) - older_than_days * 86_400
    runs, kept, evidence = old_runs(MlflowClient(), int(cutoff_s * 1000))
    result = Plan(older_than_days, runs, kept, evidence, checkpoints_root=checkpoints_root)
    if prefect:
        result.flow_runs = old_flow_runs(cutoff_s)
    if checkpoints_root is not None and Path(checkpoints_root).is_dir():
        result.checkpoint_rounds = old_checkpoint_rounds(Path(checkpoints_root), cutoff_s)
    result.flare_jobs = {Path(kit): old_jobs(kit, cutoff_s) for kit in kits}
    result.flare_local_runs = {Path(w).resolve(): old_local_runs(Path(w).resolve(), cutoff_s) for w in flare_workspaces}
    return result


def prune_centre(tracking_uri: str, older_than_days: int = RETENTION_DAYS, dry_run: bool = False,
                 backend_store_uri: str | None = None, kits: Sequence[Path] = (),
                 flare_workspaces: Sequence[Path] = ()) -> list[str]:
    """The prune ``fedauc prune`` and the ``prune`` flow run: the store at ``tracking_uri`` (purged by ``mlflow
    gc`` where it is the embedded SQLite file or ``backend_store_uri`` names the database), Prefect's server
    where ``PREFECT_API_URL`` names one, the run outputs' checkpoints, and the job store of each consortium whose
    admin kit is in ``kits`` and the simulator and POC runs left in ``flare_workspaces``. What went (or would),
    one per line."""
    from pipelines.tracking import run_outputs_dir

    planned = plan(older_than_days, run_outputs_dir() / "checkpoints", prefect=bool(os.environ.get("PREFECT_API_URL")),
                   kits=kits, flare_workspaces=flare_workspaces)
    if dry_run:
        return planned.lines()
    store = backend_store_uri or (tracking_uri if tracking_uri.startswith("sqlite:///") else None)
    return planned.lines() + apply(planned, store)


def apply(planned: Plan, backend_store_uri: str | None) -> list[str]:
    """Remove what ``planned`` lists; ``backend_store_uri`` (the tracking database) lets ``mlflow gc`` purge
    the deleted runs here, else they wait in MLflow's trash for a gc at the tracking server. Returns notes."""
    notes = []
    client = MlflowClient()
    ids = [run_id for run_id, _, _ in planned.runs]
    for run_id in ids:
        client.delete_run(run_id)
    if ids and backend_store_uri:
        for start in range(0, len(ids), GC_BATCH):
            subprocess.run([sys.executable, "-m", "mlflow", "gc", "--backend-store-uri", backend_store_uri,
                            "--run-ids", ",".join(ids[start:start + GC_BATCH])], check=True, capture_output=True)
        if backend_store_uri.startswith("sqlite:///"):
            with sqlite3.connect(backend_store_uri.removeprefix("sqlite:///"), isolation_level=None) as db:
                db.execute("VACUUM")  # SQLite keeps freed pages in its file until compacted
    elif ids:
        notes.append(f"{len(ids)} MLflow run(s) deleted; `mlflow gc --backend-store-uri <its database>` at the "
                     "tracking server frees their rows and artifacts")
    if planned.flow_runs:
        delete_flow_runs([flow_run_id for flow_run_id, _ in planned.flow_runs])
    for round_dir in planned.checkpoint_rounds:
        shutil.rmtree(round_dir)
    for kit, jobs in planned.flare_jobs.items():
        if jobs:
            delete_jobs(kit, [job.job_id for job in jobs])
    for runs in planned.flare_local_runs.values():
        remove_local_runs(runs)
    return notes
