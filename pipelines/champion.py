"""The champion compared on equal terms: a trained model is registered and takes the champion alias only if it
beats the current champion on the same evaluation, the same sites' validation splits.

The candidate's score is its training's final pooled valid macro AUC, measured on its federation's sites
and shards (their fingerprint, ``pipelines.evaluations.fingerprint``); with ``bn_stats: local`` the
training scored each site with its own BatchNorm statistics, not the registered model, so the registered
model is scored instead. A champion with no score on that fingerprint (it was trained on other sites, or
before a site joined or changed its shards) is first re-evaluated on the candidate's federation, where its
sites are: in this process, or at the hospitals over NVIDIA FLARE with the training's own environment.
(A champion trained on images of another size or task cannot score them: its score there is undefined, and
any defined score beats it.) Then ``registry.promote_best`` compares the two on that one evaluation. Both
scores are recorded: each on its model version (``schema.SCORE_TAG_PREFIX`` + fingerprint) and on the
training's run (the metric ``valid/pooled/auc_macro`` and ``champion_check/valid/pooled/auc_macro`` with the
tag ``champion_check.version``), the re-evaluation also as its own evaluation run (``purpose:
champion-check``). A DP training with an evaluation noise multiplier S_e runs these evaluations noised with
S_e (each site releases noised histograms only and charges its ledger; the training's run has the tag
``champion_check.eval_noise_multiplier``), and its model has its training's noised score; one without S_e runs
no evaluation at all: its model has no score (NaN, and no operating points) and a champion unscored on its
sites keeps the alias.
"""

from __future__ import annotations

from pathlib import Path

import mlflow
import numpy as np
import torch

from federated.data import to_model_input
from federated.engine import TrainResult
from federated.launch import Launcher, Trained
from federated.schema import (
    CHAMPION_CHECK_METRIC,
    CHAMPION_CHECK_NOISE_TAG,
    CHAMPION_CHECK_SKIPPED_TAG,
    CHAMPION_CHECK_VERSION_TAG,
    COLLAPSED_TAG,
    REGISTERED_MODEL_METRIC,
    RELIABILITY_ARTIFACT,
    SELECTION_METRIC,
)
from federated.scoring import ModelToScore
from federated.sites import trained_diseases
from federated.version import code_version
from pipelines import descriptions, evaluations, model_card, plots, registry
from pipelines.model_package import calibration, thresholds
from pipelines.model_package.contract import ModelContract, contract_for
from preprocessing.federation import Federation


def register_candidate(federation: Federation, trained: Trained, shards_root: Path | None, launcher: Launcher
                       ) -> tuple[str, bool]:
    """Register the model of ``trained`` (a training on ``federation``, whose sites reported
    ``trained.site_reports``) in the active training run and move the champion alias if it wins on equal terms
    (a collapsed one, whose scores were constant on a split, never does: see ``registry.register``).
    Returns (version, promoted).

    One way, each step taking what the ones before gave: the candidate's scores (its training's, or with local
    BatchNorm statistics the registered model's own evaluation), its contract (``pipelines.model_package.contract``)
    with the operating points and calibration read from those scores' pooled validation histograms, the current
    champion's score on these sites (re-evaluated here where it has none), the model logged with its contract, and
    the version registered once, so that promotion only compares."""
    result, config = trained.result, trained.result.config
    diseases = trained_diseases(config, federation)
    model = result.model().eval()
    collapsed = registry.collapsed_splits(result.history[-1].get("metrics", {}))
    if collapsed:
        mlflow.set_tag(COLLAPSED_TAG, ",".join(collapsed))
    evaluation = evaluations.fingerprint({report["site"]: report["shard_hash"] for report in trained.site_reports})

    # Under DP a site releases no exact evaluation (docs/privacy.md section 5; one with a budget refuses it): with
    # S_e the evaluations here are noised with it, as the training's own were; without, there are none.
    noise = None if config.dp is None else config.dp.eval_noise_multiplier
    scorable = config.dp is None or noise is not None

    def score(models: list[tuple[ModelToScore, dict]]) -> list[evaluations.Scored]:
        return evaluations.score_models(federation, models, shards_root, launcher, noise)

    own_score, valid_histograms, test_histograms = _candidate_scores(result, diseases, model, score if scorable
                                                                     else None)
    contract = _contract(federation, result, diseases, valid_histograms, test_histograms)
    champion = registry.champion_version(federation.task)
    if champion is not None and registry.score_on(federation.task, champion, evaluation) is None:
        if noise is not None:
            mlflow.set_tag(CHAMPION_CHECK_NOISE_TAG, str(noise))
        if scorable:
            registry.record_score(federation.task, champion, evaluation, _score_champion(
                champion, federation, result.input_shape, result.num_classes, score, launcher))
        else:  # unscored here, it keeps the alias (registry.promote_best)
            mlflow.set_tags({CHAMPION_CHECK_VERSION_TAG: champion, CHAMPION_CHECK_SKIPPED_TAG: (
                "a DP training's sites release no exact evaluation of the champion and it has no "
                "--eval-noise-multiplier: the champion keeps the alias")})
    model_id = registry.log_model(model, synthetic_input_example(result.input_shape), contract,
                                  None if result.ood is None else result.ood.gaussian)
    version, promoted = registry.register(model_id, federation.task, own_score, collapsed, evaluation)
    descriptions.describe_registered_model(federation.task)  # the alias may have moved
    # The new version's card and description; the old and new champions' cards and descriptions name them.
    model_card.alias_moved(federation.task, [version, champion, registry.champion_version(federation.task)])
    return version, promoted


def _candidate_scores(result: TrainResult, diseases: tuple[str, ...], model: torch.nn.Module, score
                      ) -> tuple[float, np.ndarray | None, np.ndarray | None]:
    """The candidate's selection score and its pooled (valid, test) histograms: its training's last evaluation,
    unless that did not score the registered model (BatchNorm statistics kept local: it scored the sites' own
    models) or evaluated nothing, and ``score`` (None: the sites release no evaluation) can score it here."""
    config = result.config
    own_score = result.history[-1].get("metrics", {}).get(SELECTION_METRIC, float("nan"))
    valid_histograms, test_histograms = result.valid_histograms, result.test_histograms
    if score is not None and (config.bn_stats == "local" or valid_histograms is None):
        candidate = ModelToScore(label="candidate", network=config.network, network_kwargs=config.network_kwargs,
                                 input_shape=result.input_shape, num_classes=result.num_classes, diseases=diseases)
        scored = score([(candidate, model.state_dict())])[0].evaluation
        valid_histograms, test_histograms = scored.valid_histograms, scored.test_histograms
        if config.bn_stats == "local":
            own_score = scored.metrics.get(SELECTION_METRIC, float("nan"))
            mlflow.log_metric(REGISTERED_MODEL_METRIC, own_score)
    return own_score, valid_histograms, test_histograms


def _contract(federation: Federation, result: TrainResult, diseases: tuple[str, ...],
              valid_histograms: np.ndarray | None, test_histograms: np.ndarray | None) -> ModelContract:
    """The candidate's contract, its operating points and calibration read from the pooled validation histograms
    (none without them); the calibration's reliability diagram is logged on the training's run."""
    config = result.config
    source = f"pooled validation of federation {federation.name}"
    points = None if valid_histograms is None else thresholds.from_histograms(valid_histograms, list(diseases), source)
    calibrated = None if valid_histograms is None else calibration.from_histograms(
        valid_histograms, list(diseases), source, test_histograms)
    if calibrated is not None:
        figure = plots.reliability_figure(valid_histograms, list(diseases), calibrated,
                                          f"{federation.name}: reliability, pooled validation")
        mlflow.log_figure(figure, RELIABILITY_ARTIFACT)
        plots.plt.close(figure)
    return contract_for(federation, diseases, config.network, config.network_kwargs, result.input_shape,
                        code_version(), points, mlflow.active_run().info.run_id,
                        None if result.ood is None else result.ood.reference, calibrated)


def synthetic_input_example(input_shape: tuple[int, ...]) -> np.ndarray:
    """Two mid-gray images of the model's input shape (channels first) as the model sees them: uint8 rows
    of the shard layout through the training's own conversion. The registered model's signature and
    example, and torch.export's sample input, without a patient's pixels and without opening any shard."""
    channels, height, width = input_shape
    rows = np.full((2, height, width) if channels == 1 else (2, height, width, channels), 128, dtype=np.uint8)
    return to_model_input(rows, torch.device("cpu")).numpy()


def _score_champion(version: str, federation: Federation, input_shape: tuple[int, ...], num_classes: int, score,
                    launcher: Launcher) -> float:
    """The champion's pooled valid macro AUC on ``federation``'s sites, recorded on the training's run and as its
    own evaluation run; NaN where it cannot score them (trained on images of another size or task)."""
    mlflow.set_tag(CHAMPION_CHECK_VERSION_TAG, version)
    champion = evaluations.model_to_score(federation.task, version)
    if (tuple(champion[0].input_shape), champion[0].num_classes) != (tuple(input_shape), num_classes):
        mlflow.set_tag(CHAMPION_CHECK_SKIPPED_TAG, f"the champion takes input {tuple(champion[0].input_shape)} "
                                            f"with {champion[0].num_classes} classes, these sites give "
                                            f"{tuple(input_shape)} with {num_classes}")
        return float("nan")
    (scored,) = score([champion])
    evaluations.record(federation, scored, launcher, champion=version, purpose="champion-check")
    value = scored.evaluation.metrics.get(SELECTION_METRIC, float("nan"))
    mlflow.log_metric(CHAMPION_CHECK_METRIC, value)
    return value
