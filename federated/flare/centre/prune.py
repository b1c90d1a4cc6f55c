"""A consortium's finished NVIDIA FLARE jobs removed from its server after the retention period, through
NVIDIA FLARE's own admin command (``delete_job``), never by deleting folders behind the running server.

When a job ends, NVIDIA FLARE 2.9's server archives its run folder (the job's logs, fedauc's live file, the
result) into its job store (``stores/jobs/<job id>/`` of its workspace, ``federated.flare.lockdown``) and
removes the run folder: the job store is where finished jobs pile up, one folder per training. ``delete_job``
removes a job from that store (NVIDIA FLARE refuses it for a job still dispatched or running).

Only finished jobs (NVIDIA FLARE's ``FINISHED:*`` statuses) go; a job submitted and not yet run, or running,
stays whatever its age. A job's age is its submission time: a fedauc job ends within its 24-hour timeout
(federated/flare/centre/job.py), a day against a retention period of months. Every finished job goes,
the champion's training too: what is kept for ever of a training lives in MLflow (its parent run and its
sites' runs with their privacy spending, the registered model), and each hospital's spending in its own
ledger; the job store holds the job's definition and logs, which nothing of fedauc reads after the job.

The jobs fedauc runs on the centre's own machine leave folders of its own in their ``--flare-workspace``: each
simulator job its workspace (``<workspace>/<job name>/``: the server's and every site's logs and the result,
kept for reading after a failure), each POC run its provisioned consortium (``<workspace>/poc/kits/<project>/
prod_NN/``: kits, the server's job store, the sites' run folders). They are no store's, so fedauc removes them
itself, once nothing in them was written for the retention period; the newest POC consortium stays (a POC
running now uses it), as do the provisioning's state and project file beside them.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

from common.errors import ConfigError

FINISHED = "FINISHED"  # NVIDIA FLARE's RunStatus values of an ended job all start so ("FINISHED:COMPLETED", ...)
# What NVIDIA FLARE's simulator makes in a job's workspace (startup/ and local/ for the run, server/ its server's).
SIMULATOR_FOLDERS = ("startup", "local", "server")


@dataclass(frozen=True)
class FinishedJob:
    job_id: str
    name: str
    status: str
    submitted: float  # seconds since the epoch (the server's submit_time)


def old_jobs(kit: str | Path, cutoff_s: float) -> list[FinishedJob]:
    """The finished jobs submitted before ``cutoff_s`` on the server the admin kit ``kit`` reaches."""
    from federated.flare.centre.operate import admin_session

    session = admin_session(kit)
    try:
        jobs = session.list_jobs(detailed=True)
    finally:
        session.close()
    found = [FinishedJob(str(job["job_id"]), str(job.get("name") or ""), str(job.get("status") or ""),
                         float(job.get("submit_time") or cutoff_s))
             for job in jobs]
    return sorted((job for job in found if job.status.startswith(FINISHED) and job.submitted < cutoff_s),
                  key=lambda job: job.submitted)


def delete_jobs(kit: str | Path, job_ids: list[str]) -> None:
    """Delete ``job_ids`` from the server's job store with NVIDIA FLARE's ``delete_job``; a job deleted since
    it was listed is passed over."""
    from nvflare.fuel.flare_api.api_spec import AuthorizationError, JobNotFound

    from federated.flare.centre.operate import admin_session

    session = admin_session(kit)
    try:
        for job_id in job_ids:
            try:
                session.delete_job(job_id)
            except JobNotFound:
                continue
            except AuthorizationError:
                raise ConfigError("the consortium's server does not let the admin delete jobs (its policy predates "
                                  "fedauc's retention)",
                                  fix="restart the server with `fedauc consortium start-server`, which installs the "
                                      "current policy, then prune again") from None
    finally:
        session.close()


def old_local_runs(workspace: str | Path, cutoff_s: float) -> list[Path]:
    """In a ``--flare-workspace``, the simulator jobs' workspaces and the POC consortia but the newest, nothing
    in them written since ``cutoff_s``."""
    workspace = Path(workspace)
    if not workspace.is_dir():
        return []
    found = [p for p in workspace.iterdir()
             if p.is_dir() and all((p / name).is_dir() for name in SIMULATOR_FOLDERS)]
    for project in (workspace / "poc" / "kits").glob("*"):
        found += sorted(p for p in project.glob("prod_*") if p.is_dir())[:-1]
    return sorted(p for p in found if _last_written(p) < cutoff_s)


def _last_written(folder: Path) -> float:
    return max((p.lstat().st_mtime for p in [folder, *folder.rglob("*")]), default=0.0)


def remove_local_runs(folders: list[Path]) -> None:
    for folder in folders:
        shutil.rmtree(folder)
