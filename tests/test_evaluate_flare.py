"""`fedauc evaluate`: registered models scored by every site on its own valid and test splits and pooled at the
centre, in-process and as an NVIDIA FLARE simulator job, recorded in a real MLflow store (the POC consortium
case, with no shard at the centre, is in tests/test_flare_poc.py).

Two models are registered by real trainings; one `fedauc evaluate --model-version 1 --model-version 2` in
this process and one with `--backend flare --flare-env sim` must log the same metrics (every key, to 1e-6),
the same suppression record and the same evaluation fingerprint (sites and shard hashes), and print the
same comparison table.
"""

from __future__ import annotations

import mlflow
import pytest
from mlflow import MlflowClient
from typer.testing import CliRunner

from pipelines.cli import app

pytestmark = pytest.mark.slow

runner = CliRunner()


def _train(federation, shards, run_name: str, seed: int) -> None:
    result = runner.invoke(app, ["train", "--federation", str(federation), "--shards", str(shards),
                                 "--algorithm", "codasca", "-p", "T0=4", "--rounds", "1", "--local-steps", "2",
                                 "--batch-size", "16", "--lr", "0.5", "--eval-every", "1", "--seed", str(seed),
                                 "--run-name", run_name, "--checkpoint-dir", str(shards.parent / "ckpt" / run_name)])
    assert result.exit_code == 0, result.output


def _evaluations(client: MlflowClient) -> dict[tuple[str, str], object]:
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()], "tags.fedauc_role = 'evaluation'")
    return {(run.data.params["backend"], run.data.tags["model_version"]): run for run in runs}


def test_flare_sim_evaluation_equals_the_in_process_one(tmp_path, evaluable_melanoma, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlruns.db'}")
    root, federation = evaluable_melanoma
    shards = root / "shards"
    try:
        _train(federation, shards, "first", seed=0)
        _train(federation, shards, "second", seed=1)
        common = ["evaluate", "--federation", str(federation), "--shards", str(shards),
                  "--model-version", "1", "--model-version", "2"]
        local = runner.invoke(app, common)
        assert local.exit_code == 0, local.output
        flare = runner.invoke(app, [*common, "--backend", "flare", "--flare-env", "sim",
                                    "--flare-workspace", str(tmp_path / "flare")])
        assert flare.exit_code == 0, flare.output
        table = local.output[local.output.index("| model"):]
        assert table in flare.output  # the same comparison table, both models in it
        assert table.count("(champion)") == 1 and "| v1" in table and "| v2" in table

        client = MlflowClient()
        runs = _evaluations(client)
        assert sorted(runs) == [("flare", "1"), ("flare", "2"), ("inprocess", "1"), ("inprocess", "2")]
        for version in ("1", "2"):
            mine, theirs = runs["inprocess", version], runs["flare", version]
            assert theirs.data.params["flare_env"] == "sim"
            assert theirs.data.params["backend"] == "flare" and mine.data.params["backend"] == "inprocess"
            assert ({k: v for k, v in theirs.data.params.items() if k not in ("backend", "flare_env")}
                    == {k: v for k, v in mine.data.params.items() if k != "backend"})
            assert mine.data.tags["model_uri"] == f"models:/fedauc-melanoma/{version}"
            assert theirs.data.metrics.keys() == mine.data.metrics.keys()
            assert {"valid/pooled/auc_macro", "test/pooled/auc_ci95_high_macro", "test/site/vienna/n_neg/Melanoma",
                    "valid/macro_over_sites/auc_macro"} <= mine.data.metrics.keys()
            for key in ("valid/pooled/auc_macro", "test/pooled/auc_macro", "test/pooled/auc_ci95_low_macro",
                        "valid/site/vienna/auc_macro", "test/macro_over_sites/auc_macro"):
                assert 0.0 < mine.data.metrics[key] < 1.0, key  # defined: the splits hold both classes
            for key, value in mine.data.metrics.items():
                assert theirs.data.metrics[key] == pytest.approx(value, abs=1e-6, nan_ok=True), key
            records = [mlflow.artifacts.load_dict(f"{run.info.artifact_uri}/suppressed_metrics.json")
                       for run in (mine, theirs)]
            assert records[0] == records[1]
            assert "roc_test_pooled.png" in {a.path for a in client.list_artifacts(theirs.info.run_id)}
        # The two models differ, so equal numbers are not one model scored twice.
        assert runs["inprocess", "1"].data.metrics != runs["inprocess", "2"].data.metrics
        assert list((tmp_path / "flare").rglob("log.txt"))  # the job's logs stay in its workspace
    finally:
        mlflow.set_tracking_uri(None)


@pytest.mark.parametrize(("extra", "expected"), [
    (["--backend", "flare", "--flare-env", "prod", "--kit", "sites", "--shards", "shards"],
     "not an admin's startup kit"),
    (["--backend", "flare", "--flare-env", "prod"], "--kit (the admin's startup kit) goes with --flare-env prod"),
])
def test_flare_evaluation_that_cannot_run_is_one_message(evaluable_melanoma, extra, expected):
    _, federation = evaluable_melanoma
    result = runner.invoke(app, ["evaluate", "--federation", str(federation), *extra])
    assert result.exit_code == 1 and expected in result.output and "Traceback" not in result.output


def test_prod_evaluation_refuses_a_shard_folder_at_the_centre(evaluable_melanoma, tmp_path):
    """Under prod the centre never locates, let alone reads, a shard: --shards is refused, not ignored."""
    from common.errors import ConfigError
    from federated.launch import Flare
    from pipelines.checks import check_evaluation

    root, federation = evaluable_melanoma
    prod = Flare(env="prod", kit=tmp_path / "admin@fedauc.org")
    with pytest.raises(ConfigError, match="the centre reads no shards"):
        check_evaluation(federation, root / "shards", prod)
    _, located = check_evaluation(federation, None, prod)
    assert located is None


def test_the_metrics_table_has_a_row_per_split_and_scope():
    import pandas as pd

    from pipelines.evaluations import metrics_rows
    from pipelines.tables import markdown_table

    rows = metrics_rows({"valid/pooled/auc_macro": 0.6, "test/pooled/auc_macro": 0.7,
                         "test/site/vienna/auc_macro": 0.8, "test/site/vienna/n_neg/Melanoma": 21.0})
    assert rows == [{"split": "valid", "scope": "pooled", "auc_macro": 0.6},
                    {"split": "test", "scope": "pooled", "auc_macro": 0.7},
                    {"split": "test", "scope": "site/vienna", "auc_macro": 0.8, "n_neg/Melanoma": 21.0}]
    # By default the macro means only, one short row per split and scope: `fedauc evaluate` in 100 columns.
    metrics = {f"{split}/{scope}/{metric}": 0.123456 for split in ("valid", "test")
               for scope in ("pooled", "macro_over_sites", "site/new-york") for metric in
               ("auc_macro", "auc_ci95_low_macro", "auc_ci95_high_macro", "pauc_fpr0.3_mcclish_macro",
                "auc/Melanoma", "pauc_fpr0.3_mcclish/Melanoma", "n_pos/Melanoma", "n_neg/Melanoma")}
    narrow = pd.DataFrame(metrics_rows(metrics, wide=False)).round(3)
    assert list(narrow.columns) == ["split", "scope", "auc_macro", "auc_ci95_low_macro", "auc_ci95_high_macro",
                                    "pauc_fpr0.3_mcclish_macro"]
    assert max(map(len, markdown_table(narrow).splitlines())) <= 100
    assert "auc/Melanoma" in pd.DataFrame(metrics_rows(metrics)).columns
