"""The claims benchmark's statistics (docs/claims.md, "Verdicts"): t-intervals over seeds, paired
differences and the verdict rule."""

from __future__ import annotations

import math

import numpy as np
from scipy import stats


def interval(values) -> tuple[float, float, float]:
    """Mean and 95 % t-interval over seeds (NaN bounds with fewer than two values)."""
    v = np.asarray(values, dtype=float)
    mean = float(v.mean())
    if len(v) < 2:
        return mean, math.nan, math.nan
    half = float(stats.t.ppf(0.975, len(v) - 1) * v.std(ddof=1) / math.sqrt(len(v)))
    return mean, mean - half, mean + half


def verdict(differences, margin: float = 0.0) -> str:
    """The verdict on a claimed effect from paired differences oriented so that the claim says "> -margin"
    (margin 0: a superiority claim; margin > 0: non-inferiority, "no worse than margin").

    reproduced: the 95 % interval lies above -margin; not reproduced: it lies below -margin (the opposite
    of the claim is shown); inconclusive: it contains -margin (or fewer than two seeds).
    """
    _, low, high = interval(differences)
    if math.isnan(low):
        return "inconclusive"
    if low > -margin:
        return "reproduced"
    if high < -margin:
        return "not reproduced"
    return "inconclusive"


def cell(values) -> str:
    mean, low, high = interval(values)
    return f"{mean:.3f} [{low:.3f}, {high:.3f}]" if not math.isnan(low) else f"{mean:.3f}"


def diff_cell(values) -> str:
    mean, low, high = interval(values)
    return f"{mean:+.3f} [{low:+.3f}, {high:+.3f}]" if not math.isnan(low) else f"{mean:+.3f}"


def paired(a: list[dict], b: list[dict], metric: str = "auc") -> list[float]:
    return [x[metric] - y[metric] for x, y in zip(a, b)]


def curve_area(record: dict) -> float:
    """Mean AUC over the evaluation points: higher when a method gets there sooner."""
    return float(np.mean([auc for _, auc in record["curve"]]))
