"""Evaluating registered models: what ``fedauc evaluate`` and the ``evaluate`` flow run.

The champion by default, or chosen versions in one evaluation (a comparison on the same data): every
site scores each model on its own valid and test splits (``federated.scoring.score_site``: the site-local
summaries training's evaluation rounds exchange, small counts suppressed at the site; with an evaluation
noise multiplier, noised histograms only, charged to each site's privacy ledger) and the summaries
are pooled here (``federated.evaluation.combine_sites``: per-site, pooled and macro-over-sites metrics,
95 % intervals, the pooled test ROC from the summed histograms). Where the sites score is the launcher's
(federated/launch.py): in this process where this machine holds every site's shards, or an NVIDIA FLARE
job that carries the models to the sites and brings back only their summaries and shard hashes (under
``prod`` nothing here opens or even locates a shard).

Each model's evaluation is one MLflow run (tag ``fedauc_role: evaluation``): its metrics, which were
suppressed or undefined and why, the pooled test ROC, and what it was evaluated on (the sites, each
site's shard hash, their fingerprint ``evaluation.fingerprint``: two evaluations with the same
fingerprint scored the same splits).
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import matplotlib.pyplot as plt
import mlflow
import numpy as np
import torch
from mlflow import MlflowClient
from mlflow.entities import Metric, Param

from common.errors import ConfigError
from federated import TrainConfig, schema
from federated.evaluation import Evaluation, combine_sites
from federated.launch import InProcess, Launcher
from federated.schema import (
    RELIABILITY_TEST_ARTIFACT,
    ROC_ARTIFACT,
    SUPPRESSED_ARTIFACT,
    UNDEFINED_ARTIFACT,
    MetricKey,
)
from federated.scoring import ModelToScore
from pipelines import descriptions, model_card, plots, registry, tracking
from pipelines.model_package.contract import METADATA_KEY, ModelContract
from preprocessing.federation import Federation

# An evaluation run's reliability diagram: the registered calibration map before and after, on the pooled test split.

UNDEFINED = {
    "site": "undefined at this site: no labelled positive or no labelled negative image in the split",
    "pooled": "undefined: no site's split holds a labelled positive or no site's a labelled negative",
    "macro_over_sites": "undefined: no site reports it (undefined or suppressed at every site)",
    "subgroup": "undefined: the subgroup's released cells hold no positive or no negative, or too few for an interval",
    "subgroup_gap": "undefined: fewer than two of the attribute's subgroups have an interval",
}
_DEFAULTS = TrainConfig.model_fields
BINS, MIN_COUNT = _DEFAULTS["eval_bins"].default, _DEFAULTS["eval_min_count"].default


@dataclass
class Scored:
    """One model's evaluation on one federation's sites."""

    version: str
    evaluation: Evaluation  # keys ``<split>/site/<site name>/...``, ``<split>/pooled/...``, ...
    shard_hashes: dict[str, str]  # site -> its shard hash, in the federation's order
    eval_noise_multiplier: float | None = None  # S_e of a noised evaluation (None: exact)
    privacy: dict[str, dict | None] = field(default_factory=dict)  # site -> what the job spent of its budget
    diseases: tuple[str, ...] = ()  # the model's outputs, in order (empty: the federation's sites' diseases)


def fingerprint(shard_hashes: dict[str, str]) -> str:
    """What "the same evaluation" means: the same sites with the same shards (so the same valid and test
    splits), whatever their order."""
    text = "\n".join(f"{site}={shard_hash}" for site, shard_hash in sorted(shard_hashes.items()))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def model_to_score(task: str, version: str) -> tuple[ModelToScore, dict[str, torch.Tensor]]:
    """Registered version ``version`` of ``fedauc-<task>`` as it travels to the sites: the network, its input
    shape and classes from the model's contract (``pipelines.model_package.contract``), and the registered weights."""
    name = schema.registered_model_name(task)
    uri = f"models:/{name}/{version}"
    try:
        info = mlflow.models.get_model_info(uri)
    except mlflow.exceptions.MlflowException:
        raise ConfigError(f"model {name} has no version {version} at {mlflow.get_tracking_uri()}",
                          fix="list the registered versions in the MLflow UI (`fedauc ui`) and pass one of them") from None
    state = mlflow.pytorch.load_model(uri, map_location="cpu").state_dict()
    if METADATA_KEY in (info.metadata or {}):
        spec = ModelContract.model_validate(info.metadata[METADATA_KEY]).model_to_score(version)
    else:  # registered before models carried their contract: the tensor signature and the run's config
        config = mlflow.artifacts.load_dict(f"runs:/{info.run_id}/config.json")
        spec = ModelToScore(label=version, network=config["network"], network_kwargs=config.get("network_kwargs", {}),
                            input_shape=tuple(info.signature.inputs.inputs[0].shape[1:]),
                            num_classes=int(info.signature.outputs.inputs[0].shape[-1]))
    return spec, {key: value.detach().clone() for key, value in state.items()}


def score_models(federation: Federation, models: list[tuple[ModelToScore, dict[str, torch.Tensor]]],
                 shards_root: Path | None, launcher: Launcher, eval_noise_multiplier: float | None = None
                 ) -> list[Scored]:
    """Every model of ``models`` (with its weights) scored by every site of ``federation`` where ``launcher``
    runs them (see the module docstring); with ``eval_noise_multiplier`` each site releases noised histograms
    only, charged to its ledger, and the metrics are the pooled ones of their sums."""
    names = [site.name for site in federation.sites]
    labelled = tuple(federation.sites[0].diseases)
    specs, states = [spec for spec, _ in models], [state for _, state in models]
    per_site, hashes, privacy = launcher.score(specs, states, federation, shards_root, BINS, MIN_COUNT,
                                               eval_noise_multiplier)
    return [Scored(spec.label, combine_sites([summaries[m] for summaries in per_site], names,
                                            list(spec.diseases or labelled), MIN_COUNT),
                   hashes, eval_noise_multiplier, privacy, tuple(spec.diseases or labelled))
            for m, spec in enumerate(specs)]


def record(federation: Federation, scored: Scored, launcher: Launcher, champion: str | None,
           purpose: str = "evaluate") -> str:
    """``scored`` as an MLflow evaluation run of the task's experiment (its own run, also while a training's
    run is active: a champion's re-evaluation); its run id."""
    client = MlflowClient()
    name = schema.registered_model_name(federation.task)
    experiment = tracking.experiment_id(federation.task)
    tracking.close_abandoned_runs(experiment)
    metrics, histograms = scored.evaluation.metrics, scored.evaluation.test_histograms
    tags = {schema.ROLE_TAG: schema.EVALUATION_ROLE, schema.PURPOSE_TAG: purpose,
            schema.MODEL_URI_TAG: f"models:/{name}/{scored.version}", schema.MODEL_VERSION_TAG: scored.version,
            schema.FEDERATION_TAG: federation.name,
            schema.CHAMPION_AT_EVALUATION_TAG: str(scored.version == champion).lower(), **tracking.owner_tags(),
            # Beside the trainings in the runs table, it must not read like one (the trainings view filters it out).
            schema.DESCRIPTION_TAG: f"**Evaluation, not a training**: registered version {scored.version} of `{name}` "
                                    f"({purpose}) scored on federation {federation.name}; pooled test macro AUC "
                                    f"{descriptions.headline(metrics)} (95 % interval)."}
    run_id = client.create_run(experiment, run_name=f"{purpose}-v{scored.version}", tags=tags).info.run_id
    status = "FAILED"
    try:
        params = {**launcher.params(), schema.SITES_PARAM: ",".join(scored.shard_hashes),
                  schema.EVALUATION_PARAM: fingerprint(scored.shard_hashes),
                  **{f"{schema.SHARD_HASH_PARAM_PREFIX}{site}": h for site, h in scored.shard_hashes.items()},
                  **_privacy_params(scored)}
        now = int(time.time() * 1000)
        client.log_batch(run_id, metrics=[Metric(k, float(v), now, 0) for k, v in metrics.items()],
                         params=[Param(k, str(v)) for k, v in params.items()])
        # Why a metric is absent (suppressed at its site) or NaN (undefined), next to the numbers.
        client.log_dict(run_id, scored.evaluation.suppressed, SUPPRESSED_ARTIFACT)
        client.log_dict(run_id, {key: UNDEFINED[MetricKey.parse(key).scope] for key, value in metrics.items()
                                 if np.isnan(value)},
                        UNDEFINED_ARTIFACT)
        if histograms is not None and histograms.sum():
            figure = plots.roc_figure(histograms, scored.diseases or federation.sites[0].diseases,
                                         f"{federation.name}: model v{scored.version}, pooled test ROC")
            client.log_figure(run_id, figure, ROC_ARTIFACT)
            plt.close(figure)
            calibration = _calibration(federation.task, scored.version)
            if calibration is not None:  # the registered map on the split it was not fitted on (section 16)
                figure = plots.reliability_figure(histograms, list(scored.diseases or federation.sites[0].diseases),
                                                  calibration, f"{federation.name}: model v{scored.version}, "
                                                  "reliability, pooled test")
                client.log_figure(run_id, figure, RELIABILITY_TEST_ARTIFACT)
                plt.close(figure)
        status = "FINISHED"
    finally:
        client.set_terminated(run_id, status=status)
    return run_id


def _calibration(task: str, version: str):
    """The registered version's calibration map (docs/algorithms.md section 16); None where it has none."""
    metadata = mlflow.models.get_model_info(f"models:/{schema.registered_model_name(task)}/{version}").metadata or {}
    return ModelContract.model_validate(metadata[METADATA_KEY]).calibration if METADATA_KEY in metadata else None


def _privacy_params(scored: Scored) -> dict[str, object]:
    """A noised evaluation's S_e and, per site, what the job spent there (the job's cost, as every model's run
    shares it); nothing for an exact one."""
    if scored.eval_noise_multiplier is None:
        return {}
    return {schema.EVAL_NOISE_PARAM: scored.eval_noise_multiplier,
            **{f"{schema.EVAL_PRIVACY_PARAM_PREFIX}{site}.{key}": value for site, spent in scored.privacy.items()
               for key, value in (spent or {}).items() if value is not None}}


def evaluate_registered(federation: Federation, shards_root: Path | None, versions: Sequence[str] = (),
                        launcher: Launcher | None = None, eval_noise_multiplier: float | None = None) -> list[dict]:
    """Registered ``versions`` of the task's model (default: the champion) on every site's valid and test
    splits in one evaluation (noised at the sites with ``eval_noise_multiplier``), each logged as an evaluation
    run. Per model, in ``versions``' order: ``{"model_version", "champion", "run_id", "metrics"}``."""
    if eval_noise_multiplier is not None and eval_noise_multiplier <= 0:
        raise ConfigError(f"the evaluation noise multiplier must be positive, not {eval_noise_multiplier:g}",
                          fix="pass --eval-noise-multiplier S_e with S_e > 0")
    launcher = launcher or InProcess()
    champion = registry.champion_version(federation.task)
    versions = list(dict.fromkeys(versions)) or ([champion] if champion else [])
    if not versions:
        raise ConfigError(f"no registered model fedauc-{federation.task} with a champion at {mlflow.get_tracking_uri()}",
                          fix="train one first (`fedauc train`), or pass --model-version")
    models = [model_to_score(federation.task, v) for v in versions]
    results = []
    for scored in score_models(federation, models, shards_root, launcher, eval_noise_multiplier):
        run_id = record(federation, scored, launcher, champion)
        model_card.write_card(federation.task, scored.version)  # its card now shows this evaluation
        results.append({"model_version": scored.version, "champion": scored.version == champion, "run_id": run_id,
                        "metrics": scored.evaluation.metrics})
    return results


def comparison_rows(results: list[dict]) -> list[dict]:
    """One row per evaluated model: its pooled macro AUC and 95 % interval on each split, the pooled test pAUC
    (FPR <= 0.3, McClish) and the test AUC macro over sites."""
    rows = []
    for result in results:
        m = result["metrics"]
        row = {"model": f"v{result['model_version']}{' (champion)' if result['champion'] else ''}"}
        for split in ("valid", "test"):
            row[f"{split} AUC macro"] = m.get(f"{split}/pooled/auc_macro", float("nan"))
            row[f"{split} AUC 95% CI"] = (f"[{m.get(f'{split}/pooled/auc_ci95_low_macro', float('nan')):.3f}, "
                                          f"{m.get(f'{split}/pooled/auc_ci95_high_macro', float('nan')):.3f}]")
        row["test pAUC0.3 macro"] = m.get("test/pooled/pauc_fpr0.3_mcclish_macro", float("nan"))
        row["test AUC macro over sites"] = m.get("test/macro_over_sites/auc_macro", float("nan"))
        rows.append(row)
    return rows


# What `fedauc evaluate` shows per split and scope by default: the macro means, readable in a 100-column
# terminal; --wide (and MLflow) has every disease's.
HEADLINE_COLUMNS = ("auc_macro", "auc_ci95_low_macro", "auc_ci95_high_macro", "pauc_fpr0.3_mcclish_macro")


def metrics_rows(metrics: dict[str, float], wide: bool = True) -> list[dict]:
    """Metric keys as one row per split and scope (pooled, macro_over_sites, site/<name>); without ``wide``
    only the ``HEADLINE_COLUMNS``."""
    rows: dict[tuple[str, str], dict] = {}
    for key, value in metrics.items():
        parsed = MetricKey.parse(key)
        if wide or parsed.metric in HEADLINE_COLUMNS:
            rows.setdefault((parsed.split, parsed.scope_name), {"split": parsed.split, "scope": parsed.scope_name}
                            )[parsed.metric] = value
    return list(rows.values())
