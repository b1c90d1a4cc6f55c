"""The centre's half of a training over NVIDIA FLARE: ``train_flare(config, federation, shards_root, env,
workspace, kit) -> FlareResult``, the one entry point (``federated.launch.Flare``, which ``fedauc train``
and the Prefect flows pass down; the tests and benchmarks/throughput/flare.py).

It checks the environment and the algorithm first (federated/flare/centre/environments.py), builds
the job (``flare_job``: configuration only, ``federated/flare/installed.py``), submits it in ``env``
(``submit_in_env``) and checks every site's report on its data against the federation afterwards
(``federated.sites.check_site_reports``). The environments: ``sim`` runs the server and one process per
site on this machine under NVFlare's simulator (``SimEnv``; the demo, CI); ``poc`` starts a provisioned
consortium on this machine for the job (``federated.flare.centre.poc.LocalConsortium``: our kits, root CA,
mutual TLS, real server and client processes) and submits to it as ``prod`` does; ``prod`` submits to a
running consortium with an admin's startup kit (NVFlare's ``ProdEnv``). Evaluation jobs go through the
same submission (federated/flare/centre/evaluate.py).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import numpy as np
import torch

from common.errors import FedaucError
from federated import ood
from federated.config import ShardSite, TrainConfig
from federated.engine import RoundCallback, TrainResult
from federated.flare.centre.environments import check_flare_algorithm, check_flare_env
from federated.flare.centre.feed import LiveFeed, admin_reader, local_reader, progress_printer
from federated.flare.centre.session import quiet_session
from federated.flare.installed import SERVER_MODULE, SITE_MODULE, InstalledRecipe, allow_components
from federated.flare.protocol import (
    FAILURE_MARK,
    GRID_SUFFIX,
    JOB_PROP,
    OOD_STATE_FILE,
    RESULT_DIR,
    RESULT_FILE,
    STATE_FILE,
)
from federated.flare.spec import FlareJob
from federated.health import as_diverged, warn_outliers
from federated.sites import check_site_reports, site_names
from federated.version import code_version
from preprocessing.federation import Federation

T = TypeVar("T")


class FlareJobFailed(FedaucError, RuntimeError):
    """The NVFlare job ended without a result (a site failed or stopped answering, or it timed out);
    ``site``: the one site the failure names, where it names one."""

    def __init__(self, message: str, fix: str | None = None, site: str | None = None):
        super().__init__(message, fix)
        self.site = site


def flare_job(config: TrainConfig, task: str, diseases: tuple[str, ...], job_timeout_s: float,
              share_paths: bool, threads: int | None = None, sharing: dict[str, dict] | None = None,
              checkpoints_here: bool | None = None) -> FlareJob:
    """The job for ``config``'s sites. ``share_paths``: every site on this machine reads the shard folder
    the config names and shares its QC as ``sharing`` (site name -> its YAML's sharing policy; default:
    the policy's defaults) says (SimEnv); otherwise each hospital's kit says both. ``threads``: torch's
    thread count at every site (None: each site's own). ``checkpoints_here`` (default: ``share_paths``):
    every site checkpoints under the config's checkpoint_dir on this machine (SimEnv, POC), else each
    under its own kit (federated/flare/site/resume.py)."""
    checkpoints_here = share_paths if checkpoints_here is None else checkpoints_here
    names = site_names(config)
    # The site processes run in NVFlare's workspace, not here: a relative path would name another folder.
    dirs = ({n: str(Path(s.path).resolve()) for n, s in zip(names, config.sites) if isinstance(s, ShardSite)}
            if share_paths else {})
    settings = json.loads(config.model_dump_json(exclude={"sites"}))
    if checkpoints_here and config.checkpoint_dir is not None:
        settings["checkpoint_dir"] = str(Path(config.checkpoint_dir).resolve())
    return FlareJob(code_version=code_version(), settings=settings, sites=names, task=task, diseases=diseases,
                    shard_dirs=dirs, sharing=(sharing or {}) if share_paths else {}, job_timeout_s=job_timeout_s,
                    threads=threads, checkpoints_here=checkpoints_here)


# NVIDIA FLARE gives every site SYNC_S to answer a job's first task (its "sync"); a site that has not by then
# fails the job. Under the simulator every site's process starts on this machine at once, each with about
# SITE_START_CPU_S of imports (torch, NVIDIA FLARE, fedauc) before it answers: 64 sites took 90 s on 2 cores.
SYNC_S = 60.0
SITE_START_CPU_S = 3.0
# How soon a site with no task asks the server again (NVIDIA FLARE's default: 2 s). A fedauc job's sites are
# idle only between the sync and setup tasks (the rounds are calls, not polled tasks), where a 2 s wait sat on
# every job's start; three sites asking twice a second cost the server nothing.
TASK_POLL_S = 0.5


def simulated_sync_s(sites: int) -> float:
    """Seconds the simulator's sites get to start: NVIDIA FLARE's default, or twice their start-up CPU time
    spread over this machine's cores where that is longer."""
    return max(SYNC_S, 2 * SITE_START_CPU_S * sites / (os.cpu_count() or 1))


def recipe(job: FlareJob, name: str, server_files: Sequence[Path] = (), sync_s: float = SYNC_S) -> InstalledRecipe:
    """The NVFlare job: configuration only (``federated.flare.installed``), ``job`` its server's app prop;
    ``server_files``: data files (never code) the job carries in its app's ``config/`` folder for the server,
    e.g. the weights an evaluation sends to the sites; ``sync_s``: the seconds every site has to start."""
    r = InstalledRecipe(job_name=re.sub(r"[^a-z0-9-]+", "-", name.lower()).strip("-") or "fedauc",
                        server=SERVER_MODULE, client=SITE_MODULE, min_clients=len(job.sites),
                        sync_task_timeout=sync_s)
    r.set_server_prop(JOB_PROP, job.model_dump())
    r.add_server_config({"server": {"task_request_interval": TASK_POLL_S}})
    for path in server_files:
        # The recipe's own add_server_file puts files in custom/, the code folder; the job's FedJob can put
        # them in config/. (Large values in the job's JSON instead make NVFlare's secret scan take minutes.)
        r._job.add_file_to_server(str(path), app_folder_type="config")
    return r


def failure_reason(workspace: Path) -> str | None:
    """The server's own account of why the job failed (the site and its error), from its log."""
    for log in sorted(Path(workspace).rglob("log.txt")):
        for line in log.read_text(errors="replace").splitlines():
            if FAILURE_MARK in line:
                return line[line.index(FAILURE_MARK) + len(FAILURE_MARK):].strip()
    return None


@dataclass
class FlareResult(TrainResult):
    # Every site's report on its data (federated.sites.site_report), in the federation's order.
    site_reports: list[dict] = field(default_factory=list)


def result_folder(result_root: str | Path) -> Path:
    """The folder the server wrote the job's result to (``RESULT_DIR``), found in what the job returned."""
    found = sorted(Path(result_root).rglob(f"{RESULT_DIR}/{RESULT_FILE}"))
    if not found:
        raise FlareJobFailed(f"the NVFlare job finished without a result under {result_root}",
                             fix="read the server log there (server/.../log.txt) for the failure")
    return found[0].parent


def deliver_rest(feed: LiveFeed, history: list[dict]) -> None:
    """The records the live feed did not bring (the last ones, or all where the server's file could not be
    read), to the same callbacks; a resumed job's earlier rounds are not its own and are left out."""
    first_live = feed.first_round
    for record in history:
        if first_live is None or record["round"] >= first_live:
            feed.deliver(record)


def read_result(result_root: str | Path, config: TrainConfig) -> FlareResult:
    """The global model, history, summed valid and test histograms and out-of-distribution model site 0 returned and
    every site's report, from the job's result folder."""
    folder = result_folder(result_root)
    meta = json.loads((folder / RESULT_FILE).read_text())
    state = torch.load(folder / STATE_FILE, map_location="cpu", weights_only=True)
    test, valid = (None if meta[key] is None else np.asarray(meta[key], dtype=np.float64)
                   for key in ("test_histograms", "valid_histograms"))
    ood_file = folder / OOD_STATE_FILE
    fitted = ood.from_saved(torch.load(ood_file, map_location="cpu", weights_only=True)) if ood_file.is_file() else None
    reports = meta["sites"]
    for report in reports:
        grid = folder / f"{report['site']}.{GRID_SUFFIX}"
        report["qc_grid"] = grid.read_bytes() if grid.is_file() else None
    return FlareResult(state, meta["history"], config, tuple(meta["input_shape"]), meta["num_classes"],
                       test_histograms=test, valid_histograms=valid, ood=fitted, site_reports=reports)


def submit_simulated(job: FlareJob, workspace: Path, name: str, server_files: Sequence[Path] = (),
                     feed: LiveFeed | None = None) -> Path:
    """Run ``job`` under NVFlare's simulator (every site a process here); what the job returned (a folder).
    ``feed`` reads the server's live account while the job runs (``federated.flare.centre.feed``)."""
    from nvflare.recipe import SimEnv

    r = recipe(job, name, server_files, sync_s=simulated_sync_s(len(job.sites)))
    workspace = Path(workspace)
    feed = feed or LiveFeed()
    for attempt in range(2):
        shutil.rmtree(workspace / r.job_name, ignore_errors=True)
        # Owner-only, like a consortium's server workspace: it holds the job's model and every site's logs.
        (workspace / r.job_name).mkdir(parents=True, mode=0o700)
        # The simulator's participants build only fedauc's components, as a hospital's do.
        allow_components(workspace / r.job_name / "local")
        env = SimEnv(clients=job.sites, workspace_root=str(workspace))
        try:
            with feed.reading(local_reader(workspace / r.job_name)):
                run = r.run(env)
            break
        except RuntimeError as err:
            # The simulator picks a free port for each site's worker and binds it moments later; on a busy
            # machine another process can take it in between. That lost race, and only it, is run again.
            if attempt == 0 and feed.last_round is None and _lost_port_race(workspace / r.job_name):
                continue
            reason, site = feed.failure or (failure_reason(workspace / r.job_name) or str(err), None)
            raise FlareJobFailed(f"the simulated NVFlare job failed: {reason}", site=site,
                                 fix=f"the logs of every site are under {workspace / r.job_name}") from None
    return Path(run.get_result())


def _lost_port_race(job_dir: Path) -> bool:
    return any("[Errno 98] Address already in use" in log.read_text(errors="replace")
               for log in Path(job_dir).rglob("log.txt"))


# Seconds the submitter waits beyond the job's own timeout (the server's and sites' teardown, the download).
_RESULT_MARGIN_S = 120.0
_MONITOR_POLL_S = 1.0


def _logged_sessions(exec_env, log: Path):
    """``exec_env``'s (NVFlare's ``ProdEnv``) admin sessions, with the lines NVFlare's own session manager
    prints on stdout (the job's id and meta, a dot per poll) written to ``log`` instead: this process's stdout
    is fedauc's, and other threads print on it meanwhile. The submitting thread's calls (submit, wait and
    download, status) share one session, which ``close()`` ends: NVIDIA FLARE's session manager logs in for
    each, and every login costs its admin client a second's wait and both ends a TLS handshake and a signature
    check. An abort comes from the live feed's thread, in a session of its own."""
    from nvflare.fuel.flare_api.api_spec import MonitorReturnCode
    from nvflare.fuel.utils.job_secret_scanner import warn_on_potential_secrets_in_job_dir
    from nvflare.recipe.session_mgr import SessionManager

    def note(line: str) -> None:
        with open(log, "a") as out:
            out.write(line + "\n")

    class LoggedSessions(SessionManager):
        open_session = None

        def _get_session(self):
            return quiet_session(exec_env.username, exec_env.startup_kit_location, exec_env.login_timeout, note)

        def _shared(self):
            if self.open_session is None:
                self.open_session = self._get_session()
            return self.open_session

        def close(self) -> None:
            session, self.open_session = self.open_session, None
            if session is not None:
                session.close()

        def submit_job(self, job) -> str:
            with tempfile.TemporaryDirectory() as exported:
                job.export_job(exported)
                warn_on_potential_secrets_in_job_dir(exported, job_name=job.name)
                job_id = self._shared().submit_job(str(Path(exported) / job.name))
            note(f"submitted job {job.name!r} with id {job_id}")
            return job_id

        def get_job_status(self, job_id: str) -> str | None:
            return self._shared().get_job_status(job_id)

        def abort_job(self, job_id: str) -> None:
            session = self._get_session()
            try:
                note(f"aborted job {job_id}: {session.abort_job(job_id)}")
            finally:
                session.close()

        def get_job_result(self, job_id: str, timeout: float = 0.0) -> str | None:
            session = self._shared()
            # A look a second (NVIDIA FLARE's default is two): one small admin command over the open
            # session, and the result comes back as soon as the job ends.
            returned = session.monitor_job(job_id, timeout=timeout, poll_interval=_MONITOR_POLL_S)
            note(f"job {job_id}: monitor returned {returned}")
            if returned == MonitorReturnCode.JOB_FINISHED:
                return session.download_job_result(job_id)
            if returned in (MonitorReturnCode.TIMEOUT, MonitorReturnCode.ENDED_BY_CB):
                return None
            raise RuntimeError(f"NVFlare's job monitor returned {returned}")

    return LoggedSessions({})


def submit_to_consortium(job: FlareJob, exec_env, log: Path, name: str, server_files: Sequence[Path] = (),
                         feed: LiveFeed | None = None) -> Path:
    """Submit ``job`` with an admin's kit (``exec_env``: NVFlare's ``ProdEnv``) and wait for it; the folder of
    what it returned. A job that fails or outlives its ``job_timeout_s`` is a ``FlareJobFailed``. ``feed``
    reads the server's live account while the job runs, through the admin's session: a failure the server
    reports (a site that died or failed) is printed to stderr at once and ends the job."""
    job_timeout_s = job.job_timeout_s
    r = recipe(job, name, server_files)
    log.parent.mkdir(parents=True, exist_ok=True)
    feed = feed or LiveFeed()
    sessions = exec_env._session_manager = _logged_sessions(exec_env, log)
    try:
        try:
            run = r.run(exec_env)
        except (RuntimeError, ValueError, ConnectionError) as err:
            raise FlareJobFailed(f"could not submit the job to the consortium: {err}",
                                 fix="check the admin kit and that the consortium's server runs") from None
        job_id = run.get_job_id()

        def stop(reason: str, site: str | None) -> None:  # the job cannot finish: say so now, end it
            print(f"the NVFlare job {job_id} stops: {reason}", file=sys.stderr, flush=True)
            exec_env.abort_job(job_id)

        feed.on_failure = stop
        with feed.reading(admin_reader(Path(exec_env.startup_kit_location), exec_env.username, job_id)):
            folder = run.get_result(timeout=job_timeout_s + _RESULT_MARGIN_S)
            status = run.get_status()
    finally:
        sessions.close()
    if feed.failure is not None:
        reason, site = feed.failure
        raise FlareJobFailed(f"the NVFlare job {job_id} failed: {reason}", site=site,
                             fix=f"the server's log of the job is under {folder or log}")
    if folder is None:
        raise FlareJobFailed(f"the NVFlare job {run.get_job_id()} did not finish within {job_timeout_s:g} s "
                             f"(status {status})", fix=f"abort it with the admin kit; NVFlare's output is in {log}")
    if status != "FINISHED:COMPLETED":
        reason = failure_reason(Path(folder)) or f"status {status}"
        raise FlareJobFailed(f"the NVFlare job {run.get_job_id()} failed: {reason}",
                             fix=f"the server's log of the job is under {folder}")
    return Path(folder)


def submit_in_env(env: str, federation: Federation, shards_root: Path | None, workspace: Path, admin: Path | None,
                  name: str, make_job: Callable[[bool, int | None, dict], FlareJob], read: Callable[[Path], T],
                  server_files: Sequence[Path] = (), feed: LiveFeed | None = None) -> T:
    """Run the job ``make_job(share_paths, threads, sharing)`` builds (``flare_job``'s arguments of those names)
    in ``env`` and ``read`` what it returned. ``sim`` and ``poc`` run every site on this machine (their shards
    under ``shards_root``) with this process's thread count; ``prod`` reaches the running consortium with the
    admin kit ``admin`` and reads nothing under ``shards_root``. ``server_files``: see ``recipe``; ``feed``: the
    job's live account."""
    workspace = Path(workspace)
    if env == "sim":
        job = make_job(True, torch.get_num_threads(), {site.name: site.sharing.model_dump() for site in federation.sites})
        return read(submit_simulated(job, workspace, name, server_files, feed))
    if env == "poc":
        from federated.flare.centre.poc import LocalConsortium

        with LocalConsortium(federation, shards_root, workspace / "poc") as consortium:
            return read(submit_to_consortium(make_job(False, torch.get_num_threads(), {}), consortium.exec_env(),
                                             workspace / "submit.log", name, server_files, feed))
    from nvflare.recipe import ProdEnv

    username = json.loads((admin / "startup" / "fed_admin.json").read_text())["admin"]["username"]
    return read(submit_to_consortium(make_job(False, None, {}),
                                     ProdEnv(startup_kit_location=str(admin), username=username, login_timeout=30.0),
                                     workspace / "submit.log", name, server_files, feed))


def train_flare(config: TrainConfig, federation: Federation, shards_root: Path | None, env: str, workspace: Path,
                kit: Path | None = None, callbacks: Sequence[RoundCallback] = (), name: str = "fedauc") -> FlareResult:
    """``federated.train`` over NVFlare: the job runs in ``env`` and ``callbacks`` get every round's record as
    site 0 reported it, while the job runs (the same records, in the same order, as an in-process training's
    callbacks); with ``config.progress`` a line per round on stderr (``progress_printer``).
    ``shards_root``: where this machine's sites read their shards (``sim`` and ``poc``, which run every
    site here; ``prod`` reads none). ``kit``: the admin's startup kit (``prod`` only). The sites' reports
    are checked against the federation (one ``DataError`` naming the first site that does not fit)."""
    admin = check_flare_env(env, kit)
    check_flare_algorithm(config.algorithm)
    task, diseases = federation.task, tuple(federation.sites[0].diseases)

    def make_job(share_paths: bool, threads: int | None, sharing: dict) -> FlareJob:
        # poc: every site runs here too, so each checkpoints under the config's folder (kits are new each time).
        return flare_job(config, task, diseases, 24 * 3600.0, share_paths, threads, sharing,
                         checkpoints_here=env != "prod")

    # The centre names an outlying site as an in-process training does, with each round's record.
    feed = LiveFeed([warn_outliers, *callbacks, *([progress_printer(config.rounds)] if config.progress else [])])
    try:
        result = submit_in_env(env, federation, shards_root, workspace, admin, name, make_job,
                               lambda folder: read_result(folder, config), feed=feed)
    except FlareJobFailed as err:
        raise as_diverged(err, config.lr) from None
    check_site_reports(result.site_reports, [site.name for site in federation.sites], task, diseases)
    deliver_rest(feed, result.history)
    return result
