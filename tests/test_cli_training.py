"""The training-side commands fail with a message and an exit code, not a traceback."""

import pytest
from typer.testing import CliRunner

from pipelines.cli import app

runner = CliRunner()


@pytest.fixture()
def empty_store(tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlruns.db'}")


def test_compare_names_a_missing_experiment(empty_store, tmp_path):
    result = runner.invoke(app, ["compare", "--experiment", "chest-xray"])
    assert result.exit_code == 1
    assert f"no MLflow experiment named 'chest-xray' at sqlite:///{tmp_path / 'mlruns.db'}" in result.output


def test_train_rejects_a_parameter_without_value():
    result = runner.invoke(app, ["train", "--federation", "sites/demo/chest.yaml", "--algorithm", "codasca",
                                 "-p", "T0"])
    assert result.exit_code == 2
    assert "--param 'T0': expected NAME=VALUE" in result.output
