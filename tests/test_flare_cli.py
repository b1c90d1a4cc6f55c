"""`fedauc train --backend flare --flare-env sim`: a real NVFlare simulator job from the CLI, recorded in a real
MLflow store exactly as the in-process training of the same config is (same metrics, same values, a
registered model); both with `--secure-aggregation` (the plain FLARE path: tests/test_flare.py)."""

from __future__ import annotations

import json

import mlflow
import pytest
from mlflow import MlflowClient
from typer.testing import CliRunner

from federated.schema import TIMING_METRICS
from pipelines.cli import app

pytestmark = pytest.mark.slow

runner = CliRunner()


def _train(federation, run_name, *extra):
    # Relative paths, as the README's commands use them: the site processes run elsewhere (NVFlare's workspace).
    result = runner.invoke(app, ["train", "--federation", str(federation), "--shards", "shards",
                                 "--algorithm", "codasca", "-p", "T0=4", "--rounds", "2", "--local-steps", "2",
                                 "--batch-size", "16", "--lr", "0.5", "--eval-every", "1", "--run-name", run_name,
                                 "--checkpoint-dir", f"ckpt/{run_name}", "--secure-aggregation", *extra])
    assert result.exit_code == 0, result.output
    summary_at = result.output.index('{\n  "run_id"')  # NVFlare's own log lines may surround the summary
    return json.JSONDecoder().raw_decode(result.output, summary_at)[0]


def _metrics(client: MlflowClient, run_id: str) -> dict[str, list[tuple[int, float]]]:
    run = client.get_run(run_id)
    return {key: [(m.step, m.value) for m in client.get_metric_history(run_id, key)] for key in run.data.metrics}


def test_flare_simulated_training_is_recorded_like_in_process(tmp_path, melanoma_shards, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlruns.db'}")
    root, federation = melanoma_shards
    monkeypatch.chdir(root)
    try:
        local = _train(federation, "local")
        flare = _train(federation, "flare", "--backend", "flare", "--flare-env", "sim",
                       "--flare-workspace", str(tmp_path / "flare"))
        client = MlflowClient()
        mine, theirs = _metrics(client, local["run_id"]), _metrics(client, flare["run_id"])
        assert theirs.keys() == mine.keys() and "valid/pooled/auc_macro" in mine
        for key, values in mine.items():
            if key not in TIMING_METRICS:
                assert [s for s, _ in theirs[key]] == [s for s, _ in values], key
                assert [v for _, v in theirs[key]] == pytest.approx([v for _, v in values], abs=1e-6, nan_ok=True), key
        children = {r.data.tags["site"] for r in client.search_runs(
            [client.get_run(flare["run_id"]).info.experiment_id],
            f"tags.mlflow.parentRunId = '{flare['run_id']}'")}
        assert children == {"vienna", "barcelona", "new-york"}
        assert client.get_run(flare["run_id"]).data.params["flare_env"] == "sim"
        # Each run says how it ran: no FLARE training recorded as in-process.
        assert [client.get_run(run["run_id"]).data.params["backend"] for run in (local, flare)] == ["inprocess", "flare"]
        # The data's records come from the sites' reports: the in-process run's, shard hashes and QC included.
        params = [{k: v for k, v in client.get_run(run["run_id"]).data.params.items()
                   if k not in ("flare_env", "checkpoint_dir", "backend")} for run in (local, flare)]
        assert params[0] == params[1] and "shard_hash.vienna" in params[0]
        assert params[0]["secure_aggregation"] == "True"  # --secure-aggregation reached both trainings
        artifacts = [sorted(a.path for folder in ("", "qc", "qc/vienna") for a in client.list_artifacts(run["run_id"], folder))
                     for run in (local, flare)]
        assert artifacts[0] == artifacts[1] and "roc_test_pooled.png" in artifacts[0]
        qc = [mlflow.artifacts.load_dict(f"{client.get_run(run['run_id']).info.artifact_uri}/qc/vienna/summary.json")
              for run in (local, flare)]
        assert qc[0] == qc[1]
        assert flare["model_version"] is not None
        # The registered contract carries the out-of-distribution threshold, fitted from the sites' sums over FLARE
        # (secure aggregation included) as in-process.
        contracts = [mlflow.models.get_model_info(f"models:/fedauc-melanoma/{run['model_version']}").metadata["fedauc"]
                     for run in (local, flare)]
        assert contracts[1]["ood"] is not None and contracts[1]["ood"]["threshold"] > 0
        assert contracts[1]["ood"]["threshold"] == pytest.approx(contracts[0]["ood"]["threshold"], rel=0.05)
        assert contracts[1]["ood"]["train_images"] == contracts[0]["ood"]["train_images"]
        assert list((tmp_path / "flare").rglob("log.txt"))  # the job's logs stay in its workspace
        assert (root / "ckpt" / "flare").is_dir()  # the checkpoints where the command said, not in the workspace
    finally:
        mlflow.set_tracking_uri(None)


def test_flare_env_outside_the_choices_is_refused():
    result = runner.invoke(app, ["train", "--federation", "sites/demo/melanoma.yaml", "--algorithm", "codasca",
                                 "--backend", "flare", "--flare-env", "moon"])
    words = " ".join(result.output.replace("│", " ").split())  # rich wraps the message in a box
    assert result.exit_code == 2 and "'moon' is not one of 'sim', 'poc', 'prod'" in words


@pytest.mark.parametrize(("extra", "expected"), [
    (["--flare-env", "prod"], "--kit (the admin's startup kit) goes with --flare-env prod, and only with it"),
    (["--flare-env", "poc", "--kit", "kits/admin"], "goes with --flare-env prod, and only with it"),
    (["--flare-env", "prod", "--kit", "sites"], "not an admin's startup kit (no startup/fed_admin.json)"),
])
def test_flare_env_and_kit_that_cannot_run_are_one_message(melanoma_shards, extra, expected):
    root, federation = melanoma_shards
    result = runner.invoke(app, ["train", "--federation", str(federation), "--shards", str(root / "shards"),
                                 "--algorithm", "codasca", "--backend", "flare", *extra])
    assert result.exit_code == 1 and expected in result.output and "Traceback" not in result.output
