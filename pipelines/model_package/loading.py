"""The registered model loaded where it scores: ``models:/`` URIs resolved (by default a task's champion),
the model downloaded into a scratch folder and loaded as a ``Scorer`` (``flavor.load_scorer``), and the
operating points a scoring run uses (a hospital's own file before the registered ones)."""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, replace
from pathlib import Path

import mlflow
from mlflow import MlflowClient

from common.errors import ConfigError
from federated.schema import CHAMPION_ALIAS, registered_model_name
from pipelines.model_package import thresholds as op
from pipelines.model_package.flavor import load_scorer
from pipelines.model_package.predict import Scorer


def resolve_model(uri: str | None, task: str | None) -> tuple[str, str, str]:
    """(name, version, ``models:/name/version``) of ``uri`` (``models:/name/version`` or ``models:/name@alias``),
    by default the champion of ``task``."""
    if uri is None:
        if task is None:
            raise ConfigError("no model and no task to take the champion of",
                              fix="pass --model models:/fedauc-<task>@champion, --task, or a site YAML")
        uri = f"models:/{registered_model_name(task)}@{CHAMPION_ALIAS}"
    if not uri.startswith("models:/"):
        raise ConfigError(f"--model {uri!r} is not a models:/ URI", fix="pass models:/<name>/<version> or models:/<name>@<alias>")
    rest = uri.removeprefix("models:/")
    client = MlflowClient()
    try:
        if "@" in rest:
            name, alias = rest.split("@", 1)
            version = str(client.get_model_version_by_alias(name, alias).version)
        else:
            name, version = rest.rsplit("/", 1)
            client.get_model_version(name, version)
    except (mlflow.exceptions.MlflowException, ValueError):
        raise ConfigError(f"no registered model {uri} at {mlflow.get_tracking_uri()}",
                          fix="train one (`fedauc train`), or point MLFLOW_TRACKING_URI at the registry that has it") from None
    return name, version, f"models:/{name}/{version}"


def load_registered(uri: str | None, task: str | None, folder: Path) -> Scorer:
    name, version, exact = resolve_model(uri, task)
    local = mlflow.artifacts.download_artifacts(exact, dst_path=str(folder))
    return load_scorer(local, name, version)


@dataclass
class Chosen:
    """The operating points a scoring run uses and where they come from."""

    point: str
    thresholds: dict[str, float | None]
    source: str


def choose_points(scorer: Scorer, point: str, hospital_file: Path | None) -> Chosen:
    """The hospital's own file when there is one, else the registered points."""
    diseases = scorer.contract.diseases
    if hospital_file is not None and hospital_file.is_file():
        points = op.read(hospital_file)
        # Its name, not its path: the source is echoed to the Prefect run log, which the centre may hold.
        return Chosen(point, points.thresholds(point, diseases), f"this hospital's {hospital_file.name} ({points.source})")
    if scorer.contract.operating_points is None:
        if point not in op.POINTS:
            raise ConfigError(f"unknown operating point {point!r}", fix=f"pass one of {list(op.POINTS)}")
        return Chosen(point, dict.fromkeys(diseases), "none registered with the model: no decisions")
    points = scorer.contract.operating_points
    return Chosen(point, points.thresholds(point, diseases), f"registered with the model ({points.source})")


def with_hospital_refit(scorer: Scorer, hospital_file: Path | None) -> Scorer:
    """``scorer`` with the hospital's own refusal threshold and calibration map (``fedauc thresholds``) in place
    of the registered ones, where its file has them: the site scores with what was read on its own images."""
    if hospital_file is None or not hospital_file.is_file():
        return scorer
    return with_refit(scorer, op.read(hospital_file))


def with_refit(scorer: Scorer, own: op.OperatingPoints) -> Scorer:
    update = {key: value for key, value in (("ood", own.ood), ("calibration", own.calibration)) if value is not None}
    if scorer.contract.ood is None:  # a model without a refusal model has no Gaussian to measure distances with
        update.pop("ood", None)
    return replace(scorer, contract=scorer.contract.model_copy(update=update)) if update else scorer


def scratch_folder() -> tempfile.TemporaryDirectory:
    return tempfile.TemporaryDirectory(prefix="fedauc-model-")
