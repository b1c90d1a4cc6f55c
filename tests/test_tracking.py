import json
import os
import re
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import mlflow
import numpy as np
import pytest
import torch
from mlflow import MlflowClient
from sklearn.metrics import roc_auc_score

from federated import schema
from pipelines import compare, plots, registry, runs, tracking

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture()
def store(tmp_path, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    uri = tracking.configure(tmp_path)
    assert uri == f"sqlite:///{tmp_path / 'mlruns.db'}"
    yield tmp_path
    mlflow.set_tracking_uri(None)


def _trained_like_model(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8), torch.nn.Linear(8, 2))
    model.train()
    model(torch.randn(64, 4) * 3 + 1)  # moves BN running stats away from their init
    return model


def test_champion_moves_only_to_a_better_model(store):
    example = np.random.default_rng(0).normal(size=(2, 4)).astype(np.float32)
    experiment = tracking.experiment_id("chest-xray")
    assert (store / "mlartifacts" / "chest-xray").as_uri() == MlflowClient().get_experiment(experiment).artifact_location

    versions = []
    # An undefined validation AUC (no positive in a small validation split) makes the first model champion
    # only because there is none; any defined score then replaces it, and NaN never wins again.
    for seed, metric in [(0, float("nan")), (1, 0.71), (2, 0.69), (3, float("nan")), (4, 0.75)]:
        with mlflow.start_run(experiment_id=experiment):
            versions.append(registry.register_model(_trained_like_model(seed), "chest-xray", example, metric))
    assert versions == [("1", True), ("2", True), ("3", False), ("4", False), ("5", True)]
    champion = MlflowClient().get_model_version_by_alias("fedauc-chest-xray", "champion")
    assert str(champion.version) == "5"
    assert float(champion.tags[schema.SELECTION_METRIC_TAG]) == 0.75


def _python(script: str, *args: str, timeout: float = 300) -> subprocess.Popen:
    env = {**os.environ, "MLFLOW_TRACKING_URI": mlflow.get_tracking_uri(), "PYTHONPATH": str(ROOT)}
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(script), *args], env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


# Each racer promotes its own version of every race, all racers starting a race together.
RACER = """
    import json, sys, time
    from pathlib import Path
    from mlflow import MlflowClient
    from pipelines import registry, tracking
    tracking.configure()
    gate, racers, me, version, races = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4], int(sys.argv[5])
    won = []
    for race in range(races):
        (gate / f"{race}-{me}").touch()
        while len(list(gate.glob(f"{race}-*"))) < racers:
            time.sleep(0.001)
        won.append(registry.promote_best(MlflowClient(), f"race-{race}", version))
    print(json.dumps(won))
"""


def test_racing_promotions_have_one_winner(store, tmp_path):
    """Three trainings finish at once against a champion at 0.5: only the best (0.9, version 3) may win,
    whatever the interleaving of their reads and writes on the one SQLite store."""
    client, races = MlflowClient(), 4
    metrics = {"1": 0.5, "2": 0.6, "3": 0.9, "4": 0.7}
    for race in range(races):
        client.create_registered_model(f"race-{race}")
        for version, metric in metrics.items():
            assert client.create_model_version(f"race-{race}", source=(tmp_path / "model").as_uri()).version == int(version)
            client.set_model_version_tag(f"race-{race}", version, schema.SELECTION_METRIC_TAG, repr(metric))
        client.set_registered_model_alias(f"race-{race}", schema.CHAMPION_ALIAS, "1")
    gate = tmp_path / "gate"
    gate.mkdir()
    racers = {version: _python(RACER, str(gate), "3", f"racer{version}", version, str(races)) for version in "234"}
    won = {}
    for version, process in racers.items():
        out, err = process.communicate(timeout=300)
        assert process.returncode == 0, err[-3000:]
        won[version] = json.loads(out)
    assert won == {"2": [False] * races, "3": [True] * races, "4": [False] * races}
    for race in range(races):
        assert str(client.get_model_version_by_alias(f"race-{race}", schema.CHAMPION_ALIAS).version) == "3"


def test_runs_of_a_killed_training_are_closed_as_killed_on_the_next_start(store):
    experiment = tracking.experiment_id("chest-xray")
    killed = _python("""
        import os, signal, sys
        from pipelines import runs, tracking
        tracking.configure()
        with runs.training_runs(sys.argv[1], "killed", "tiny", ["alpha", "beta"]) as (parent, children):
            print(parent.info.run_id, *children, flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
    """, experiment)
    out, err = killed.communicate(timeout=300)
    assert killed.returncode == -signal.SIGKILL, err[-3000:]
    orphans = out.split()
    client = MlflowClient()

    def status(run_id):
        return client.get_run(run_id).info.status

    assert len(orphans) == 3 and {status(r) for r in orphans} == {"RUNNING"}
    owner = tracking.owner_tags()
    alive = client.create_run(experiment, tags=owner).info.run_id  # this process: still working
    elsewhere = client.create_run(experiment, tags={**owner, schema.OWNER_HOST_TAG: "another-host"}).info.run_id
    reused_pid = client.create_run(experiment, tags={**owner, schema.OWNER_STARTED_TAG: "1.0"}).info.run_id
    with runs.training_runs(experiment, "next", "tiny", ["alpha"]) as (parent, _):
        assert {status(r) for r in [*orphans, reused_pid]} == {"KILLED"}
        assert "ended without closing the run" in client.get_run(orphans[0]).data.tags[schema.END_REASON_TAG]
        assert status(alive) == status(elsewhere) == "RUNNING"
    assert status(parent.info.run_id) == "FINISHED"


def test_a_training_that_raises_ends_all_its_runs_failed(store):
    experiment = tracking.experiment_id("chest-xray")
    with (pytest.raises(RuntimeError, match="site crashed"),
          runs.training_runs(experiment, "crash", "tiny", ["alpha", "beta"]) as (parent, children)):
        raise RuntimeError("site crashed")
    client = MlflowClient()
    assert {client.get_run(r).info.status for r in [parent.info.run_id, *children]} == {"FAILED"}


def test_registered_model_reproduces_eval_mode_outputs(store):
    model = _trained_like_model(0)
    batch = np.random.default_rng(1).normal(size=(5, 4)).astype(np.float32)
    with mlflow.start_run(experiment_id=tracking.experiment_id("melanoma")):
        registry.register_model(model, "melanoma", batch[:2], 0.8)
    loaded = mlflow.pytorch.load_model("models:/fedauc-melanoma@champion")
    with torch.no_grad():
        expected = model.eval()(torch.from_numpy(batch))
        np.testing.assert_allclose(loaded(torch.from_numpy(batch)).numpy(), expected.numpy(), rtol=1e-5, atol=1e-6)


def test_register_rejects_single_row_example(store):
    with pytest.raises(ValueError, match="at least 2 rows"):
        registry.register_model(_trained_like_model(0), "melanoma", np.zeros((1, 4), np.float32), 0.5)


def test_roc_figure_from_histograms_matches_sklearn_within_its_bound_and_reports_undefined():
    from models.metrics import score_histograms

    rng = np.random.default_rng(0)
    y_true = rng.integers(0, 2, size=(200, 4)).astype(float)
    y_true[:, 2] = 0.0  # one class only: undefined AUC
    y_true[:, 3] = np.nan  # a disease this site never labels
    y_true[:10, 0] = np.nan  # missing labels are left out
    y_score = np.clip(y_true * 0.3 + rng.random((200, 4)) * 0.7, 0, 1)
    histograms = np.stack([np.stack(score_histograms(y_true[:, c], y_score[:, c], 1000)) for c in range(4)])
    fig = plots.roc_figure(histograms, ("A", "B", "C", "D"), "test")
    labels = [text.get_text() for text in fig.axes[0].get_legend().get_texts()]
    keep = ~np.isnan(y_true[:, 0])
    for label, exact in ((labels[0], roc_auc_score(y_true[keep, 0], y_score[keep, 0])),
                         (labels[1], roc_auc_score(y_true[:, 1], np.nan_to_num(y_score[:, 1])))):
        value, low, high, bound = (float(x) for x in re.fullmatch(
            r"\w: AUC ([\d.]+), 95 % CI \[([\d.]+), ([\d.]+)\]; binning error <= ([\d.e+-]+)", label).groups())
        assert low <= value <= high
        # The bound is shown to one significant digit (a true 1.49e-03 reads 1e-03); the AUC to 3 decimals.
        assert abs(value - exact) <= 1.5 * bound + 5e-4
    assert labels[2].startswith("C: undefined (") and labels[3].startswith("D: undefined (")
    curve = fig.axes[0].get_lines()[1]  # disease B: from (0, 0) to (1, 1), never decreasing
    fpr, tpr = curve.get_xdata(), curve.get_ydata()
    assert (fpr[0], tpr[0], fpr[-1], tpr[-1]) == (0, 0, 1, 1) and (np.diff(fpr) >= 0).all() and (np.diff(tpr) >= 0).all()


def test_compare_runs_unknown_experiment_names_it(store):
    with pytest.raises(ValueError, match="no MLflow experiment named 'nope'"):
        compare.compare_runs("nope")
