"""Metrics pooled over sites from score histograms (docs/algorithms.md section 2): no per-image score leaves a
site; each value comes with the guaranteed bound on its distance to the exact metric, and the AUC with an interval."""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist
from typing import NamedTuple

import numpy as np

from models.metrics.binary import MetricResult, area_up_to, binary_inputs, check_rate


@dataclass(frozen=True)
class Bounded:
    """A metric computed from score histograms and the largest possible difference from the exact value
    computed from the scores themselves: ``|value - exact| <= bound``."""

    value: MetricResult
    bound: float


def score_histograms(y_true, y_score, bins: int) -> tuple[np.ndarray, np.ndarray]:
    """Counts of the positives' and of the negatives' scores in ``bins`` equal-width bins of [0, 1].

    Bin b holds scores in [b / bins, (b + 1) / bins); 1.0 falls in the last bin. NaN labels are missing
    and dropped. Scores must lie in [0, 1] (probabilities). Returns two float64 arrays of length ``bins``.
    """
    if isinstance(bins, bool) or not isinstance(bins, (int, np.integer)) or bins < 1:
        raise ValueError(f"bins must be a positive integer, got {bins!r}")
    y, s = binary_inputs(y_true, y_score)
    outside = (s < 0) | (s > 1)
    if outside.any():
        i = int(np.flatnonzero(outside)[0])
        raise ValueError(f"y_score must lie in [0, 1] (probabilities); got {s[i]!r}")
    idx = np.minimum((s * bins).astype(np.int64), bins - 1)
    return (np.bincount(idx[y == 1], minlength=bins).astype(np.float64),
            np.bincount(idx[y == 0], minlength=bins).astype(np.float64))


def _histogram_inputs(hist_pos, hist_neg) -> tuple[np.ndarray, np.ndarray, str | None]:
    """Validated 1-D count arrays and, when a class is empty, why the metric is undefined."""
    hp = np.asarray(hist_pos, dtype=np.float64)
    hn = np.asarray(hist_neg, dtype=np.float64)
    if hp.ndim != 1 or hp.shape != hn.shape:
        raise ValueError(f"hist_pos and hist_neg must be 1-D of one length, got shapes {hp.shape} and {hn.shape}")
    for name, h in (("hist_pos", hp), ("hist_neg", hn)):
        if not np.isfinite(h).all() or (h < 0).any():
            raise ValueError(f"{name} must hold finite non-negative counts")
    n_pos, n_neg = hp.sum(), hn.sum()
    reason = None
    if n_pos + n_neg == 0:
        reason = "no labelled sample"
    elif n_pos == 0:
        reason = f"no positive among {n_neg:.0f} labelled samples"
    elif n_neg == 0:
        reason = f"no negative among {n_pos:.0f} labelled samples"
    return hp, hn, reason


def _undefined(reason: str) -> Bounded:
    return Bounded(MetricResult.undefined(reason), math.nan)


def histogram_auc(hist_pos, hist_neg) -> Bounded:
    """ROC AUC from score histograms (:func:`score_histograms`), pairs within one bin counted 1/2.

    A pair of a positive and a negative in different bins is ordered exactly as by the scores; a pair in
    the same bin counts 1/2 where the exact AUC counts 0, 1/2 or 1. So
    ``|value - exact AUC| <= bound = (1/2) sum_b hist_pos[b] hist_neg[b] / (n_pos n_neg)``,
    half the fraction of positive-negative pairs that share a bin.
    """
    hp, hn, reason = _histogram_inputs(hist_pos, hist_neg)
    if reason:
        return _undefined(reason)
    pairs = hp.sum() * hn.sum()
    below = np.cumsum(hn) - hn  # negatives in lower bins
    value = float((hp * (below + 0.5 * hn)).sum() / pairs)
    return Bounded(MetricResult(value), float(0.5 * (hp * hn).sum() / pairs))


def histogram_roc(hp: np.ndarray, hn: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(fpr, tpr) at every bin edge from the top: exact ROC points, joined by the tie diagonal in a bin."""
    occupied = (hp + hn) > 0
    hp, hn = hp[occupied][::-1], hn[occupied][::-1]
    return np.r_[0.0, np.cumsum(hn) / hn.sum()], np.r_[0.0, np.cumsum(hp) / hp.sum()]


class HistogramInterval(NamedTuple):
    """A confidence interval for the exact AUC from score histograms: ``[low, high]`` clipped to [0, 1],
    and ``half_width`` before clipping (what a macro mean's interval adds up)."""

    low: float
    high: float
    half_width: float


def histogram_auc_interval(hist_pos, hist_neg, confidence: float = 0.95) -> HistogramInterval:
    """DeLong's normal-approximation interval for the AUC from score histograms, widened by the
    histogram bound (:func:`histogram_auc`) so that it is an interval for the exact AUC.

    DeLong, DeLong and Clarke-Pearson (1988): with the placement values of each positive,
    ``V10 = (negatives below + 1/2 negatives tied) / n_neg``, and of each negative,
    ``V01 = (positives above + 1/2 positives tied) / n_pos``, the AUC is their mean and
    ``Var = s2(V10) / n_pos + s2(V01) / n_neg`` (s2: sample variance). In a histogram every entry of a bin
    shares the bin's placement value, so the variance needs the counts alone: no per-image score. NaN
    when the AUC is undefined or a class has a single entry (no sample variance).
    """
    z = _normal_quantile(confidence)
    auc, variance = _delong_variance(hist_pos, hist_neg)
    if math.isnan(variance):
        return HistogramInterval(math.nan, math.nan, math.nan)
    half_width = float(z * math.sqrt(variance) + auc.bound)
    return HistogramInterval(max(0.0, auc.value - half_width), min(1.0, auc.value + half_width), half_width)


def _normal_quantile(confidence: float) -> float:
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must lie in (0, 1), got {confidence}")
    return NormalDist().inv_cdf(0.5 + confidence / 2)


def _delong_variance(hist_pos, hist_neg) -> tuple[Bounded, float]:
    """The histogram AUC and DeLong's variance of it (NaN where undefined or a class has a single entry)."""
    auc = histogram_auc(hist_pos, hist_neg)
    hp, hn, _ = _histogram_inputs(hist_pos, hist_neg)
    n_pos, n_neg = hp.sum(), hn.sum()
    if not auc.value.defined or n_pos < 2 or n_neg < 2:
        return auc, math.nan
    v10 = (np.cumsum(hn) - 0.5 * hn) / n_neg
    v01 = (hp.sum() - np.cumsum(hp) + 0.5 * hp) / n_pos
    variance = ((hp * (v10 - auc.value) ** 2).sum() / (n_pos - 1) / n_pos
                + (hn * (v01 - auc.value) ** 2).sum() / (n_neg - 1) / n_neg)
    return auc, float(variance)


class Difference(NamedTuple):
    """``value = AUC(a) - AUC(b)`` from histograms, and a confidence interval ``[low, high]`` for the exact
    difference (not clipped: it lies in [-1, 1])."""

    value: float
    low: float
    high: float


def histogram_auc_difference(a: tuple, b: tuple, confidence: float = 0.95) -> Difference:
    """The difference of the AUCs of two disjoint groups of images, ``a`` and ``b`` (each ``(hist_pos,
    hist_neg)``), with its interval: the groups share no image, so their DeLong variances add; widened by
    both histogram bounds so that it covers the exact difference. NaN where either AUC has no interval."""
    z = _normal_quantile(confidence)
    (auc_a, var_a), (auc_b, var_b) = _delong_variance(*a), _delong_variance(*b)
    if math.isnan(var_a) or math.isnan(var_b):
        return Difference(math.nan, math.nan, math.nan)
    value = float(auc_a.value) - float(auc_b.value)
    half_width = z * math.sqrt(var_a + var_b) + auc_a.bound + auc_b.bound
    return Difference(value, value - half_width, value + half_width)


def histogram_partial_auc(hist_pos, hist_neg, max_fpr: float, standardized: bool = True) -> Bounded:
    """One-way partial AUC over FPR in [0, max_fpr] from score histograms, normalised as
    :func:`partial_roc_auc` (McClish-standardised, or the raw area divided by ``max_fpr``).

    The ROC of the histograms passes through the exact ROC's points at every bin edge and crosses each
    bin's rectangle (width dF_b, height dT_b) on its diagonal, where the exact curve may take any
    monotone path. Bound on the raw area: ``dF_b dT_b / 2`` for a bin wholly inside FPR <= max_fpr and
    ``(max_fpr - F_b) dT_b`` for the bin that straddles it; divided by ``max_fpr`` (raw) or multiplied
    by ``1 / (2 (max_fpr - max_fpr^2 / 2))`` (McClish).
    """
    check_rate(max_fpr, "max_fpr")
    hp, hn, reason = _histogram_inputs(hist_pos, hist_neg)
    if reason:
        return _undefined(reason)
    fpr, tpr = histogram_roc(hp, hn)
    area = area_up_to(fpr, tpr, max_fpr)
    start, d_f, d_t = fpr[:-1], np.diff(fpr), np.diff(tpr)
    inside = fpr[1:] <= max_fpr
    straddles = (start < max_fpr) & ~inside
    area_bound = float((0.5 * d_f * d_t)[inside].sum() + ((max_fpr - start) * d_t)[straddles].sum())
    if not standardized:
        return Bounded(MetricResult(area / max_fpr), area_bound / max_fpr)
    min_area, max_area = 0.5 * max_fpr**2, max_fpr
    scale = 0.5 / (max_area - min_area)
    return Bounded(MetricResult(0.5 * (1 + (area - min_area) / (max_area - min_area))), area_bound * scale)


def histogram_two_way_partial_auc(hist_pos, hist_neg, min_tpr: float, max_fpr: float) -> Bounded:
    """Two-way partial AUC (:func:`two_way_partial_auc`) from score histograms.

    The ``ceil((1 - min_tpr) n+)`` lowest positives and ``ceil(max_fpr n-)`` highest negatives are taken
    bin by bin (a bin on the border contributes the needed part of its count); pairs of selected entries
    in different bins are ordered exactly, pairs within a bin count 1/2:
    ``bound = (1/2) sum_b p_b q_b / (sum p sum q)`` with p_b, q_b the selected counts in bin b.
    """
    if not 0 <= min_tpr < 1:
        raise ValueError(f"min_tpr must lie in [0, 1), got {min_tpr}")
    check_rate(max_fpr, "max_fpr")
    hp, hn, reason = _histogram_inputs(hist_pos, hist_neg)
    if reason:
        return _undefined(reason)
    n_p = math.ceil(round((1 - min_tpr) * hp.sum(), 9))
    n_q = math.ceil(round(max_fpr * hn.sum(), 9))
    p = np.clip(n_p - (np.cumsum(hp) - hp), 0, hp)  # lowest positives, from the bottom bin up
    q = np.clip(n_q - (np.cumsum(hn[::-1]) - hn[::-1]), 0, hn[::-1])[::-1]  # highest negatives, from the top
    pairs = p.sum() * q.sum()
    below = np.cumsum(q) - q
    value = float((p * (below + 0.5 * q)).sum() / pairs)
    return Bounded(MetricResult(value), float(0.5 * (p * q).sum() / pairs))
