"""Plots logged with runs: ROC curves and reliability diagrams drawn from score histograms (no per-image score
needed), and the model card's forest plot of AUC by site and subgroup."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

# histogram_roc: the exact ROC points at the bin edges, the curve the histogram metrics integrate.
from models.metrics import histogram_auc, histogram_auc_interval, histogram_roc
from pipelines.model_package.calibration import Calibration, bin_centres, ece_interval, platt, reliability


def roc_figure(histograms: np.ndarray, diseases: tuple[str, ...], title: str):
    """One ROC curve per disease from score histograms (C, 2, B: positives, negatives; e.g. summed over sites
    by site-local evaluation), no per-image score needed; the legend gives the histogram AUC, its 95 % interval and its binning bound,
    undefined diseases are listed with the reason."""
    fig, ax = plt.subplots(figsize=(5.5, 5))
    for column, disease in enumerate(diseases):
        positives, negatives = histograms[column]
        area = histogram_auc(positives, negatives)
        if np.isnan(area.value):
            ax.plot([], [], " ", label=f"{disease}: undefined ({area.value.reason})")
            continue
        fpr, tpr = histogram_roc(np.asarray(positives, float), np.asarray(negatives, float))
        # The 95 % interval (what the AUC could be on other patients); the binning bound (how far the histogram's
        # AUC can be from the exact one on these) is named as such: a bare ± read as a confidence interval.
        interval = histogram_auc_interval(positives, negatives)
        ax.plot(fpr, tpr, lw=1.5, label=f"{disease}: AUC {float(area.value):.3f}, 95 % CI [{interval.low:.3f}, "
                                        f"{interval.high:.3f}]; binning error <= {area.bound:.0e}")
    ax.plot([0, 1], [0, 1], color="grey", lw=0.8, ls="--")
    ax.axvspan(0, 0.3, color="tab:blue", alpha=0.06, label="pAUC region (FPR <= 0.3)")
    ax.set(xlabel="False positive rate", ylabel="True positive rate", title=title, xlim=(0, 1), ylim=(0, 1.01))
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    return fig


def forest_figure(rows: list[tuple[str, dict[str, tuple[float, float, float]]]], diseases: list[str],
                  pooled: dict[str, float], title: str):
    """A forest plot: one panel per disease, one line per row (a site or a subgroup, ``(label, {disease: (AUC,
    low, high)})``) with its 95 % interval, the pooled AUC as a dashed line; a row without the disease stays
    empty there (too small to report)."""
    fig, axes = plt.subplots(1, len(diseases), figsize=(2.6 * len(diseases) + 1.6, 0.28 * len(rows) + 1.4),
                             sharey=True, squeeze=False)
    positions = np.arange(len(rows))[::-1]
    for ax, disease in zip(axes[0], diseases):
        for y, (_, values) in zip(positions, rows):
            if disease in values:
                auc, low, high = values[disease]
                ax.plot([low, high], [y, y], color="tab:blue", lw=1.2)
                ax.plot([auc], [y], "s", color="tab:blue", ms=4)
        if not np.isnan(pooled.get(disease, np.nan)):
            ax.axvline(pooled[disease], color="grey", ls="--", lw=0.8)
        ax.axvline(0.5, color="lightgrey", lw=0.8)
        ax.set(xlim=(0, 1), title=disease, xlabel="AUC (95 % CI)")
        ax.tick_params(labelsize=7)
    axes[0][0].set_yticks(positions, [label for label, _ in rows], fontsize=7)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    return fig


def reliability_figure(histograms: np.ndarray, diseases: list[str], calibration: Calibration, title: str):
    """Per disease, the observed rate of disease against the stated probability, before (the raw score) and after
    the calibration map, from score histograms (C, 2, B): the validation ones the map was fitted on, or a test
    split's; the legend gives each curve's expected calibration error on them and its 95 % interval."""
    fig, ax = plt.subplots(figsize=(5.5, 5))
    centres = bin_centres(histograms.shape[-1])
    for column, disease in enumerate(diseases):
        fitted = calibration.diseases.get(disease)
        if fitted is None:
            ax.plot([], [], " ", label=f"{disease}: no map ({calibration.undefined.get(disease, '')})")
            continue
        positives, negatives = np.clip(np.asarray(histograms[column], dtype=np.float64), 0, None)
        if positives.sum() + negatives.sum() < 1:
            ax.plot([], [], " ", label=f"{disease}: no labelled image")
            continue
        for stated, style in ((centres, "--"), (platt(centres, fitted.slope, fitted.intercept), "-")):
            ece = ece_interval(positives, negatives, stated)
            images, mean_stated, observed = reliability(positives, negatives, stated)
            filled = images > 0
            when = "raw score" if style == "--" else "calibrated"
            ax.plot(mean_stated[filled], observed[filled], style, marker="o", ms=3,
                    label=f"{disease}, {when}: ECE {ece.value:.3f} [{ece.low:.3f}, {ece.high:.3f}]")
    ax.plot([0, 1], [0, 1], color="grey", lw=0.8, ls=":")
    ax.set(xlabel="Stated probability", ylabel="Observed rate of disease", title=title, xlim=(0, 1), ylim=(0, 1.01))
    ax.legend(loc="upper left", fontsize=7)
    fig.tight_layout()
    return fig
