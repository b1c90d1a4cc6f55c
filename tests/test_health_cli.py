"""A training that goes wrong says so at the command line and in MLflow: `fedauc train --lr 1e9` on a small
federation exits 1 with a short message naming the round and the fix, its runs end FAILED with the reason,
and nothing is registered; a collapsed model (constant scores) is recorded and never champion."""

from __future__ import annotations

import re

import mlflow
import pytest
from mlflow import MlflowClient
from typer.testing import CliRunner

from federated import schema
from federated.schema import FAILURE_TAG
from pipelines import registry, tracking
from pipelines.cli import app
from pipelines.runs import RoundLogger, training_runs

pytestmark = pytest.mark.slow


def test_a_diverging_training_exits_1_with_the_round_and_the_fix(melanoma_shards, tmp_path, monkeypatch):
    root, federation = melanoma_shards
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlruns.db'}")
    result = CliRunner().invoke(app, ["train", "--federation", str(federation), "--shards", str(root / "shards"),
                                      "--algorithm", "fedavg", "--rounds", "2", "-I", "2", "--batch-size", "8",
                                      "--lr", "1e9", "--checkpoint-dir", str(tmp_path / "ckpt")])
    assert result.exit_code == 1, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) <= 8, result.output
    assert "Traceback" not in result.output
    assert re.search(r"site\(s\) .*, round \d+: ", result.output), result.output
    assert "lower the learning rate (--lr, now 1e+09)" in result.output
    client = MlflowClient()
    runs = client.search_runs([tracking.experiment_id("melanoma")])
    assert len(runs) == 4  # the training and its three sites
    assert {run.info.status for run in runs} == {"FAILED"}
    assert all(re.search(r"round \d+: ", run.data.tags[FAILURE_TAG]) for run in runs)
    assert client.search_registered_models() == []
    refused = CliRunner().invoke(app, ["train", "--federation", str(federation), "--shards", str(root / "shards"),
                                       "--algorithm", "fedavg", "--aggregation", "median", "--secure-aggregation"])
    assert refused.exit_code == 1
    assert ("--aggregation median needs every site's values at the combiner, and secure aggregation shows it their "
            "sum only: use one or the other") in refused.output
    assert len(client.search_runs([tracking.experiment_id("melanoma")])) == 4  # no run started


def test_a_collapsed_version_is_never_champion_even_the_first(tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlruns.db'}")
    metrics = {"valid/pooled/auc/A": 0.5, "valid/pooled/auc/B": 0.5, "valid/pooled/auc_macro": 0.5,
               "test/pooled/auc/A": 0.5, "test/pooled/auc/B": 0.61}
    assert registry.collapsed_splits(metrics) == ["valid"]
    assert registry.collapsed_splits({**metrics, "valid/pooled/auc/B": 0.5001}) == []
    client, name = MlflowClient(), "fedauc-test"
    client.create_registered_model(name)

    def version(metric, collapsed=None):
        v = client.create_model_version(name, source=str(tmp_path)).version
        client.set_model_version_tag(name, v, schema.SELECTION_METRIC_TAG, repr(metric))
        if collapsed:
            client.set_model_version_tag(name, v, schema.COLLAPSED_TAG, collapsed)
        return str(v)

    first = version(0.5, "valid,test")
    assert not registry.promote_best(client, name, first)
    with pytest.raises(mlflow.exceptions.MlflowException):
        client.get_model_version_by_alias(name, schema.CHAMPION_ALIAS)
    second = version(0.3)
    assert registry.promote_best(client, name, second)  # worse than the collapsed one's 0.5, still champion
    third = version(0.9, "valid")
    assert not registry.promote_best(client, name, third)
    assert str(client.get_model_version_by_alias(name, schema.CHAMPION_ALIAS).version) == second


def test_each_sites_update_norms_reach_its_child_run(tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlruns.db'}")
    record = {"round": 0, "bytes_sent": [10, 10, 10], "bytes_received": [10, 10, 10], "train_loss": 0.6,
              "seconds": 1.0, "lr": 0.1, "site_losses": [0.5, 0.6, 0.7],
              "update_norm": {"model": [1.0, 2.0, 3000.0], "c": [0.1, 0.2, 0.3]},
              "update_norm_rel": {"model": [0.0005, 0.002, 2000.0], "c": [0.4, 1.0, 2.0]}}
    experiment = tracking.experiment_id("health")
    with training_runs(experiment, "norms", "fed", ["a", "b", "c"]) as (parent, children):
        RoundLogger(MlflowClient(), parent.info.run_id, children)(record)
    client = MlflowClient()
    third = client.get_run(children[2]).data.metrics
    assert third["update_norm/model"] == 3000.0 and third["update_norm_rel/model"] == 2000.0
    assert third["update_norm_rel/c"] == 2.0 and third["train_loss"] == 0.7
    assert client.get_run(parent.info.run_id).data.metrics["lr"] == 0.1
