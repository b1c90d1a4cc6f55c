"""One disease's metrics (docs/algorithms.md section 2): ROC AUC, one-way and two-way partial AUC, the
``MetricResult`` that carries why a value is undefined, and the input checks every metric shares."""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np


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


def binary_inputs(y_true, y_score) -> tuple[np.ndarray, np.ndarray]:
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


def check_rate(value: float, name: str) -> None:
    if not 0 < value <= 1:
        raise ValueError(f"{name} must lie in (0, 1], got {value}")


# ---------------------------------------------------------------------------------------------------
# Binary metrics
# ---------------------------------------------------------------------------------------------------


def roc_auc(y_true, y_score) -> MetricResult:
    """ROC AUC as the Mann-Whitney statistic (ties count 1/2), equal to scikit-learn's roc_auc_score.

    NaN labels are missing and ignored. A single class gives NaN with the reason.
    """
    y, s = binary_inputs(y_true, y_score)
    reason = _class_check(y)
    if reason:
        return MetricResult.undefined(reason)
    ranks = average_ranks(s)  # a tied positive/negative pair contributes 1/2
    n_pos = y.sum()
    n_neg = y.size - n_pos
    return MetricResult((ranks[y == 1].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def average_ranks(values: np.ndarray) -> np.ndarray:
    """1-based ranks, ties sharing their mean rank (scipy.stats.rankdata's default, in numpy: a hospital's
    site process need not load scipy)."""
    order = np.argsort(values, kind="mergesort")
    ordered = values[order]
    starts = np.flatnonzero(np.r_[True, ordered[1:] != ordered[:-1]])
    ends = np.r_[starts[1:], len(values)]
    ranks = np.empty(len(values), dtype=np.float64)
    ranks[order] = np.repeat((starts + ends + 1) / 2.0, ends - starts)
    return ranks


def _roc_curve(y: np.ndarray, s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(fpr, tpr) from (0, 0) to (1, 1), one point per distinct score (ties move diagonally)."""
    order = np.argsort(-s, kind="mergesort")
    s_sorted, y_sorted = s[order], y[order]
    last_of_run = np.r_[np.flatnonzero(np.diff(s_sorted)), s_sorted.size - 1]
    tp = np.cumsum(y_sorted)[last_of_run]
    fp = (last_of_run + 1) - tp
    return np.r_[0.0, fp / fp[-1]], np.r_[0.0, tp / tp[-1]]


def area_up_to(fpr: np.ndarray, tpr: np.ndarray, max_fpr: float) -> float:
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
    check_rate(max_fpr, "max_fpr")
    y, s = binary_inputs(y_true, y_score)
    reason = _class_check(y)
    if reason:
        return MetricResult.undefined(reason)
    area = area_up_to(*_roc_curve(y, s), max_fpr)
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
    check_rate(max_fpr, "max_fpr")
    y, s = binary_inputs(y_true, y_score)
    reason = _class_check(y)
    if reason:
        return MetricResult.undefined(reason)
    pos, neg = np.sort(s[y == 1]), np.sort(s[y == 0])[::-1]
    # round() first so that 0.7 * 10 = 7.000000000000001 does not become 8
    hard_pos = pos[: math.ceil(round((1 - min_tpr) * pos.size, 9))]
    hard_neg = neg[: math.ceil(round(max_fpr * neg.size, 9))]
    diff = hard_pos[:, None] - hard_neg[None, :]
    return MetricResult(float(((diff > 0) + 0.5 * (diff == 0)).mean()))
