"""Calibrated probabilities: a map from the network's score to the rate of disease, fitted on the pooled
validation histograms (C, 2, B: positives' and negatives' counts per score bin, already summed over sites), so
no image's score leaves a site.

The map is Platt scaling (Platt, "Probabilistic Outputs for Support Vector Machines and Comparisons to
Regularized Likelihood Methods", 1999): p = sigmoid(slope * logit(s) + intercept), fitted by weighted logistic
regression on the bin centres with the bins' counts as weights and Platt's smoothed targets (N+ + 1) / (N+ + 2)
and 1 / (N- + 2), which keep a federation with few positives from a map that promises 0 or 1. Compared in
docs/algorithms.md section 16: isotonic regression needs far more labelled images than a validation split of
rare findings holds (Niculescu-Mizil and Caruana, ICML 2005) and its steps tie distinct scores, so the ranking,
the AUC and the operating points would change; temperature scaling (Guo et al., ICML 2017) is the special case
intercept = 0, which cannot move an AUC-trained score's base rate. With slope > 0 the map is strictly
increasing: an operating point's threshold t is the calibrated threshold map(t), with the same sensitivity and
specificity.

The expected calibration error (Guo et al. 2017, ``RELIABILITY_BINS`` equal-width bins of the stated
probability) is stated before and after the map, with a 95 % percentile bootstrap interval (the histograms'
counts resampled as one multinomial draw of the same total). The ECE is biased upwards on few images (each
reliability bin's |observed - stated| gains from sampling noise), so on a small split the interval can lie
above the estimate: it says how far the error could be, not that the estimate is central.
"""

from __future__ import annotations

import numpy as np
from pydantic import BaseModel, ConfigDict

RELIABILITY_BINS = 10
BOOTSTRAP_DRAWS = 200
_EPS = 1e-6  # scores are clipped into [eps, 1 - eps] before the logit: a bin centre never reaches 0 or 1 anyway


class Ece(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    value: float
    low: float  # the 95 % bootstrap interval
    high: float


class DiseaseCalibration(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    slope: float
    intercept: float
    valid_before: Ece  # on the histograms the map was fitted on: "after" is in-sample
    valid_after: Ece
    test_before: Ece | None = None  # the pooled test split's, out of sample (None: no site holds one)
    test_after: Ece | None = None


class Calibration(BaseModel):
    """Per disease, its Platt map and calibration errors (or why it has none), and what they were read from."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    method: str = "platt scaling on the pooled validation histograms (Platt 1999)"
    source: str
    diseases: dict[str, DiseaseCalibration]
    undefined: dict[str, str] = {}

    def apply(self, disease: str, scores) -> np.ndarray:
        """The calibrated probabilities of ``scores`` for ``disease``; NaN where the disease has no map."""
        scores = np.asarray(scores, dtype=np.float64)
        fitted = self.diseases.get(disease)
        if fitted is None:
            return np.full_like(scores, np.nan)
        return platt(scores, fitted.slope, fitted.intercept)


def _logit(scores: np.ndarray) -> np.ndarray:
    clipped = np.clip(scores, _EPS, 1 - _EPS)
    return np.log(clipped) - np.log1p(-clipped)


def platt(scores, slope: float, intercept: float) -> np.ndarray:
    return 0.5 * (1 + np.tanh((slope * _logit(np.asarray(scores, dtype=np.float64)) + intercept) / 2))


def bin_centres(bins: int) -> np.ndarray:
    return (np.arange(bins) + 0.5) / bins


def fit_platt(positives: np.ndarray, negatives: np.ndarray) -> tuple[float, float]:
    """(slope, intercept) minimising the counts-weighted log loss with Platt's smoothed targets, by Newton's
    method on the two parameters (the loss is convex in them)."""
    z = _logit(bin_centres(len(positives)))
    P, N = positives.sum(), negatives.sum()
    t_pos, t_neg = (P + 1) / (P + 2), 1 / (N + 2)
    # Each bin contributes its positives with target t_pos and its negatives with target t_neg.
    x = np.concatenate([z, z])
    w = np.concatenate([positives, negatives])
    t = np.concatenate([np.full_like(z, t_pos), np.full_like(z, t_neg)])
    keep = w > 0
    x, w, t = x[keep], w[keep], t[keep]
    def loss(theta):  # the weighted cross-entropy, written with logaddexp so that no exp overflows
        u = theta[0] * x + theta[1]
        return float(np.sum(w * (t * np.logaddexp(0, -u) + (1 - t) * np.logaddexp(0, u))))

    theta = np.array([1.0, 0.0])
    for _ in range(100):
        p = 0.5 * (1 + np.tanh((theta[0] * x + theta[1]) / 2))  # sigmoid without overflow
        gradient = np.array([np.sum(w * (p - t) * x), np.sum(w * (p - t))])
        curvature = w * p * (1 - p)
        hessian = np.array([[np.sum(curvature * x * x), np.sum(curvature * x)],
                            [np.sum(curvature * x), np.sum(curvature)]]) + 1e-9 * np.eye(2)
        step = np.linalg.solve(hessian, gradient)
        # Backtracking: a full Newton step can overshoot where the scores are far from calibrated.
        scale, before = 1.0, loss(theta)
        while loss(theta - scale * step) > before and scale > 1e-8:
            scale /= 2
        theta = theta - scale * step
        if np.abs(scale * step).max() < 1e-10:
            break
    return float(theta[0]), float(theta[1])


def reliability(positives: np.ndarray, negatives: np.ndarray, stated: np.ndarray) -> tuple[np.ndarray, ...]:
    """Per reliability bin (``RELIABILITY_BINS`` equal-width bins of the stated probability): the images, their
    mean stated probability and their observed rate of disease (NaN where empty). ``stated``: each score bin's
    probability as stated (its centre, or the map of its centre)."""
    which = np.minimum((stated * RELIABILITY_BINS).astype(int), RELIABILITY_BINS - 1)
    counts = positives + negatives
    images = np.bincount(which, counts, RELIABILITY_BINS)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean_stated = np.bincount(which, counts * stated, RELIABILITY_BINS) / images
        observed = np.bincount(which, positives, RELIABILITY_BINS) / images
    return images, mean_stated, observed


def ece(positives: np.ndarray, negatives: np.ndarray, stated: np.ndarray) -> float:
    images, mean_stated, observed = reliability(positives, negatives, stated)
    filled = images > 0
    return float(np.sum(images[filled] * np.abs(observed[filled] - mean_stated[filled])) / images.sum())


def ece_interval(positives: np.ndarray, negatives: np.ndarray, stated: np.ndarray, seed: int = 0) -> Ece:
    counts = np.concatenate([positives, negatives])
    total = int(round(counts.sum()))
    rng = np.random.default_rng(seed)
    draws = rng.multinomial(total, counts / counts.sum(), size=BOOTSTRAP_DRAWS)
    bins = len(positives)
    values = [ece(d[:bins], d[bins:], stated) for d in draws]
    low, high = np.percentile(values, [2.5, 97.5])
    return Ece(value=ece(positives, negatives, stated), low=float(low), high=float(high))


def from_histograms(valid: np.ndarray, diseases: list[str], source: str, test: np.ndarray | None = None) -> Calibration:
    """Each disease's map from its pooled validation histograms ``(C, 2, B)`` and its calibration errors before and
    after, on the validation histograms and (where given) the pooled test ones. Noised histograms (a DP release)
    may hold negative counts: they count as empty bins."""
    valid = np.clip(np.asarray(valid, dtype=np.float64), 0, None)
    test = None if test is None else np.clip(np.asarray(test, dtype=np.float64), 0, None)
    centres = bin_centres(valid.shape[-1])
    fitted, undefined = {}, {}
    for c, disease in enumerate(diseases):
        hp, hn = valid[c]
        if hp.sum() < 1 or hn.sum() < 1:
            undefined[disease] = f"no labelled {'positive' if hp.sum() < 1 else 'negative'} validation image"
            continue
        slope, intercept = fit_platt(hp, hn)
        if slope <= 0:  # a map that reverses the ranking would turn the operating points around
            undefined[disease] = f"the validation scores do not rank the positives above the negatives (slope {slope:.2f})"
            continue
        mapped = platt(centres, slope, intercept)
        errors = {"valid_before": ece_interval(hp, hn, centres), "valid_after": ece_interval(hp, hn, mapped)}
        if test is not None and test[c].sum() >= 1:
            errors.update(test_before=ece_interval(*test[c], centres), test_after=ece_interval(*test[c], mapped))
        fitted[disease] = DiseaseCalibration(slope=slope, intercept=intercept, **errors)
    return Calibration(source=source, diseases=fitted, undefined=undefined)
