"""What MLflow's own description fields say, so its UI answers "which method won, by how much, which version is
the champion and why" without opening a JSON: a training run's result, a registered model's champion rule and
comparison table (rewritten whenever the alias may move), each version's card.

Every figure is read back from MLflow (the training runs' metrics and params, the versions' tags), so a
description never disagrees with the record it summarizes.
"""

from __future__ import annotations

import math

from mlflow import MlflowClient
from mlflow.exceptions import MlflowException

from federated.schema import (
    CHAMPION_ALIAS,
    COLLAPSED_TAG,
    DESCRIPTION_TAG,
    HEADLINE_INTERVAL,
    HEADLINE_METRIC,
    SELECTION_METRIC,
    SELECTION_METRIC_TAG,
    registered_model_name,
)

CHAMPION_RULE = (
    "The champion (alias `champion`) is the version with the highest pooled **validation** macro AUC, compared only "
    "between versions scored on the same sites and shards (a champion from another federation is re-evaluated "
    "there first); a version whose scores collapsed to 0.5 never wins. Test AUCs below are reported, never used "
    "to choose.")


def _auc(value: float | None) -> str:
    return "n/a" if value is None or math.isnan(value) else f"{value:.3f}"


def headline(metrics: dict[str, float]) -> str:
    """The pooled test macro AUC with its 95 % interval, e.g. ``0.812 [0.771, 0.853]``."""
    low, high = (metrics.get(key) for key in HEADLINE_INTERVAL)
    interval = "" if low is None or high is None or math.isnan(low) else f" [{_auc(low)}, {_auc(high)}]"
    return _auc(metrics.get(HEADLINE_METRIC)) + interval


def training_description(params: dict[str, str], metrics: dict[str, float], version: str, promoted: bool,
                         champion: str | None = None) -> str:
    """A finished training's result as its run's description; ``promoted``: its version holds the champion alias
    now (``champion``: the version that does otherwise). Rewritten whenever the alias moves
    (``pipelines.model_card.alias_moved``), so only the champion's training says it is one."""
    sites = params.get("sites", "").replace(",", ", ")
    outcome = ("the champion" if promoted else
               f"not the champion (version {champion} is)" if champion else "not the champion")
    return (f"**Pooled test macro AUC {headline(metrics)}** (95 % interval), pooled validation macro AUC "
            f"{_auc(metrics.get(SELECTION_METRIC))}.\n\n"
            f"Algorithm **{params.get('algorithm', '?')}**, {params.get('rounds', '?')} rounds of "
            f"{params.get('I', '?')} local steps, network {params.get('network', '?')}; federation "
            f"{params.get('federation', '?')} of {params.get('K', '?')} sites ({sites}).\n\n"
            f"Registered as `{registered_model_name(params.get('task', '?'))}` version {version}: {outcome} "
            "(chosen on validation).")


def describe_training(run_id: str, version: str, promoted: bool, champion: str | None = None) -> None:
    client = MlflowClient()
    run = client.get_run(run_id)
    client.set_tag(run_id, DESCRIPTION_TAG,
                   training_description(run.data.params, run.data.metrics, version, promoted, champion))


def version_description(contract, algorithm: str, selection_metric: float) -> str:
    """A version's card: what it is, how it scored, what it outputs, where its thresholds come from."""
    lines = [f"**{algorithm}** on {contract.task}: pooled validation macro AUC {_auc(selection_metric)} "
             "(what the champion is chosen by).",
             f"Diseases (outputs, in order): {', '.join(contract.diseases)}.",
             f"Network {contract.network}, input {'x'.join(map(str, contract.input_shape))}."]
    if contract.provenance is not None:
        lines.append(f"Provenance: {contract.provenance.describe()}; code {contract.code_version}.")
    lines.extend(operating_point_lines(contract.operating_points))
    return "\n".join(lines)


def operating_point_lines(points) -> list[str]:
    """The operating points (``thresholds.OperatingPoints`` or None) as Markdown lines: a version's description
    and its model card."""
    if points is None:
        return ["Operating points: none (no defined validation score to set them from)."]
    lines = [f"Operating points (from {points.source}):"]
    for disease, named in points.points.items():
        shown = "; ".join(f"{name}: threshold {p.threshold:.3f}, sensitivity {p.sensitivity:.2f}, "
                          f"specificity {p.specificity:.2f}" for name, p in named.items())
        lines.append(f"- {disease}: {shown}")
    lines.extend(f"- {disease}: undefined ({why})" for disease, why in points.undefined.items())
    return lines


def comparison_rows(task: str) -> list[dict[str, str]]:
    """One row per registered version, best validation score first: what the registered model's table shows."""
    client = MlflowClient()
    name = registered_model_name(task)
    try:
        champion = str(client.get_model_version_by_alias(name, CHAMPION_ALIAS).version)
    except MlflowException:  # no alias yet: nothing is champion
        champion = None
    rows = []
    for version in client.search_model_versions(f"name = '{name}'"):
        run = _run_data(client, version.run_id)
        metrics = run.metrics if run else {}
        selection = float(version.tags.get(SELECTION_METRIC_TAG, "nan"))
        rows.append({"version": str(version.version),
                     "algorithm": (run.params.get("algorithm", "?") if run else "?"),
                     "valid AUC (chooses)": _auc(selection),
                     "test AUC [95 % interval]": headline(metrics),
                     "": ("**champion**" if str(version.version) == champion
                          else "collapsed" if COLLAPSED_TAG in version.tags else ""),
                     "_rank": -math.inf if math.isnan(selection) else selection})
    rows.sort(key=lambda row: (-row["_rank"], int(row["version"])))
    return [{k: v for k, v in row.items() if k != "_rank"} for row in rows]


def _run_data(client: MlflowClient, run_id: str | None):
    """A version's training run's data; None where the run is gone (deleted by hand): the row says "?"."""
    try:
        return client.get_run(run_id).data if run_id else None
    except MlflowException:
        return None


def registered_model_description(task: str) -> str:
    rows = comparison_rows(task)
    if not rows:
        return CHAMPION_RULE
    header = list(rows[0])
    table = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    table += ["| " + " | ".join(row[h] for h in header) + " |" for row in rows]
    return CHAMPION_RULE + "\n\n" + "\n".join(table)


def describe_registered_model(task: str) -> None:
    """Rewrite the registered model's description (call after anything that may move the alias)."""
    MlflowClient().update_registered_model(registered_model_name(task),
                                           description=registered_model_description(task))
