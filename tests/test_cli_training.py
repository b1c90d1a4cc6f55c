"""The training-side commands fail with a message and an exit code, not a traceback."""

from pathlib import Path

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


def test_centralized_is_refused_over_flare():
    """Pooling moves patient data: over NVIDIA FLARE the command refuses it before anything starts."""
    from federated import SyntheticSite, TrainConfig
    from federated.flare.centre.job import train_flare
    from preprocessing.errors import ConfigError
    from preprocessing.federation import load_federation

    result = runner.invoke(app, ["train", "--federation", "sites/demo/chest.yaml", "--algorithm", "centralized",
                                 "--backend", "flare"])
    assert result.exit_code == 1
    assert ("error: algorithm 'centralized' pools every site's data at one place, which moves patient data out of "
            "the hospitals: it does not run over NVIDIA FLARE\n") in result.output
    assert "Traceback" not in result.output
    config = TrainConfig(algorithm="centralized", rounds=1, sites=[SyntheticSite(n_train=8)] * 4)  # a flow that skips the CLI
    with pytest.raises(ConfigError, match="moves patient data"):
        train_flare(config, load_federation("sites/demo/chest.yaml"), None, "sim", Path("unused"))


def test_train_refuses_what_dp_does_not_cover_before_reading_shards():
    result = runner.invoke(app, ["train", "--federation", "sites/demo/chest.yaml", "--algorithm", "fedxl2", "--dp",
                                 "--noise-multiplier", "1.0"])
    assert result.exit_code == 1
    assert "error: algorithm 'fedxl2' is refused under DP: its loss pairs each record" in result.output
    assert "Traceback" not in result.output
    result = runner.invoke(app, ["train", "--federation", "sites/demo/chest.yaml", "--algorithm", "codasca", "--dp"])
    assert result.exit_code == 2
    assert "--dp needs one of --noise-multiplier and --target-epsilon" in result.output
