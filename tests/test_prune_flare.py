"""``fedauc prune --kit`` on a real NVIDIA FLARE server started as ``fedauc consortium start-server`` starts it
(a provisioned kit, its job store in its own workspace), the admin on mutual TLS: finished jobs submitted
before the retention period go through NVIDIA FLARE's ``delete_job`` (their folder leaves the job store), a job
still waiting to run and recent jobs stay, ``--dry-run`` lists them and deletes nothing. No hospital connects:
jobs are submitted and aborted before they run (NVIDIA FLARE's own ``FINISHED:ABORTED``), which is all the job
store needs to hold finished jobs. And a server provisioned before the retention is granted ``delete_job`` at
its next start. The jobs run on the centre's machine (``--flare-workspace``): a real NVIDIA FLARE simulator
run's workspace and POC consortia provisioned as ``--flare-env poc`` provisions them go once nothing in them was
written for the period, the newest POC consortium, the provisioning's state and other files stay."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from nvflare.fuel.sec.authz import AuthzContext, Person
from nvflare.security.security import FLAuthorizer
from typer.testing import CliRunner

from common.lifetime import family, signal_all
from federated.flare.centre.poc import ADMIN, admin_session, free_port
from federated.flare.centre.provision import project, provision
from federated.flare.lockdown import STORES, centre_policy
from federated.flare.processes import start_command, start_env
from federated.flare.server.start import prepare_server
from pipelines import retention, tracking
from pipelines.cli import app
from preprocessing.federation import load_federation

pytestmark = pytest.mark.slow
DAY = 86_400


def _job_folder(root, name: str):
    """A job NVIDIA FLARE accepts (its meta and one app for the server and every client); it never runs."""
    folder = root / name
    (folder / "app" / "config").mkdir(parents=True)
    (folder / "meta.json").write_text(json.dumps({"name": name, "resource_spec": {}, "min_clients": 1,
                                                  "deploy_map": {"app": ["@ALL"]}}))
    (folder / "app" / "config" / "config_fed_server.json").write_text(
        json.dumps({"format_version": 2, "workflows": [], "components": []}))
    (folder / "app" / "config" / "config_fed_client.json").write_text(
        json.dumps({"format_version": 2, "executors": [], "components": []}))
    return folder


def _jobs(kit) -> dict[str, str]:
    session = admin_session(kit)
    try:
        return {job["job_id"]: job["status"] for job in session.list_jobs(detailed=True)}
    finally:
        session.close()


@pytest.fixture(scope="module")
def server(poc_slot, melanoma_shards, tmp_path_factory):
    """The consortium's server alone, with two old jobs (one aborted, one waiting) and, after the cut, a recent
    aborted one."""
    _, federation = melanoma_shards
    here = tmp_path_factory.mktemp("prune-flare")
    kits = provision(project(load_federation(federation), "localhost", free_port(), ADMIN), here / "kits")
    with open(here / "server.log", "ab") as log:
        process = subprocess.Popen(start_command(prepare_server(kits.server)), cwd=kits.server, env=start_env(),
                                   stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        session = admin_session(kits.admin, timeout_s=180.0)  # waits for the server to answer
        try:
            def submit(name: str, abort: bool) -> str:
                job_id = session.submit_job(str(_job_folder(here / "jobs", name)))
                if abort:
                    session.abort_job(job_id)
                return job_id

            old, waiting = submit("weekly-1", abort=True), submit("weekly-2", abort=False)
            time.sleep(1.0)  # NVIDIA FLARE's submit_time has the server clock's resolution
            cut = time.time()
            time.sleep(1.0)
            recent = submit("weekly-3", abort=True)
        finally:
            session.close()
        yield {"kits": kits, "cut": cut, "old": old, "waiting": waiting, "recent": recent,
               "mlflow": tracking.default_tracking_uri(here / "mlflow")}
    finally:
        signal_all(family(process.pid), signal.SIGKILL)
        process.wait()


def _prune(server, *args: str):
    with pytest.MonkeyPatch.context() as patch:  # the policy's clock a day past the cut
        patch.setattr(retention, "time", SimpleNamespace(time=lambda: server["cut"] + DAY))
        patch.setenv("MLFLOW_TRACKING_URI", server["mlflow"])
        return CliRunner().invoke(app, ["prune", "--older-than-days", "1", "--kit", str(server["kits"].admin), *args])


def test_dry_run_lists_the_old_finished_job_and_deletes_nothing(server):
    before = _jobs(server["kits"].admin)
    assert before == {server["old"]: "FINISHED:ABORTED", server["waiting"]: "SUBMITTED",
                      server["recent"]: "FINISHED:ABORTED"}
    result = _prune(server, "--dry-run")
    assert result.exit_code == 0, result.output
    assert "1 finished NVIDIA FLARE job(s)" in result.output
    assert [line for line in result.output.splitlines() if line.startswith("nvflare job ")] == [
        f"nvflare job {server['old']} (FINISHED:ABORTED) weekly-1"]
    assert _jobs(server["kits"].admin) == before


def test_prune_deletes_the_old_finished_job_from_the_job_store_and_keeps_the_rest(server):
    jobs = server["kits"].server / STORES / "jobs"
    assert (jobs / server["old"]).is_dir()
    result = _prune(server)
    assert result.exit_code == 0, result.output
    assert set(_jobs(server["kits"].admin)) == {server["waiting"], server["recent"]}
    assert not (jobs / server["old"]).exists()
    assert (jobs / server["waiting"]).is_dir() and (jobs / server["recent"]).is_dir()
    assert "0 finished NVIDIA FLARE job(s)" in _prune(server, "--dry-run").output


def test_a_server_provisioned_before_the_retention_may_delete_jobs_after_its_next_start(tmp_path, melanoma_shards):
    _, federation = melanoma_shards
    kits = provision(project(load_federation(federation), "localhost", 8002, ADMIN), tmp_path)
    policy = kits.server / "local" / "authorization.json.default"
    earlier = centre_policy(server=True)
    del earlier["permissions"]["project_admin"]["delete_job"]
    policy.write_text(json.dumps(earlier))
    admin = Person(ADMIN, "coordinating_centre", "project_admin")

    def may_delete() -> bool:
        authorizer = FLAuthorizer("coordinating_centre", json.loads(policy.read_text()))
        return authorizer.authorize(AuthzContext("delete_job", admin, admin))[0]

    assert not may_delete()
    prepare_server(kits.server)
    assert may_delete()


def _age(root, when: float) -> None:
    for path in [root, *root.rglob("*")]:
        os.utime(path, (when, when), follow_symlinks=False)


def test_old_simulator_and_poc_workspaces_go_and_the_rest_stays(tmp_path, melanoma_shards):
    _, federation = melanoma_shards
    workspace = tmp_path / "flare_workspace"
    # A real simulator run (a job with no workflow: it stops at once, its workspace laid out as any job's).
    subprocess.run([str(Path(sys.executable).parent / "nvflare"), "simulator",
                    str(_job_folder(tmp_path / "jobs", "weekly-1")), "-w", str(workspace / "weekly-1"), "-n", "1",
                    "-t", "1"], capture_output=True, timeout=300)
    assert (workspace / "weekly-1" / "server" / "log.txt").is_file()
    shutil.copytree(workspace / "weekly-1", workspace / "weekly-2")
    kits = workspace / "poc" / "kits"
    for _ in range(2):  # two POC runs: prod_00 and prod_01
        consortium = provision(project(load_federation(federation), "localhost", 8002, ADMIN), kits).server.parent
    (workspace / "submit.log").write_text("job submitted\n")  # what a prod training leaves: not a job's folder
    (workspace / "notes").mkdir()
    cut = time.time()
    for old in (workspace / "weekly-1", workspace / "submit.log", workspace / "notes", kits):
        _age(old, cut - 10 * DAY)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(retention, "time", SimpleNamespace(time=lambda: cut + DAY / 2))
        patch.setenv("MLFLOW_TRACKING_URI", tracking.default_tracking_uri(tmp_path / "mlflow"))

        def prune(*args):
            return CliRunner().invoke(app, ["prune", "--older-than-days", "1", "--flare-workspace", str(workspace),
                                            *args])

        dry = prune("--dry-run")
        assert dry.exit_code == 0, dry.output
        project_name = consortium.parent.name
        assert [line for line in dry.output.splitlines() if line.startswith("nvflare workspace ")] == [
            "nvflare workspace flare_workspace/poc/kits/" + project_name + "/prod_00",
            "nvflare workspace flare_workspace/weekly-1"]
        assert (workspace / "weekly-1").is_dir() and (kits / project_name / "prod_00").is_dir()
        assert str(tmp_path) not in dry.output
        result = prune()
        assert result.exit_code == 0, result.output
    assert sorted(p.name for p in workspace.iterdir()) == ["notes", "poc", "submit.log", "weekly-2"]
    assert sorted(p.name for p in (kits / project_name).iterdir()) == ["prod_01", "state"]
