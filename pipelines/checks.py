"""Checks the command line runs before it starts Prefect or MLflow: a bad federation, site file, shard folder
or training config is reported in seconds as one FedaucError, instead of after a server start-up, inside a
flow run's traceback, or as a FAILED MLflow run of a training that never started."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from common.errors import ConfigError
from federated.launch import Launcher
from federated.settings import TrainSettings
from pipelines.onboarding import shards_root
from preprocessing.federation import Federation, load_federation
from preprocessing.sites import SiteConfigError, validate_site


def check_site(site_yaml: str | Path) -> None:
    """The site YAML and its data (root, metadata files, columns, rows); every problem at once."""
    problems = validate_site(site_yaml, losses=False)
    if problems:
        raise SiteConfigError(problems)


def check_training(federation_yaml: str | Path, shards: str | Path | None, config: dict, launcher: Launcher,
                   names: Mapping[str, str] | None = None) -> tuple[Federation, Path, TrainSettings]:
    """Where it runs (``launcher``, checked when it was built: whether it takes the algorithm), ``config`` (a
    ``TrainConfig`` without sites: ``federated.sites.training_settings``, a bad value named as ``names`` says),
    the federation and its site files, and every site's shards where this machine reads them
    (``federated.sites.federation_config``: the same check every launcher's training makes). Returns the
    federation, its shards folder and the settings, validated: what the flow and the engine take without
    validating them again."""
    from federated import get_algorithm
    from federated.dp.refusals import check_dp_job
    from federated.sites import federation_config, training_settings

    get_algorithm(config["algorithm"])  # a typo is reported first: nothing else needs reading to find it
    launcher.check_algorithm(config["algorithm"])
    settings = training_settings(config, names)
    # What DP does not cover is refused before any shard is read (each site checks again, with its budget).
    check_dp_job(settings.algorithm, settings.dp, settings.guarantee_positives)
    federation = load_federation(federation_yaml)
    root = shards_root(shards, federation)
    federation_config(federation, root, settings, read_shards=launcher.reads_shards_here)
    return federation, root, settings


def check_evaluation(federation_yaml: str | Path, shards: str | Path | None,
                     launcher: Launcher) -> tuple[Federation, Path | None]:
    """The federation and, where the sites are on this machine (``launcher.reads_shards_here``), every site's
    shards. Where the hospitals read their own, no shard folder is located here, and one given is refused
    rather than silently read."""
    from federated.sites import site_shard_dirs

    federation = load_federation(federation_yaml)
    if not launcher.reads_shards_here:
        if shards is not None:
            raise ConfigError("--shards with --flare-env prod: the centre reads no shards, each hospital's client "
                              "scores its own", fix="leave out --shards (the hospitals gave theirs to "
                                                    "`fedauc consortium start-site --shards`)")
        return federation, None
    root = shards_root(shards, federation)
    site_shard_dirs(federation, root)
    return federation, root
