"""A federated training recorded in MLflow: what the ``train_federated`` flow and ``fedauc train`` run.

One parent run per training (params: algorithm and every hyperparameter, sites, K, I, shard hashes, code
version) and one child run per site. Per-round metrics go where they belong: pooled and
macro-over-sites values and the bytes communicated to the parent, a site's own metrics and bytes to its
child run. At the end: the pooled test ROC (from the sites' summed score histograms), the sites' QC
summaries (counts only, small ones suppressed; the QC report itself stays at the site) and shard hashes as
each site reports them (over NVIDIA FLARE the sites send them: the centre opens no shard), which metrics were
suppressed, the config, and the global model, registered as ``fedauc-<task>`` with the champion alias moved
when it wins on pooled validation macro-AUC on the same sites' validation splits (pipelines/champion.py).
Importable and testable without Prefect.
"""

from __future__ import annotations

import json
import math
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import matplotlib.pyplot as plt
import mlflow
import pandas as pd
from mlflow import MlflowClient
from mlflow.entities import Metric

from common.small_counts import released
from federated import TrainConfig, get_algorithm
from federated.launch import InProcess, Launcher
from federated.schema import (
    ALGORITHM_PARAM_PREFIX,
    CODE_VERSION_PARAM,
    CONFIG_ARTIFACT,
    CONTINUES_TAG,
    FEDERATION_PARAM,
    FEDERATION_TAG,
    HEADLINE_METRIC,
    I_PARAM,
    K_PARAM,
    PARENT_RUN_TAG,
    PRIVACY_BUDGET_CHANGE_TAG,
    PRIVACY_METRICS,
    PRIVACY_PREFIX,
    QC_FOLDER,
    QC_SUMMARY_JSON,
    QC_SUMMARY_MD,
    ROC_ARTIFACT,
    ROLE_TAG,
    SELECTION_METRIC,
    SHARD_HASH_PARAM_PREFIX,
    SITE,
    SITE_ROLE,
    SITE_TAG,
    SITES_PARAM,
    SUPPRESSED_ARTIFACT,
    TASK_PARAM,
    TRAINING_ROLE,
    MetricKey,
)
from federated.settings import TrainSettings
from federated.sites import federation_config, trained_diseases, training_settings
from federated.version import code_version
from pipelines import descriptions, plots, registry, tracking
from pipelines.champion import register_candidate
from pipelines.tables import markdown_table
from preprocessing.federation import Federation
from preprocessing.qc import render_central_markdown
from preprocessing.qc_counts import SAMPLE_GRID_FILE, suppressed_label_counts


@dataclass
class TrainingRun:
    run_id: str
    run_name: str
    algorithm: str
    local_steps: int
    model_version: str
    promoted: bool
    final_metrics: dict[str, float]
    seconds: float


def training_params(config: TrainConfig, federation: Federation) -> dict[str, str]:
    """Every hyperparameter, the algorithm's defaults resolved, plus what identifies the code. The data's
    identity (each site's shard hash) comes from the sites' reports (:func:`site_params`)."""
    algorithm_params = get_algorithm(config.algorithm).Params(**config.params).model_dump()
    params = dict(config.model_dump(exclude={"sites", "params"}))
    params.update({f"{ALGORITHM_PARAM_PREFIX}{key}": value for key, value in algorithm_params.items()})
    params.update({
        FEDERATION_PARAM: federation.name,
        TASK_PARAM: federation.task,
        SITES_PARAM: ",".join(site.name for site in federation.sites),
        K_PARAM: len(federation.sites),
        I_PARAM: config.local_steps,
        CODE_VERSION_PARAM: code_version(),
    })
    return {key: str(value) for key, value in params.items()}


def site_params(reports: list[dict]) -> dict[str, str]:
    return {f"{SHARD_HASH_PARAM_PREFIX}{report['site']}": report["shard_hash"] for report in reports}


def named_sites(suppressed: dict[str, str], names: list[str]) -> dict[str, str]:
    """The engine's suppression record with each site named, as every other record names it (the engine's keys
    carry the site's index)."""
    out = {}
    for key, why in suppressed.items():
        parsed = MetricKey.parse(key)
        if parsed.scope == SITE and parsed.site.isdigit():
            key = str(MetricKey(parsed.split, SITE, parsed.metric, names[int(parsed.site)]))
        out[key] = why
    return out


# What a site sends as NaN under differential privacy (federated/dp/site.py, federated/timing.py): not logged.
WITHHELD_UNDER_DP = ("train_loss", "round_seconds", "compute_seconds", "wait_seconds")


class RoundLogger:
    """Engine callback: splits each round's record between the parent run and the site child runs."""

    def __init__(self, client: MlflowClient, parent_id: str, child_ids: list[str]):
        self.client, self.parent_id, self.child_ids = client, parent_id, child_ids
        self.bytes_sent_cumulative = 0

    def __call__(self, record: dict) -> None:
        step, now = record["round"] + 1, int(time.time() * 1000)
        self.bytes_sent_cumulative += sum(record["bytes_sent"])
        parent = {
            "bytes_sent_cumulative": float(self.bytes_sent_cumulative),
            "bytes_sent_total": float(sum(record["bytes_sent"])),
            "bytes_received_total": float(sum(record["bytes_received"])),
            "train_loss": record["train_loss"],
            "round_seconds": record["seconds"],
            "lr": record["lr"],
        }
        children: list[dict[str, float]] = [
            {"bytes_sent": float(sent), "bytes_received": float(received), "train_loss": loss}
            for sent, received, loss in zip(record["bytes_sent"], record["bytes_received"], record["site_losses"])
        ]
        # The slow hospital named (federated/timing.py); a record from before it has none.
        for metrics, compute, wait in zip(children, record.get("site_compute_s", ()), record.get("site_wait_s", ())):
            metrics["compute_seconds"], metrics["wait_seconds"] = compute, wait
        if "slowest" in record:
            parent["slowest_site_held_up_seconds"] = record["slowest"]["held_up_s"]
        for metrics in (parent, *children):  # under differential privacy the sites withhold losses and timings (NaN)
            for key in WITHHELD_UNDER_DP:
                if key in metrics and math.isnan(metrics[key]):
                    del metrics[key]
        for key in ("update_norm", "update_norm_rel"):  # federated/health.py: per group, per site
            for group, values in record[key].items():
                for metrics, value in zip(children, values):
                    if math.isfinite(value):
                        metrics[f"{key}/{group}"] = value
        for key, value in record.get("metrics", {}).items():
            parsed = MetricKey.parse(key)
            if parsed.scope == SITE:  # the engine's record names a site by its index
                children[int(parsed.site)][f"{parsed.split}/{parsed.metric}"] = value
            else:
                parent[key] = value
        self._log(self.parent_id, parent, step, now)
        for run_id, metrics in zip(self.child_ids, children):
            self._log(run_id, metrics, step, now)

    def _log(self, run_id: str, metrics: dict[str, float], step: int, now: int) -> None:
        self.client.log_batch(run_id, metrics=[Metric(k, float(v), now, step) for k, v in metrics.items()])


@contextmanager
def training_runs(experiment: str, run_name: str, federation: str, sites: list[str]):
    """The parent run of a training and one child run per site, each tagged with the process that owns it.
    Runs that a killed process left RUNNING are closed first (``tracking.close_abandoned_runs``); on leaving,
    the children end with the parent's status (FAILED when an exception escapes, with its reason:
    ``tracking.record_failure``). Yields (parent, child ids)."""
    client = MlflowClient()
    tracking.close_abandoned_runs(experiment)
    owner = tracking.owner_tags()
    with mlflow.start_run(experiment_id=experiment, run_name=run_name,
                          tags={ROLE_TAG: TRAINING_ROLE, FEDERATION_TAG: federation, **owner}) as parent:
        child_ids = [
            client.create_run(experiment, run_name=f"{run_name}/{site}",
                              tags={PARENT_RUN_TAG: parent.info.run_id, ROLE_TAG: SITE_ROLE, SITE_TAG: site,
                                    **owner}).info.run_id
            for site in sites
        ]
        status = "FAILED"
        try:
            yield parent, child_ids
            status = "FINISHED"
        except Exception as err:  # the metrics logged so far stay; the runs say why they end here
            tracking.record_failure(client, [parent.info.run_id, *child_ids], err)
            raise
        finally:
            for run_id in child_ids:
                client.set_terminated(run_id, status=status)


def train_tracked(
    federation: Federation,
    shards_root: Path,
    config: TrainSettings | dict,
    run_name: str | None = None,
    launcher: Launcher | None = None,
) -> TrainingRun:
    """Train ``config`` (the training's settings, or a dict of them: a deployment's) on the federation's shards where
    ``launcher`` says (default: in this process) and record it in MLflow; the records are the same wherever
    it ran. The training is built and checked once here (``federated.sites.federation_config``: where this
    machine holds the shards, every site's folder, task and diseases). What is recorded about the sites' data
    (shard hashes, QC summaries, model input) comes from their reports (``federated.sites.site_report``),
    checked against the federation: an NVIDIA FLARE site sends its own, so ``prod`` reads no shards here."""
    launcher = launcher or InProcess()
    names = [site.name for site in federation.sites]
    launcher.check()
    settings = training_settings(config)  # the command line's come checked, and are not checked again
    launcher.check_algorithm(settings.algorithm)
    config = federation_config(federation, shards_root, settings, read_shards=launcher.reads_shards_here)
    pooled = launcher.pools(config.algorithm)
    client = MlflowClient()
    experiment = tracking.experiment_id(federation.task)
    started = time.perf_counter()
    run_name = run_name or f"{config.algorithm}-I{config.local_steps}"
    # Before the run starts: an unknown algorithm or hyperparameter must not leave a FAILED run behind.
    recorded = launcher.recorded(config)
    params = {**training_params(recorded, federation), **launcher.params()}
    # A resumed training continues the unfinished runs of its name: they hold its first rounds (and bytes).
    continued = [r.info.run_id for r in client.search_runs(
        [experiment], f"attributes.run_name = '{run_name}' and tags.{ROLE_TAG} = '{TRAINING_ROLE}' and "
        "attributes.status != 'FINISHED'")] if config.resume else []
    with training_runs(experiment, run_name, federation.name, names) as (parent, child_ids):
        if continued:
            mlflow.set_tag(CONTINUES_TAG, ",".join(continued))
        mlflow.log_params(params)
        mlflow.log_dict(json.loads(recorded.model_dump_json()), CONFIG_ARTIFACT)
        # A pooled training (centralized: one site holding every site's data) has no per-site rounds: its
        # one site's records go to the parent only.
        logger = RoundLogger(client, parent.info.run_id, [] if pooled else child_ids)
        trained = launcher.train(config, federation, shards_root, [logger], name=run_name)
        result, reports = trained.result, trained.site_reports
        mlflow.log_params(site_params(reports))
        log_privacy(client, names, child_ids, result.privacy or {r["site"]: r.get("privacy") for r in reports})
        _log_site_artifacts(client, federation, reports, child_ids, result.test_histograms, trained_diseases(config, federation))
        final = result.history[-1].get("metrics", {})
        mlflow.log_dict(named_sites(result.history[-1].get("suppressed", {}), names), SUPPRESSED_ARTIFACT)
        version, promoted = register_candidate(federation, trained, Path(shards_root) if launcher.reads_shards_here
                                               else None, launcher)
        descriptions.describe_training(parent.info.run_id, version, promoted, registry.champion_version(federation.task))
    return TrainingRun(parent.info.run_id, run_name, config.algorithm, config.local_steps, version, promoted, final,
                       time.perf_counter() - started)


def _log_site_artifacts(client, federation, reports, child_ids, test_histograms, diseases) -> None:
    """Per site: its QC summary (and its sample grid where the site YAML opts in) as the site reported it;
    on the parent: the pooled test ROC curves, drawn from the histograms the sites' last evaluation summed."""
    for report, run_id in zip(reports, child_ids):
        summary = report["qc"]
        for target, folder in ((run_id, QC_FOLDER), (mlflow.active_run().info.run_id, f"{QC_FOLDER}/{report['site']}")):
            client.log_dict(target, summary, f"{folder}/{QC_SUMMARY_JSON}")
            client.log_text(target, render_central_markdown(summary), f"{folder}/{QC_SUMMARY_MD}")
            if report["qc_grid"] is not None:
                with tempfile.TemporaryDirectory() as tmp:
                    grid = Path(tmp) / SAMPLE_GRID_FILE
                    grid.write_bytes(report["qc_grid"])
                    client.log_artifact(target, str(grid), artifact_path=folder)
    if test_histograms is not None and test_histograms.sum():
        figure = plots.roc_figure(test_histograms, diseases,
                                     f"{federation.name}: pooled test ROC")
        mlflow.log_figure(figure, ROC_ARTIFACT)
        plt.close(figure)


def log_privacy(client, names: list[str], child_ids: list[str], privacy: dict[str, dict | None]) -> None:
    """Each site's privacy spending under DP, on its own run: the job's epsilon, the site's spent and remaining
    epsilon (remaining absent where the site has no budget) at the site's delta."""
    for name, run_id in zip(names, child_ids):
        spent = privacy.get(name)
        if not spent:
            continue
        for key in PRIVACY_METRICS:
            if spent.get(key) is not None:
                client.log_metric(run_id, PRIVACY_PREFIX + key, float(spent[key]))
        if spent.get("budget_change"):
            client.set_tag(run_id, PRIVACY_BUDGET_CHANGE_TAG, spent["budget_change"])


def training_summary(run: TrainingRun) -> dict:
    """The headline of a training, JSON-serializable (Prefect result, CLI output)."""
    return {
        "run_id": run.run_id,
        "run_name": run.run_name,
        "algorithm": run.algorithm,
        "I": run.local_steps,
        "model_version": run.model_version,
        "promoted": run.promoted,
        "seconds": round(run.seconds, 1),
        SELECTION_METRIC: run.final_metrics.get(SELECTION_METRIC, float("nan")),
        HEADLINE_METRIC: run.final_metrics.get(HEADLINE_METRIC, float("nan")),
    }


def training_markdown(summary: dict) -> str:
    return markdown_table(pd.DataFrame([summary]))


def label_report_markdown(report: dict, min_count: int = 10) -> str:
    """The labels-only report as it may leave the site (a Prefect artifact): positives and negatives per split
    and disease and quarantined rows per reason, below ``min_count`` suppressed, no totals beside them."""
    rows = [{"split": split, "disease": disease,
             **suppressed_label_counts(counts["positives"], counts["negatives"], min_count)}
            for split, part in report["splits"].items() for disease, counts in part["labels"].items()]
    reasons = {reason: released(count, min_count) for reason, count in report["quarantine_by_reason"].items()}
    head = (f"input rows = kept + quarantined: {'balanced' if report['balanced'] else 'NOT balanced'}; quarantined "
            f"rows by reason: {reasons or 'none'} (counts below {min_count} shown as \"<{min_count}\")\n\n")
    return head + markdown_table(pd.DataFrame(rows))
