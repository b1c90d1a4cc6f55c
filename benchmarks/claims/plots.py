"""The claims benchmark's figures (docs/claims.md): means over seeds with their 95 % t-interval bands."""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING

from benchmarks.claims.stats import interval

if TYPE_CHECKING:
    from benchmarks.claims.runs import Setting


def _plot(path: Path, draw) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 3.6), dpi=110)
    draw(ax)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def _band(ax, x, per_x, label, **kw):
    cells = [interval(v) for v in per_x]
    ax.plot(x, [c[0] for c in cells], marker="o", label=label, **kw)
    if all(not math.isnan(c[1]) for c in cells):
        ax.fill_between(x, [c[1] for c in cells], [c[2] for c in cells], alpha=0.2)


def plot_period(runs, s: Setting, path: Path) -> None:
    def draw(ax):
        for alg in ("codaplus", "codasca"):
            _band(ax, list(s.periods), [[v["auc"] for v in runs[(alg, I)]] for I in s.periods], alg)
        ax.set_xscale("log", base=2)
        ax.set(xlabel="communication window I (local steps)", ylabel=f"{s.scored} test AUC",
               title=f"AUC vs I at T = {s.iterations} iterations")
    _plot(path, draw)


def plot_rate(runs, methods, s: Setting, path: Path) -> None:
    def draw(ax):
        for name in methods:
            _band(ax, [100 * p for p in s.rates], [[v["auc"] for v in runs[(name, p)]] for p in s.rates], name)
        ax.set_xscale("log")
        ax.set(xlabel="positive rate at every site (%)", ylabel=f"{s.scored} test AUC", title="AUC vs positive rate")
    _plot(path, draw)


def plot_curves(runs, s: Setting, path: Path, title: str, each_seed: bool = False) -> None:
    """AUC vs iterations, one band per method (``runs``: name -> the seeds' records, each with its curve);
    ``each_seed``: the mean and every seed's own curve instead of the band (a peak and a decline, an
    overfitting model's shape, show in a seed's curve before the mean's, and a band over few seeds is wide)."""
    def draw(ax):
        for k, (name, values) in enumerate(runs.items()):
            if not values:
                continue
            iterations = [it for it, _ in values[0]["curve"]]
            per_x = [[v["curve"][i][1] for v in values] for i in range(len(iterations))]
            if not each_seed:
                _band(ax, iterations, per_x, name)
                continue
            colour = f"C{k}"
            ax.plot(iterations, [sum(v) / len(v) for v in per_x], color=colour, marker="o", label=f"{name}, mean")
            for v in values:
                ax.plot(iterations, [auc for _, auc in v["curve"]], color=colour, alpha=0.3, linewidth=0.8)
        ax.set(xlabel="iteration (local steps per site)", ylabel=f"{s.scored} test AUC", title=title)
    _plot(path, draw)
