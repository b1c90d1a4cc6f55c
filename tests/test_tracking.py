import mlflow
import numpy as np
import pytest
import torch
from mlflow import MlflowClient
from sklearn.metrics import roc_auc_score

from pipelines import tracking


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
            versions.append(tracking.register_model(_trained_like_model(seed), "chest-xray", example, metric))
    assert versions == [("1", True), ("2", True), ("3", False), ("4", False), ("5", True)]
    champion = MlflowClient().get_model_version_by_alias("fedauc-chest-xray", "champion")
    assert str(champion.version) == "5"
    assert float(champion.tags[tracking.SELECTION_METRIC_TAG]) == 0.75


def test_registered_model_reproduces_eval_mode_outputs(store):
    model = _trained_like_model(0)
    batch = np.random.default_rng(1).normal(size=(5, 4)).astype(np.float32)
    with mlflow.start_run(experiment_id=tracking.experiment_id("melanoma")):
        tracking.register_model(model, "melanoma", batch[:2], 0.8)
    loaded = mlflow.pytorch.load_model("models:/fedauc-melanoma@champion")
    with torch.no_grad():
        expected = model.eval()(torch.from_numpy(batch))
        np.testing.assert_allclose(loaded(torch.from_numpy(batch)).numpy(), expected.numpy(), rtol=1e-5, atol=1e-6)


def test_register_rejects_single_row_example(store):
    with pytest.raises(ValueError, match="at least 2 rows"):
        tracking.register_model(_trained_like_model(0), "melanoma", np.zeros((1, 4), np.float32), 0.5)


def test_roc_figure_legend_matches_sklearn_and_reports_undefined():
    rng = np.random.default_rng(0)
    y_true = rng.integers(0, 2, size=(200, 4)).astype(float)
    y_true[:, 2] = 0.0  # one class only: undefined AUC
    y_true[:, 3] = np.nan  # a disease this site never labels
    y_true[:10, 0] = np.nan  # missing labels are left out
    y_score = y_true * 0.3 + rng.random((200, 4))
    fig = tracking.roc_figure(y_true, np.nan_to_num(y_score), ("A", "B", "C", "D"), "test")
    labels = [text.get_text() for text in fig.axes[0].get_legend().get_texts()]
    keep = ~np.isnan(y_true[:, 0])
    assert labels[0] == f"A: AUC {roc_auc_score(y_true[keep, 0], y_score[keep, 0]):.3f}"
    assert labels[1] == f"B: AUC {roc_auc_score(y_true[:, 1], y_score[:, 1]):.3f}"
    assert labels[2] == "C: undefined (one class)"
    assert labels[3] == "D: undefined (no labels)"


def test_roc_figure_runs_on_the_numpy_1_api(monkeypatch):
    """pyproject allows numpy 1.26, which has no np.trapezoid (numpy 2 renamed np.trapz to it)."""
    monkeypatch.delattr(np, "trapezoid", raising=False)
    y_true = np.array([[0.0], [1.0], [0.0], [1.0], [1.0]])
    y_score = np.array([[0.1], [0.8], [0.35], [0.3], [0.9]])
    fig = tracking.roc_figure(y_true, y_score, ("A",), "numpy 1")
    assert fig.axes[0].get_legend().get_texts()[0].get_text() == "A: AUC 0.833"


def test_compare_runs_unknown_experiment_names_it(store):
    with pytest.raises(ValueError, match="no MLflow experiment named 'nope'"):
        tracking.compare_runs("nope")
