"""`fedauc train --resume` on a tiny preprocessed federation, with real Prefect and MLflow: a training
stopped after round 2 and resumed to round 4 reaches the model of an uninterrupted 4-round training; the
checkpoints go beside the MLflow store, never into the folder the command runs in."""

import re

import pytest
import torch
import yaml
from mlflow import MlflowClient
from typer.testing import CliRunner

from pipelines.prefect_env import configure_prefect_env

configure_prefect_env()

from pipelines import flows  # noqa: E402
from pipelines.cli import app  # noqa: E402
from preprocessing.synth import generate_site  # noqa: E402

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A preprocessed two-site federation, an MLflow store beside it and a working folder to run fedauc in."""
    root = tmp_path_factory.mktemp("tiny")
    patch = pytest.MonkeyPatch()
    entries = []
    for name, fmt in (("alpha", "nih-cxr14"), ("beta", "padchest")):
        generate_site(fmt, root / "data" / name, n=60, seed=3, workers=0, progress=False)
        site = {"name": name, "format": fmt, "root": f"data/{name}", "task": "chest-xray", "image_size": 32,
                "min_image_size": 16, "split": {"seed": 0, "valid": 0.25, "test": 0.25, "use_official": False}}
        (root / f"{name}.yaml").write_text(yaml.safe_dump(site))
        entries.append({"config": f"{name}.yaml"})
    federation = root / "federation.yaml"
    federation.write_text(yaml.safe_dump({"name": "tiny", "task": "chest-xray", "sites": entries}))
    flows.preprocess_federation(str(federation), str(root / "shards"), workers=0)
    work = root / "work"  # where the user runs fedauc
    work.mkdir()
    patch.chdir(work)
    yield root
    patch.undo()


@pytest.fixture()
def store(tiny, monkeypatch):
    """The tiny federation's own MLflow store (conftest points every test at the session's first)."""
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tiny / 'mlruns.db'}")
    return tiny


def fedauc_train(root, algorithm, run_name, rounds, *extra):
    """`fedauc train` on the tiny federation; returns the run id."""
    result = CliRunner().invoke(app, ["train", "--federation", str(root / "federation.yaml"), "--shards",
                                      str(root / "shards"), "--algorithm", algorithm, "--rounds", str(rounds),
                                      "-I", "2", "--batch-size", "8", "--eval-every", "0", "--run-name", run_name,
                                      *extra])
    assert result.exit_code == 0, result.output
    assert '"run_name": "' + run_name + '"' in result.output
    return re.search(r'"run_id": "(\w+)"', result.output).group(1)


def test_train_resume_reaches_the_uninterrupted_model(store):
    tiny = store
    checkpoints = tiny / "checkpoints"  # beside tiny / mlruns.db

    def train(run_name, rounds, *extra):
        return fedauc_train(tiny, "fedxl2", run_name, rounds, *extra)

    train("stopped", 2)
    assert (checkpoints / "stopped" / "LATEST").read_text() == "round_000001"
    resumed = train("stopped", 4, "--resume")
    # the resumed training ran rounds 3 and 4 only (MLflow steps are 1-based rounds)
    assert [m.step for m in MlflowClient().get_metric_history(resumed, "train_loss")] == [3, 4]
    train("uninterrupted", 4)
    for site in (0, 1):
        got, want = (torch.load(checkpoints / run / "round_000003" / f"site_{site}.pt", weights_only=True)
                     for run in ("stopped", "uninterrupted"))
        for key, value in want["model"].items():
            assert torch.equal(value, got["model"][key]), key
    assert not list((tiny / "work").iterdir())


def test_centralized_pools_the_sites_in_process(store):
    """The research baseline from the command line: one model trained on both sites' data pooled here."""
    tiny = store
    run_id = fedauc_train(tiny, "centralized", "pooled", 2)
    run = MlflowClient().get_run(run_id)
    assert run.data.params["algorithm"] == "centralized" and run.data.params["sites"] == "alpha,beta"
    assert run.data.params["batch_size"] == "16"  # K x B: an iteration sees what a federated one sees
    assert "test/pooled/auc_macro" in run.data.metrics
    assert (tiny / "checkpoints" / "pooled" / "LATEST").read_text() == "round_000001"


def test_fedauc_train_validates_its_settings_once_and_the_flow_and_engine_trust_them(store, monkeypatch):
    """The command builds the settings, the flow and the engine take the object whole (scikit-learn's
    ``_fit_context(prefer_skip_nested_validation=True)``): one validation for one training, not one per layer."""
    from federated.settings import TrainSettings

    validations = []
    validate = TrainSettings.model_validate.__func__

    def counted(cls, value, *args, **kwargs):
        if cls is TrainSettings:
            validations.append(type(value).__name__)
        return validate(cls, value, *args, **kwargs)

    monkeypatch.setattr(TrainSettings, "model_validate", classmethod(counted))
    run_id = fedauc_train(store, "fedavg", "validated-once", 1, "--trim-fraction", "0.3")
    assert validations == ["dict"]
    params = MlflowClient().get_run(run_id).data.params
    assert params["trim_fraction"] == "0.3"  # an option no hand list names reaches the record
