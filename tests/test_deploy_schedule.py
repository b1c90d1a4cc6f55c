"""The consortium's scheduled work runs: a real Prefect server, infra/prefect.yaml deployed by
`fedauc deploy` (pools included, all or nothing), an interval schedule the scheduler turns into a flow run,
and a worker of the site's pool that completes it."""

import os
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import pytest
import yaml

from pipelines.prefect_env import PROJECT_ROOT, configure_prefect_env

configure_prefect_env()

from prefect import get_client  # noqa: E402
from prefect.client.schemas.actions import DeploymentScheduleCreate  # noqa: E402
from prefect.client.schemas.filters import (  # noqa: E402
    DeploymentFilter,
    DeploymentFilterId,
    FlowRunFilter,
    FlowRunFilterId,
)
from prefect.client.schemas.schedules import IntervalSchedule  # noqa: E402

from pipelines.servers import stop_server  # noqa: E402
from preprocessing.synth import generate_site  # noqa: E402

pytestmark = pytest.mark.slow
PREFECT_FILE = PROJECT_ROOT / "infra" / "prefect.yaml"


# The centre's checkout, which no hospital shares: a deployment must not send a worker there.
CENTRE_HOME = "/nonexistent/the-centres-fedauc"


def _fedauc(*args, timeout=600):
    return subprocess.run([sys.executable, "-m", "pipelines.cli", *args], cwd=PROJECT_ROOT, capture_output=True,
                          text=True, timeout=timeout, env={**os.environ, "FEDAUC_HOME": CENTRE_HOME})


def _registered() -> tuple[set[str], dict]:
    with get_client(sync_client=True) as client:
        return {p.name for p in client.read_work_pools()}, {d.name: d for d in client.read_deployments()}


def test_deploy_registers_one_role_paused_then_every_deployment(prefect_server):
    declared = yaml.safe_load(PREFECT_FILE.read_text())["deployments"]
    # A hospital registers its own three, in its own pool, and nothing else.
    result = _fedauc("deploy", "--prefect-file", str(PREFECT_FILE), "--role", "hospital", "--site", "vienna")
    assert result.returncode == 0, result.stdout + result.stderr
    pools, deployments = _registered()
    assert pools == {"site-vienna"}
    assert set(deployments) == {"onboard-vienna", "preprocess-vienna", "client-vienna"}

    # The centre: its pool's deployments without the demo-only ones; every schedule paused.
    result = _fedauc("deploy", "--prefect-file", str(PREFECT_FILE), "--role", "centre")
    assert result.returncode == 0, result.stdout + result.stderr
    pools, deployments = _registered()
    centre = {d["name"] for d in declared if d["work_pool"]["name"] == "fedauc-central" and "demo-only" not in d.get("tags", [])}
    assert pools == {"site-vienna", "fedauc-central"} and set(deployments) == centre | {
        "onboard-vienna", "preprocess-vienna", "client-vienna"}
    assert centre == {"consortium-chest-codasca", "consortium-melanoma-codasca", "prune-centre"}
    assert all(not s.active for name in centre for s in deployments[name].schedules) and deployments[
        "consortium-chest-codasca"].schedules
    assert "not edited yet" in result.stdout and "consortium-chest-codasca" in result.stdout
    assert all("sites/demo" not in yaml.safe_dump(deployments[name].parameters) for name in centre)

    # Named, schedules active on request; then every deployment (the demo), paused.
    result = _fedauc("deploy", "--prefect-file", str(PREFECT_FILE), "--name", "nightly-chest-codasca",
                     "--schedules-active")
    assert result.returncode == 0, result.stdout + result.stderr
    assert all(s.active for s in _registered()[1]["nightly-chest-codasca"].schedules)
    assert _fedauc("deploy", "--prefect-file", str(PREFECT_FILE)).returncode == 1  # no role, no name: nothing
    result = _fedauc("deploy", "--prefect-file", str(PREFECT_FILE), "--role", "demo")
    assert result.returncode == 0, result.stdout + result.stderr
    pools, deployments = _registered()
    assert {d["work_pool"]["name"] for d in declared} <= pools
    assert set(deployments) == {d["name"] for d in declared}
    assert deployments["nightly-chest-codasca"].work_pool_name == "fedauc-central"
    assert not any(s.active for d in deployments.values() for s in d.schedules)
    assert f"registered {len(declared)} deployments" in result.stdout


def test_a_broken_file_deploys_nothing(prefect_server, tmp_path):
    """One bad entrypoint among many: refused before any pool or deployment is created."""
    declared = yaml.safe_load(PREFECT_FILE.read_text())
    declared["deployments"] = [{**d, "name": f"x-{d['name']}", "work_pool": {"name": f"x-{d['work_pool']['name']}"}}
                               for d in declared["deployments"]]
    declared["deployments"][3]["entrypoint"] = "pipelines/flows.py:no_such_flow"
    broken = tmp_path / "prefect.yaml"
    broken.write_text(yaml.safe_dump(declared))
    started = time.monotonic()
    result = _fedauc("deploy", "--prefect-file", str(broken), "--role", "demo")
    assert result.returncode == 1
    assert "no_such_flow" in result.stderr and "nothing was deployed" in result.stderr
    assert "Traceback" not in result.stderr
    with get_client(sync_client=True) as client:
        assert not [p.name for p in client.read_work_pools() if p.name.startswith("x-")]
        assert not [d.name for d in client.read_deployments() if d.name.startswith("x-")]
    assert time.monotonic() - started < 120


def test_the_scheduler_creates_a_run_and_the_site_worker_completes_it(prefect_server, tmp_path):
    # The deployment's own site YAML points at the demo data; the schedule carries a tiny site instead.
    generate_site("chexpert", tmp_path / "data", n=60, seed=3, workers=0, progress=False)
    site_yaml = tmp_path / "stanford.yaml"
    site_yaml.write_text(yaml.safe_dump({"name": "stanford", "format": "chexpert", "root": "data/CheXpert-v1.0-small",
                                         "task": "chest-xray", "image_size": 32, "min_image_size": 16}))
    with get_client(sync_client=True) as client:
        if not client.read_deployments():
            assert _fedauc("deploy", "--prefect-file", str(PREFECT_FILE), "--role", "demo").returncode == 0
        deployment = client.read_deployment_by_name("onboard_site/onboard-stanford")
        client.create_deployment_schedules(deployment.id, [DeploymentScheduleCreate(
            schedule=IntervalSchedule(interval=timedelta(seconds=10)), active=True,
            parameters={"site": "stanford"})])

    # The hospital's worker finds the site's YAML by its name: no hospital path in what the centre stores.
    # The hospital's worker runs in a folder of its own, with no $FEDAUC_HOME: the run enters the checkout
    # its fedauc is installed from (this one), not the centre's (CENTRE_HOME, set when deploying).
    env = {**os.environ, "PREFECT_WORKER_QUERY_SECONDS": "1", "PREFECT_HOME": str(tmp_path / "worker-home"),
           "FEDAUC_SITES": str(tmp_path)}
    env.pop("FEDAUC_HOME", None)
    with open(tmp_path / "worker.log", "wb") as log:
        worker = subprocess.Popen([str(Path(sys.executable).parent / "prefect"), "worker", "start", "--pool",
                                   "site-stanford", "--type", "process"], env=env, stdout=log, cwd=tmp_path,
                                  stderr=subprocess.STDOUT, start_new_session=True)
    try:
        completed = _wait_for_completed_run(deployment.id, prefect_server["log"], timeout_s=300)
    finally:
        stop_server(worker)
    assert completed is not None, (
        f"no completed scheduled run; server log:\n{prefect_server['log'].read_text()[-3000:]}\n"
        f"worker log:\n{(tmp_path / 'worker.log').read_text()[-3000:]}")
    assert completed.parameters == {"site": "stanford"}
    # Named from its own parameters, and its tasks from theirs, as a worker runs them (tests/test_run_names.py).
    assert completed.name == "onboard stanford"
    assert _task_run_names(completed.id) == {"validate stanford", "labels-report stanford"}
    assert completed.auto_scheduled  # made by the scheduler service, not by this test
    assert "InvalidRequestError" not in prefect_server["log"].read_text()


def _wait_for_completed_run(deployment_id, server_log, timeout_s):
    deadline = time.monotonic() + timeout_s
    with get_client(sync_client=True) as client:
        while time.monotonic() < deadline:
            # SQLAlchemy 2.1 beside Prefect 3.8.8: the scheduler fails on every loop and never creates a run.
            assert "InvalidRequestError" not in server_log.read_text(errors="replace"), server_log.read_text()[-3000:]
            runs = client.read_flow_runs(deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[deployment_id])))
            done = [r for r in runs if r.state and r.state.is_completed()]
            if done:
                return done[0]
            failed = [r for r in runs if r.state and r.state.is_final()]
            assert not failed, f"scheduled run ended {failed[0].state.type}: {failed[0].state.message}"
            time.sleep(2)
    return None


def test_a_consortium_training_deployment_triggered_by_hand_registers_a_model(prefect_server, melanoma_shards,
                                                                              tmp_path):
    """infra/prefect.yaml's NVIDIA FLARE training deployment, run by hand (`prefect deployment run`) by the
    central pool's worker: here against the simulator instead of the consortium's admin kit (every site a
    process on this machine), on the tiny melanoma federation; it ends with a registered model, recorded
    under a run name of its own."""
    root, federation = melanoma_shards
    tracking_uri = f"sqlite:///{tmp_path / 'mlruns.db'}"
    with get_client(sync_client=True) as client:
        if not client.read_deployments():
            assert _fedauc("deploy", "--prefect-file", str(PREFECT_FILE), "--role", "demo").returncode == 0
        deployment = client.read_deployment_by_name("train_federated/consortium-melanoma-codasca")
        declared = deployment.parameters
        assert declared["launcher"]["env"] == "prod" and declared["launcher"]["kit"].endswith("admin@fedauc.org")
        assert declared["config"]["timeout_s"] > 0 and deployment.schedules
        flow_run = client.create_flow_run_from_deployment(deployment.id, parameters={
            "federation_yaml": str(federation), "shards_root": str(root / "shards"),
            "launcher": {"kind": "flare", "env": "sim", "workspace": str(tmp_path / "flare")},
            "config": {**declared["config"], "rounds": 1, "local_steps": 2, "batch_size": 16, "eval_every": 1,
                       "network_kwargs": {"widths": [8, 16, 32]}, "loader_workers": 0, "progress": False,
                       "checkpoint_dir": str(tmp_path / "checkpoints")}})

    env = {**os.environ, "PREFECT_WORKER_QUERY_SECONDS": "1", "PREFECT_HOME": str(tmp_path / "worker-home"),
           "MLFLOW_TRACKING_URI": tracking_uri, "OMP_NUM_THREADS": "1"}
    with open(tmp_path / "worker.log", "wb") as log:
        worker = subprocess.Popen([str(Path(sys.executable).parent / "prefect"), "worker", "start", "--pool",
                                   "fedauc-central", "--type", "process"], env=env, stdout=log,
                                  stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 400
        with get_client(sync_client=True) as client:
            while time.monotonic() < deadline:
                state = client.read_flow_run(flow_run.id).state
                if state is not None and state.is_final():
                    break
                time.sleep(2)
    finally:
        stop_server(worker)
    assert state is not None and state.is_completed(), (
        f"{state}\nworker log:\n{(tmp_path / 'worker.log').read_text()[-4000:]}")

    from mlflow import MlflowClient

    mlflow_client = MlflowClient(tracking_uri=tracking_uri)
    assert [int(v.version) for v in mlflow_client.search_model_versions("name = 'fedauc-melanoma'")] == [1]
    (run,) = mlflow_client.search_runs([mlflow_client.get_experiment_by_name("melanoma").experiment_id],
                                       "tags.fedauc_role = 'federated-training'")
    assert run.info.status == "FINISHED" and run.data.params["flare_env"] == "sim"
    assert run.info.run_name.startswith("consortium-melanoma-codasca-") and "{flow_run}" not in run.info.run_name
    # The Prefect run and the MLflow run name each other: the flow run's short id in both (issue 47).
    assert run.info.run_name == f"consortium-melanoma-codasca-{str(flow_run.id)[:8]}"
    with get_client(sync_client=True) as client:
        assert client.read_flow_run(flow_run.id).name == f"train melanoma {run.info.run_name}"
    assert _task_run_names(flow_run.id) == {f"train melanoma {run.info.run_name}"}


def _task_run_names(flow_run_id) -> set[str]:
    with get_client(sync_client=True) as client:
        return {task_run.name for task_run in client.read_task_runs(
            flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])))}


def test_the_hospitals_pacs_scoring_runs_on_its_own_worker(prefect_server, tmp_path):
    """pacs-scoring-hanoi on the pool site-hanoi: the scheduler makes a run, the hospital's worker scores the
    new study of a real Orthanc and stores its SR; the PACS password reaches the worker from its environment
    only (the deployment's parameters hold none)."""
    from pacs_helpers import radiograph, register_chest_model, upload
    from pydicom.uid import generate_uid

    from pipelines.hospital import pacs
    from pipelines.hospital.sinks import DicomSrSink
    from testbed.orthanc import PASSWORD, USER, orthanc_server

    with orthanc_server(tmp_path / "orthanc") as base:
        store = register_chest_model(tmp_path / "store")
        study = generate_uid()
        upload(base, radiograph(tmp_path / "pa.dcm", study, "P1", "PA", 1))
        site_yaml = tmp_path / "hanoi.yaml"
        site_yaml.write_text(yaml.safe_dump({
            "name": "hanoi", "format": "vindr-cxr", "root": str(tmp_path), "task": "chest-xray", "image_size": 32,
            "min_image_size": 16, "pacs": {"url": f"{base}/dicom-web", "username": USER, "stable_minutes": 0,
                                           "password_env": "HANOI_PACS_PASSWORD"}}))
        parameters = {"site_yaml": str(site_yaml), "shards_root": str(tmp_path / "shards"),
                      "model": "models:/fedauc-chest-xray/1"}
        with get_client(sync_client=True) as client:
            if not client.read_deployments():
                assert _fedauc("deploy", "--prefect-file", str(PREFECT_FILE), "--role", "demo").returncode == 0
            deployment = client.read_deployment_by_name("score_pacs/pacs-scoring-hanoi")
            assert deployment.global_concurrency_limit.limit == 1  # one run at a time
            assert "PASSWORD" not in str(deployment.parameters).upper()
            client.create_deployment_schedules(deployment.id, [DeploymentScheduleCreate(
                schedule=IntervalSchedule(interval=timedelta(seconds=10)), active=True, parameters=parameters)])
        env = {**os.environ, "PREFECT_WORKER_QUERY_SECONDS": "1", "PREFECT_HOME": str(tmp_path / "worker-home"),
               "MLFLOW_TRACKING_URI": store, "HANOI_PACS_PASSWORD": PASSWORD}
        with open(tmp_path / "worker.log", "wb") as log:
            worker = subprocess.Popen([str(Path(sys.executable).parent / "prefect"), "worker", "start", "--pool",
                                       "site-hanoi", "--type", "process"], env=env, stdout=log,
                                      stderr=subprocess.STDOUT, start_new_session=True)
        try:
            completed = _wait_for_completed_run(deployment.id, prefect_server["log"], timeout_s=300)
        finally:
            stop_server(worker)
        assert completed is not None and completed.auto_scheduled, (tmp_path / "worker.log").read_text()[-3000:]
        assert DicomSrSink(pacs.Pacs(f"{base}/dicom-web", (USER, PASSWORD))).latest(study, "fedauc-chest-xray", "1")
