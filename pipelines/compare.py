"""The runs of an experiment compared: ``fedauc compare``'s table.

Read from an MLflow server (MLFLOW_TRACKING_URI=http(s)://..., the centre's setup) over MLflow's REST API with
the standard library (pipelines/mlflow_rest.py), without importing MLflow (over a second of the command's
start); from any other store (the embedded SQLite file, a database URI) with MLflow's client. Both readers give
the same ``TrainingRun`` records, and one function (``training_rows``) makes the table's rows of them.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, NamedTuple

from federated.schema import CONTINUES_TAG, ROLE_TAG, TRAINING_ROLE
from pipelines import mlflow_rest
from pipelines.store_uri import tracking_uri

if TYPE_CHECKING:
    import pandas as pd
    from mlflow.entities import Run

TRAININGS = f"tags.{ROLE_TAG} = '{TRAINING_ROLE}'"  # the trainings' parent runs (not their site runs)


class TrainingRun(NamedTuple):
    """What the table reads of a training's run, whichever reader read it. Times in ms since the epoch."""

    run_id: str
    name: str
    status: str
    start_time: int
    end_time: int | None
    metrics: dict[str, float]  # each metric's latest value
    params: dict[str, str]
    tags: dict[str, str]


def from_client(run: Run) -> TrainingRun:
    info, data = run.info, run.data
    return TrainingRun(info.run_id, info.run_name, info.status, info.start_time, info.end_time, data.metrics,
                       data.params, data.tags)


def from_rest(run: dict) -> TrainingRun:
    """A run of the REST API's ``runs/search`` answer (its fields at their proto defaults where left out)."""
    info, data = run["info"], run.get("data", {})
    pairs = {part: {item["key"]: item.get("value", "") for item in data.get(part, [])} for part in ("params", "tags")}
    return TrainingRun(info["run_id"], info.get("run_name", ""), info["status"], int(info.get("start_time", 0)),
                       int(info["end_time"]) if "end_time" in info else None,
                       # float() reads the "NaN" and "Infinity" the API writes for those values
                       {m["key"]: float(m.get("value", 0.0)) for m in data.get("metrics", [])},
                       pairs["params"], pairs["tags"])


def read_trainings(experiment: str, uri: str) -> list[TrainingRun]:
    """The trainings of ``experiment`` at the store ``uri``, newest first; a ValueError names a missing one."""
    if mlflow_rest.reads_over_http(uri):
        server = mlflow_rest.TrackingServer(uri)
        found = server.experiment_id(experiment)
        runs = [] if found is None else [from_rest(run) for run in server.search_runs([found], TRAININGS)]
    else:
        from mlflow import MlflowClient

        client = MlflowClient(tracking_uri=uri)
        found = getattr(client.get_experiment_by_name(experiment), "experiment_id", None)
        runs, token = [], None
        while found is not None:
            page = client.search_runs([found], filter_string=TRAININGS, max_results=mlflow_rest.SEARCH_PAGE,
                                      page_token=token)
            runs.extend(from_client(run) for run in page)
            token = page.token
            if not token:
                break
    if found is None:
        raise ValueError(f"no MLflow experiment named {experiment!r} at {uri}")
    return runs


def compare_runs(experiment: str, sort_by: str = "AUC macro", include_unfinished: bool = False,
                 uri: str | None = None) -> pd.DataFrame:
    """``training_rows`` of the experiment's trainings at ``uri`` (default: MLFLOW_TRACKING_URI, else the
    project's embedded store: pipelines/store_uri.py) as a frame; ``frame.attrs["hidden"]`` counts the
    unfinished runs left out."""
    import pandas as pd

    columns, rows, hidden = training_rows(read_trainings(experiment, uri or tracking_uri()), sort_by,
                                          include_unfinished)
    table = pd.DataFrame(rows, columns=columns)
    table.attrs["hidden"] = hidden
    return table


def training_rows(runs: list[TrainingRun], sort_by: str = "AUC macro",
                  include_unfinished: bool = False) -> tuple[list[str], list[dict], int]:
    """The federated trainings (parent runs), best first by ``sort_by`` (missing values last, ties newest
    first): federation, sites and status, algorithm, I, per-disease pooled test AUC and pAUC (FPR <= 0.3,
    McClish), macro means, bytes communicated and minutes (a resumed training's with the runs it continues, its ``CONTINUES_TAG``),
    then the bounds of each AUC's 95 % interval (``AUC <x> low`` / ``high``; ``tables.fold_intervals`` shows
    them inside the AUC cells). Runs that did not finish (failed, killed, still running) are left out unless
    ``include_unfinished``, and then listed by status without AUCs (a failed run's last evaluation during
    training is not its result). Returns the columns (every row's, in order of appearance), the rows (a
    column a row lacks is missing from its dict) and the count of unfinished runs left out."""
    by_id = {run.run_id: run for run in runs}
    rows, hidden = [], 0
    for run in runs:
        if run.status != "FINISHED" and not include_unfinished:
            hidden += 1
            continue
        metrics, params = run.metrics, run.params
        row = {
            "run": run.name,
            "federation": run.tags.get("federation", params.get("federation")),
            "sites": params.get("sites", "").replace(",", ", "),
            "status": run.status,
            "algorithm": params.get("algorithm"),
            "I": int(params.get("local_steps", 0)),
            "rounds": int(params.get("rounds", 0)),
        }
        for prefix, short in (("test/pooled/auc", "AUC"), ("test/pooled/pauc_fpr0.3_mcclish", "pAUC0.3")):
            row[f"{short} macro"] = metrics.get(f"{prefix}_macro", float("nan"))
            row.update({f"{short} {key.rsplit('/', 1)[1]}": value for key, value in sorted(metrics.items())
                        if key.startswith(prefix + "/")})
        for end in ("low", "high"):  # the 95 % interval of each pooled AUC (federated.evaluation.pooled_auc_intervals)
            row[f"AUC macro {end}"] = metrics.get(f"test/pooled/auc_ci95_{end}_macro", float("nan"))
            row.update({f"AUC {key.rsplit('/', 1)[1]} {end}": value for key, value in sorted(metrics.items())
                        if key.startswith(f"test/pooled/auc_ci95_{end}/")})
        if run.status != "FINISHED":  # its last evaluation during training, not a result: no AUC shown
            row.update({key: float("nan") for key in row if key.startswith(("AUC", "pAUC"))})
        # A resumed training's totals cover the runs it continues (their rounds are its first ones).
        parts = [run, *(by_id[i] for i in run.tags.get(CONTINUES_TAG, "").split(",") if i in by_id)]
        row["MB sent"] = sum(p.metrics.get("bytes_sent_cumulative", 0.0) for p in parts) / 1e6 \
            if "bytes_sent_cumulative" in metrics else float("nan")
        row["minutes"] = sum((p.end_time or p.start_time) - p.start_time for p in parts) / 60_000 \
            if run.end_time else float("nan")
        rows.append(row)
    columns = list(dict.fromkeys(column for row in rows for column in row))
    if rows and sort_by not in columns:
        raise ValueError(f"cannot sort by {sort_by!r}; columns are {columns}")
    present = [row for row in rows if not _missing(row.get(sort_by))]
    ordered = sorted(present, key=lambda row: row[sort_by], reverse=True)
    return columns, ordered + [row for row in rows if _missing(row.get(sort_by))], hidden


def _missing(value) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))
