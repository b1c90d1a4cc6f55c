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
    from common.errors import ConfigError
    from federated import SyntheticSite, TrainConfig
    from federated.flare.centre.job import train_flare
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


def _train_error(*options: str) -> str:
    """The one error line of a `fedauc train` that stops on its options, before any shard is read (none exist)."""
    result = runner.invoke(app, ["train", "--federation", "sites/demo/chest.yaml", "--algorithm", "codasca",
                                 "--shards", "no-shards-here", *options])
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output
    (line,) = [line for line in result.output.splitlines() if line.startswith("error: ")]
    assert result.output.count("error") == 1, result.output  # one message, not pydantic's and another
    return line


@pytest.mark.parametrize(("options", "expected"), [
    (["--dp"], "error: --dp: DP needs exactly one of noise_multiplier (--noise-multiplier) and target_epsilon"),
    (["--dp", "--noise-multiplier", "1", "--target-epsilon", "3"], "error: --dp: DP needs exactly one of"),
    (["--dp", "--noise-multiplier", "0"], "error: --noise-multiplier: Input should be greater than 0"),
    (["--dp", "--target-epsilon", "3", "--max-grad-norm", "-1"], "error: --max-grad-norm: Input should be greater"),
    (["--dp", "--target-epsilon", "3", "--eval-noise-multiplier", "0"], "error: --eval-noise-multiplier: Input"),
    (["--noise-multiplier", "1"], "error: --noise-multiplier: needs --dp"),
    (["--target-epsilon", "1", "--eval-noise-multiplier", "2"], "error: --target-epsilon, --eval-noise-multiplier: need --dp"),
])
def test_a_bad_dp_option_is_one_message_naming_it(options, expected):
    assert _train_error(*options).startswith(expected)


@pytest.mark.parametrize(("options", "expected"), [
    (["--rounds", "0"], "error: --rounds: Input should be greater than 0"),
    (["-I", "0"], "error: --local-steps: Input should be greater than 0"),
    (["--lr", "-0.1"], "error: --lr: Input should be greater than 0"),
    (["--eval-every", "-1"], "error: --eval-every: Input should be greater than or equal to 0"),
    (["--backend", "torchrun", "--site-timeout", "0"], "error: --site-timeout: Input should be greater than 0"),
    (["-p", "T0=soon"], "error: --param T0: Input should be a valid integer"),
    (["--secure-aggregation", "--aggregation", "median"], "error: --aggregation median needs every site's values"),
])
def test_a_bad_training_option_is_one_message_naming_it(options, expected):
    assert _train_error(*options).startswith(expected)


def test_a_flow_s_bad_setting_is_named_by_its_field_before_any_shard_is_read(tmp_path):
    """A flow or a deployment's config goes through the same check as the command line's options."""
    from common.errors import ConfigError
    from federated.sites import federation_config
    from preprocessing.federation import load_federation

    settings = {"algorithm": "codasca", "rounds": 1, "dp": {"noise_multiplier": 0}}
    with pytest.raises(ConfigError) as err:
        federation_config(load_federation("sites/demo/chest.yaml"), tmp_path / "no-shards", settings)
    assert str(err.value).splitlines()[0] == "training config: dp.noise_multiplier: Input should be greater than 0"


def test_help_shows_each_bound_the_settings_hold_an_option_to():
    result = runner.invoke(app, ["train", "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0
    lines = {line.split()[1]: line for line in result.output.splitlines() if line.startswith("│    --")}
    for option, shown in (("--rounds", "(> 0)"), ("--eval-every", "(>= 0)"), ("--max-grad-norm", "(> 0)")):
        assert shown in lines[option], lines[option]


def test_every_setting_is_an_option_and_a_setting_the_settings_gain_is_one_without_an_edit():
    """The options derive from TrainSettings' fields (pipelines/cli/train_options.py): one list, not two."""
    import typer
    from pydantic import Field

    from federated.settings import TrainSettings
    from pipelines.cli.train_options import NOT_OPTIONS, command_signature, option_names

    assert set(option_names()) >= set(TrainSettings.model_fields) - NOT_OPTIONS

    class Gained(TrainSettings):
        mixup_alpha: float = Field(default=0.0, ge=0)

    assert option_names(Gained)["mixup_alpha"] == "--mixup-alpha"
    given = {}

    def probe(**options):
        given.update(options)

    probe.__signature__ = command_signature(Gained)
    gained = typer.Typer()
    gained.command()(probe)
    result = runner.invoke(gained, ["--help"], env={"COLUMNS": "200"})
    (line,) = [line for line in result.output.splitlines() if "--mixup-alpha" in line]
    assert "(>= 0)" in line and "[default: 0.0]" in line
    result = runner.invoke(gained, ["--federation", "f.yaml", "--algorithm", "fedavg", "--mixup-alpha", "0.4"])
    assert result.exit_code == 0, result.output
    assert given["mixup_alpha"] == 0.4 and given["rounds"] == 20


@pytest.mark.parametrize(("options", "expected"), [
    (["--trim-fraction", "0.7"], "error: --trim-fraction: Input should be less than 0.5"),
    (["--warmup-rounds", "-1"], "error: --warmup-rounds: Input should be greater than or equal to 0"),
    (["--site-weighting", "weighted", "--outlier-factor", "1"], "error: --outlier-factor: Input should be greater"),
])
def test_an_option_derived_from_a_setting_is_named_in_its_one_error(options, expected):
    assert _train_error(*options).startswith(expected)
