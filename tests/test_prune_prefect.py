"""``fedauc prune`` on a real Prefect server (``prefect server start``): finished flow runs that ended before
the retention period go through Prefect's API with their logs and artifacts, whatever their final state and
whether they ever ran; runs still scheduled or running, runs that ended within the period, their logs and
artifacts (the latest of a key among them) and the deployments stay; ``--dry-run`` lists them and deletes
nothing."""

from __future__ import annotations

import time
from datetime import datetime, timezone
from types import SimpleNamespace

import pytest
from typer.testing import CliRunner

from pipelines.prefect_env import configure_prefect_env

configure_prefect_env()

from prefect import get_client  # noqa: E402
from prefect.client.schemas.actions import ArtifactCreate, LogCreate, WorkPoolCreate  # noqa: E402
from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId  # noqa: E402
from prefect.states import Cancelled, Completed, Crashed, Failed, Pending, Running, Scheduled  # noqa: E402

from pipelines import retention, tracking  # noqa: E402
from pipelines.cli import app  # noqa: E402

pytestmark = pytest.mark.slow
DAY = 86_400

# Each run's name and the states it goes through, in order.
OLD = {"old-completed": (Pending, Running, Completed), "old-failed": (Pending, Running, Failed),
       "old-cancelled-before-it-ran": (Cancelled,), "old-crashed-before-it-ran": (Pending, Crashed)}
KEPT_OLD = {"running-since-long": (Pending, Running), "scheduled-long-ago": ()}
# Started before the period, ended within it (it ran, or waited late, for longer than the period): kept, for
# the period after its end, like any run that ended then.
ENDED_RECENTLY = "started-long-ago-ended-recently"
RECENT = {"recent-completed": (Pending, Running, Completed)}


@pytest.fixture(scope="module")
def centre(prefect_server, tmp_path_factory):
    """Two deployments' flow runs: the old ones, then the cut, then a recent one. Returns the cut and the
    deployments' ids."""
    with get_client(sync_client=True) as client:
        client.create_work_pool(WorkPoolCreate(name="fedauc-central", type="process"))
        deployments = []
        for flow_name, name in (("score_pacs", "pacs-scoring-vienna"), ("evaluate", "evaluate-chest-champion")):
            flow_id = client.create_flow_from_name(flow_name)
            deployments.append(client.create_deployment(flow_id, name, work_pool_name="fedauc-central",
                                                        entrypoint=f"pipelines/flows.py:{flow_name}"))

        def runs(named: dict) -> list:
            made = []
            for index, (name, states) in enumerate(named.items()):
                made.append(client.create_flow_run_from_deployment(deployments[index % 2], name=name,
                                                                   state=Scheduled()))
                for state in states:
                    client.set_flow_run_state(made[-1].id, state(), force=True)
            return made

        made = runs({ENDED_RECENTLY: (Pending, Running)} | OLD | KEPT_OLD)
        time.sleep(0.1)
        cut = time.time()
        time.sleep(0.1)
        made += runs(RECENT)
        client.set_flow_run_state(made[0].id, Completed(), force=True)
        ids = {run.name: run.id for run in made}
        # What an evaluation leaves: its log lines and its table under the same key every night.
        for name in ("old-completed", "old-failed", "recent-completed"):
            client.create_artifact(ArtifactCreate(key="evaluate-chest", type="markdown", data=f"{name}",
                                                  flow_run_id=ids[name]))
            client.create_logs([LogCreate(name="prefect.flow_runs", level=20, message=f"{name} {line}",
                                          timestamp=datetime.now(timezone.utc), flow_run_id=ids[name])
                                for line in range(3)])
    return {"cut": cut, "deployments": deployments, "ids": ids, "mlflow": tracking.default_tracking_uri(
        tmp_path_factory.mktemp("mlflow"))}


def _names() -> set[str]:
    with get_client(sync_client=True) as client:
        return {run.name for run in client.read_flow_runs(limit=200)}


def _artifacts_and_logs(ids) -> tuple[list[str], set[str]]:
    with get_client(sync_client=True) as client:
        artifacts = sorted(a.data for a in client.read_artifacts())
        logs = {log.message.split()[0] for log in client.read_logs(LogFilter(flow_run_id=LogFilterFlowRunId(any_=ids)))}
    return artifacts, logs


def _prune(centre, *args: str):
    with pytest.MonkeyPatch.context() as patch:  # the policy's clock a day past the cut
        patch.setattr(retention, "time", SimpleNamespace(time=lambda: centre["cut"] + DAY))
        patch.setenv("MLFLOW_TRACKING_URI", centre["mlflow"])  # a store of its own: nothing of other tests'
        return CliRunner().invoke(app, ["prune", "--older-than-days", "1", *args])


def test_dry_run_lists_the_old_finished_flow_runs_and_deletes_nothing(centre):
    before = _names()
    result = _prune(centre, "--dry-run")
    assert result.exit_code == 0, result.output
    assert f"{len(OLD)} Prefect flow run(s)" in result.output
    listed = {line.removeprefix("prefect flow run ") for line in result.output.splitlines()
              if line.startswith("prefect flow run ")}
    assert listed == set(OLD)
    assert _names() == before == set(OLD) | set(KEPT_OLD) | set(RECENT) | {ENDED_RECENTLY}
    assert _artifacts_and_logs(list(centre["ids"].values())) == (
        ["old-completed", "old-failed", "recent-completed"], {"old-completed", "old-failed", "recent-completed"})


def test_prune_deletes_the_old_finished_runs_and_keeps_the_rest_and_the_deployments(centre):
    result = _prune(centre)
    assert result.exit_code == 0, result.output
    assert _names() == set(KEPT_OLD) | set(RECENT) | {ENDED_RECENTLY}
    with get_client(sync_client=True) as client:
        assert {d.id for d in client.read_deployments()} == set(centre["deployments"])
    assert "0 Prefect flow run(s)" in _prune(centre, "--dry-run").output
    # Prefect drops a deleted run's logs in a task of its own, moments later.
    deadline = time.monotonic() + 60
    while (found := _artifacts_and_logs(list(centre["ids"].values())))[1] != {"recent-completed"}:
        assert time.monotonic() < deadline, found
        time.sleep(0.5)
    assert found[0] == ["recent-completed"]
