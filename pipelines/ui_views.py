"""The links ``fedauc ui`` prints, one per question, so that each answer is one click away.

Per task: the experiment's trainings, best pooled test AUC first with that column and its interval shown; the
champion's version page (its description says what it is, pipelines/descriptions.py); the task's Prefect flow runs.

MLflow 3.17's runs table takes its filter, sort and columns from a *shared view*: the URL parameter
``viewStateShareKey=<key>`` names the experiment tag ``mlflow.sharedViewState.<key>``, a JSON object of the
search facets (``searchFilter``, ``orderByKey``, ``orderByAsc``) and the table's state (``selectedColumns``).
URL search parameters alone cannot choose columns, and with one present the UI ignores the shared view, so the
link carries the key only (on ``/runs``: the redirect from the bare experiment route drops it) (and ``workflowType``, which picks the model-training view: pipelines/mlflow_ui.py).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from urllib.parse import quote, urlencode

from mlflow import MlflowClient
from mlflow.exceptions import MlflowException

from federated.schema import (
    CHAMPION_ALIAS,
    HEADLINE_INTERVAL,
    HEADLINE_METRIC,
    ROLE_TAG,
    SELECTION_METRIC,
    TRAINING_ROLE,
    registered_model_name,
)

SHARED_VIEW_TAG_PREFIX = "mlflow.sharedViewState."
TRAININGS_VIEW = "fedauc-trainings"
TRAINING_WORKFLOW = {"workflowType": "machine_learning"}
METRIC_COLUMN_WIDTH = 250  # pixels: "test/pooled/auc_ci95_high_macro" in full


def _column(kind: str, name: str) -> str:
    """MLflow's canonical column key (``metrics.`name```), as its runs table and sort keys spell them."""
    return f"{kind}.`{name}`"


def trainings_view_state() -> dict:
    """The shared view: trainings only (no site runs, no evaluations), best pooled test AUC first, the columns
    that answer "which method won, by how much" in that order, wide enough that their names differ (MLflow cuts
    a header at its column's width, and every pooled test metric starts ``test/pooled/auc``)."""
    metrics = [_column("metrics", key) for key in (HEADLINE_METRIC, *HEADLINE_INTERVAL, SELECTION_METRIC)]
    columns = [_column("params", "algorithm"), *metrics, _column("params", "sites"), _column("attributes", "Models")]
    return {
        "searchFilter": f"tags.{ROLE_TAG} = '{TRAINING_ROLE}'",
        "orderByKey": metrics[0],
        "orderByAsc": False,
        "selectedColumns": columns,
        "columnOrder": [_column("attributes", "Run Name"), *columns],
        "columnWidths": dict.fromkeys(metrics, METRIC_COLUMN_WIDTH),
    }


@dataclass(frozen=True)
class TaskLinks:
    task: str
    trainings: str
    champion: str | None  # the champion version's page; None before any model is registered
    flow_runs: str


def publish_views(client: MlflowClient | None = None) -> list[tuple[str, str, str | None]]:
    """Write the trainings view on every experiment that holds a training; (task, experiment id, champion
    version or None) for each, by task name."""
    client = client or MlflowClient()
    state = json.dumps(trainings_view_state())
    found = []
    for experiment in client.search_experiments():
        if not client.search_runs([experiment.experiment_id], f"tags.{ROLE_TAG} = '{TRAINING_ROLE}'", max_results=1):
            continue
        if experiment.tags.get(SHARED_VIEW_TAG_PREFIX + TRAININGS_VIEW) != state:
            client.set_experiment_tag(experiment.experiment_id, SHARED_VIEW_TAG_PREFIX + TRAININGS_VIEW, state)
        try:
            champion = str(client.get_model_version_by_alias(registered_model_name(experiment.name),
                                                             CHAMPION_ALIAS).version)
        except MlflowException:  # no registered model or no alias yet
            champion = None
        found.append((experiment.name, experiment.experiment_id, champion))
    return sorted(found)


def task_links(mlflow_url: str, prefect_url: str, client: MlflowClient | None = None) -> list[TaskLinks]:
    """The links of every task with a training (``publish_views`` writes the views they open)."""
    links = []
    for task, experiment_id, champion in publish_views(client):
        query = urlencode({"viewStateShareKey": TRAININGS_VIEW, **TRAINING_WORKFLOW})
        version_page = None if champion is None else (
            f"{mlflow_url}/#/models/{quote(registered_model_name(task))}/versions/{champion}?"
            + urlencode(TRAINING_WORKFLOW))
        links.append(TaskLinks(task, f"{mlflow_url}/#/experiments/{experiment_id}/runs?{query}", version_page,
                               f"{prefect_url}/runs?{urlencode({'flow-run-search': task, 'task-run-search': task})}"))
    return links


def links_text(links: list[TaskLinks]) -> str:
    if not links:
        return "No training recorded yet: `fedauc demo` or `fedauc train` first, then these links answer per task."
    lines = []
    for link in links:
        lines.append(f"{link.task}:")
        lines.append(f"  trainings, best pooled test AUC first: {link.trainings}")
        lines.append(f"  champion (chosen on validation): {link.champion or 'none registered yet'}")
        lines.append(f"  Prefect flow runs: {link.flow_runs}")
    return "\n".join(lines)
