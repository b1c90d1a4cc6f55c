"""The runs of an experiment compared: ``fedauc compare``'s table."""

from __future__ import annotations

import mlflow
import pandas as pd
from mlflow import MlflowClient

from federated.schema import ROLE_TAG, TRAINING_ROLE


def compare_runs(experiment: str, sort_by: str = "AUC macro", include_unfinished: bool = False) -> pd.DataFrame:
    """The experiment's federated trainings (parent runs), best first: federation, sites and status, algorithm,
    I, per-disease pooled test AUC and pAUC (FPR <= 0.3, McClish), macro means, bytes communicated and
    minutes, then the bounds of each AUC's 95 % interval (``AUC <x> low`` / ``high``; ``tables.fold_intervals``
    shows them inside the AUC cells). Runs that did not finish (failed, killed, still running) have no test metrics and are left out
    unless ``include_unfinished``; ``frame.attrs["hidden"]`` counts them."""
    client = MlflowClient()
    found = client.get_experiment_by_name(experiment)
    if found is None:
        raise ValueError(f"no MLflow experiment named {experiment!r} at {mlflow.get_tracking_uri()}")
    runs = client.search_runs(
        [found.experiment_id], filter_string=f"tags.{ROLE_TAG} = '{TRAINING_ROLE}'", max_results=10_000
    )
    rows, hidden = [], 0
    for run in runs:
        if run.info.status != "FINISHED" and not include_unfinished:
            hidden += 1
            continue
        metrics, params = run.data.metrics, run.data.params
        row = {
            "run": run.info.run_name,
            "federation": run.data.tags.get("federation", params.get("federation")),
            "sites": params.get("sites", "").replace(",", ", "),
            "status": run.info.status,
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
        row["MB sent"] = metrics.get("bytes_sent_cumulative", float("nan")) / 1e6
        row["minutes"] = (run.info.end_time - run.info.start_time) / 60_000 if run.info.end_time else float("nan")
        rows.append(row)
    table = pd.DataFrame(rows)
    if not table.empty:
        if sort_by not in table:
            raise ValueError(f"cannot sort by {sort_by!r}; columns are {list(table.columns)}")
        table = table.sort_values(sort_by, ascending=False, na_position="last").reset_index(drop=True)
    table.attrs["hidden"] = hidden
    return table
