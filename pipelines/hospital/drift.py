"""Watching the model in use without patient data: what a scoring run tells the centre, and the drift figure.

At the hospital (``aggregates``): how many images were scored and refused (by reason) and, per disease, a
histogram of the probabilities beside the same histogram of the site's own validation split (the
reference), over ``BINS`` bins cut at the reference's quantiles (as PSI is usually computed: a model whose
scores crowd into a narrow range still spreads over the bins; the edges, quantiles of at least ``BINS`` x
``min_count`` validation images, leave with the counts). Under the site's ``sharing:`` policy: a count below ``min_count`` leaves
as 0 and is named in ``suppressed`` (the centre sees that a bin was small, never how small), and with fewer
than ``min_count`` images scored no histogram leaves at all. Nothing per image, no path, no UID.

At the centre (``record``): the aggregates as an MLflow run of the task's experiment (tag ``fedauc_role:
hospital-scoring``, the model version and the site), and per disease the population stability index

    PSI = sum_b (a_b - e_b) ln(a_b / e_b)

between the run's proportions ``a`` and the validation split's ``e`` (both floored at ``EPSILON``, so that an
empty or suppressed bin counts as rare, not impossible). Above ``PSI_WARNING`` (0.25, the usual "major
shift" line; 0.1 - 0.25 is read as moderate) ``record`` returns a one-line warning. ``drift_figure`` draws
a site's PSI per disease over its scoring runs.
"""

from __future__ import annotations

import time

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import mlflow
import numpy as np
from mlflow import MlflowClient

from preprocessing.sites import SharingPolicy

BINS = 5
EPSILON = 1e-4
PSI_WARNING = 0.25
ROLE = "hospital-scoring"


def quantile_edges(reference: np.ndarray) -> np.ndarray:
    """The inner bin edges of one disease: the reference's quantiles (unique; fewer bins when they tie)."""
    values = reference[~np.isnan(reference)]
    return np.unique(np.quantile(values, np.arange(1, BINS) / BINS)) if len(values) else np.zeros(0)


def counts(values: np.ndarray, edges: np.ndarray) -> list[int]:
    values = values[~np.isnan(values)]
    return np.bincount(np.searchsorted(edges, values, side="right"), minlength=len(edges) + 1).astype(int).tolist()


def aggregates(rows: list[dict], reference: np.ndarray, diseases: list[str], sharing: SharingPolicy) -> dict:
    """What may leave the hospital about a scoring run's ``rows`` (predict rows) and its validation split's
    probabilities ``reference`` (N, C)."""
    minimum, suppressed = sharing.min_count, []

    def small(name: str, count: int) -> int:
        if 0 < count < minimum:
            suppressed.append(name)
            return 0
        return count

    scored = [row for row in rows if row["status"] == "scored"]
    refused: dict[str, int] = {}
    for row in rows:
        if row["status"] != "scored":
            refused[row["reason"]] = refused.get(row["reason"], 0) + 1
    out = {"min_count": minimum, "scored": small("scored", len(scored)),
           "refused": {reason: small(f"refused/{reason}", n) for reason, n in sorted(refused.items())},
           "edges": {}, "histograms": {}, "reference": {}}
    if len(scored) >= minimum and len(reference) >= BINS * minimum:
        current = np.array([[row[f"p_{d}"] for d in diseases] for row in scored], dtype=np.float64)
        for c, disease in enumerate(diseases):
            edges = quantile_edges(reference[:, c])
            out["edges"][disease] = [round(float(e), 6) for e in edges]
            for key, values in (("histograms", current[:, c]), ("reference", reference[:, c])):
                out[key][disease] = [small(f"{key}/{disease}/{b}", n) for b, n in enumerate(counts(values, edges))]
    out["suppressed"] = suppressed
    return out


def psi(current, reference) -> float:
    """The population stability index of two histograms over the same bins (module docstring)."""
    a, e = np.asarray(current, dtype=np.float64), np.asarray(reference, dtype=np.float64)
    if a.sum() == 0 or e.sum() == 0:
        return float("nan")
    a, e = np.maximum(a / a.sum(), EPSILON), np.maximum(e / e.sum(), EPSILON)
    return float(np.sum((a - e) * np.log(a / e)))


def record(task: str, site: str, model: str, version: str, summary: dict) -> list[str]:
    """The run's aggregates in the centre's MLflow against the model version; returns the warnings."""
    from pipelines import tracking

    experiment = tracking.experiment_id(task)
    warnings = []
    metrics = {"scored": summary["scored"], **{f"refused/{k}": v for k, v in summary["refused"].items()}}
    for disease, counts in summary["histograms"].items():
        value = psi(counts, summary["reference"][disease])
        metrics[f"psi/{disease}"] = value
        if value > PSI_WARNING:
            warnings.append(f"drift: site {site}, {disease}: PSI {value:.2f} > {PSI_WARNING} between model {model} "
                            f"v{version}'s scores and the site's validation scores")
    with mlflow.start_run(experiment_id=experiment, run_name=f"scoring {site}", tags={
            "fedauc_role": ROLE, "site": site, "model": model, "model_version": version}):
        mlflow.log_metrics({k: float(v) for k, v in metrics.items()})
        mlflow.log_dict(summary, "scoring_aggregates.json")
        if warnings:
            mlflow.set_tag("drift_warning", " | ".join(warnings)[:5000])
        figure = drift_figure(task, site)
        if figure is not None:
            mlflow.log_figure(figure, f"drift_{site}.png")
            plt.close(figure)
    return warnings


def drift_figure(task: str, site: str):
    """PSI per disease over the site's scoring runs (all model versions, oldest first); None before any."""
    from pipelines import tracking

    client = MlflowClient()
    runs = client.search_runs([tracking.experiment_id(task)],
                              f"tags.fedauc_role = '{ROLE}' and tags.site = '{site}'", order_by=["attributes.start_time ASC"])
    series: dict[str, list[tuple[float, float]]] = {}
    for run in runs:
        for key, value in run.data.metrics.items():
            if key.startswith("psi/"):
                series.setdefault(key.removeprefix("psi/"), []).append((run.info.start_time / 1000, value))
    if not series:
        return None
    fig, ax = plt.subplots(figsize=(6, 3.5))
    for disease, points in sorted(series.items()):
        times, values = zip(*points)
        ax.plot([time.strftime("%m-%d %H:%M", time.localtime(t)) for t in times], values, marker="o", label=disease)
    ax.axhline(PSI_WARNING, color="tab:red", ls="--", lw=1, label=f"warning ({PSI_WARNING})")
    ax.set(ylabel="PSI vs validation", title=f"{task} at {site}: drift of the scores")
    ax.tick_params(axis="x", labelrotation=30, labelsize=7)
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig
