"""The runs of an experiment compared: ``fedauc compare``'s table."""

from __future__ import annotations

import mlflow
import pandas as pd
from mlflow import MlflowClient

from federated.schema import CONTINUES_TAG, ROLE_TAG, TRAINING_ROLE


def compare_runs(experiment: str, sort_by: str = "AUC macro", include_unfinished: bool = False) -> pd.DataFrame:
    """The experiment's federated trainings (parent runs), best first: federation, sites and status, algorithm,
    I, per-disease pooled test AUC and pAUC (FPR <= 0.3, McClish), macro means, bytes communicated and
    minutes (a resumed training's with the runs it continues, its ``CONTINUES_TAG``), then the bounds of each AUC's 95 % interval (``AUC <x> low`` / ``high``; ``tables.fold_intervals``
    shows them inside the AUC cells). Runs that did not finish (failed, killed, still running) are left out
    unless ``include_unfinished``, and then listed by status without AUCs (a failed run's last evaluation
    during training is not its result); ``frame.attrs["hidden"]`` counts them."""
    client = MlflowClient()
    found = client.get_experiment_by_name(experiment)
    if found is None:
        raise ValueError(f"no MLflow experiment named {experiment!r} at {mlflow.get_tracking_uri()}")
    runs = client.search_runs(
        [found.experiment_id], filter_string=f"tags.{ROLE_TAG} = '{TRAINING_ROLE}'", max_results=10_000
    )
    by_id = {run.info.run_id: run for run in runs}
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
        if run.info.status != "FINISHED":  # its last evaluation during training, not a result: no AUC shown
            row.update({key: float("nan") for key in row if key.startswith(("AUC", "pAUC"))})
        # A resumed training's totals cover the runs it continues (their rounds are its first ones).
        parts = [run, *(by_id[i] for i in run.data.tags.get(CONTINUES_TAG, "").split(",") if i in by_id)]
        row["MB sent"] = sum(p.data.metrics.get("bytes_sent_cumulative", 0.0) for p in parts) / 1e6 \
            if "bytes_sent_cumulative" in metrics else float("nan")
        row["minutes"] = sum((p.info.end_time or p.info.start_time) - p.info.start_time for p in parts) / 60_000 \
            if run.info.end_time else float("nan")
        rows.append(row)
    table = pd.DataFrame(rows)
    if not table.empty:
        if sort_by not in table:
            raise ValueError(f"cannot sort by {sort_by!r}; columns are {list(table.columns)}")
        table = table.sort_values(sort_by, ascending=False, na_position="last").reset_index(drop=True)
    table.attrs["hidden"] = hidden
    return table
