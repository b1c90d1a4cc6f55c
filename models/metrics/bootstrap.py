"""Percentile bootstrap confidence intervals of a metric over the rows of one evaluation."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from models.metrics.binary import MetricResult, roc_auc


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
