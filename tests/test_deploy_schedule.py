"""The consortium's scheduled work runs: a real Prefect server on PostgreSQL, infra/prefect.yaml deployed by
`fedauc deploy` (pools included, all or nothing), an interval schedule the scheduler turns into a flow run,
and a worker of the site's pool that completes it."""

import contextlib
import contextvars
import os
import subprocess
import sys
import threading
import time
from datetime import timedelta
from functools import partial
from pathlib import Path

import pytest
import yaml

from pipelines.prefect_env import PROJECT_ROOT, configure_prefect_env

configure_prefect_env()

from click.testing import Result  # noqa: E402
from prefect import get_client  # noqa: E402
from prefect.client.schemas.actions import DeploymentScheduleCreate  # noqa: E402
from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterId, FlowRunFilter, FlowRunFilterId  # noqa: E402
from prefect.client.schemas.schedules import IntervalSchedule  # noqa: E402
from typer.testing import CliRunner  # noqa: E402

from pipelines.cli import app  # noqa: E402
from pipelines.servers import stop_server  # noqa: E402
from preprocessing.synth import generate_site  # noqa: E402

pytestmark = pytest.mark.slow
PREFECT_FILE = PROJECT_ROOT / "infra" / "prefect.yaml"
runner = CliRunner()


# The centre's checkout, which no hospital shares: a deployment must not send a worker there.
CENTRE_HOME = "/nonexistent/the-centres-fedauc"


def _fedauc(*args, timeout=600):
    """``fedauc <args>`` as the centre's operator runs it: a process of its own."""
    return subprocess.run([sys.executable, "-m", "pipelines.cli", *args], cwd=PROJECT_ROOT, capture_output=True,
                          text=True, timeout=timeout, env={**os.environ, "FEDAUC_HOME": CENTRE_HOME})


def _deploy(*args) -> Result:
    """``fedauc deploy <args>`` through the same command line in this process: its own process would import every
    flow again before ``prefect deploy`` (which it still starts) imports them once more, 20 to 40 s a call on
    two cores. One run keeps the process boundary (``test_a_broken_file_deploys_nothing``: what reaches the
    terminal when it fails)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("FEDAUC_HOME", CENTRE_HOME)
        result = runner.invoke(app, ["deploy", *args])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result


def _registered() -> tuple[set[str], dict]:
    with get_client(sync_client=True) as client:
        return {p.name for p in client.read_work_pools()}, {d.name: d for d in client.read_deployments()}


def test_deploy_registers_one_role_paused_then_every_deployment(prefect_server_on_postgres):
    declared = yaml.safe_load(PREFECT_FILE.read_text())["deployments"]
    # A hospital registers its own three, in its own pool, and nothing else.
    result = _deploy("--prefect-file", str(PREFECT_FILE), "--role", "hospital", "--site", "vienna")
    assert result.exit_code == 0, result.output
    pools, deployments = _registered()
    assert pools == {"site-vienna"}
    assert set(deployments) == {"onboard-vienna", "preprocess-vienna", "client-vienna"}

    # The centre: its pool's deployments without the demo-only ones; every schedule paused.
    result = _deploy("--prefect-file", str(PREFECT_FILE), "--role", "centre")
    assert result.exit_code == 0, result.output
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
    result = _deploy("--prefect-file", str(PREFECT_FILE), "--name", "nightly-chest-codasca",
                     "--schedules-active")
    assert result.exit_code == 0, result.output
    assert all(s.active for s in _registered()[1]["nightly-chest-codasca"].schedules)
    assert _deploy("--prefect-file", str(PREFECT_FILE)).exit_code == 1  # no role, no name: nothing
    result = _deploy("--prefect-file", str(PREFECT_FILE), "--role", "demo")
    assert result.exit_code == 0, result.output
    pools, deployments = _registered()
    assert {d["work_pool"]["name"] for d in declared} <= pools
    assert set(deployments) == {d["name"] for d in declared}
    assert deployments["nightly-chest-codasca"].work_pool_name == "fedauc-central"
    assert not any(s.active for d in deployments.values() for s in d.schedules)
    assert f"registered {len(declared)} deployments" in result.stdout


def test_a_broken_file_deploys_nothing(prefect_server_on_postgres, tmp_path):
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


@pytest.fixture(scope="module")
def workers(prefect_server_on_postgres, melanoma_shards, tmp_path_factory):
    """The three runs a worker completes below, set up and started at once, and their workers started
    together, each run awaited in a thread of its own: one after another, the tests waited out three
    worker starts, three scheduler ticks and three flow-run starts in a row. Each run has its own pool,
    deployment, folder, worker and MLflow store, so no test's outcome depends on another's. ``{name: run}``,
    each run a dict of its ``folder``, ``deployment``, ``awaited`` (its ``Awaited``) and what its test checks;
    an Orthanc missing here skips the PACS test alone."""
    from testbed.orthanc import PASSWORD, orthanc_server

    with get_client(sync_client=True) as client:
        if not client.read_deployments():
            assert _deploy("--prefect-file", str(PREFECT_FILE), "--role", "demo").exit_code == 0
    log = prefect_server_on_postgres["log"]
    with contextlib.ExitStack() as stack:
        runs = {}
        onboarding = runs["onboarding"] = _schedule_onboarding(tmp_path_factory.mktemp("scheduled-onboarding"))
        worker = _worker(onboarding["folder"], "site-stanford", FEDAUC_SITES=str(onboarding["folder"]))
        stack.callback(stop_server, worker)
        onboarding["awaited"] = Awaited(worker, partial(_wait_for_completed_run, onboarding["deployment"].id, log,
                                                             onboarding["folder"] / "worker.log", 300))

        training = runs["training"] = _start_training(tmp_path_factory.mktemp("consortium-training"),
                                                      melanoma_shards)
        worker = _worker(training["folder"], "fedauc-central", OMP_NUM_THREADS="1",
                         MLFLOW_TRACKING_URI=training["store"])
        stack.callback(stop_server, worker)
        training["awaited"] = Awaited(worker, partial(_wait_for_final_state, training["flow_run"].id, log,
                                                          training["folder"] / "worker.log", 400))

        folder = tmp_path_factory.mktemp("pacs-scoring")
        try:
            base = stack.enter_context(orthanc_server(folder / "orthanc"))
        except pytest.skip.Exception as skipped:
            runs["pacs"] = {"skipped": str(skipped)}
        else:
            scoring = runs["pacs"] = _schedule_pacs_scoring(folder, base)
            worker = _worker(folder, "site-hanoi", MLFLOW_TRACKING_URI=scoring["store"], HANOI_PACS_PASSWORD=PASSWORD)
            stack.callback(stop_server, worker)
            scoring["awaited"] = Awaited(worker, partial(_wait_for_completed_run, scoring["deployment"].id, log,
                                                                    folder / "worker.log", 300))
        yield runs
        for run in runs.values():
            if "awaited" in run:
                run["awaited"].thread.join()


class Awaited:
    """``wait()`` run in a thread of its own, and ``worker`` stopped as soon as it returns: a scheduled
    deployment's worker would otherwise start its next run every 10 s while the other tests wait for theirs.
    ``result()`` is what ``wait`` returned, or raises what it raised."""

    def __init__(self, worker: subprocess.Popen, wait):
        self.outcome: dict = {}

        def run():
            try:
                self.outcome["value"] = wait()
            except BaseException as err:  # the test that reads the result raises it
                self.outcome["error"] = err
            finally:
                stop_server(worker)

        # In this thread's context: Prefect's settings (the module's server) are a context variable, which a new
        # thread would start without (and so wait on an ephemeral server of its own).
        self.thread = threading.Thread(target=contextvars.copy_context().run, args=(run,), daemon=True)
        self.thread.start()

    def result(self):
        self.thread.join()
        if "error" in self.outcome:
            raise self.outcome["error"]
        return self.outcome["value"]


def _store(folder: Path) -> str:
    return f"sqlite:///{folder / 'mlruns.db'}"


def _worker(folder: Path, pool: str, **env) -> subprocess.Popen:
    """A worker of ``pool`` with its own Prefect home in ``folder`` (its log: ``folder / "worker.log"``), polling
    every second; ``env`` on top of this process's environment, without $FEDAUC_HOME: the worker runs in a
    folder of its own, and a run it starts enters the checkout its fedauc is installed from (this one), not the
    centre's (CENTRE_HOME, set when deploying)."""
    environment = {**os.environ, "PREFECT_WORKER_QUERY_SECONDS": "1", "PREFECT_HOME": str(folder / "worker-home"),
                   **env}
    environment.pop("FEDAUC_HOME", None)
    with open(folder / "worker.log", "wb") as log:
        return subprocess.Popen([str(Path(sys.executable).parent / "prefect"), "worker", "start", "--pool", pool,
                                 "--type", "process"], env=environment, stdout=log, cwd=folder,
                                stderr=subprocess.STDOUT, start_new_session=True)


def _run_for(workers: dict, name: str) -> dict:
    run = workers[name]
    if "skipped" in run:
        pytest.skip(run["skipped"])
    return run


def _schedule_onboarding(folder: Path):
    # The deployment's own site YAML points at the demo data; the schedule carries a tiny site instead.
    generate_site("chexpert", folder / "data", n=60, seed=3, workers=0, progress=False)
    site_yaml = folder / "stanford.yaml"
    site_yaml.write_text(yaml.safe_dump({"name": "stanford", "format": "chexpert", "root": "data/CheXpert-v1.0-small",
                                         "task": "chest-xray", "image_size": 32, "min_image_size": 16}))
    with get_client(sync_client=True) as client:
        deployment = client.read_deployment_by_name("onboard_site/onboard-stanford")
        client.create_deployment_schedules(deployment.id, [DeploymentScheduleCreate(
            schedule=IntervalSchedule(interval=timedelta(seconds=10)), active=True,
            parameters={"site": "stanford"})])
    return {"folder": folder, "deployment": deployment}


def test_the_scheduler_creates_a_run_and_the_site_worker_completes_it(prefect_server_on_postgres, workers):
    # The hospital's worker finds the site's YAML by its name (FEDAUC_SITES): no hospital path in what the
    # centre stores.
    run = _run_for(workers, "onboarding")
    completed = run["awaited"].result()
    assert completed.parameters == {"site": "stanford"}
    # Named from its own parameters, and its tasks from theirs, as a worker runs them (tests/test_run_names.py).
    assert completed.name == "onboard stanford"
    assert _task_run_names(completed.id) == {"validate stanford", "labels-report stanford"}
    assert completed.auto_scheduled  # made by the scheduler service, not by this test
    assert "InvalidRequestError" not in prefect_server_on_postgres["log"].read_text()


class _Polled:
    """What a wait saw of the Prefect server, for its failure message: a server that stops answering makes every
    wait of the module time out at once, and the runs' states alone would not say so."""

    def __init__(self):
        self.slowest_answer_s = 0.0
        self.seen = "nothing yet"

    def ask(self, read):
        started = time.monotonic()
        answer = read()
        self.slowest_answer_s = max(self.slowest_answer_s, time.monotonic() - started)
        return answer

    def timed_out(self, what: str, timeout_s: float, logs: dict[str, Path]) -> AssertionError:
        tails = "\n".join(f"{name} log:\n{_log_lines(path)}" for name, path in logs.items())
        return AssertionError(f"{what} within {timeout_s:.0f} s; last seen: {self.seen}; the Prefect server's slowest "
                              f"answer took {self.slowest_answer_s:.1f} s\n{tails}")


def _log_lines(path: Path, lines: int = 40) -> str:
    """A Prefect process's last log records (timestamped lines): its tracebacks at exit filled a plain tail."""
    return "\n".join([line for line in path.read_text(errors="replace").splitlines()
                      if line[:2].isdigit() and " | " in line][-lines:])


def _wait_for_completed_run(deployment_id, server_log: Path, worker_log: Path, timeout_s: float):
    deadline, polled, paused = time.monotonic() + timeout_s, _Polled(), False
    with get_client(sync_client=True) as client:
        while time.monotonic() < deadline:
            # SQLAlchemy 2.1 beside Prefect 3.8.8: the scheduler fails on every loop and never creates a run.
            assert "InvalidRequestError" not in server_log.read_text(errors="replace"), server_log.read_text()[-3000:]
            runs = polled.ask(partial(client.read_flow_runs, deployment_filter=DeploymentFilter(
                id=DeploymentFilterId(any_=[deployment_id]))))
            polled.seen = ", ".join(f"{r.state.name} since {r.state.timestamp:%H:%M:%S}" for r in runs if r.state) or "no run"
            if not paused and any(r.state and not r.state.is_scheduled() for r in runs):
                # One run started is enough: pausing deletes the runs made ahead (8 flow runs in the module, not 3)
                for schedule in client.read_deployment(deployment_id).schedules:
                    client.update_deployment_schedule(deployment_id, schedule.id, active=False)
                paused = True
            done = [r for r in runs if r.state and r.state.is_completed()]
            if done:
                return done[0]
            failed = [r for r in runs if r.state and r.state.is_final()]
            assert not failed, f"scheduled run ended {failed[0].state.type}: {failed[0].state.message}"
            time.sleep(2)
    raise polled.timed_out("no scheduled run completed", timeout_s, {"server": server_log, "worker": worker_log})


def _wait_for_final_state(flow_run_id, server_log: Path, worker_log: Path, timeout_s: float):
    deadline, polled = time.monotonic() + timeout_s, _Polled()
    with get_client(sync_client=True) as client:
        while time.monotonic() < deadline:
            state = polled.ask(partial(client.read_flow_run, flow_run_id)).state
            polled.seen = f"{state.name} since {state.timestamp:%H:%M:%S}" if state else "no state"
            if state is not None and state.is_final():
                return state
            time.sleep(2)
    raise polled.timed_out("the run did not end", timeout_s, {"server": server_log, "worker": worker_log})


def _start_training(folder: Path, melanoma_shards):
    """infra/prefect.yaml's NVIDIA FLARE training deployment, run by hand (`prefect deployment run`): here
    against the simulator instead of the consortium's admin kit (every site a process on this machine), on
    the tiny melanoma federation."""
    root, federation = melanoma_shards
    with get_client(sync_client=True) as client:
        deployment = client.read_deployment_by_name("train_federated/consortium-melanoma-codasca")
        declared = deployment.parameters
        flow_run = client.create_flow_run_from_deployment(deployment.id, parameters={
            "federation_yaml": str(federation), "shards_root": str(root / "shards"),
            "launcher": {"kind": "flare", "env": "sim", "workspace": str(folder / "flare")},
            "config": {**declared["config"], "rounds": 1, "local_steps": 2, "batch_size": 16, "eval_every": 1,
                       "network_kwargs": {"widths": [8, 16, 32]}, "loader_workers": 0, "progress": False,
                       "checkpoint_dir": str(folder / "checkpoints")}})
    return {"folder": folder, "deployment": deployment, "flow_run": flow_run, "store": _store(folder)}


def test_a_consortium_training_deployment_triggered_by_hand_registers_a_model(workers):
    """infra/prefect.yaml's NVIDIA FLARE training deployment, run by hand by the central pool's worker
    (``_start_training``); it ends with a registered model, recorded under a run name of its own."""
    run = _run_for(workers, "training")
    folder, deployment, flow_run = run["folder"], run["deployment"], run["flow_run"]
    declared = deployment.parameters
    assert declared["launcher"]["env"] == "prod" and declared["launcher"]["kit"].endswith("admin@fedauc.org")
    assert declared["config"]["timeout_s"] > 0 and deployment.schedules
    state = run["awaited"].result()
    assert state.is_completed(), (
        f"{state}\nworker log:\n{(folder / 'worker.log').read_text()[-4000:]}")

    from mlflow import MlflowClient

    mlflow_client = MlflowClient(tracking_uri=run["store"])
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


def _schedule_pacs_scoring(folder: Path, base: str):
    """pacs-scoring-hanoi scheduled every 10 s with a new study in the PACS at ``base`` and a chest model in
    ``folder``'s store."""
    from pacs_helpers import radiograph, register_chest_model, upload
    from pydicom.uid import generate_uid

    from testbed.orthanc import USER

    store = register_chest_model(folder / "store")
    study = generate_uid()
    upload(base, radiograph(folder / "pa.dcm", study, "P1", "PA", 1))
    site_yaml = folder / "hanoi.yaml"
    site_yaml.write_text(yaml.safe_dump({
        "name": "hanoi", "format": "vindr-cxr", "root": str(folder), "task": "chest-xray", "image_size": 32,
        "min_image_size": 16, "pacs": {"url": f"{base}/dicom-web", "username": USER, "stable_minutes": 0,
                                       "password_env": "HANOI_PACS_PASSWORD"}}))
    parameters = {"site_yaml": str(site_yaml), "shards_root": str(folder / "shards"),
                  "model": "models:/fedauc-chest-xray/1"}
    with get_client(sync_client=True) as client:
        deployment = client.read_deployment_by_name("score_pacs/pacs-scoring-hanoi")
        client.create_deployment_schedules(deployment.id, [DeploymentScheduleCreate(
            schedule=IntervalSchedule(interval=timedelta(seconds=10)), active=True, parameters=parameters)])
    return {"folder": folder, "deployment": deployment, "store": store, "base": base, "study": study}


def test_the_hospitals_pacs_scoring_runs_on_its_own_worker(prefect_server_on_postgres, workers):
    """pacs-scoring-hanoi on the pool site-hanoi: the scheduler makes a run, the hospital's worker scores the
    new study of a real Orthanc and stores its SR; the PACS password reaches the worker from its environment
    only (the deployment's parameters hold none)."""
    from pipelines.hospital import pacs
    from pipelines.hospital.sinks import DicomSrSink
    from testbed.orthanc import PASSWORD, USER

    run = _run_for(workers, "pacs")
    deployment = run["deployment"]
    assert deployment.global_concurrency_limit.limit == 1  # one run at a time
    assert "PASSWORD" not in str(deployment.parameters).upper()
    assert run["awaited"].result().auto_scheduled
    assert DicomSrSink(pacs.Pacs(f"{run['base']}/dicom-web", (USER, PASSWORD))).latest(run["study"], "fedauc-chest-xray",
                                                                                          "1")
