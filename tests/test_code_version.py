"""One code version (federated/version.py): what MLflow records for a training is what an NVIDIA FLARE job
carries and a site sends and accepts, so an operator matches a run to what the hospitals report."""

from __future__ import annotations

import re

import mlflow
import pytest
from mlflow import MlflowClient

from federated.flare.centre.job import flare_job
from federated.flare.site.heartbeat import Heartbeat
from federated.flare.site.version import check_code_version
from federated.sites import federation_config
from pipelines import runs, tracking
from preprocessing.federation import load_federation

SETTINGS = dict(algorithm="fedavg", network="small_resnet", network_kwargs={"widths": [8, 8]}, rounds=1, local_steps=1,
                batch_size=8, eval_every=1, progress=False, loader_workers=0, device="cpu")


@pytest.fixture()
def store(tmp_path, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    tracking.configure(tmp_path)
    yield tmp_path
    mlflow.set_tracking_uri(None)


def test_a_tracked_training_records_the_version_a_flare_site_reports_and_accepts(store, melanoma_shards):
    root, federation_yaml = melanoma_shards
    federation = load_federation(federation_yaml)
    run = runs.train_tracked(federation, root / "shards", dict(SETTINGS), "version-check")
    recorded = MlflowClient().get_run(run.run_id).data.params["code_version"]
    assert re.fullmatch(r"\d+\.\d+\.\d+\+g[0-9a-f]{12}", recorded), recorded

    # The job the centre builds for the same training carries it ...
    job = flare_job(federation_config(federation, root / "shards", SETTINGS), federation.task,
                    tuple(federation.sites[0].diseases), 60.0, share_paths=False)
    assert job.code_version == recorded
    # ... a site of the same checkout accepts it without any allowed_code_versions ...
    check_code_version("vienna", job.code_version)
    # ... and the site's heartbeat (what the centre's live account shows) carries the same string.
    beats = []
    with Heartbeat(lambda site, version, done: beats.append((site, version, done)), "vienna", interval_s=60.0):
        pass
    assert beats and {version for _, version, _ in beats} == {recorded}
