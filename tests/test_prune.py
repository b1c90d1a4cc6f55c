"""``fedauc prune`` on a real MLflow store (SQLite and its artifact folder) and a real checkpoint folder: what
the retention policy keeps (trainings, their privacy records, the champion and the registry, a noised
evaluation) stays, the old evaluation and scoring detail and old checkpoint rounds go, and ``--dry-run``
changes nothing. Records are written by fedauc's own recording code (testbed/year_records.py)."""

from __future__ import annotations

import datetime as dt
import os
import sqlite3
import time
from pathlib import Path
from types import SimpleNamespace

import mlflow
import numpy as np
import pytest
from mlflow import MlflowClient
from mlflow.entities import ViewType
from typer.testing import CliRunner

from federated.checkpoint import LATEST
from federated.schema import CHAMPION_ALIAS, EVALUATION_ROLE, PRIVACY_PREFIX, SCORING_ROLE
from pipelines import retention, tracking
from pipelines.cli import app
from testbed import year_records as records

ROOT = Path(__file__).resolve().parents[1]

SITES = ["hanoi", "vienna", "nih"]
DAY = 86_400


@pytest.fixture(scope="module")
def centre(tmp_path_factory):
    """A centre's store: two weeks' trainings (the second champion), old evaluations (one noised) and scoring
    days, then, after the cut, a new evaluation and scoring day; two checkpoint folders. Returns the cut."""
    here = tmp_path_factory.mktemp("centre")
    os.environ["MLFLOW_TRACKING_URI"] = tracking.default_tracking_uri(here)
    tracking.configure()
    rng = np.random.default_rng(0)
    fed = records.federation(SITES)
    trainings = [records.record_training(fed, f"weekly-{week}", rng, rounds=4, eval_every=2) for week in (1, 2)]
    records.record_evaluation(fed, rng)
    noised = records.record_evaluation(fed, rng, noise_multiplier=2.0)
    for day in range(2):
        for site in SITES[:2]:
            records.record_scoring_day(fed, site, dt.date(2026, 1, 1) + dt.timedelta(days=day), rng)
    time.sleep(0.05)
    cut = time.time()
    time.sleep(0.05)
    recent = records.record_evaluation(fed, rng)
    records.record_scoring_day(fed, "hanoi", dt.date(2026, 3, 1), rng)
    checkpoints = here / "checkpoints"
    for name, rounds in (("weekly-1", (38, 39)), ("weekly-2", (39, 40))):
        for index in rounds:
            (checkpoints / name / f"round_{index:04d}").mkdir(parents=True)
            (checkpoints / name / f"round_{index:04d}" / "site_0.pt").write_bytes(b"\0" * 4096)
        (checkpoints / name / LATEST).write_text(f"round_{rounds[-1]:04d}")
    old = cut - 1
    os.utime(checkpoints / "weekly-1" / LATEST, (old - 10 * DAY, old - 10 * DAY))
    yield {"dir": here, "uri": tracking.default_tracking_uri(here), "cut": cut, "trainings": trainings, "noised": noised, "recent": recent}
    mlflow.set_tracking_uri(None)


def _state(centre) -> dict:
    here, client = centre["dir"], MlflowClient(centre["uri"])
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()], "",
                              run_view_type=ViewType.ALL, max_results=10_000)
    return {"runs": {r.info.run_id: r for r in runs},
            "artifacts": sorted(str(p.relative_to(here)) for p in (here / "mlartifacts").rglob("*") if p.is_file()),
            "checkpoints": sorted(str(p.relative_to(here)) for p in (here / "checkpoints").rglob("*"))}


def _summary(state: dict) -> tuple:
    runs = sorted((i, r.info.lifecycle_stage, r.info.status, len(r.data.metrics)) for i, r in state["runs"].items())
    return runs, state["artifacts"], state["checkpoints"]


def _prune(centre, *args: str):
    # The policy's clock one day past the cut: with --older-than-days 1, what was recorded before the cut is old.
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(retention, "time", SimpleNamespace(time=lambda: centre["cut"] + DAY))
        patch.setenv("MLFLOW_TRACKING_URI", centre["uri"])  # every test starts on the session's store (conftest)
        return CliRunner().invoke(app, ["prune", "--older-than-days", "1", *args])


def test_dry_run_lists_the_old_detail_and_changes_nothing(centre):
    before = _state(centre)
    result = _prune(centre, "--dry-run")
    assert result.exit_code == 0, result.output
    assert "dry run: nothing was removed" in result.output
    assert _summary(_state(centre)) == _summary(before)
    listed = [line for line in result.output.splitlines() if line.startswith("mlflow run ")]
    assert len(listed) == 1 + 2 * 2, result.output  # one exact evaluation, two days at two sites
    assert "1 run(s) recording privacy spending" in result.output
    assert "checkpoint checkpoints/weekly-1/round_0038" in result.output
    assert "weekly-2" not in result.output.split("checkpoint", 1)[-1]
    assert str(centre["dir"]) not in result.output  # no path of the centre's machine, let alone a patient's


def test_prune_frees_the_old_detail_and_keeps_what_the_policy_keeps(centre):
    here = centre["dir"]
    before = _state(centre)
    size_before = (here / "mlruns.db").stat().st_size
    result = _prune(centre)
    assert result.exit_code == 0, result.output
    after = _state(centre)
    gone = set(before["runs"]) - set(after["runs"])
    assert len(gone) == 5 and all(before["runs"][i].data.tags["fedauc_role"] in (EVALUATION_ROLE, SCORING_ROLE)
                                  for i in gone)
    # Purged by mlflow gc, not left in MLflow's trash: no run id of theirs in any artifact path.
    assert not [p for p in after["artifacts"] if any(i in p for i in gone)]
    assert [p for p in before["artifacts"] if any(i in p for i in gone)]
    assert (here / "mlruns.db").stat().st_size < size_before
    # Kept: both trainings with their site runs and privacy spending, the registry and the champion.
    for run_id, _version in centre["trainings"]:
        assert after["runs"][run_id].info.lifecycle_stage == "active"
        children = [r for r in after["runs"].values() if r.data.tags.get("mlflow.parentRunId") == run_id]
        assert len(children) == len(SITES)
        assert all(any(k.startswith(PRIVACY_PREFIX) for k in c.data.metrics) for c in children)
    client = MlflowClient(centre["uri"])
    champion = client.get_model_version_by_alias("fedauc-chest-xray", CHAMPION_ALIAS)
    assert champion.run_id in {run_id for run_id, _ in centre["trainings"]}
    assert len(client.search_model_versions("name = 'fedauc-chest-xray'")) == 2
    mlflow.set_tracking_uri(centre["uri"])
    mlflow.artifacts.download_artifacts(f"models:/fedauc-chest-xray@{CHAMPION_ALIAS}", dst_path=str(here / "x"))
    assert centre["noised"] in after["runs"] and centre["recent"] in after["runs"]
    assert [r for r in after["runs"].values() if r.data.tags.get("day") == "2026-03-01"]
    assert after["checkpoints"] == sorted([
        "checkpoints/weekly-1", "checkpoints/weekly-1/LATEST", "checkpoints/weekly-1/round_0039",
        "checkpoints/weekly-1/round_0039/site_0.pt", "checkpoints/weekly-2", "checkpoints/weekly-2/LATEST",
        "checkpoints/weekly-2/round_0039", "checkpoints/weekly-2/round_0039/site_0.pt",
        "checkpoints/weekly-2/round_0040", "checkpoints/weekly-2/round_0040/site_0.pt"])
    with sqlite3.connect(here / "mlruns.db") as db:  # the rows went, not only the lifecycle flag
        ids = ",".join(f"'{i}'" for i in gone)
        assert db.execute(f"select count(*) from runs where run_uuid in ({ids})").fetchone() == (0,)
    again = _prune(centre, "--dry-run")
    assert "0 MLflow evaluation/scoring run(s)" in again.output


def test_retention_below_a_day_is_refused():
    with pytest.raises(ValueError, match="at least 1"):
        retention.plan(0)
