"""Checks the command line runs before it starts Prefect or MLflow: a bad federation, site file, shard folder
or training config is reported in seconds as one FedaucError, instead of after a server start-up, inside a
flow run's traceback, or as a FAILED MLflow run of a training that never started."""

from __future__ import annotations

from pathlib import Path

from pydantic import ValidationError

from pipelines.onboarding import shards_root
from preprocessing.errors import ConfigError
from preprocessing.federation import Federation, load_federation
from preprocessing.sites import SiteConfigError, validate_site, validation_problems


def check_site(site_yaml: str | Path) -> None:
    """The site YAML and its data (root, metadata files, columns, rows); every problem at once."""
    problems = validate_site(site_yaml)
    if problems:
        raise SiteConfigError(problems)


def check_training(federation_yaml: str | Path, shards: str | Path | None, config: dict,
                   local_sites: bool = True) -> tuple[Federation, Path]:
    """The federation and its site files, every site's shards (``shards``, or where ``shards_root`` says;
    only when ``local_sites``: the sites train on this machine, not at the hospitals of a running
    consortium) and ``config`` (a ``TrainConfig`` without sites) with its algorithm and hyperparameters.
    Returns the federation and its shards folder."""
    from federated import ShardSite, TrainConfig, get_algorithm
    from federated.privacy.policy import check_dp_job
    from pipelines.runs import site_shard_dirs

    get_algorithm(config["algorithm"])  # a typo is reported first: nothing else needs reading to find it
    federation = load_federation(federation_yaml)
    root = shards_root(shards, federation)
    if local_sites:
        site_shard_dirs(federation, root)
    try:
        validated = TrainConfig.model_validate({**config, "sites": [ShardSite(name=site.name, path=root / site.name)
                                                                    for site in federation.sites]})
        get_algorithm(validated.algorithm).Params(**validated.params)
    except ValidationError as err:
        problems = validation_problems("training config", err)
        raise ConfigError("\n".join(str(p) for p in problems),
                          fix="see `fedauc train --help`; hyperparameters per algorithm: federated/algorithms/") from None
    # What DP does not cover is refused here too, before a job starts (each site checks again, and its budget).
    check_dp_job(validated.algorithm, validated.dp, validated.guarantee_positives)
    return federation, root


def check_evaluation(federation_yaml: str | Path, shards: str | Path | None,
                     flare_env: str | None = None) -> tuple[Federation, Path | None]:
    """The federation and, where the sites are on this machine (in-process, NVFlare ``sim`` and ``poc``), every
    site's shards. Under ``prod`` the hospitals read their own: no shard folder is located here, and one
    given is refused rather than silently read."""
    from pipelines.runs import site_shard_dirs

    federation = load_federation(federation_yaml)
    if flare_env == "prod":
        if shards is not None:
            raise ConfigError("--shards with --flare-env prod: the centre reads no shards, each hospital's client "
                              "scores its own", fix="leave out --shards (the hospitals gave theirs to "
                                                    "`fedauc consortium start-site --shards`)")
        return federation, None
    root = shards_root(shards, federation)
    site_shard_dirs(federation, root)
    return federation, root
