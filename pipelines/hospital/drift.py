"""Watching the model in use without patient data: what a day of scoring tells the centre, and the drift figure.

At the hospital: each scoring run's exact counts (``tally``: images scored and refused by reason and, per
disease, a histogram of the probabilities beside the same histogram of the site's own validation split, the
reference, over ``BINS`` bins cut at the reference's quantiles, as PSI is usually computed: a model whose
scores crowd into a narrow range still spreads over the bins) are added to the day's tally, kept beside the
site's shards (``DayTallies``, mode 0600). A day's tally leaves once, when a run of a later day closes it
(``release``): one record per site, model version and day, none for a day that scored and refused nothing,
however often the job runs (every 15 minutes: a record per run would be 35,000 runs per site-year, and the
differences of a day's running totals would give away each run's small counts). A closed day stays in the
file until the centre has its record (``DayTallies.sent``), and ``record`` skips a day the centre already
has: a centre that cannot be reached loses no day, and a run that stops between the two sends none twice. What leaves is under the site's ``sharing:``
policy: a count below ``min_count`` leaves as ``"<min_count"`` (``common.small_counts``, the one rule:
the centre sees that a bin was small, never how small, and counts it as 0); with fewer than ``min_count`` images scored, or a reference of fewer than ``BINS`` x
``min_count`` images, no histogram leaves at all. At a site with a ``privacy:`` budget no edge or histogram
leaves (``withheld``): the edges are exact quantiles of its validation scores and the reference exact counts
of its records, which its budget does not pay for; its counts still do. Nothing per image, no path, no UID.

At the centre (``record``): the day's aggregates as an MLflow run of the task's experiment (tag
``fedauc_role: hospital-scoring``, the site, the day and the model version), and per disease the population
stability index

    PSI = sum_b (a_b - e_b) ln(a_b / e_b)

between the day's proportions ``a`` and the validation split's ``e`` (both floored at ``EPSILON``, so that an
empty or suppressed bin counts as rare, not impossible). Above ``PSI_WARNING`` (0.25, the usual "major
shift" line; 0.1 - 0.25 is read as moderate) ``record`` returns a one-line warning. ``drift_figure`` draws
a site's PSI per disease over its last ``FIGURE_DAYS`` days.
"""

from __future__ import annotations

import datetime as dt
import json
import os
from pathlib import Path

import matplotlib
import matplotlib.dates

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import mlflow
import numpy as np
from mlflow import MlflowClient

from common.small_counts import at_least, is_suppressed, released
from federated.flare.lockdown import write_owner_only
from federated.schema import (
    DAY_TAG,
    DRIFT_WARNING_TAG,
    MODEL_TAG,
    MODEL_VERSION_TAG,
    PSI_METRIC_PREFIX,
    REFUSED_METRIC_PREFIX,
    ROLE_TAG,
    SCORED_METRIC,
    SCORING_AGGREGATES_ARTIFACT,
    SCORING_ROLE,
    SITE_TAG,
    drift_figure_name,
)
from preprocessing.sites import SharingPolicy

BINS = 5
EPSILON = 1e-4
PSI_WARNING = 0.25
# A quarter of daily records: readable on one figure, and what the centre keeps of scoring detail by default.
FIGURE_DAYS = 90


def quantile_edges(reference: np.ndarray) -> np.ndarray:
    """The inner bin edges of one disease: the reference's quantiles (unique; fewer bins when they tie)."""
    values = reference[~np.isnan(reference)]
    return np.unique(np.quantile(values, np.arange(1, BINS) / BINS)) if len(values) else np.zeros(0)


def counts(values: np.ndarray, edges: np.ndarray) -> list[int]:
    values = values[~np.isnan(values)]
    return np.bincount(np.searchsorted(edges, values, side="right"), minlength=len(edges) + 1).astype(int).tolist()


def tally(rows: list[dict], reference: np.ndarray, diseases: list[str]) -> dict:
    """The exact counts of a scoring run's ``rows`` (predict rows) against its validation split's probabilities
    ``reference`` (N, C); they stay at the hospital (``release`` says what leaves)."""
    scored = [row for row in rows if row["status"] == "scored"]
    refused: dict[str, int] = {}
    for row in rows:
        if row["status"] != "scored":
            refused[row["reason"]] = refused.get(row["reason"], 0) + 1
    out = {"scored": len(scored), "refused": dict(sorted(refused.items())), "edges": {}, "histograms": {},
           "reference": {}}
    if scored and len(reference):
        current = np.array([[row[f"p_{d}"] for d in diseases] for row in scored], dtype=np.float64)
        for c, disease in enumerate(diseases):
            edges = quantile_edges(reference[:, c])
            out["edges"][disease] = [round(float(e), 6) for e in edges]
            out["histograms"][disease] = counts(current[:, c], edges)
            out["reference"][disease] = counts(reference[:, c], edges)
    return out


def merge(earlier: dict, later: dict) -> dict:
    """Two tallies of one day added up. Their histograms add where they share their bins (a tally without
    histograms adds to any); where the reference changed (the site's shards written again) the later bins
    are kept and the earlier histograms dropped: a day's drift is read against one reference."""
    refused = {reason: earlier["refused"].get(reason, 0) + later["refused"].get(reason, 0)
               for reason in sorted({*earlier["refused"], *later["refused"]})}
    binned = later if later["edges"] else earlier
    kept = [t for t in (earlier, later)
            if t["edges"] and (t["edges"], t["reference"]) == (binned["edges"], binned["reference"])]
    histograms = {disease: [sum(bins) for bins in zip(*(t["histograms"][disease] for t in kept))]
                  for disease in binned["histograms"]}
    return {"scored": earlier["scored"] + later["scored"], "refused": refused, "edges": binned["edges"],
            "histograms": histograms, "reference": binned["reference"]}


def release(counted: dict, sharing: SharingPolicy, withhold_histograms: bool = False) -> dict:
    """What may leave the hospital of a tally (module docstring): small counts suppressed; no edge and no
    histogram with ``withhold_histograms`` (a site with a privacy budget)."""
    minimum = sharing.min_count
    out = {"min_count": minimum, "scored": released(counted["scored"], minimum),
           "refused": {reason: released(n, minimum) for reason, n in counted["refused"].items()},
           "edges": {}, "histograms": {}, "reference": {}}
    binned = sum(next(iter(counted["histograms"].values()), []))
    in_reference = sum(next(iter(counted["reference"].values()), []))
    if withhold_histograms:
        out["withheld"] = ("edges and histograms: the site has a privacy budget; the edges are exact quantiles of "
                           "its validation scores")
    elif binned >= minimum and in_reference >= BINS * minimum:
        for disease, edges in counted["edges"].items():
            out["edges"][disease] = edges
            for key in ("histograms", "reference"):
                out[key][disease] = [released(n, minimum) for n in counted[key][disease]]
    return out


def aggregates(rows: list[dict], reference: np.ndarray, diseases: list[str], sharing: SharingPolicy) -> dict:
    """What may leave the hospital about ``rows`` scored at once: ``release`` of their ``tally``."""
    return release(tally(rows, reference, diseases), sharing)


class DayTallies:
    """The days not yet sent, per model version, in one file beside the site's shards (mode 0600): exact
    counts, so they stay at the hospital."""

    def __init__(self, path: str | Path):
        self.path = Path(path)

    def _read(self) -> dict[str, dict[str, dict]]:  # model version -> day -> tally
        return json.loads(self.path.read_text()) if self.path.is_file() else {}

    def _write(self, days: dict[str, dict[str, dict]]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        partial = self.path.with_name(self.path.name + ".partial")
        partial.unlink(missing_ok=True)
        write_owner_only(partial, json.dumps(days))
        os.replace(partial, self.path)

    def add(self, key: str, today: dt.date, run: dict) -> list[tuple[str, str, dict]]:
        """Add a run's tally (of model version ``key``) to ``today``'s; returns every earlier day's as
        ``(key, day, tally)``, closed, to send. A run that scored and refused nothing adds nothing."""
        days, day = self._read(), today.isoformat()
        if run["scored"] or run["refused"]:
            mine = days.setdefault(key, {})
            mine[day] = merge(mine[day], run) if day in mine else run
            self._write(days)
        return [(k, d, counted) for k, by_day in sorted(days.items()) for d, counted in sorted(by_day.items())
                if d < day]

    def sent(self, key: str, day: str) -> None:
        """The centre has the day's record: its tally goes."""
        days = self._read()
        days.get(key, {}).pop(day, None)
        self._write({k: by_day for k, by_day in days.items() if by_day})


def psi(current, reference) -> float:
    """The population stability index of two histograms over the same bins (module docstring)."""
    a, e = (np.asarray([at_least(n) for n in counts], dtype=np.float64) for counts in (current, reference))
    if a.sum() == 0 or e.sum() == 0:
        return float("nan")
    a, e = np.maximum(a / a.sum(), EPSILON), np.maximum(e / e.sum(), EPSILON)
    return float(np.sum((a - e) * np.log(a / e)))


def record(task: str, site: str, model: str, version: str, summary: dict, day: str | None = None) -> list[str]:
    """A day's aggregates of the site (default today's) in the centre's MLflow against the model version, unless
    the centre has that day's record already; returns the warnings."""
    from pipelines import tracking

    day = day or dt.date.today().isoformat()
    experiment = tracking.experiment_id(task)
    tags = {ROLE_TAG: SCORING_ROLE, SITE_TAG: site, DAY_TAG: day, MODEL_TAG: model, MODEL_VERSION_TAG: version}
    if MlflowClient().search_runs([experiment], " and ".join(f"tags.{k} = '{v}'" for k, v in tags.items()),
                                  max_results=1):
        return []
    warnings = []
    released_counts = {SCORED_METRIC: summary["scored"],
                       **{f"{REFUSED_METRIC_PREFIX}{k}": v for k, v in summary["refused"].items()}}
    metrics = {key: count for key, count in released_counts.items() if not is_suppressed(count)}
    for disease, binned in summary["histograms"].items():
        value = psi(binned, summary["reference"][disease])
        metrics[f"{PSI_METRIC_PREFIX}{disease}"] = value
        if value > PSI_WARNING:
            warnings.append(f"drift: site {site}, {disease}: PSI {value:.2f} > {PSI_WARNING} between model {model} "
                            f"v{version}'s scores of {day} and the site's validation scores")
    with mlflow.start_run(experiment_id=experiment, run_name=f"scoring {site} {day}", tags=tags):
        mlflow.log_metrics({k: float(v) for k, v in metrics.items()})
        mlflow.log_dict(summary, SCORING_AGGREGATES_ARTIFACT)
        if warnings:
            mlflow.set_tag(DRIFT_WARNING_TAG, " | ".join(warnings)[:5000])
        figure = drift_figure(task, site)
        if figure is not None:
            mlflow.log_figure(figure, drift_figure_name(site))
            plt.close(figure)
    return warnings


def drift_figure(task: str, site: str, days: int = FIGURE_DAYS):
    """PSI per disease over the site's last ``days`` scoring records (every model version), in the order of
    their days; None before any. A fixed window: the figure is drawn again with every day's record, and a
    figure of all the days so far would make a year's figures grow with the square of the days."""
    from pipelines import tracking

    runs = MlflowClient().search_runs([tracking.experiment_id(task)],
                                      f"tags.{ROLE_TAG} = '{SCORING_ROLE}' and tags.site = '{site}'",
                                      max_results=days, order_by=["tags.day DESC"])
    series: dict[str, list[tuple[dt.date, float]]] = {}
    for run in runs:
        day = dt.date.fromisoformat(run.data.tags["day"])
        for key, value in run.data.metrics.items():
            if key.startswith("psi/"):
                series.setdefault(key.removeprefix("psi/"), []).append((day, value))
    if not series:
        return None
    fig, ax = plt.subplots(figsize=(6, 3.5))
    for disease, points in sorted(series.items()):
        when, values = zip(*sorted(points))
        ax.plot(when, values, marker="o", ms=3, label=disease)
    ax.axhline(PSI_WARNING, color="tab:red", ls="--", lw=1, label=f"warning ({PSI_WARNING})")
    ax.set(ylabel="PSI vs validation", title=f"{task} at {site}: drift of the scores, last {days} records")
    ax.xaxis.set_major_formatter(matplotlib.dates.ConciseDateFormatter(ax.xaxis.get_major_locator()))
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig
