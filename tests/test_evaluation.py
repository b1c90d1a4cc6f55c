"""Site-local evaluation (federated/evaluation.py) and the histogram metrics it pools with
(models/metrics/): each histogram metric within its stated bound of the exact value computed from the
scores in one process, the engine's per-site / pooled / macro keys, small-count suppression, and the
evaluation's bytes in the round's accounting."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import federated
from federated import SyntheticSite, TensorSite, TrainConfig
from federated.evaluation import METRICS, combine, site_summary
from federated.predict import predict_scores
from models.metrics import (
    evaluate_multilabel,
    histogram_auc,
    histogram_partial_auc,
    histogram_two_way_partial_auc,
    partial_roc_auc,
    roc_auc,
    score_histograms,
    two_way_partial_auc,
)


def _scores(n, seed, spread=1.0):
    rng = np.random.default_rng(seed)
    y = (rng.random(n) < 0.3).astype(float)
    s = 1 / (1 + np.exp(-(spread * rng.standard_normal(n) + 1.2 * y - 1)))
    return y, s


@pytest.mark.parametrize("bins", [7, 100, 1000])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_histogram_metrics_are_within_their_bound_of_the_exact_metrics(bins, seed):
    y, s = _scores(700 + 97 * seed, seed, spread=0.3 + seed)
    hp, hn = score_histograms(y, s, bins)
    assert hp.sum() == (y == 1).sum() and hn.sum() == (y == 0).sum()
    pairs = [(histogram_auc(hp, hn), roc_auc(y, s))]
    for beta in (0.3, 0.5):
        for standardized in (True, False):
            pairs.append((histogram_partial_auc(hp, hn, beta, standardized), partial_roc_auc(y, s, beta, standardized)))
    pairs.append((histogram_two_way_partial_auc(hp, hn, 0.5, 0.5), two_way_partial_auc(y, s, 0.5, 0.5)))
    for got, exact in pairs:
        assert 0 <= got.bound < 1
        assert abs(got.value - exact) <= got.bound + 1e-12
    # the AUC bound is half the fraction of positive-negative pairs in one bin
    same_bin = sum(((y == 1) & (np.minimum((s * bins).astype(int), bins - 1) == b)).sum()
                   * ((y == 0) & (np.minimum((s * bins).astype(int), bins - 1) == b)).sum() for b in range(bins))
    assert pairs[0][0].bound == pytest.approx(0.5 * same_bin / ((y == 1).sum() * (y == 0).sum()))


def test_histogram_metrics_are_exact_when_no_bin_holds_both_classes():
    y = np.array([1, 0, 1, 0, 0, 1, 0.0])
    s = np.array([0.05, 0.15, 0.25, 0.35, 0.45, 1.0, 0.85])
    hp, hn = score_histograms(y, s, 10)
    assert histogram_auc(hp, hn).value == pytest.approx(roc_auc(y, s)) and histogram_auc(hp, hn).bound == 0
    got = histogram_partial_auc(hp, hn, 0.5)
    assert got.value == pytest.approx(partial_roc_auc(y, s, 0.5)) and got.bound == 0
    got = histogram_two_way_partial_auc(hp, hn, 0.3, 0.7)
    assert got.value == pytest.approx(two_way_partial_auc(y, s, 0.3, 0.7)) and got.bound == 0


def test_histogram_inputs_are_validated():
    with pytest.raises(ValueError, match=r"y_score must lie in \[0, 1\]"):
        score_histograms([1, 0], [0.5, 1.5], 10)
    with pytest.raises(ValueError, match="bins must be a positive integer"):
        score_histograms([1, 0], [0.5, 0.5], 0)
    with pytest.raises(ValueError, match="same length"):
        score_histograms([1, 0, 1], [0.5, 0.5], 4)
    with pytest.raises(ValueError, match="1-D of one length"):
        histogram_auc([1, 2], [1, 2, 3])
    with pytest.raises(ValueError, match="non-negative counts"):
        histogram_auc([1, -2], [1, 2])
    undefined = histogram_auc([0, 0], [3, 1])
    assert np.isnan(undefined.value) and undefined.value.reason == "no positive among 4 labelled samples"


def _federation(n_test=(60, 80, 50), **kw):
    sites = [SyntheticSite(n_train=64, n_valid=30, n_test=n, shape=(6,), num_classes=2, pos_rate=[0.3, 0.4],
                           shift=0.5 * k, task_seed=9) for k, n in enumerate(n_test)]
    base = dict(algorithm="fedavg", sites=sites, network="linear", rounds=2, local_steps=2, batch_size=16, lr=0.5,
                progress=False, loader_workers=0)
    base.update(kw)
    return TrainConfig(**base)


def _exact(result, cfg, split="test"):
    """Exact per-site and pooled metrics of the final global model, computed in one process."""
    model = result.model().eval()
    labels, scores = [], []
    for k, spec in enumerate(cfg.sites):
        part = spec.load(k).splits[split]
        labels.append(part.labels)
        scores.append(predict_scores(model, part.images, torch.device("cpu")))
    diseases = ["class0", "class1"]
    per_site = [evaluate_multilabel(y, s, diseases, (0.3, 0.5), two_way=((0.5, 0.5),)) for y, s in zip(labels, scores)]
    pooled = evaluate_multilabel(np.concatenate(labels), np.concatenate(scores), diseases, (0.3, 0.5),
                                 two_way=((0.5, 0.5),))
    return per_site, pooled, labels


def test_site_local_evaluation_matches_the_exact_metrics():
    cfg = _federation(eval_bins=100_000)
    result = federated.train(cfg)
    metrics = result.history[-1]["metrics"]
    assert all(isinstance(v, float) for v in metrics.values())
    per_site, pooled, labels = _exact(result, cfg)
    for m in METRICS:
        for d, disease in enumerate(("class0", "class1")):
            key = f"{m}/{disease}"
            for k in range(3):
                assert metrics[f"test/site/{k}/{key}"] == pytest.approx(per_site[k][key], abs=1e-12)
                assert metrics[f"test/site/{k}/n_pos/{disease}"] == (labels[k][:, d] == 1).sum()
            assert abs(metrics[f"test/pooled/{key}"] - pooled[key]) <= metrics[f"test/pooled/{m}_bound/{disease}"] + 1e-12
            assert metrics[f"test/pooled/{m}_bound/{disease}"] < 1e-3
            assert metrics[f"test/macro_over_sites/{key}"] == pytest.approx(np.mean([p[key] for p in per_site]))
    assert "valid/pooled/auc_macro" in metrics  # valid splits of 30 rows: their site metrics are suppressed
    assert not any(k.startswith("test/") for k in result.history[-1]["suppressed"])
    default = federated.train(cfg.model_copy(update={"eval_bins": 1000})).history[-1]["metrics"]
    for d in ("class0", "class1"):  # the default bins: within 1e-3 of the exact pooled AUC here
        assert abs(default[f"test/pooled/auc/{d}"] - pooled[f"auc/{d}"]) < 1e-3


def test_small_counts_are_suppressed_but_still_pooled():
    rng = np.random.default_rng(3)
    x = [rng.standard_normal((40, 5)).astype(np.float32) for _ in range(2)]
    y0 = (rng.random((40, 2)) < 0.5).astype(np.float32)
    y1 = y0.copy()
    y1[:, 1] = 0.0
    y1[:4, 1] = 1.0  # site 1: 4 positives of class1 in its test split
    sites = [TensorSite(train=(x[0], y0), test=(x[0], y0)), TensorSite(train=(x[1], y1), test=(x[1], y1))]
    cfg = TrainConfig(algorithm="fedavg", sites=sites, network="linear", rounds=1, local_steps=1, batch_size=8,
                      progress=False, loader_workers=0, eval_bins=100_000)
    result = federated.train(cfg)
    metrics, suppressed = result.history[-1]["metrics"], result.history[-1]["suppressed"]
    assert suppressed["test/site/1/n_pos/class1"] == "<10"
    assert suppressed["test/site/1/auc/class1"] == "suppressed: fewer than 10 positives"
    assert set(suppressed) == {f"test/site/1/{m}/class1" for m in METRICS} | {"test/site/1/n_pos/class1"}
    assert not any(k in metrics for k in suppressed)
    assert metrics["test/site/1/n_neg/class1"] == 36.0 and "test/site/1/auc/class0" in metrics
    model = result.model().eval()
    s = np.concatenate([predict_scores(model, torch.from_numpy(xi), torch.device("cpu")) for xi in x])
    pooled = roc_auc(np.concatenate([y0, y1])[:, 1], s[:, 1])  # the suppressed site's rows included
    assert abs(metrics["test/pooled/auc/class1"] - pooled) <= metrics["test/pooled/auc_bound/class1"] + 1e-12
    assert metrics["test/macro_over_sites/auc/class1"] == metrics["test/site/0/auc/class1"]


def test_summary_leaves_nothing_below_min_count_and_has_a_fixed_size():
    y = np.array([[1, 0], [0, 0], [1, 1], [0, 0], [0, 0]], dtype=float)
    s = np.linspace(0.1, 0.9, 10).reshape(5, 2)
    report, hist = site_summary(y, s, bins=8, min_count=3)
    assert report.shape == (2, 3 + len(METRICS)) and hist.shape == (2, 2, 8)
    assert report[0, :3].tolist() == [-1.0, 3.0, 1.0] and np.isnan(report[0, 3:]).all()  # 2 positives < 3
    metrics, suppressed = combine(report[None], hist, [4], ["a", "b"], 3)
    assert suppressed["site/4/n_pos/a"] == "<3" and metrics["site/4/n_neg/a"] == 3.0
    bigger, hist2 = site_summary(np.tile(y, (20, 1)), np.tile(s, (20, 1)), bins=8, min_count=3)
    assert bigger.shape == report.shape and hist2.shape == hist.shape


def test_evaluation_traffic_is_counted():
    # The evaluation's bytes alone: the last round's out-of-distribution sums (tests/test_ood.py) are left out.
    cfg = _federation(rounds=3, eval_every=2, eval_bins=50, ood_false_refusal=0)
    history = federated.train(cfg).history
    C, M, B = 2, len(METRICS), 50
    report, hist = 8 * C * (3 + M), 8 * C * 2 * B
    plain = history[0]["bytes_sent"]
    for r in (1, 2):  # evaluated after round 2 (eval_every) and after the last round
        assert [s - p for s, p in zip(history[r]["bytes_sent"], plain)] == [2 * (report + hist)] * 3
        assert [s - p for s, p in zip(history[r]["bytes_received"], history[0]["bytes_received"])] == \
            [2 * (2 * report + hist)] * 3
