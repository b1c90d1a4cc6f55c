"""Evaluation jobs at sites with a privacy budget (federated/dp/evaluation.py): with an evaluation noise
multiplier S_e each site releases noised histograms only and charges its ledger one Gaussian mechanism at rate 1
per model, the same over NVIDIA FLARE's simulator and in this process; over its budget, or without S_e, a site
refuses in one line before anything is released. A DP training with S_e checks the champion by such an
evaluation."""

from __future__ import annotations

import numpy as np
import pytest

from federated.evaluation import combine_sites
from federated.flare.centre.evaluate import evaluate_flare
from federated.flare.centre.job import FlareJobFailed
from federated.launch import InProcess
from federated.network import build_named
from federated.privacy.ledger import Entry, Ledger, epsilon
from federated.privacy.policy import PrivacyRefused
from federated.scoring import ModelToScore

pytestmark = pytest.mark.slow

S_E = 5.0
SHAPE = (3, 32, 32)


def _models():
    """Two registered-like linear models (their weights: each its own random init)."""
    specs = [ModelToScore(label=label, network="linear", input_shape=SHAPE, num_classes=1) for label in ("1", "2")]
    return specs, [build_named("linear", {}, SHAPE, 1).state_dict() for _ in specs]


def _cost(steps: int) -> float:
    """The accountant's epsilon, at the budgets' delta, of one noised evaluation of ``steps`` models."""
    return epsilon([Entry("job", "evaluation", S_E, 1.0, steps)], 1e-5)


def test_a_noised_evaluation_over_the_simulator_releases_noised_histograms_and_charges_the_ledger(tmp_path, budgets):
    federation, shards, paths = budgets([50.0, 40.0, None])
    specs, states = _models()
    per_site, hashes, privacy = evaluate_flare(specs, states, federation, shards, "sim", tmp_path / "sim", None,
                                               bins=32, min_count=10, eval_noise_multiplier=S_E, name="test-noised")
    assert sorted(hashes) == sorted(site.name for site in federation.sites)
    for summaries in per_site:
        assert len(summaries) == 2
        for summary in summaries:
            for report, histograms in summary.values():
                assert np.isnan(report).all()  # no per-site metric or count leaves
                assert (histograms >= 0).all() and (histograms != np.round(histograms)).any()  # noised counts
    pooled = combine_sites([s[0] for s in per_site], [site.name for site in federation.sites], ["Melanoma"], 10)
    assert 0.0 <= pooled.metrics["valid/pooled/auc_macro"] <= 1.0
    assert not [key for key in pooled.metrics if "/site/" in key]
    # Charged exactly the accountant's epsilon of one Gaussian mechanism at rate 1 per model.
    for path in paths[:2]:
        (entry,) = Ledger.load(path).entries
        assert (entry.what, entry.noise_multiplier, entry.sample_rate, entry.steps) == ("evaluation", S_E, 1.0, 2)
        assert Ledger.load(path).spent(1e-5) == pytest.approx(_cost(2), rel=1e-12)
    assert privacy["vienna"]["epsilon_job"] == pytest.approx(_cost(2))
    assert privacy["vienna"]["epsilon_remaining"] == pytest.approx(50.0 - _cost(2))
    # A site without a budget releases the same and reports its spend, with no budget to refuse against.
    assert privacy["new-york"]["epsilon_spent"] == pytest.approx(_cost(2))
    assert privacy["new-york"]["epsilon_remaining"] is None and not paths[2].exists()

    # In this process: the same charge.
    _, _, local = InProcess().score(specs, states, federation, shards, 32, 10, S_E)
    for path, name in zip(paths[:2], ("vienna", "barcelona")):
        first, second = Ledger.load(path).entries
        assert (second.what, second.noise_multiplier, second.sample_rate, second.steps) == ("evaluation", S_E, 1.0, 2)
        assert local[name]["epsilon_job"] == pytest.approx(privacy[name]["epsilon_job"], rel=1e-12)
        assert Ledger.load(path).spent(1e-5) == pytest.approx(epsilon([first, second], 1e-5), rel=1e-12)


@pytest.mark.parametrize(("noise", "epsilons", "expected"), [
    (S_E, [50.0, 0.05, 50.0], "site 'barcelona' refuses the job: it would spend epsilon "),
    (None, [50.0, 50.0, 50.0], "site 'vienna' refuses an evaluation: it has a privacy budget (epsilon 50, "),
])
def test_a_site_refuses_an_evaluation_over_its_budget_or_without_noise_over_the_simulator(
        tmp_path, budgets, noise, epsilons, expected):
    federation, shards, paths = budgets(epsilons)
    specs, states = _models()
    with pytest.raises(FlareJobFailed) as failed:
        evaluate_flare(specs, states, federation, shards, "sim", tmp_path / "sim", None, bins=32, min_count=10,
                       eval_noise_multiplier=noise, name="test-noised-refused")
    line = str(failed.value).splitlines()[0]
    assert expected in line and "Traceback" not in str(failed.value), line
    if noise is not None:
        assert "over the site's budget of 0.05 (remaining 0.05)" in line
        assert Ledger.load(paths[1]).entries == []


def test_in_process_every_site_admits_the_job_before_any_is_charged(budgets):
    federation, shards, paths = budgets([50.0, 50.0, 0.05])
    specs, states = _models()
    with pytest.raises(PrivacyRefused, match=r"^site 'new-york' refuses the job: .* budget of 0\.05"):
        InProcess().score(specs, states, federation, shards, 32, 10, S_E)
    with pytest.raises(PrivacyRefused, match=r"^site 'vienna' refuses an evaluation: it has a privacy budget"):
        InProcess().score(specs, states, federation, shards, 32, 10, None)
    assert all(Ledger.load(path).entries == [] for path in paths)


def test_a_dp_training_with_eval_noise_checks_the_champion_by_a_noised_evaluation(budgets, tmp_path, monkeypatch):
    import mlflow
    from mlflow.tracking import MlflowClient

    from pipelines import runs
    from preprocessing.federation import Federation

    mlflow.set_tracking_uri(None)  # first: where an earlier test set one, this unsets MLFLOW_TRACKING_URI too
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlruns.db'}")
    federation, shards, paths = budgets([None, None, None])
    settings = dict(algorithm="fedavg", network="linear", rounds=1, local_steps=2, batch_size=16, lr=0.5,
                    eval_every=0, progress=False, loader_workers=0, device="cpu")
    two = Federation(federation.path, federation.spec, federation.sites[:2])  # the champion: unscored on three
    champion = runs.train_tracked(two, shards, settings, run_name="champion")
    budgets([50.0, 40.0, 30.0])
    dp = {"noise_multiplier": 1.0, "max_grad_norm": 1.0, "eval_noise_multiplier": 2.0}
    run = runs.train_tracked(federation, shards, {**settings, "dp": dp}, run_name="dp-noised-check")
    client = MlflowClient()
    tags = client.get_run(run.run_id).data.tags
    assert tags["champion_check.eval_noise_multiplier"] == "2.0" and "champion_check.skipped" not in tags
    assert tags["champion_check.version"] == champion.model_version
    (check,) = client.search_runs([client.get_run(run.run_id).info.experiment_id], "tags.purpose = 'champion-check'")
    assert check.data.params["eval_noise_multiplier"] == "2.0"
    assert not [key for key in check.data.metrics if "/site/" in key]
    for path in paths:  # the training (with its one noised evaluation), then the champion's noised evaluation
        entries = Ledger.load(path).entries
        assert [(e.what, e.noise_multiplier, e.steps) for e in entries] == [
            ("training", 1.0, 2), ("evaluation", 2.0, 1), ("evaluation", 2.0, 1)]
        assert entries[-1].job == f"evaluation of model(s) {champion.model_version}"

    # `fedauc evaluate` carries S_e through the flow to the sites; without it a budgeted site refuses in one line.
    from typer.testing import CliRunner

    from pipelines.cli import app

    common = ["evaluate", "--federation", str(federation.path), "--shards", str(shards)]
    refused = CliRunner().invoke(app, common)
    assert refused.exit_code == 1 and "Traceback" not in refused.output
    assert "site 'vienna' refuses an evaluation: it has a privacy budget" in refused.output
    noised = CliRunner().invoke(app, [*common, "--eval-noise-multiplier", "2.0"])
    assert noised.exit_code == 0, noised.output
    assert "site/vienna" not in noised.output and "pooled" in noised.output
    for path in paths:
        assert len(Ledger.load(path).entries) == 4
