"""A hospital's failed flow run tells the consortium's Prefect server the step and the kind of problem, never
the hospital's paths (pipelines.site_params.failures_stay_at_the_site): a site YAML whose data root names a
patient, onboarded and preprocessed as its worker runs them, leaves that name in no flow run, task run or log
line the server holds, and in the error the site itself gets."""

import pickle
import time

import pytest
import yaml

from pipelines.prefect_env import configure_prefect_env

configure_prefect_env()

from prefect import get_client  # noqa: E402
from prefect.client.schemas.filters import (  # noqa: E402
    FlowRunFilter,
    FlowRunFilterName,
    LogFilter,
    LogFilterFlowRunId,
)

from common.errors import FailedAtSite  # noqa: E402
from pipelines import flows  # noqa: E402
from pipelines.preprocess_flow import preprocess_site  # noqa: E402

MARKER = "MRN-CANARY-4711"


def _held_by_the_server(run_name: str) -> list[str]:
    """Every text the server holds of the flow run ``run_name``: its state, its task runs' states, its logs."""
    with get_client(sync_client=True) as client:
        (run,) = client.read_flow_runs(flow_run_filter=FlowRunFilter(name=FlowRunFilterName(any_=[run_name])))
        tasks = client.read_task_runs(flow_run_filter=FlowRunFilter(name=FlowRunFilterName(any_=[run_name])))
        deadline = time.monotonic() + 30  # run logs reach the server in batches
        while True:
            logs = client.read_logs(LogFilter(flow_run_id=LogFilterFlowRunId(any_=[run.id])))
            if any("FailedAtSite" in log.message for log in logs) or time.monotonic() > deadline:
                break
            time.sleep(1)
    return [run.state.message or "", *(task.state.message or "" for task in tasks if task.state),
            *(log.message for log in logs)]


@pytest.fixture
def hospital(tmp_path, monkeypatch):
    sites = tmp_path / "sites"
    sites.mkdir()
    for name in ("ghost", "phantom"):
        (sites / f"{name}.yaml").write_text(yaml.safe_dump({
            "name": name, "format": "chexpert", "root": str(tmp_path / MARKER / "CheXpert-v1.0-small"),
            "task": "chest-xray", "image_size": 32, "min_image_size": 16}))
    monkeypatch.setenv("FEDAUC_SITES", str(sites))
    monkeypatch.setenv("FEDAUC_SHARDS", str(tmp_path / "shards"))


@pytest.mark.parametrize(("run", "site", "step"), [(flows.onboard_site, "ghost", "onboard ghost"),
                                                   (preprocess_site, "phantom", "preprocess phantom")])
def test_a_failed_site_run_tells_the_server_the_step_and_the_site_the_whole_error(hospital, run, site, step):
    with pytest.raises(FailedAtSite) as raised:
        run(site)
    assert MARKER in str(raised.value.at_site)  # the hospital's own error names its data root
    assert MARKER not in str(raised.value) and "failed at the site" in str(raised.value)
    # Prefect persists a failed run's exception as its result, pickled: the site's error stays out of it.
    assert MARKER.encode() not in pickle.dumps(raised.value)
    held = _held_by_the_server(step)
    assert any("failed at the site" in text for text in held), held
    assert not [text for text in held if MARKER in text]
