"""Privacy budgets over NVIDIA FLARE's simulator: the site process refuses a job over its budget and the centre
hears one line; a DP training with secure aggregation gives the in-process model when the sites fix their own
noise seeds, and each site's ledger is charged the same."""

from __future__ import annotations

import pytest
import torch

import federated
from federated.dp.site import NOISE_SEED_ENV
from federated.flare.centre.job import train_flare
from federated.privacy.ledger import Ledger
from federated.sites import federation_config
from preprocessing.federation import Federation

pytestmark = pytest.mark.slow


def _config(federation, shards, **extra):
    settings = dict(algorithm="codasca", params={"T0": 4}, network="small_resnet_gn",
                    network_kwargs={"widths": [4, 8]}, rounds=2, local_steps=2, batch_size=16, lr=0.5, eval_every=0,
                    progress=False, loader_workers=0, timeout_s=60, device="cpu",
                    dp={"noise_multiplier": 1.0, "max_grad_norm": 1.0}, **extra)
    return federation_config(federation, shards, settings)


def test_a_site_over_its_budget_refuses_over_the_simulator(tmp_path, budgets):
    federation, shards, paths = budgets([50.0, 0.05, 50.0])
    with pytest.raises(Exception) as err:
        train_flare(_config(federation, shards), federation, shards, "sim", tmp_path / "sim", name="test-dp-refused")
    line = str(err.value).splitlines()[0]
    assert "site 'barcelona' refuses the job: it would spend epsilon " in line
    assert "over the site's budget of 0.05 (remaining 0.05)" in line
    assert "<path at the site>" not in line
    assert Ledger.load(paths[1]).entries == []


def test_a_dp_flare_run_with_secure_aggregation_equals_the_in_process_one(tmp_path, budgets, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # the site processes compute like this one-thread process
    monkeypatch.setenv(NOISE_SEED_ENV, "7")  # each site's own seed, in its own process's environment
    federation, shards, paths = budgets([50.0, 50.0, 50.0])
    cfg = _config(federation, shards, secure_aggregation=True)
    flare = train_flare(cfg, federation, shards, "sim", tmp_path / "sim", name="test-dp")
    local = federated.train(cfg)
    worst = max((flare.global_state[k].float() - v.float()).abs().max().item() for k, v in local.global_state.items())
    assert worst <= 1e-5
    by_site = {r["site"]: r["privacy"] for r in flare.site_reports}
    for name, spent in local.privacy.items():
        assert by_site[name]["epsilon_job"] == pytest.approx(spent["epsilon_job"])
        assert by_site[name]["epsilon_remaining"] > spent["epsilon_remaining"]  # the second run spent more
    for path in paths:  # both trainings charged at every site
        assert len(Ledger.load(path).entries) == 2
    # The noise is the site's own: another seed there gives another model.
    monkeypatch.setenv(NOISE_SEED_ENV, "8")
    other = federated.train(cfg)
    assert any(not torch.equal(other.global_state[k], v) for k, v in local.global_state.items())


def test_the_centre_records_each_sites_spent_and_remaining_epsilon(budgets, tmp_path, monkeypatch):
    """A tracked DP training over the simulator at budgeted sites: each site's epsilons on its MLflow run, and the
    model registered without an exact evaluation at the sites (which they would refuse) while the champion,
    unscored there, keeps the alias."""
    import mlflow
    from mlflow.tracking import MlflowClient

    from federated.launch import Flare
    from pipelines import runs
    from pipelines.registry import CHAMPION_ALIAS

    mlflow.set_tracking_uri(None)  # first: where an earlier test set one, this unsets MLFLOW_TRACKING_URI too
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlruns.db'}")
    federation, shards, paths = budgets([50.0, 40.0, 30.0])
    settings = _config(federation, shards).model_dump(mode="json", exclude={"sites"})
    for path in paths:  # the champion was trained before the sites set budgets, on two of them: unscored on three
        path.unlink()
    two = Federation(federation.path, federation.spec, federation.sites[:2])
    champion = runs.train_tracked(two, shards, {**settings, "dp": None, "eval_every": 2}, run_name="champion")
    assert champion.promoted
    budgets([50.0, 40.0, 30.0])
    run = runs.train_tracked(federation, shards, settings, run_name="dp-recorded",
                             launcher=Flare(env="sim", workspace=tmp_path / "sim"))
    client = MlflowClient()
    assert not run.promoted and run.model_version != champion.model_version
    name = f"fedauc-{federation.task}"
    assert str(client.get_model_version_by_alias(name, CHAMPION_ALIAS).version) == champion.model_version
    tags = client.get_run(run.run_id).data.tags
    assert "release no exact evaluation" in tags["champion_check.skipped"]
    children = client.search_runs([client.get_run(run.run_id).info.experiment_id],
                                  f"tags.mlflow.parentRunId = '{run.run_id}'")
    by_site = {r.data.tags["site"]: r.data.metrics for r in children}
    for name, budget in zip(["vienna", "barcelona", "new-york"], [50.0, 40.0, 30.0]):
        metrics = by_site[name]
        assert 0 < metrics["privacy/epsilon_spent"] == pytest.approx(metrics["privacy/epsilon_job"])
        assert metrics["privacy/epsilon_remaining"] == pytest.approx(budget - metrics["privacy/epsilon_spent"])
        assert metrics["privacy/delta"] == pytest.approx(1e-5)
        assert "train_loss" not in metrics  # withheld by the sites, not logged as NaN
        assert "compute_seconds" not in metrics and "wait_seconds" not in metrics  # likewise: the batches' sizes


def test_resumes_over_the_simulator_charge_every_round_that_leaves_the_sites_again(tmp_path, budgets):
    """Each site process charges a resumed training for every round after its last committed checkpoint: a round
    sent but not committed (the centre aborted after the exchange) and, with no checkpoint left, every round. The
    ledger then composes every release that left the site."""
    import shutil

    from federated.checkpoint import point_latest
    from federated.privacy.ledger import Entry, epsilon

    federation, shards, paths = budgets([50.0, 50.0, 50.0])
    ckpt = tmp_path / "ckpt"
    cfg = _config(federation, shards, checkpoint_dir=str(ckpt))
    train_flare(cfg, federation, shards, "sim", tmp_path / "sim1", name="test-dp-resume")
    for site in ("vienna", "barcelona", "new-york"):  # round 1 left every site, its checkpoint never committed
        (ckpt / site / "round_000001" / "meta.json").unlink()
        point_latest(ckpt / site, 0)
    resumed = cfg.model_copy(update={"resume": True})
    train_flare(resumed, federation, shards, "sim", tmp_path / "sim2", name="test-dp-resume")
    shutil.rmtree(ckpt)  # no checkpoint at all: the resume trains from round 0
    train_flare(resumed, federation, shards, "sim", tmp_path / "sim3", name="test-dp-resume")
    for path in paths:
        ledger = Ledger.load(path)
        assert [e.steps for e in ledger.entries] == [4, 2, 4]  # rounds x local steps that left, per run
        q = ledger.entries[0].sample_rate
        assert ledger.spent(1e-5) == pytest.approx(epsilon([Entry("", "training", 1.0, q, 10)], 1e-5), rel=1e-9)


def _evaluate_meanwhile(shards, stop, done):
    """Evaluation jobs at every site, one after another, each holding its admission a moment before it releases."""
    import time

    from federated.dp.evaluation import admit_evaluation

    count = 0
    while not stop.is_set():
        releases = [admit_evaluation(site, shards / site, ["v1"], 50.0) for site in ("vienna", "barcelona", "new-york")]
        time.sleep(0.2)
        for release in releases:
            release.release([])
        count += 1
    done.put(count)


def test_a_flare_training_and_evaluations_at_once_keep_every_charge(tmp_path, budgets):
    """The site processes of a simulator training charge their ledgers while another process admits and releases
    evaluation jobs at the same sites: every ledger holds the training and every evaluation."""
    import multiprocessing

    federation, shards, paths = budgets([50.0, 50.0, 50.0])
    context = multiprocessing.get_context("fork")
    stop, done = context.Event(), context.Queue()
    evaluations = context.Process(target=_evaluate_meanwhile, args=(shards, stop, done))
    evaluations.start()
    try:
        train_flare(_config(federation, shards), federation, shards, "sim", tmp_path / "sim", name="test-dp-at-once")
    finally:
        stop.set()
        count = done.get(timeout=120)
        evaluations.join(60)
    assert count >= 1
    for path in paths:
        whats = [e.what for e in Ledger.load(path).entries]
        assert whats.count("training") == 1 and whats.count("evaluation") == count
