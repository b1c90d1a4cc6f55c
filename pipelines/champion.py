"""The champion compared on equal terms: a trained model is registered and takes the champion alias only if it
beats the current champion on the same evaluation, the same sites' validation splits.

The candidate's score is its training's final pooled valid macro AUC, measured on its federation's sites
and shards (their fingerprint, ``pipelines.evaluations.fingerprint``); with ``bn_stats: local`` the
training scored each site with its own BatchNorm statistics, not the registered model, so the registered
model is scored instead. A champion with no score on that fingerprint (it was trained on other sites, or
before a site joined or changed its shards) is first re-evaluated on the candidate's federation, where its
sites are: in this process, or at the hospitals over NVIDIA FLARE with the training's own environment.
(A champion trained on images of another size or task cannot score them: its score there is undefined, and
any defined score beats it.) Then ``tracking.promote_best`` compares the two on that one evaluation. Both
scores are recorded: each on its model version (``tracking.SCORE_TAG_PREFIX`` + fingerprint) and on the
training's run (the metric ``valid/pooled/auc_macro`` and ``champion_check/valid/pooled/auc_macro`` with the
tag ``champion_check.version``), the re-evaluation also as its own evaluation run (``purpose:
champion-check``).
"""

from __future__ import annotations

from pathlib import Path

import mlflow
import numpy as np
import torch

from federated import TrainConfig
from federated.flare.version import code_version
from federated.scoring import ModelToScore
from pipelines import evaluations, tracking
from pipelines.hospital import thresholds
from pipelines.hospital.contract import contract_for
from preprocessing.federation import Federation

SELECTION_METRIC = "valid/pooled/auc_macro"


def register_candidate(model: torch.nn.Module, federation: Federation, config: TrainConfig, input_shape: tuple[int, ...],
                       num_classes: int, own_score: float, collapsed: list[str], reports: list[dict], input_example,
                       shards_root: Path | None, flare: dict | None,
                       valid_histograms: np.ndarray | None = None) -> tuple[str, bool]:
    """Register ``model`` (trained on ``federation``, whose sites reported ``reports``) in the active training
    run and move the champion alias if it wins on equal terms (a ``collapsed`` one never does: see
    ``tracking.register_model``). Returns (version, promoted).

    The model is registered with its contract (``pipelines.hospital.contract``) and its operating points, read
    from ``valid_histograms`` (the training's last evaluation, pooled over sites) or, where the training did
    not return them (over NVIDIA FLARE; BatchNorm statistics kept local, where that evaluation scored the
    sites' own models), from an evaluation of the registered model itself."""
    hashes = {report["site"]: report["shard_hash"] for report in reports}
    evaluation = evaluations.fingerprint(hashes)

    def score(models: list[tuple[ModelToScore, dict]]) -> list[evaluations.Scored]:
        return evaluations.score_models(federation, models, shards_root, flare)

    if config.bn_stats == "local" or valid_histograms is None:
        candidate = ModelToScore(label="candidate", network=config.network, network_kwargs=config.network_kwargs,
                                 input_shape=input_shape, num_classes=num_classes)
        scored = score([(candidate, model.state_dict())])[0].evaluation
        valid_histograms = scored.valid_histograms
        if config.bn_stats == "local":
            own_score = scored.metrics.get(SELECTION_METRIC, float("nan"))
            mlflow.log_metric(f"registered_model/{SELECTION_METRIC}", own_score)
    points = None if valid_histograms is None else thresholds.from_histograms(
        valid_histograms, list(federation.sites[0].diseases), f"pooled validation of federation {federation.name}")
    contract = contract_for(federation, config.network, config.network_kwargs, input_shape, code_version(), points)

    def score_champion(version: str) -> float:
        mlflow.set_tag("champion_check.version", version)
        champion = evaluations.model_to_score(federation.task, version)
        if (tuple(champion[0].input_shape), champion[0].num_classes) != (tuple(input_shape), num_classes):
            # Trained on other images (another size or task): it cannot score these sites' splits at all.
            mlflow.set_tag("champion_check.skipped", f"the champion takes input {tuple(champion[0].input_shape)} "
                                                     f"with {champion[0].num_classes} classes, these sites give "
                                                     f"{tuple(input_shape)} with {num_classes}")
            return float("nan")
        (scored,) = score([champion])
        evaluations.record(federation, scored, flare, champion=version, purpose="champion-check")
        value = scored.evaluation.metrics.get(SELECTION_METRIC, float("nan"))
        mlflow.log_metric(f"champion_check/{SELECTION_METRIC}", value)
        return value

    return tracking.register_model(model, federation.task, input_example, own_score, collapsed, evaluation,
                                   score_champion, contract)
