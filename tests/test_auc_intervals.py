"""95 % intervals of the pooled AUC from score histograms (models.metrics.histogram_auc_interval), their macro
mean (federated.evaluation.pooled_auc_intervals) and how tables show them (pipelines.tables.fold_intervals)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from scipy.stats import norm

from federated.evaluation import combine, site_summary
from models.metrics import histogram_auc, histogram_auc_interval, score_histograms
from pipelines.tables import fold_intervals

Z95 = 1.959963984540054


def test_interval_by_hand():
    # Positives 0.9, 0.6; negatives 0.7, 0.2, 0.1. Placements: V10 = (1, 2/3), V01 = (1/2, 1, 1); AUC = 5/6;
    # s2(V10) = 1/18, s2(V01) = 1/12; Var = (1/18) / 2 + (1/12) / 3 = 1/18.
    hp, hn = score_histograms([1, 1, 0, 0, 0], [0.9, 0.6, 0.7, 0.2, 0.1], 1000)
    interval = histogram_auc_interval(hp, hn)
    assert interval.half_width == pytest.approx(Z95 * math.sqrt(1 / 18))
    assert interval.low == pytest.approx(5 / 6 - Z95 * math.sqrt(1 / 18)) and interval.high == 1.0  # clipped


def _delong_from_scores(y: np.ndarray, s: np.ndarray) -> tuple[float, float]:
    """DeLong's AUC and variance from per-image scores, by the pairwise kernel psi(x, y) = 1, 1/2, 0."""
    pos, neg = s[y == 1], s[y == 0]
    psi = (pos[:, None] > neg[None, :]) + 0.5 * (pos[:, None] == neg[None, :])
    v10, v01 = psi.mean(axis=1), psi.mean(axis=0)
    return psi.mean(), v10.var(ddof=1) / pos.size + v01.var(ddof=1) / neg.size


@pytest.mark.parametrize("bins", [20, 1000])
def test_interval_matches_delong_on_the_binned_scores(bins):
    rng = np.random.default_rng(3)
    y = (rng.random(600) < 0.1).astype(float)
    s = 1 / (1 + np.exp(-(rng.normal(size=600) + 1.2 * y)))
    hp, hn = score_histograms(y, s, bins)
    # In a histogram a bin's entries are tied: DeLong on the bin indices, widened by the histogram bound.
    auc, variance = _delong_from_scores(y, np.minimum((s * bins).astype(int), bins - 1))
    bounded = histogram_auc(hp, hn)
    assert float(bounded.value) == pytest.approx(auc)
    interval = histogram_auc_interval(hp, hn)
    assert interval.half_width == pytest.approx(Z95 * math.sqrt(variance) + bounded.bound)
    assert interval.low == pytest.approx(auc - interval.half_width)


def test_interval_covers_the_true_auc_about_95_percent_of_the_time():
    # Binormal scores at the demo melanoma test's size (40 positives, 2000 negatives): the true AUC is
    # Phi(shift / sqrt(2)); a sigmoid keeps the order and maps the scores into [0, 1].
    rng = np.random.default_rng(0)
    shift, n_pos, n_neg, trials = 1.0, 40, 2000, 1000
    true_auc = norm.cdf(shift / math.sqrt(2))
    covered = 0
    for _ in range(trials):
        scores = np.r_[rng.normal(shift, 1, n_pos), rng.normal(0, 1, n_neg)]
        hp, hn = score_histograms(np.r_[np.ones(n_pos), np.zeros(n_neg)], 1 / (1 + np.exp(-scores)), 1000)
        interval = histogram_auc_interval(hp, hn)
        covered += interval.low <= true_auc <= interval.high
    assert 0.92 <= covered / trials <= 0.98


def test_undefined_intervals():
    assert all(math.isnan(v) for v in histogram_auc_interval([0, 0], [3, 1]))  # no positive
    assert all(math.isnan(v) for v in histogram_auc_interval([1, 0], [3, 1]))  # one positive: no variance
    with pytest.raises(ValueError, match="confidence"):
        histogram_auc_interval([1, 1], [1, 1], confidence=1.0)


def test_pooled_metrics_carry_the_intervals_and_a_conservative_macro_interval():
    rng = np.random.default_rng(1)
    labels = (rng.random((800, 2)) < [0.2, 0.4]).astype(float)
    scores = 1 / (1 + np.exp(-(rng.normal(size=(800, 2)) + labels * [1.5, 0.5])))
    reports, histograms = zip(*(site_summary(labels[i::2], scores[i::2], 1000, 10) for i in range(2)))
    metrics, _ = combine(np.stack(reports), np.sum(histograms, axis=0), [0, 1], ["a", "b"], 10)
    summed = np.sum(histograms, axis=0)
    for c, disease in enumerate(["a", "b"]):
        interval = histogram_auc_interval(*summed[c])
        assert metrics[f"pooled/auc_ci95_low/{disease}"] == interval.low
        assert metrics[f"pooled/auc_ci95_high/{disease}"] == interval.high
        assert interval.low < metrics[f"pooled/auc/{disease}"] < interval.high
    half = np.mean([histogram_auc_interval(*summed[c]).half_width for c in range(2)])
    assert metrics["pooled/auc_ci95_low_macro"] == pytest.approx(metrics["pooled/auc_macro"] - half)
    assert metrics["pooled/auc_ci95_high_macro"] == pytest.approx(metrics["pooled/auc_macro"] + half)


def test_fold_intervals_puts_the_bounds_in_the_cell():
    frame = pd.DataFrame({"run": ["a", "b"], "AUC macro": [0.81234, float("nan")], "MB": [1.0, 2.0],
                          "AUC macro low": [0.8, float("nan")], "AUC macro high": [0.83, float("nan")]})
    shown = fold_intervals(frame)
    assert list(shown.columns) == ["run", "AUC macro", "MB"]
    assert list(shown["AUC macro"]) == ["0.812 [0.800, 0.830]", "n/a"]
    assert list(frame.columns) == ["run", "AUC macro", "MB", "AUC macro low", "AUC macro high"]  # not modified
