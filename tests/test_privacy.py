"""Each hospital's privacy budget (federated/privacy/) and the differential privacy that spends it
(federated/dp/): the ledger composes as Opacus's accountant says, a site refuses a job over its budget or without
DP before any step, the ledger is owner-only, per-sample clipping and noise are what the accountant assumes, and
what DP does not cover is refused in one line."""

from __future__ import annotations

import math
import os
import stat

import numpy as np
import pytest
import torch
from opacus.accountants import RDPAccountant
from torch import nn

import federated
from federated.algorithms.fedavg import FedAvg
from federated.dp.refusals import dp_methods
from federated.dp.sgd import clip_per_sample, noised_sum, per_sample_gradients, private_gradients
from federated.privacy.budget import set_budget
from federated.privacy.ledger import Entry, Ledger, epsilon, ledger_path, state_dir
from federated.privacy.policy import PrivacyRefused, SiteBudget
from federated.registry import get_algorithm
from models.objectives import auc_margin_loss, auc_square_loss, masked_bce_with_logits

SITE = {"kind": "synthetic", "n_train": 200, "n_test": 100, "shape": [6], "pos_rate": 0.2, "signal": 2.0}
DP = {"noise_multiplier": 1.0, "max_grad_norm": 1.0}


def _config(tmp_path, dp=DP, algorithm="fedavg", budgets=(None, None), **extra):
    sites = []
    for k, budget in enumerate(budgets):
        ledger = tmp_path / f"site{k}.privacy-ledger.json"
        if budget is not None:
            Ledger(ledger, SiteBudget(**budget)).save()
        sites.append({**SITE, "ledger": str(ledger)})
    return {"algorithm": algorithm, "sites": sites, "network": "linear", "rounds": 3, "local_steps": 2,
            "batch_size": 20, "lr": 0.1, "progress": False, "loader_workers": 0, "dp": dp, **extra}


def test_the_ledger_composes_as_the_accountant_says(tmp_path):
    first, second = Entry("a", "training", 1.1, 0.01, 500), Entry("b", "training", 0.8, 0.02, 300)
    acc = RDPAccountant()
    for e in (first, second):
        for _ in range(e.steps):
            acc.step(noise_multiplier=e.noise_multiplier, sample_rate=e.sample_rate)
    expected = acc.get_epsilon(1e-5)
    ledger = Ledger(ledger_path(tmp_path / "site"), SiteBudget(epsilon=10, delta=1e-5), [first, second])
    ledger.save()
    assert Ledger.load(ledger.path).spent(1e-5) == pytest.approx(expected, rel=1e-9)
    # Composed by the accountant, not summed: two trainings together spend less than their epsilons added.
    assert expected < epsilon([first], 1e-5) + epsilon([second], 1e-5)
    assert epsilon([], 1e-5) == 0.0


def test_a_job_over_the_budget_is_refused_at_the_site_before_any_step(tmp_path, monkeypatch):
    def no_step(self, site, batch):
        raise AssertionError("a refused job took a step")

    monkeypatch.setattr(FedAvg, "local_step", no_step)
    cfg = _config(tmp_path, budgets=(None, {"epsilon": 0.5, "delta": 1e-5}))
    before = (tmp_path / "site1.privacy-ledger.json").read_text()
    with pytest.raises(PrivacyRefused) as err:
        federated.train(cfg)
    line = str(err.value)
    assert "\n" not in line
    assert line.startswith("site 'synthetic1' refuses the job: it would spend epsilon ")
    assert "over the site's budget of 0.5 (remaining 0.5)" in line
    assert "6 steps at sampling rate 0.1, noise multiplier 1" in line
    # Nothing is charged anywhere when one site of the process refuses.
    assert (tmp_path / "site1.privacy-ledger.json").read_text() == before
    assert not (tmp_path / "site0.privacy-ledger.json").exists()


def test_a_job_without_dp_is_refused_by_a_site_with_a_budget(tmp_path):
    cfg = _config(tmp_path, dp=None, budgets=({"epsilon": 3, "delta": 1e-5}, None))
    with pytest.raises(PrivacyRefused, match=r"^site 'synthetic0' refuses the job: it has a privacy budget \(epsilon "
                                             r"3, delta 1e-05\) and the job trains without DP"):
        federated.train(cfg)


def test_a_dp_job_is_charged_once_and_remaining_epsilon_shrinks(tmp_path):
    budget = {"epsilon": 8, "delta": 1e-5}
    cfg = _config(tmp_path, budgets=(budget, budget))
    federated.train(cfg)
    ledger = Ledger.load(tmp_path / "site0.privacy-ledger.json")
    assert [(e.noise_multiplier, e.sample_rate, e.steps) for e in ledger.entries] == [(1.0, 0.1, 6)]
    once = ledger.spent(1e-5)
    federated.train(cfg)  # a second training is charged again, composed with the first
    twice = Ledger.load(tmp_path / "site0.privacy-ledger.json").spent(1e-5)
    assert once < twice < 2 * once


def test_the_ledger_is_owner_only_and_a_readable_one_is_refused(tmp_path):
    shard_dir = tmp_path / "shards" / "vienna"
    shard_dir.mkdir(parents=True)
    old = os.umask(0)
    try:
        path, _ = set_budget("vienna", shard_dir, SiteBudget(epsilon=3, delta=1e-6))
    finally:
        os.umask(old)
    assert path == state_dir() / "vienna.privacy-ledger.json"  # the site's, not the shard folder's
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert Ledger.load(path).budget == SiteBudget(epsilon=3, delta=1e-6)
    path.chmod(0o644)
    with pytest.raises(PrivacyRefused, match="mode 644; it must be owner-only"):
        Ledger.load(path)


def test_clipped_per_sample_gradients_never_exceed_C():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 4), nn.Tanh(), nn.Linear(4, 2))
    x = torch.randn(16, 6) * torch.logspace(-3, 2, 16)[:, None]  # tiny to huge gradients
    y, mask = (torch.rand(16, 2) < 0.5).float(), torch.ones(16, 2)
    _, grads = per_sample_gradients(model, x, y, mask, _bce, [])
    clipped, norms = clip_per_sample(grads, 0.5)
    after = torch.stack([g.reshape(16, -1).square().sum(1) for g in clipped]).sum(0).sqrt()
    assert (norms > 0.5).any() and (norms < 0.5).any()
    assert (after <= 0.5 + 1e-6).all()
    small = norms < 0.5
    assert torch.allclose(after[small], norms[small], rtol=1e-5)  # within the bound: untouched


def _bce(logits, y, mask, extras):  # FedAvg's per-record loss (the algorithm's own method)
    return FedAvg.sample_loss(FedAvg.__new__(FedAvg), None, logits, y, mask, extras)


def test_the_noise_std_is_noise_multiplier_times_C():
    gen = torch.Generator().manual_seed(1)
    zeros = [torch.zeros(4, 200_000)]
    noise = noised_sum(zeros, 1.3 * 0.7, gen)[0]
    assert noise.std().item() == pytest.approx(1.3 * 0.7, rel=0.01)
    assert abs(noise.mean().item()) < 0.01


def test_private_gradients_are_the_batch_gradients_without_clipping_or_noise():
    """With a bound no record reaches and negligible noise, DP-SGD's and DP-SGDA's gradients are the batch losses'
    autograd gradients: the per-record losses are the batch losses' terms."""
    torch.manual_seed(0)
    model = nn.Linear(6, 2)
    x, y = torch.randn(12, 6), torch.tensor([[1.0, 0.0], [0.0, 1.0]] * 6)
    mask = torch.ones(12, 2)
    gen = torch.Generator().manual_seed(0)
    _, private = private_gradients(model, x, y, mask, _bce, [], 1e6, 1e-12, 12, gen)
    expected = torch.autograd.grad(masked_bce_with_logits(model(x), y, mask), list(model.parameters()))
    for p, e in zip(private, expected):
        torch.testing.assert_close(p, e, rtol=1e-5, atol=1e-6)
    from federated.algorithms.codaplus import CODAPlus

    algo = CODAPlus.__new__(CODAPlus)
    algo.p = CODAPlus.Params()
    site = type("S", (), {"prior": torch.tensor([0.3, 0.6])})()
    a, b, alpha = torch.tensor([0.6, 0.5]), torch.tensor([0.2, 0.3]), torch.tensor([0.1, 0.4])
    _, private = private_gradients(model, x, y, mask, lambda z, yy, m, ex: algo.sample_loss(site, z, yy, m, ex),
                                   [a, b, alpha], 1e6, 1e-12, 12, gen)
    leaves = [t.clone().requires_grad_() for t in (a, b, alpha)]
    loss = auc_margin_loss(torch.sigmoid(model(x)), y, *leaves, site.prior, mask=mask)
    expected = torch.autograd.grad(loss, [*model.parameters(), *leaves])
    for p, e in zip(private, expected):
        torch.testing.assert_close(p, e, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(("algorithm", "why"), [("fedxl1", "its loss pairs each record with other records' scores"),
                                                ("localpair", "gathers per-sample scores (score pools)"),
                                                ("coda", "per-class sums of the site's own scores")])
def test_pairwise_and_compositional_algorithms_are_refused_under_dp(tmp_path, algorithm, why):
    with pytest.raises(PrivacyRefused) as err:
        federated.train(_config(tmp_path, algorithm=algorithm))
    assert "\n" not in str(err.value) and why in str(err.value)
    assert str(err.value).startswith(f"algorithm {algorithm!r} is refused under DP: ")


def test_batchnorm_is_refused_under_dp_and_its_groupnorm_variant_trains(tmp_path):
    site = {"kind": "synthetic", "n_train": 24, "shape": [1, 8, 8], "pos_rate": 0.3, "signal": 3.0}
    cfg = {"algorithm": "codasca", "sites": [site, site], "network": "small_resnet",
           "network_kwargs": {"widths": [4, 8]}, "rounds": 1, "local_steps": 1, "batch_size": 8,
           "progress": False, "loader_workers": 0, "dp": DP}
    with pytest.raises(PrivacyRefused) as err:
        federated.train(cfg)
    assert "\n" not in str(err.value)
    assert str(err.value).startswith("network 'small_resnet' is refused under DP: its BatchNorm layers")
    assert "--network small_resnet_gn" in str(err.value)
    result = federated.train({**cfg, "network": "small_resnet_gn"})
    assert all(torch.isfinite(v).all() for v in result.global_state.values())


def test_with_dp_the_server_receives_no_per_site_loss_norm_or_time(tmp_path, monkeypatch):
    """The row each site sends in the round's per-site gather carries NaN for its losses, update norms and compute
    and wait seconds (each site checks its own loss and update; its time follows its secret Poisson batch sizes),
    and the record has no round seconds and names no slowest site; without DP the rows carry values (the check can
    fail)."""
    from federated import engine

    def rows_sent(cfg) -> torch.Tensor:
        rows = []

        def recording(*args):
            rows.append(engine_with_times(*args))
            return rows[-1]

        monkeypatch.setattr(engine, "with_times", recording)
        records = []
        federated.train(cfg, callbacks=[records.append])
        return torch.cat(rows).cpu(), records

    engine_with_times = engine.with_times
    sent, records = rows_sent(_config(tmp_path, algorithm="codasca"))
    assert len(sent) == 2 * 3 and sent[:, 3:].isnan().all()  # 2 sites x 3 rounds; losses, norms, then times
    for record in records:
        assert all(math.isnan(v) for v in record["site_losses"]) and math.isnan(record["train_loss"])
        assert "loss_reference" not in record and record["outliers"] == []
        assert all(math.isnan(v) for v in record["update_norm"]["model"])
        times = ("site_compute_s", "site_wait_s", "site_compute_cpu_s", "site_process_cpu_s")
        assert all(math.isnan(v) for key in times for v in record[key]) and math.isnan(record["seconds"])
        assert "slowest" not in record
        assert "metrics" not in record  # no evaluation is released without its own noise
    clear, records = rows_sent(_config(tmp_path / "clear", dp=None, algorithm="codasca"))
    assert clear[:, 3:].isfinite().all() and records[-1]["slowest"]["compute_s"] > 0


def test_a_dp_site_names_itself_when_its_update_is_not_finite(tmp_path, monkeypatch):
    from federated.health import TrainingDiverged

    real = FedAvg.before_communication

    def poisoned(self, site):  # the loss was fine; what the site would send is not
        real(self, site)
        if site.index == 1:
            with torch.no_grad():
                self.params(site)[0].fill_(float("nan"))

    monkeypatch.setattr(FedAvg, "before_communication", poisoned)
    with pytest.raises(TrainingDiverged, match=r"site\(s\) 'synthetic1', round 0: the update is not finite"):
        federated.train(_config(tmp_path))


def test_evaluation_histograms_are_released_with_counted_noise_and_no_per_site_metric(tmp_path):
    budget = {"epsilon": 50, "delta": 1e-5}
    dp = {**DP, "eval_noise_multiplier": 2.0}
    records = []
    federated.train(_config(tmp_path, dp=dp, budgets=(budget, None), eval_every=2), callbacks=[records.append])
    evaluated = [r for r in records if "metrics" in r]
    assert [r["round"] for r in evaluated] == [1, 2]
    for record in evaluated:
        assert 0.0 <= record["metrics"]["test/pooled/auc_macro"] <= 1.0
        assert not [k for k in record["metrics"] if "/site/" in k]
    entries = Ledger.load(tmp_path / "site0.privacy-ledger.json").entries
    assert [(e.what, e.noise_multiplier, e.sample_rate, e.steps) for e in entries] == [
        ("training", 1.0, 0.1, 6), ("evaluation", 2.0, 1.0, 2)]
    # The noise: N(0, (2 sqrt(C))^2) on every bin, floored at 0 (half of the bins stay 0, the rest half-normal).
    from federated.dp.site import SitePrivacy

    release = SitePrivacy("s", 1.0, 1.0, 0.1, 1.0, 0, {}, 2.0, torch.Generator().manual_seed(0))
    report, hist = release.release_summary(np.zeros((4, 6)), np.zeros((4, 2, 20_000)))
    assert np.isnan(report).all()
    positive = hist[hist > 0]
    assert len(positive) / hist.size == pytest.approx(0.5, abs=0.01)
    assert positive.mean() == pytest.approx(2.0 * 2 * math.sqrt(2 / math.pi), rel=0.02)


def test_a_resume_of_a_finished_training_runs_and_charges_no_round(tmp_path):
    budget = {"epsilon": 8, "delta": 1e-5}
    cfg = _config(tmp_path, budgets=(budget, budget), checkpoint_dir=str(tmp_path / "ckpt"))
    first = federated.train(cfg)
    result = federated.train({**cfg, "resume": True})
    assert len(Ledger.load(tmp_path / "site0.privacy-ledger.json").entries) == 1
    assert result.privacy["synthetic0"]["epsilon_job"] == 0.0
    assert result.privacy["synthetic0"]["epsilon_spent"] == pytest.approx(first.privacy["synthetic0"]["epsilon_spent"])


def test_the_site_yaml_declares_its_budget():
    from preprocessing.sites import SiteConfig

    site = {"name": "vienna", "format": "siim-isic-2020", "root": "/data/isic", "task": "melanoma"}
    assert SiteConfig.model_validate(site).privacy is None
    assert SiteConfig.model_validate({**site, "privacy": {"epsilon": 3, "delta": 1e-5}}).privacy.epsilon == 3
    with pytest.raises(ValueError, match=r"privacy\.epsilon"):
        SiteConfig.model_validate({**site, "privacy": {"epsilon": 0, "delta": 1e-5}})


@pytest.mark.parametrize("algorithm", sorted(dp_methods()))
def test_every_dp_algorithm_trains_and_is_charged_each_step_it_takes(tmp_path, algorithm):
    budget = {"epsilon": 20, "delta": 1e-5}
    result = federated.train(_config(tmp_path, algorithm=algorithm, budgets=(budget, None)))
    assert all(torch.isfinite(v).all() for v in result.global_state.values())
    (entry,) = Ledger.load(tmp_path / "site0.privacy-ledger.json").entries
    assert entry.steps == 3 * 2 + get_algorithm(algorithm).dp_extra_steps
    assert result.privacy["synthetic1"]["epsilon_remaining"] is None  # no budget there, still reported


def test_localsgdam_per_record_loss_is_the_auc_square_loss_term():
    from federated.algorithms.localsgdam import LocalSGDAM

    torch.manual_seed(0)
    model = nn.Linear(6, 2)
    x, y, mask = torch.randn(12, 6), torch.tensor([[1.0, 0.0], [0.0, 1.0]] * 6), torch.ones(12, 2)
    site = type("S", (), {"prior": torch.tensor([0.3, 0.6])})()
    algo = LocalSGDAM.__new__(LocalSGDAM)
    a, b, alpha = torch.tensor([0.6, 0.5]), torch.tensor([0.2, 0.3]), torch.tensor([0.1, 0.4])
    _, private = private_gradients(model, x, y, mask, lambda z, yy, m, ex: algo.sample_loss(site, z, yy, m, ex),
                                   [a, b, alpha], 1e6, 1e-12, 12, torch.Generator().manual_seed(0))
    leaves = [t.clone().requires_grad_() for t in (a, b, alpha)]
    loss = auc_square_loss(torch.sigmoid(model(x)), y, *leaves, site.prior, mask=mask)
    for p, e in zip(private, torch.autograd.grad(loss, [*model.parameters(), *leaves])):
        torch.testing.assert_close(p, e, rtol=1e-5, atol=1e-6)


def test_an_evaluation_jobs_noise_is_fresh_even_under_an_audits_fixed_seed(tmp_path, monkeypatch):
    """A fixed FEDAUC_DP_NOISE_SEED reproduces a training's noise; an evaluation job's would give two jobs'
    releases the same noise, whose difference is exact."""
    from federated.dp.evaluation import admit_evaluation
    from federated.dp.site import NOISE_SEED_ENV, site_seed

    monkeypatch.setenv(NOISE_SEED_ENV, "7")
    seeds = [admit_evaluation("north", tmp_path / "north", ["v1"], 1.0).generator.initial_seed() for _ in range(2)]
    assert seeds[0] != seeds[1]
    assert site_seed("north", "job") == site_seed("north", "job")  # the training's stays reproducible


def test_a_site_yaml_with_a_budget_and_a_shared_qc_grid_is_refused_in_one_line(tmp_path):
    """The grid is real training images with their labels, sent with every training: no budget counts it."""
    import yaml

    from preprocessing.sites import SiteConfigError, load_site

    (tmp_path / "a").mkdir()
    site = {"name": "a", "format": "nih-cxr14", "root": "a", "task": "chest-xray"}
    path = tmp_path / "a.yaml"
    path.write_text(yaml.safe_dump({**site, "sharing": {"qc_grid": True}, "privacy": {"epsilon": 3, "delta": 1e-5}}))
    with pytest.raises(SiteConfigError) as err:
        load_site(path)
    assert "\n" not in str(err.value)
    assert str(err.value).startswith(f"{path}: sharing.qc_grid: true sends real training images")
    for alone in ({"sharing": {"qc_grid": True}}, {"privacy": {"epsilon": 3, "delta": 1e-5}}):
        path.write_text(yaml.safe_dump({**site, **alone}))
        assert load_site(path).name == "a"

