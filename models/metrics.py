"""AUC and partial-AUC metrics per disease, per site and pooled (docs/algorithms.md section 2).

Pure numpy functions with scikit-learn's argument order ``(y_true, y_score)``. A metric that is not
defined (a class absent, every label missing) returns a :class:`MetricResult` equal to NaN that carries
the reason; nothing raises and nothing is silently 0.5. A ``MetricResult`` is a ``float``, so the
dicts returned here go straight to MLflow's ``log_metrics`` or JSON, and ``result.reason`` explains a NaN.

Names in the dict helpers: ``auc``, ``pauc_fpr{beta}_mcclish`` (identical to scikit-learn's
``roc_auc_score(max_fpr=beta)``), ``pauc_fpr{beta}_raw`` (area under the ROC for FPR <= beta divided by
beta, in [0, 1]) and ``tpauc_tpr{alpha}_fpr{beta}`` (two-way), each as ``<name>/<disease>`` and the
macro mean over defined diseases as ``<name>_macro``.

Pooled over sites without per-image scores: :func:`score_histograms` (fixed equal-width bins of
[0, 1]) and :func:`histogram_auc`, :func:`histogram_partial_auc`, :func:`histogram_two_way_partial_auc`,
each returning a :class:`Bounded` value with the guaranteed bound on its distance to the exact metric,
and :func:`histogram_auc_interval`, a confidence interval for the AUC from the same histograms.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
from scipy.stats import norm, rankdata


class MetricResult(float):
    """A float metric value; NaN values carry ``reason``, the explanation of why it is undefined."""

    reason: str | None

    def __new__(cls, value: float, reason: str | None = None) -> MetricResult:
        obj = super().__new__(cls, value)
        obj.reason = reason
        return obj

    @classmethod
    def undefined(cls, reason: str) -> MetricResult:
        return cls(math.nan, reason)

    @property
    def defined(self) -> bool:
        return not math.isnan(self)

    def __reduce__(self):
        return MetricResult, (float(self), self.reason)

    def __repr__(self) -> str:
        return f"MetricResult(nan, reason={self.reason!r})" if self.reason else f"MetricResult({float(self)!r})"

    def __str__(self) -> str:  # print() and f-strings show the number, as for a float
        return float.__repr__(self)


def metric_reasons(results: Mapping[str, float]) -> dict[str, str]:
    """``{key: reason}`` for every undefined entry of a metrics dict (for run tags or a report)."""
    return {k: v.reason for k, v in results.items() if isinstance(v, MetricResult) and v.reason}


# ---------------------------------------------------------------------------------------------------
# Input validation (once, at the boundary)
# ---------------------------------------------------------------------------------------------------


def _binary_inputs(y_true, y_score) -> tuple[np.ndarray, np.ndarray]:
    """1-D float arrays with NaN labels (missing) dropped; raises on malformed input."""
    y = np.asarray(y_true, dtype=np.float64).ravel()
    s = np.asarray(y_score, dtype=np.float64).ravel()
    if y.shape != s.shape:
        raise ValueError(f"y_true and y_score must have the same length, got {y.shape[0]} and {s.shape[0]}")
    present = ~np.isnan(y)
    bad = present & (y != 0) & (y != 1)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise ValueError(f"y_true must be 0, 1 or NaN (missing); got {y[i]!r} at row {i}")
    if np.isnan(s[present]).any():
        i = int(np.flatnonzero(present & np.isnan(s))[0])
        raise ValueError(f"y_score is NaN at row {i} (a labelled sample must have a score)")
    return y[present], s[present]


def _class_check(y: np.ndarray) -> str | None:
    n_pos = int(y.sum())
    if y.size == 0:
        return "no labelled sample"
    if n_pos == 0:
        return f"no positive among {y.size} labelled samples"
    if n_pos == y.size:
        return f"no negative among {y.size} labelled samples"
    return None


def _check_rate(value: float, name: str) -> None:
    if not 0 < value <= 1:
        raise ValueError(f"{name} must lie in (0, 1], got {value}")


# ---------------------------------------------------------------------------------------------------
# Binary metrics
# ---------------------------------------------------------------------------------------------------


def roc_auc(y_true, y_score) -> MetricResult:
    """ROC AUC as the Mann-Whitney statistic (ties count 1/2), equal to scikit-learn's roc_auc_score.

    NaN labels are missing and ignored. A single class gives NaN with the reason.
    """
    y, s = _binary_inputs(y_true, y_score)
    reason = _class_check(y)
    if reason:
        return MetricResult.undefined(reason)
    ranks = rankdata(s)  # average ranks: a tied positive/negative pair contributes 1/2
    n_pos = y.sum()
    n_neg = y.size - n_pos
    return MetricResult((ranks[y == 1].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def _roc_curve(y: np.ndarray, s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(fpr, tpr) from (0, 0) to (1, 1), one point per distinct score (ties move diagonally)."""
    order = np.argsort(-s, kind="mergesort")
    s_sorted, y_sorted = s[order], y[order]
    last_of_run = np.r_[np.flatnonzero(np.diff(s_sorted)), s_sorted.size - 1]
    tp = np.cumsum(y_sorted)[last_of_run]
    fp = (last_of_run + 1) - tp
    return np.r_[0.0, fp / fp[-1]], np.r_[0.0, tp / tp[-1]]


def _area_up_to(fpr: np.ndarray, tpr: np.ndarray, max_fpr: float) -> float:
    """Trapezoidal area under the ROC for FPR in [0, max_fpr], interpolating linearly at max_fpr."""
    stop = np.searchsorted(fpr, max_fpr, side="right")
    x, yv = fpr[:stop], tpr[:stop]
    if x[-1] < max_fpr:
        # the segment crossing max_fpr; stop < len(fpr) because fpr ends at 1 >= max_fpr
        x0, x1, y0, y1 = fpr[stop - 1], fpr[stop], tpr[stop - 1], tpr[stop]
        x = np.r_[x, max_fpr]
        yv = np.r_[yv, y0 + (y1 - y0) * (max_fpr - x0) / (x1 - x0)]
    return float(np.sum(np.diff(x) * (yv[1:] + yv[:-1]) / 2))  # trapezoid rule (np.trapezoid needs numpy 2)


def partial_roc_auc(y_true, y_score, max_fpr: float, standardized: bool = True) -> MetricResult:
    """One-way partial AUC over FPR in [0, max_fpr].

    ``standardized=True``: McClish's correction ``(1 + (A - A_min)/(A_max - A_min)) / 2`` of the area A,
    with ``A_min = max_fpr^2 / 2`` (the diagonal) and ``A_max = max_fpr``, identical to scikit-learn's
    ``roc_auc_score(y_true, y_score, max_fpr=max_fpr)``; 0.5 is chance, 1 perfect. This is the value
    FeDXL's tables report: the authors' evaluation calls scikit-learn's ``max_fpr``.
    ``standardized=False``: the raw area divided by ``max_fpr``, in [0, 1], chance ``max_fpr / 2``.
    """
    _check_rate(max_fpr, "max_fpr")
    y, s = _binary_inputs(y_true, y_score)
    reason = _class_check(y)
    if reason:
        return MetricResult.undefined(reason)
    area = _area_up_to(*_roc_curve(y, s), max_fpr)
    if not standardized:
        return MetricResult(area / max_fpr)
    min_area, max_area = 0.5 * max_fpr**2, max_fpr
    return MetricResult(0.5 * (1 + (area - min_area) / (max_area - min_area)))


def two_way_partial_auc(y_true, y_score, min_tpr: float, max_fpr: float) -> MetricResult:
    """Two-way partial AUC over TPR >= min_tpr and FPR <= max_fpr (Yang et al. 2019), in [0, 1].

    The fraction of correctly ordered pairs (ties 1/2) between the ``ceil((1 - min_tpr) n+)``
    lowest-scored positives and the ``ceil(max_fpr n-)`` highest-scored negatives; when those counts are
    whole numbers it equals the ROC area inside the region divided by ``(1 - min_tpr) max_fpr``.
    """
    if not 0 <= min_tpr < 1:
        raise ValueError(f"min_tpr must lie in [0, 1), got {min_tpr}")
    _check_rate(max_fpr, "max_fpr")
    y, s = _binary_inputs(y_true, y_score)
    reason = _class_check(y)
    if reason:
        return MetricResult.undefined(reason)
    pos, neg = np.sort(s[y == 1]), np.sort(s[y == 0])[::-1]
    # round() first so that 0.7 * 10 = 7.000000000000001 does not become 8
    hard_pos = pos[: math.ceil(round((1 - min_tpr) * pos.size, 9))]
    hard_neg = neg[: math.ceil(round(max_fpr * neg.size, 9))]
    diff = hard_pos[:, None] - hard_neg[None, :]
    return MetricResult(float(((diff > 0) + 0.5 * (diff == 0)).mean()))


# ---------------------------------------------------------------------------------------------------
# Multi-label, per site, pooled
# ---------------------------------------------------------------------------------------------------


def _macro(values: Sequence[MetricResult], what: str) -> MetricResult:
    defined = [v for v in values if v.defined]
    if not defined:
        return MetricResult.undefined(f"{what}: no defined value to average")
    return MetricResult(float(np.mean(defined)))


def _beta_name(beta: float) -> str:
    return f"{beta:g}"


def metric_names(betas: Sequence[float] = (0.3, 0.5), two_way: Sequence[tuple[float, float]] = ()) -> list[str]:
    """The metric names :func:`evaluate_multilabel` reports, in order."""
    names = ["auc"]
    for beta in betas:
        names += [f"pauc_fpr{_beta_name(beta)}_mcclish", f"pauc_fpr{_beta_name(beta)}_raw"]
    names += [f"tpauc_tpr{_beta_name(a)}_fpr{_beta_name(b)}" for a, b in two_way]
    return names


def _as_matrix(y_true, y_score, diseases: Sequence[str], mask) -> tuple[np.ndarray, np.ndarray]:
    y = np.asarray(y_true, dtype=np.float64)
    s = np.asarray(y_score, dtype=np.float64)
    if y.ndim == 1:
        y, s = y[:, None], s.reshape(-1, 1)
    if y.ndim != 2 or s.shape != y.shape:
        raise ValueError(f"y_true and y_score must have the same (N, C) shape, got {y.shape} and {s.shape}")
    if y.shape[1] != len(diseases):
        raise ValueError(f"{y.shape[1]} label columns but {len(diseases)} disease names {list(diseases)}")
    if mask is not None:
        m = np.asarray(mask)
        if m.shape != y.shape:
            raise ValueError(f"mask must have shape {y.shape}, got {m.shape}")
        y = np.where(m.astype(bool), y, np.nan)
    return y, s


def evaluate_multilabel(y_true, y_score, diseases: Sequence[str], betas: Sequence[float] = (0.3, 0.5),
                        mask=None, two_way: Sequence[tuple[float, float]] = ()) -> dict[str, MetricResult]:
    """Per-disease AUC and partial AUCs and their macro means over the defined diseases.

    ``y_true`` (N, C) with 1, 0 or NaN (missing); ``mask`` (N, C) True = label present, an alternative
    way to mark missing labels. ``two_way`` lists (min_tpr, max_fpr) pairs for two-way partial AUC.
    Keys ``<metric>/<disease>`` and ``<metric>_macro`` with metric names from :func:`metric_names`.
    """
    y, s = _as_matrix(y_true, y_score, diseases, mask)
    metrics: dict[str, Callable[[np.ndarray, np.ndarray], MetricResult]] = {"auc": roc_auc}
    for beta in betas:
        metrics[f"pauc_fpr{_beta_name(beta)}_mcclish"] = lambda t, p, b=beta: partial_roc_auc(t, p, b, True)
        metrics[f"pauc_fpr{_beta_name(beta)}_raw"] = lambda t, p, b=beta: partial_roc_auc(t, p, b, False)
    for min_tpr, max_fpr in two_way:
        metrics[f"tpauc_tpr{_beta_name(min_tpr)}_fpr{_beta_name(max_fpr)}"] = (
            lambda t, p, a=min_tpr, b=max_fpr: two_way_partial_auc(t, p, a, b))
    out: dict[str, MetricResult] = {}
    for name, fn in metrics.items():
        per_disease = []
        for c, disease in enumerate(diseases):
            value = fn(y[:, c], s[:, c])
            if not value.defined:
                value = MetricResult.undefined(f"{disease}: {value.reason}")
            out[f"{name}/{disease}"] = value
            per_disease.append(value)
        out[f"{name}_macro"] = _macro(per_disease, f"{name}_macro")
    return out


def per_site_and_pooled(y_true_by_site: Mapping[str, object], y_score_by_site: Mapping[str, object],
                        diseases: Sequence[str], betas: Sequence[float] = (0.3, 0.5),
                        mask_by_site: Mapping[str, object] | None = None,
                        two_way: Sequence[tuple[float, float]] = ()) -> dict[str, MetricResult]:
    """Metrics per site, pooled over all sites' samples, and macro-averaged over sites.

    Keys: ``site/<site>/<key>`` (each site's :func:`evaluate_multilabel`), ``pooled/<key>`` (one
    evaluation of every site's samples concatenated: a ranking across hospitals, never the average of
    site AUCs), and ``macro_over_sites/<key>`` (mean over the sites where ``<key>`` is defined).
    """
    if set(y_true_by_site) != set(y_score_by_site):
        raise ValueError(f"labels and scores name different sites: {sorted(y_true_by_site)} vs {sorted(y_score_by_site)}")
    if not y_true_by_site:
        raise ValueError("per_site_and_pooled needs at least one site")
    out: dict[str, MetricResult] = {}
    per_site: dict[str, dict[str, MetricResult]] = {}
    ys, ss = [], []
    for site in y_true_by_site:
        mask = None if mask_by_site is None else mask_by_site.get(site)
        y, s = _as_matrix(y_true_by_site[site], y_score_by_site[site], diseases, mask)
        ys.append(y)
        ss.append(s)
        per_site[site] = evaluate_multilabel(y, s, diseases, betas, two_way=two_way)
        out.update({f"site/{site}/{k}": v for k, v in per_site[site].items()})
    pooled = evaluate_multilabel(np.concatenate(ys), np.concatenate(ss), diseases, betas, two_way=two_way)
    out.update({f"pooled/{k}": v for k, v in pooled.items()})
    for key in pooled:
        out[f"macro_over_sites/{key}"] = _macro([m[key] for m in per_site.values()], f"macro_over_sites/{key}")
    return out


# ---------------------------------------------------------------------------------------------------
# Metrics from score histograms (pooled over sites without per-image scores leaving a site)
# ---------------------------------------------------------------------------------------------------


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
    y, s = _binary_inputs(y_true, y_score)
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


def _histogram_roc(hp: np.ndarray, hn: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
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
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must lie in (0, 1), got {confidence}")
    auc = histogram_auc(hist_pos, hist_neg)
    hp, hn, _ = _histogram_inputs(hist_pos, hist_neg)
    n_pos, n_neg = hp.sum(), hn.sum()
    if not auc.value.defined or n_pos < 2 or n_neg < 2:
        return HistogramInterval(math.nan, math.nan, math.nan)
    v10 = (np.cumsum(hn) - 0.5 * hn) / n_neg
    v01 = (hp.sum() - np.cumsum(hp) + 0.5 * hp) / n_pos
    variance = ((hp * (v10 - auc.value) ** 2).sum() / (n_pos - 1) / n_pos
                + (hn * (v01 - auc.value) ** 2).sum() / (n_neg - 1) / n_neg)
    half_width = float(norm.ppf(0.5 + confidence / 2) * math.sqrt(variance) + auc.bound)
    return HistogramInterval(max(0.0, auc.value - half_width), min(1.0, auc.value + half_width), half_width)


def histogram_partial_auc(hist_pos, hist_neg, max_fpr: float, standardized: bool = True) -> Bounded:
    """One-way partial AUC over FPR in [0, max_fpr] from score histograms, normalised as
    :func:`partial_roc_auc` (McClish-standardised, or the raw area divided by ``max_fpr``).

    The ROC of the histograms passes through the exact ROC's points at every bin edge and crosses each
    bin's rectangle (width dF_b, height dT_b) on its diagonal, where the exact curve may take any
    monotone path. Bound on the raw area: ``dF_b dT_b / 2`` for a bin wholly inside FPR <= max_fpr and
    ``(max_fpr - F_b) dT_b`` for the bin that straddles it; divided by ``max_fpr`` (raw) or multiplied
    by ``1 / (2 (max_fpr - max_fpr^2 / 2))`` (McClish).
    """
    _check_rate(max_fpr, "max_fpr")
    hp, hn, reason = _histogram_inputs(hist_pos, hist_neg)
    if reason:
        return _undefined(reason)
    fpr, tpr = _histogram_roc(hp, hn)
    area = _area_up_to(fpr, tpr, max_fpr)
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
    _check_rate(max_fpr, "max_fpr")
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


# ---------------------------------------------------------------------------------------------------
# Bootstrap
# ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ConfidenceInterval:
    """Percentile bootstrap interval around the full-sample estimate."""

    estimate: MetricResult
    low: float
    high: float
    confidence: float
    n_boot: int
    n_valid: int  # replicates where the metric was defined (the interval uses only these)


def bootstrap_ci(y_true, y_score, metric: Callable[..., float] = roc_auc, n_boot: int = 1000,
                 confidence: float = 0.95, seed: int = 0, stratify: bool = True) -> ConfidenceInterval:
    """Percentile bootstrap confidence interval of ``metric(y_true, y_score)``.

    Rows are resampled with replacement. ``stratify=True`` (1-D labels only) resamples positives and
    negatives separately, keeping the class counts, so every replicate of an AUC is defined. For (N, C)
    labels pass a metric such as ``lambda t, s: evaluate_multilabel(t, s, diseases)["auc_macro"]`` with
    ``stratify=False``. Replicates where the metric is NaN are dropped and counted in ``n_valid``.
    """
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must lie in (0, 1), got {confidence}")
    if n_boot < 1:
        raise ValueError(f"n_boot must be positive, got {n_boot}")
    y = np.asarray(y_true, dtype=np.float64)
    s = np.asarray(y_score, dtype=np.float64)
    if y.shape[0] != s.shape[0]:
        raise ValueError(f"y_true and y_score must have the same number of rows, got {y.shape[0]} and {s.shape[0]}")
    estimate = metric(y, s)
    estimate = estimate if isinstance(estimate, MetricResult) else MetricResult(estimate)
    if not estimate.defined:
        return ConfidenceInterval(estimate, math.nan, math.nan, confidence, n_boot, 0)
    rng = np.random.default_rng(seed)
    if stratify:
        if y.ndim != 1:
            raise ValueError("stratify=True needs 1-D labels; pass stratify=False for (N, C) labels")
        groups = [np.flatnonzero(y == 1), np.flatnonzero(y == 0), np.flatnonzero(np.isnan(y))]
        groups = [g for g in groups if g.size]
    else:
        groups = [np.arange(y.shape[0])]
    values = []
    for _ in range(n_boot):
        rows = np.concatenate([rng.choice(g, size=g.size, replace=True) for g in groups])
        value = float(metric(y[rows], s[rows]))
        if not math.isnan(value):
            values.append(value)
    if not values:
        return ConfidenceInterval(estimate, math.nan, math.nan, confidence, n_boot, 0)
    tail = (1 - confidence) / 2 * 100
    low, high = np.percentile(values, [tail, 100 - tail])
    return ConfidenceInterval(estimate, float(low), float(high), confidence, n_boot, len(values))
