"""Prefect flows users schedule: onboard a site, preprocess a federation, train, evaluate, compare, demo.

Each flow reads like the table of contents of its job; the work is in the packages (``preprocessing``,
``federated``, ``pipelines.runs``). Tasks are the units of retry and caching: preprocessing is cached by
the shard writer's own content hash (a re-run with nothing changed does no work), training by the shard
content hashes plus the full training config, so a retried or repeated flow never retrains what it has
(except against a running consortium, whose shards only the hospitals can hash: never cached).
Import after ``pipelines.prefect_env.configure_prefect_env()``.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pandas as pd
from prefect import flow, get_run_logger, task
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from prefect.cache_policies import NO_CACHE
from prefect.deployments import run_deployment

from common.errors import FedaucError
from federated import launch
from federated.backends import SiteFailure
from federated.schema import HEADLINE_METRIC, SELECTION_METRIC
from federated.settings import TrainSettings
from federated.sites import site_shard_dirs, training_settings
from pipelines import evaluations, retention, run_names, runs, tracking
from pipelines.compare import compare_runs
from pipelines.preprocess_flow import artifact_key, log_outcome, preprocess
from pipelines.run_names import FLOW_RUN_PLACEHOLDER
from pipelines.site_params import failures_stay_at_the_site, site_yaml
from pipelines.tables import fold_intervals, markdown_table
from preprocessing.federation import load_federation
from preprocessing.label_report import label_report
from preprocessing.scan import scan_site
from preprocessing.shard_format import shard_content_hash
from preprocessing.sites import SiteConfigError, load_site, validate_site


def _transient(task, task_run, state) -> bool:
    """Retry what a second attempt can fix (a dropped connection, a busy disk, a site process that died),
    not a bad config, missing data or a bug, which would fail the same way after minutes of retraining."""
    error = state.result(raise_on_failure=False)
    if isinstance(error, (FedaucError, FileNotFoundError, NotADirectoryError, PermissionError)):
        return False
    return isinstance(error, (OSError, SiteFailure))


# --- onboarding ---------------------------------------------------------------------------------------
@task(name="validate-site", task_run_name=run_names.site_step("validate"), cache_policy=NO_CACHE)
@failures_stay_at_the_site("validate")
def validate(site_yaml: str) -> None:
    # Without the label values and losses: their lines name values and counts, and this task's state reaches the
    # consortium's Prefect server; `fedauc sites validate` shows them at the site.
    problems = validate_site(site_yaml, losses=False)
    if problems:
        raise SiteConfigError(problems)


@task(name="labels-report", task_run_name=run_names.site_step("labels-report"), cache_policy=NO_CACHE)
@failures_stay_at_the_site("labels-report")
def labels_only_report(site_yaml: str) -> dict:
    config = load_site(site_yaml)
    report = label_report(scan_site(config), config.task)
    # Its result reaches the centre (the flow run's, and a persisted result): files named within the site's root.
    report["metadata_files"] = [os.path.relpath(path, config.root) for path in report["metadata_files"]]
    return report


@flow(name="onboard_site", flow_run_name=run_names.of_flow(run_names.site_step("onboard", "site")))
@failures_stay_at_the_site("onboard")
def onboard_site(site: str) -> dict:
    """The gate before a site joins: its YAML and data root validate, and its labels are worth reading.
    ``site``: its name, resolved at the site (``pipelines.site_params``)."""
    path = str(site_yaml(site))
    validate(path)
    report = labels_only_report(path)
    config = load_site(path)
    create_markdown_artifact(key=f"onboard-{artifact_key(config.name)}",
                             markdown=runs.label_report_markdown(report, config.sharing.min_count),
                             description=f"labels-only report of site {config.name}")
    return report


# --- preprocessing ------------------------------------------------------------------------------------
@flow(name="preprocess_federation", flow_run_name=run_names.of_flow(run_names.federation_data))
def preprocess_federation(federation_yaml: str, out_dir: str, workers: int = 2, dispatch: str = "local") -> list[dict]:
    """Every site of a federation, each where its data lives.

    ``dispatch="local"`` runs each site's preprocessing here, inside this flow run (the embedded default, one
    machine): ``preprocess_flow.preprocess``, the work of ``preprocess_site`` without a flow run of its own per
    site, each site's outcome logged as that flow logs it; ``"deployments"`` triggers each site's deployment
    ``preprocess_site/preprocess-<site>`` so that it runs on that hospital's own work pool (infra/prefect.yaml)
    and waits for all of them.
    """
    federation = load_federation(federation_yaml)
    if dispatch == "local":
        results = [preprocess(site.source, out_dir, workers) for site in federation.sites]
        for result in results:
            log_outcome(result)
        return results
    if dispatch != "deployments":
        raise ValueError(f"dispatch must be 'local' or 'deployments', got {dispatch!r}")
    # Each hospital's deployment names its site and shards folder; the hospital resolves them.
    flow_runs = [run_deployment(f"preprocess_site/preprocess-{site.name}", parameters={"workers": workers})
                 for site in federation.sites]
    failed = [run.name for run in flow_runs if not run.state.is_completed()]
    if failed:
        raise RuntimeError(f"site preprocessing did not complete: {', '.join(failed)}")
    return [run.state.result() for run in flow_runs]


# --- training -----------------------------------------------------------------------------------------
def _training_cache_key(context, parameters) -> str | None:
    """Shard content hashes + the whole config: same data, same config, same trained model. None (never
    cached) where the shards are not on this machine (a running consortium's are at the hospitals, their
    hashes known only from the sites' reports after the training, so a cache key cannot say that the data
    is unchanged)."""
    where = launch.launcher(parameters.get("launcher"))
    if not where.reads_shards_here:
        return None
    federation = load_federation(parameters["federation_yaml"])
    hashes = [shard_content_hash(d) for d in site_shard_dirs(federation, Path(parameters["shards_root"]))]
    config = parameters["config"]
    config = config.model_dump(mode="json") if isinstance(config, TrainSettings) else config
    payload = json.dumps({"hashes": hashes, "config": config, "tracking": tracking.tracking_uri(),
                          "name": parameters.get("run_name"), "launcher": where.model_dump(mode="json")},
                         sort_keys=True, default=str)
    return "train-" + hashlib.sha256(payload.encode()).hexdigest()


@task(name="train", task_run_name=run_names.training, retries=1, retry_delay_seconds=5,
      retry_condition_fn=_transient, cache_key_fn=_training_cache_key, persist_result=True)
def train_task(federation_yaml: str, shards_root: str, config: TrainSettings | dict, run_name: str | None = None,
               launcher: dict | None = None) -> dict:
    tracking.configure()  # the entry of the process it runs in (the demo's trainings: a process pool's)
    federation = load_federation(federation_yaml)
    logger = get_run_logger()
    # A deployment's dict (Prefect's flow parameters may have made it a TrainSettings already) is checked here,
    # once, the algorithm's hyperparameters included; fedauc train's come checked and pass as they are.
    settings = training_settings(config)
    logger.info("training %s on federation %s (%d sites), %s rounds", settings.algorithm, federation.name,
                len(federation.sites), settings.rounds)
    result = runs.train_tracked(federation, Path(shards_root), settings, run_name, launch.launcher(launcher))
    summary = runs.training_summary(result)
    logger.info("%s: %s = %.4f, %s = %.4f; model version %s %s (MLflow run %s, %.0f s)", summary["run_name"],
                HEADLINE_METRIC, summary[HEADLINE_METRIC], SELECTION_METRIC, summary[SELECTION_METRIC],
                summary["model_version"], "is the champion" if summary["promoted"] else "is not the champion",
                summary["run_id"], summary["seconds"])
    return summary


@flow(name="train_federated", flow_run_name=run_names.of_flow(run_names.training))
def train_federated(federation_yaml: str, shards_root: str, config: TrainSettings | dict,
                    run_name: str | None = None, launcher: dict | None = None) -> dict:
    """One algorithm, one federation, one config (``federated.TrainSettings``, as `fedauc train` validated them,
    or a deployment's dict of them, validated in the task), where
    ``launcher`` says (its JSON form, federated/launch.py: default in this process; e.g.
    ``{"kind": "flare", "env": "prod", "workspace": folder, "kit": admin kit}`` for a running consortium).
    ``{flow_run}`` in ``run_name`` becomes this flow run's short id, which its name also carries
    (``run_names.training``): a scheduled deployment's runs are named apart, in Prefect and MLflow alike."""
    if run_name is not None and FLOW_RUN_PLACEHOLDER in run_name:
        run_name = run_names.with_flow_run(run_name)
    summary = train_task(federation_yaml, shards_root, config, run_name, launcher)
    training_artifact(summary, load_federation(federation_yaml).task)
    return summary


def training_artifact(summary: dict, task: str) -> None:
    """A training's headline as a Prefect artifact of the flow run that trained it, keyed by task and run (one
    key holds one task's history: chest X-ray and melanoma never share one)."""
    create_markdown_artifact(key=f"train-{artifact_key(task)}-{artifact_key(summary['run_name'])}",
                             markdown=runs.training_markdown(summary), description="federated training")


@flow(name="start_site_client")
@failures_stay_at_the_site("start-site")
def start_site_client(kit: str, site_yaml: str, shards_root: str) -> int:
    """At a hospital: its NVIDIA FLARE client from its startup kit, after every check
    (federated/flare/site/start.py); runs until the client stops and returns its exit status."""
    from federated.flare.site.start import prepare_site, run_site

    return run_site(prepare_site(kit, site_yaml, shards_root))


# --- evaluation and comparison ------------------------------------------------------------------------
@task(name="evaluate-models", task_run_name=run_names.evaluation, cache_policy=NO_CACHE, retries=1,
      retry_delay_seconds=5, retry_condition_fn=_transient)
def evaluate_task(federation_yaml: str, shards_root: str | None, model_versions: list[str] | None,
                  launcher: dict | None, eval_noise_multiplier: float | None = None) -> list[dict]:
    tracking.configure()  # the entry of the process it runs in
    return evaluations.evaluate_registered(load_federation(federation_yaml),
                                           None if shards_root is None else Path(shards_root), model_versions or (),
                                           launch.launcher(launcher), eval_noise_multiplier)


@flow(name="evaluate", flow_run_name=run_names.of_flow(run_names.evaluation))
def evaluate(federation_yaml: str, shards_root: str | None = None, model_versions: list[str] | None = None,
             launcher: dict | None = None, eval_noise_multiplier: float | None = None) -> list[dict]:
    """Registered models (default: the task's champion) on every site's valid and test splits and pooled, in one
    evaluation, where ``launcher`` says (its JSON form, federated/launch.py; an NVIDIA FLARE job scores them at
    the sites; ``prod``: ``shards_root`` None, nothing read here); with ``eval_noise_multiplier`` every site
    releases noised histograms only, charged to its privacy ledger (docs/privacy.md section 5)."""
    results = evaluate_task(federation_yaml, shards_root, model_versions, launcher, eval_noise_multiplier)
    task_key = artifact_key(load_federation(federation_yaml).task)
    for row in evaluations.comparison_rows(results):
        get_run_logger().info("evaluated %s", ", ".join(f"{key}: {value}" for key, value in row.items()))
    for result in results:
        create_table_artifact(key=f"evaluate-{task_key}-v{result['model_version']}", table=evaluations.metrics_rows(result["metrics"]),
                              description=f"model v{result['model_version']}: valid and test metrics")
    create_markdown_artifact(key=f"evaluate-{task_key}", markdown=markdown_table(pd.DataFrame(evaluations.comparison_rows(results))),
                             description="the models compared on the same evaluation")
    return results


@flow(name="compare", flow_run_name=run_names.of_flow(run_names.comparison))
def compare(federation_yaml: str, shards_root: str, base_config: dict, algorithms: list[str],
            local_steps: list[int]) -> list[dict]:
    """A sweep over algorithms and communication periods I, then the comparison table of the experiment.

    ``base_config`` is what every run shares (a TrainConfig without sites, algorithm and params); each
    algorithm runs with its default hyperparameters."""
    summaries = [train_task(federation_yaml, shards_root, {**base_config, "algorithm": algorithm, "local_steps": i},
                            f"{algorithm}-I{i}")
                 for algorithm in algorithms for i in local_steps]
    task_name = load_federation(federation_yaml).task
    table = compare_runs(task_name)
    create_markdown_artifact(key=f"compare-{artifact_key(task_name)}", markdown=markdown_table(fold_intervals(table)),
                             description="runs of the experiment, best first")
    return summaries


# --- retention ----------------------------------------------------------------------------------------
@flow(name="prune")
def prune(older_than_days: int = retention.RETENTION_DAYS, dry_run: bool = False,
          kits: list[str] | None = None, flare_workspaces: list[str] | None = None) -> list[str]:
    """The centre's stores pruned to its retention policy (pipelines/retention.py), the job stores of the
    consortia whose admin kits ``kits`` names and the simulator and POC runs left in ``flare_workspaces``: what
    went, one per line."""
    lines = retention.prune_centre(tracking.configure(), older_than_days, dry_run, kits=[Path(k) for k in kits or ()],
                                   flare_workspaces=[Path(w) for w in flare_workspaces or ()])
    create_markdown_artifact(key="prune", markdown="\n".join(f"- {line}" for line in lines),
                             description=f"{'would remove' if dry_run else 'removed'} (retention policy)")
    return lines
