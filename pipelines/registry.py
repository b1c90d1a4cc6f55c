"""The model registry: a training's model registered as ``fedauc-<task>``, and the champion alias moved by a
compare-and-set loop (``promote_best``), so racing trainings cannot both win, and only between versions scored
on the same evaluation (the same sites with the same shards). Scores are computed before (pipelines/champion.py):
promotion only compares."""

from __future__ import annotations

import json
import math

import mlflow
import numpy as np
from mlflow import MlflowClient
from mlflow.exceptions import MlflowException
from mlflow.protos.databricks_pb2 import RESOURCE_ALREADY_EXISTS, ErrorCode
from mlflow.utils.mlflow_tags import MLFLOW_MODEL_VERSIONS

from federated.schema import (
    CHAMPION_ALIAS,
    COLLAPSED_TAG,
    SCORE_TAG_PREFIX,
    SELECTION_EVALUATION_TAG,
    SELECTION_METRIC_TAG,
    WAS_CHAMPION_TAG,
    registered_model_name,
)


def _new_version(client: MlflowClient, name: str, model_id: str) -> str:
    """Register the logged model ``model_id`` as a new version of ``name`` as MLflow's ``registered_model_name=``
    does, without its lines on stderr ("Successfully registered model ...": fedauc says it itself); the
    version, also named on the logged model (its link in MLflow's UI)."""
    try:
        client.create_registered_model(name)
    except MlflowException as err:
        if err.error_code != ErrorCode.Name(RESOURCE_ALREADY_EXISTS):
            raise
    version = client.create_model_version(name, source=f"models:/{model_id}", model_id=model_id).version
    linked = json.loads(client.get_logged_model(model_id).tags.get(MLFLOW_MODEL_VERSIONS, "[]"))
    client.set_logged_model_tags(model_id, {MLFLOW_MODEL_VERSIONS: json.dumps(
        [*linked, {"name": name, "version": version}])})
    return str(version)


def register_model(
    model,
    task: str,
    input_example: np.ndarray,
    selection_metric: float,
    collapsed: list[str] = (),
    evaluation: str | None = None,
    contract=None,
    ood=None,
) -> tuple[str, bool]:
    """Log ``model`` into the active run (:func:`log_model`) and register it (:func:`register`): (version,
    promoted)."""
    return register(log_model(model, input_example, contract, ood), task, selection_metric, collapsed, evaluation)


def log_model(model, input_example: np.ndarray, contract=None, ood=None) -> str:
    """Log ``model`` into the active run; its logged model's id. ``contract`` (a
    ``pipelines.model_package.contract.ModelContract``): what the model says about itself; with it the model is
    also a pyfunc model that scores image files (``pipelines.model_package.flavor``), without it (the registry's
    own tests) the bare program is logged. ``ood``: the ``federated.ood.Gaussian`` of the contract's
    out-of-distribution refusal, stored beside it.

    ``input_example`` is stored with the model (``input_example.json`` and torch.export's sample inputs), at the
    centre: a synthetic batch of the right shape and dtype, never a patient's images.

    The model is exported in eval mode (torch.export, MLflow's pt2 format) so that BatchNorm uses its running
    statistics when the registered model is loaded; the example batch has two rows because torch.export
    freezes a batch dimension of size one.
    """
    import torch  # here: the champion's lookup, a daily command, imports this module and needs no torch

    if input_example.shape[0] < 2:
        raise ValueError("input_example needs at least 2 rows: torch.export treats a batch of 1 as static")
    model.eval()
    # Stated, not inferred: inference would pin the local "+cpu" build label, which no index serves.
    requirements = [f"torch=={torch.__version__.split('+')[0]}", f"numpy=={np.__version__}"]
    if contract is not None:
        from pipelines.model_package.flavor import log_model as log_with_contract

        return log_with_contract(model, contract, input_example, requirements, ood).model_id
    return mlflow.pytorch.log_model(model, name="model", input_example=input_example, serialization_format="pt2",
                                    pip_requirements=requirements).model_id


def register(model_id: str, task: str, selection_metric: float, collapsed: list[str] = (),
             evaluation: str | None = None) -> tuple[str, bool]:
    """Register the logged model ``model_id`` as ``fedauc-<task>`` and move the champion alias to the version
    with the best pooled validation macro-AUC on the same evaluation (``promote_best``). Returns (version,
    promoted). ``collapsed``: the splits on which the model's scores were constant (:func:`collapsed_splits`);
    such a version is tagged with them and never becomes champion. ``evaluation``: the fingerprint of the sites
    and shards ``selection_metric`` was measured on; the current champion's score there is recorded before
    (:func:`record_score`, pipelines/champion.py), so registering only compares."""
    name = registered_model_name(task)
    client = MlflowClient()
    version = _new_version(client, name, model_id)
    client.set_model_version_tag(name, version, SELECTION_METRIC_TAG, repr(float(selection_metric)))
    if collapsed:
        client.set_model_version_tag(name, version, COLLAPSED_TAG, ",".join(collapsed))
    if evaluation is not None:
        client.set_model_version_tag(name, version, SELECTION_EVALUATION_TAG, evaluation)
        client.set_model_version_tag(name, version, SCORE_TAG_PREFIX + evaluation, repr(float(selection_metric)))
    return version, promote_best(client, name, version, evaluation)


def champion_version(task: str) -> str | None:
    try:
        return str(MlflowClient().get_model_version_by_alias(registered_model_name(task), CHAMPION_ALIAS).version)
    except mlflow.exceptions.MlflowException:
        return None


def score_on(task: str, version: str, evaluation: str) -> float | None:
    """Version ``version``'s recorded pooled valid macro AUC on ``evaluation`` (None: never scored there)."""
    tags = MlflowClient().get_model_version(registered_model_name(task), version).tags
    value = tags.get(SCORE_TAG_PREFIX + evaluation)
    return None if value is None else float(value)


def record_score(task: str, version: str, evaluation: str, score: float) -> None:
    """Record version ``version``'s pooled valid macro AUC on ``evaluation`` (the champion's re-evaluation)."""
    MlflowClient().set_model_version_tag(registered_model_name(task), version, SCORE_TAG_PREFIX + evaluation,
                                         repr(float(score)))


def collapsed_splits(metrics: dict[str, float]) -> list[str]:
    """The splits on which every defined pooled AUC is exactly 0.5: nothing separates positives from negatives,
    as when a diverged model scores every image the same (a saturated sigmoid)."""
    out = []
    for split in ("valid", "test"):
        aucs = [v for k, v in metrics.items() if k.startswith(f"{split}/pooled/auc/") and not math.isnan(v)]
        if aucs and all(v == 0.5 for v in aucs):
            out.append(split)
    return out


def _best_version(client: MlflowClient, name: str, evaluation: str | None = None) -> str | None:
    """The registered version with the highest selection metric (with ``evaluation``: its score there, among the
    versions scored on it); an undefined one (NaN, untagged) never beats a defined one, and ties go to the
    earlier version, so the first model is champion whatever its metric (there is nothing to beat, and
    evaluation needs a champion) and a later one must score higher. A collapsed version is never a candidate,
    even the first (None when there is no other)."""
    key = SELECTION_METRIC_TAG if evaluation is None else SCORE_TAG_PREFIX + evaluation

    def rank(version) -> tuple[bool, float, int]:
        metric = float(version.tags.get(key, "nan"))
        return (not math.isnan(metric), -math.inf if math.isnan(metric) else metric, -int(version.version))

    candidates = [v for v in client.search_model_versions(f"name = '{name}'") if COLLAPSED_TAG not in v.tags]
    scored = [v for v in candidates if evaluation is None or key in v.tags]
    return str(max(scored or candidates, key=rank).version) if candidates else None


def promote_best(client: MlflowClient, name: str, version: str, evaluation: str | None = None) -> bool:
    """Point the champion alias at the best registered version; True when that is ``version``.

    With ``evaluation`` (the fingerprint of the sites and shards ``version`` was scored on) only versions scored
    on that same evaluation compete, so a model trained on three sites is never compared with one trained on
    four by their own federations' numbers. A champion with no score there (a racing training moved the alias
    to a version nobody scored on these sites) keeps the alias: nothing here scores it.

    A compare-and-set loop, since MLflow has no conditional alias update: read the alias and the best version,
    set the alias only when they differ, then read again, until they agree. Every version's metric tag is
    written before its promotion starts, so the last write of any racing promotion is made after the best
    version's tag is visible, and the alias ends on it: two racing trainings cannot both win, and the worse one
    cannot overwrite the better one. (A champion set by hand is replaced by the best version.)
    """
    while True:
        try:
            current = str(client.get_model_version_by_alias(name, CHAMPION_ALIAS).version)
        except mlflow.exceptions.MlflowException:
            current = None
        if (evaluation is not None and current is not None and current != version
                and SCORE_TAG_PREFIX + evaluation not in client.get_model_version(name, current).tags):
            return False
        best = _best_version(client, name, evaluation)
        if current == best or best is None:
            return best == version
        _mark_was_champion(client, name, best)  # before the alias: never a champion untagged
        client.set_registered_model_alias(name, CHAMPION_ALIAS, best)


def _mark_was_champion(client: MlflowClient, name: str, version: str) -> None:
    try:
        client.set_model_version_tag(name, version, WAS_CHAMPION_TAG, "true")
    except mlflow.exceptions.MlflowException:
        # A racing promotion of the same version wrote it first: MLflow inserts a new tag without an upsert, and
        # the second insert breaks the table's unique key (tests/test_tracking.py's racers met it).
        if client.get_model_version(name, version).tags.get(WAS_CHAMPION_TAG) != "true":
            raise
