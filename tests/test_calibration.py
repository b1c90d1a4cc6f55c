"""Calibrated probabilities from pooled histograms (pipelines/model_package/calibration.py): the Platt map is
recovered from counts alone, the calibration error falls where the score was miscalibrated, and what cannot be
calibrated says why."""

from __future__ import annotations

import numpy as np
import pytest

from pipelines.model_package import calibration as cal

BINS = 1000


def _histograms(scores: np.ndarray, labels: np.ndarray) -> np.ndarray:
    index = np.minimum((scores * BINS).astype(int), BINS - 1)
    return np.stack([np.bincount(index[labels], minlength=BINS), np.bincount(index[~labels], minlength=BINS)]).astype(float)


def _miscalibrated(n: int, slope: float, intercept: float, seed: int) -> np.ndarray:
    """Scores whose true rate of disease is platt(score, slope, intercept): an AUC-trained score's usual shape."""
    rng = np.random.default_rng(seed)
    scores = rng.beta(0.6, 2.0, n)
    labels = rng.uniform(size=n) < cal.platt(scores, slope, intercept)
    return _histograms(scores, labels)


def test_the_platt_map_is_recovered_from_the_histograms_and_the_error_falls_out_of_sample():
    valid, test = _miscalibrated(40_000, 0.5, -1.5, 0), _miscalibrated(40_000, 0.5, -1.5, 1)
    fitted = cal.from_histograms(np.stack([valid]), ["A"], "pooled validation", np.stack([test]))
    a = fitted.diseases["A"]
    assert a.slope == pytest.approx(0.5, abs=0.05) and a.intercept == pytest.approx(-1.5, abs=0.1)
    # Out of sample, on the test histograms: well above 0.05 before, at most a few hundredths after.
    assert a.test_before.value > 0.05 and a.test_after.value < 0.02
    assert a.test_after.high < a.test_before.low  # the intervals do not overlap
    for ece in (a.valid_before, a.valid_after, a.test_before, a.test_after):
        assert ece.low <= ece.value <= ece.high
    # Strictly increasing: an operating point's threshold keeps its sensitivity and specificity through the map.
    raw = np.linspace(0.001, 0.999, 500)
    assert np.all(np.diff(fitted.apply("A", raw)) > 0)


def test_a_calibrated_score_is_left_alone():
    rng = np.random.default_rng(2)
    scores = rng.uniform(size=40_000)
    histograms = _histograms(scores, rng.uniform(size=scores.size) < scores)
    a = cal.from_histograms(np.stack([histograms]), ["A"], "v").diseases["A"]
    assert a.slope == pytest.approx(1.0, abs=0.05) and a.intercept == pytest.approx(0.0, abs=0.05)
    assert a.valid_before.value < 0.02


def test_what_cannot_be_calibrated_says_why_and_has_no_probability():
    good = _miscalibrated(5000, 0.5, -1.5, 3)
    no_positive = good.copy()
    no_positive[0] = 0
    reversed_ranking = good[:, ::-1].copy()  # positives at low scores
    fitted = cal.from_histograms(np.stack([good, no_positive, reversed_ranking]), ["A", "B", "C"], "v")
    assert set(fitted.diseases) == {"A"}
    assert fitted.undefined["B"] == "no labelled positive validation image"
    assert fitted.undefined["C"].startswith("the validation scores do not rank the positives above the negatives")
    assert np.isnan(fitted.apply("B", [0.3])).all() and not np.isnan(fitted.apply("A", [0.3])).any()


def test_noised_histograms_with_negative_counts_still_give_a_map():
    # A DP release adds Gaussian noise to every bin: negative counts count as empty.
    noised = _miscalibrated(20_000, 0.5, -1.5, 4) + np.random.default_rng(5).normal(0, 2.0, (2, BINS))
    a = cal.from_histograms(np.stack([noised]), ["A"], "v").diseases["A"]
    assert a.slope == pytest.approx(0.5, abs=0.1) and a.valid_after.value < a.valid_before.value
