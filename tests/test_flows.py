"""The whole path on a tiny federation, with a real Prefect run and a real MLflow SQLite store."""

import json

import mlflow
import numpy as np
import pytest
import yaml
from mlflow import MlflowClient

from pipelines import compare
from pipelines.prefect_env import configure_prefect_env

configure_prefect_env()

from pipelines import flows  # noqa: E402
from preprocessing.synth import generate_site  # noqa: E402

pytestmark = pytest.mark.slow

DISEASES = ["Cardiomegaly", "Edema", "Consolidation", "Atelectasis", "Pleural Effusion"]


@pytest.fixture(scope="module")
def federation(tmp_path_factory):
    root = tmp_path_factory.mktemp("federation")
    entries = []
    for name, fmt in (("alpha", "nih-cxr14"), ("beta", "padchest")):
        generate_site(fmt, root / "data" / name, n=120, seed=7, workers=0, progress=False)
        site = {"name": name, "format": fmt, "root": f"data/{name}", "task": "chest-xray", "image_size": 32,
                "min_image_size": 16, "split": {"seed": 0, "valid": 0.25, "test": 0.3, "use_official": False}}
        if name == "alpha":  # opts in to sharing its QC grid; beta keeps the default (off)
            site["sharing"] = {"qc_grid": True}
        (root / f"{name}.yaml").write_text(yaml.safe_dump(site))
        entries.append({"config": f"{name}.yaml"})
    (root / "federation.yaml").write_text(yaml.safe_dump({"name": "tiny", "task": "chest-xray", "sites": entries}))
    return root


@pytest.fixture(scope="module")
def mlflow_store(tmp_path_factory):
    store = tmp_path_factory.mktemp("mlflow")
    patch = pytest.MonkeyPatch()
    patch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{store / 'mlruns.db'}")
    yield store
    patch.undo()
    mlflow.set_tracking_uri(None)


def _logged_prefixes(flow_run_id, wanted: int) -> set[str]:
    """The starts ("site <name>: shards ...") of the preprocessing lines Prefect's server holds of a flow run;
    run logs reach it in batches."""
    import time

    from prefect import get_client
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId

    only = LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run_id]))
    deadline = time.monotonic() + 30
    while True:
        with get_client(sync_client=True) as client:
            lines = {log.message.split(" (")[0] for log in client.read_logs(only) if log.message.startswith("site ")}
        if len(lines) >= wanted or time.monotonic() > deadline:
            return lines
        time.sleep(1)


def test_onboard_preprocess_train_evaluate(federation, mlflow_store, monkeypatch):
    monkeypatch.setenv("FEDAUC_SITES", str(federation))  # the site's worker finds its YAML by the site's name
    report = flows.onboard_site("alpha")
    assert report["input_rows"] == report["kept"] + report["quarantined"] == 120

    shards = federation / "shards"
    state = flows.preprocess_federation(str(federation / "federation.yaml"), str(shards), workers=0,
                                        return_state=True)
    first = state.result()
    assert [s["site"] for s in first] == ["alpha", "beta"]
    assert _logged_prefixes(state.state_details.flow_run_id, 2) == {"site alpha: shards written",
                                                                    "site beta: shards written"}
    again = flows.preprocess_federation(str(federation / "federation.yaml"), str(shards), workers=0)
    assert all(s["reused"] for s in again) and not any(s["reused"] for s in first)

    config = {"algorithm": "codasca", "params": {"T0": 4}, "network": "small_resnet", "rounds": 3,
              "local_steps": 2, "batch_size": 8, "lr": 0.05, "eval_every": 1, "progress": False}
    summary = flows.train_federated(str(federation / "federation.yaml"), str(shards), config, "codasca-tiny")
    assert summary["promoted"] and summary["model_version"] == "1"

    client = MlflowClient()
    parent = client.get_run(summary["run_id"])
    assert parent.data.params["algorithm"] == "codasca"
    assert parent.data.params["algo.eta_g"] == "1.0" and parent.data.params["K"] == "2"
    for site in ("alpha", "beta"):
        shard_hash = json.loads((shards / site / "shard.json").read_text())["content_hash"]
        assert parent.data.params[f"shard_hash.{site}"] == shard_hash
    history = client.get_metric_history(summary["run_id"], "valid/pooled/auc_macro")
    assert [m.step for m in history] == [1, 2, 3]
    assert {"test/pooled/auc/Cardiomegaly", "test/pooled/pauc_fpr0.3_mcclish/Edema",
            "test/macro_over_sites/auc_macro", "bytes_sent_total"} <= set(parent.data.metrics)
    artifacts = {a.path for a in client.list_artifacts(summary["run_id"])}
    assert {"config.json", "roc_test_pooled.png", "qc"} <= artifacts
    assert {a.path for a in client.list_artifacts(summary["run_id"], "qc/alpha")} == {
        "qc/alpha/summary.json", "qc/alpha/summary.md", "qc/alpha/samples.png"}
    assert {a.path for a in client.list_artifacts(summary["run_id"], "qc/beta")} == {
        "qc/beta/summary.json", "qc/beta/summary.md"}
    shared = mlflow.artifacts.load_dict(f"{parent.info.artifact_uri}/qc/beta/summary.json")
    assert shared == json.loads((shards / "beta" / "qc" / "central.json").read_text())
    children = client.search_runs([parent.info.experiment_id],
                                  filter_string=f"tags.mlflow.parentRunId = '{summary['run_id']}'")
    assert sorted(c.data.tags["site"] for c in children) == ["alpha", "beta"]
    for child in children:
        assert "test/auc_macro" in child.data.metrics and "bytes_sent" in child.data.metrics
        # No per-site ROC at the centre: the sites send summed histograms, not their own.
        assert {a.path for a in client.list_artifacts(child.info.run_id)} == {"qc"}

    champion = client.get_model_version_by_alias("fedauc-chest-xray", "champion")
    assert str(champion.version) == "1"
    (result,) = flows.evaluate(str(federation / "federation.yaml"), str(shards))
    assert result["model_version"] == "1" and result["champion"]
    evaluated = result["metrics"]
    assert {"valid/pooled/auc_macro", "test/site/alpha/auc_macro", "test/pooled/auc_ci95_low_macro"} <= set(evaluated)
    # Training evaluates at the sites and pools score histograms: within the reported bound of the exact value.
    bound = max(v for k, v in parent.data.metrics.items() if k.startswith("test/pooled/auc_bound/") and not np.isnan(v))
    for key in ("test/pooled/auc_macro", "test/pooled/auc/Cardiomegaly"):
        logged, reproduced = parent.data.metrics[key], evaluated[key]
        assert (np.isnan(logged) and np.isnan(reproduced)) or abs(logged - reproduced) <= bound + 1e-6, key
    evaluation = client.search_runs([parent.info.experiment_id], filter_string="tags.fedauc_role = 'evaluation'")[0]
    undefined = mlflow.artifacts.load_dict(f"{evaluation.info.artifact_uri}/undefined_metrics.json")
    assert set(undefined) == {key for key, value in evaluated.items() if np.isnan(value)}
    assert all(undefined.values())
    suppressed = mlflow.artifacts.load_dict(f"{evaluation.info.artifact_uri}/suppressed_metrics.json")
    # Per-site cells and the model card's subgroup cells (federated/subgroups.py) below the threshold.
    assert all((key.split("/")[:2] in (["valid", "site"], ["test", "site"]) or key.split("/")[1] == "subgroup")
               and key not in evaluated for key in suppressed)
    assert evaluation.data.params["shard_hash.alpha"] == parent.data.params["shard_hash.alpha"]

    table = compare.compare_runs("chest-xray")
    assert list(table["run"]) == ["codasca-tiny"] and table.loc[0, "I"] == 2
    assert table.loc[0, "MB sent"] > 0

    # Same shards, same config: the training task is cached, no second MLflow run.
    assert flows.train_federated(str(federation / "federation.yaml"), str(shards), config, "codasca-tiny") == summary
    assert len(compare.compare_runs("chest-xray")) == 1

    shared = {key: value for key, value in config.items() if key not in ("algorithm", "params")}
    swept = flows.compare(str(federation / "federation.yaml"), str(shards), {**shared, "rounds": 1}, ["fedavg"], [1, 2])
    assert [s["run_name"] for s in swept] == ["fedavg-I1", "fedavg-I2"]
    table = compare.compare_runs("chest-xray")
    assert sorted(table["run"]) == ["codasca-tiny", "fedavg-I1", "fedavg-I2"]
    assert sorted(table.loc[table["algorithm"] == "fedavg", "I"]) == [1, 2]


def test_training_without_shards_names_the_missing_site(federation, tmp_path):
    from common.errors import DataError
    from federated.sites import site_shard_dirs
    from preprocessing.federation import load_federation

    with pytest.raises(DataError, match=r"federation 'tiny': no shards at .*alpha(.|\n)*run `fedauc preprocess"):
        site_shard_dirs(load_federation(federation / "federation.yaml"), tmp_path)


def test_missing_shards_are_not_retried():
    """A missing shard stays missing: retrying it would only repeat the failure (and its traceback)."""
    from common.errors import DataError

    class Failed:
        def __init__(self, error):
            self.error = error

        def result(self, raise_on_failure):
            return self.error

    assert not flows._transient(None, None, Failed(DataError("no shards at x")))
    assert not flows._transient(None, None, Failed(FileNotFoundError("x")))
    assert flows._transient(None, None, Failed(ConnectionResetError("peer reset")))
