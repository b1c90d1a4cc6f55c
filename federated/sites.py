"""A federation's sites as training sites: one named ``ShardSite`` per hospital, checked against the federation.

Every launcher builds its config here (in-process training, ``torchrun``, NVFlare), so a site's name, its
shard folder and the check that its shards fit the federation (task, diseases) are decided once.
"""

from __future__ import annotations

from pathlib import Path

from federated.config import ShardSite, SyntheticSite, TensorSite, TrainConfig
from preprocessing.errors import ConfigError, DataError
from preprocessing.federation import Federation
from preprocessing.shard_format import SHARD_FILE, is_finished, read_shard_info


def check_shard(site: str, shard_dir: Path, task: str, diseases: tuple[str, ...]) -> None:
    """Raise a ``DataError`` naming ``site`` unless ``shard_dir`` holds finished shards of ``task`` with
    exactly ``diseases`` (the federation's, in its order)."""
    if not is_finished(shard_dir):
        raise DataError(f"site {site!r}: no shards at {shard_dir} (no {SHARD_FILE})",
                        fix=f"run `fedauc preprocess <{site}'s site YAML> --out {Path(shard_dir).parent}` first")
    meta = read_shard_info(shard_dir)
    if meta.get("site") != site:
        raise DataError(f"{shard_dir}: the shards belong to site {meta.get('site')!r}, not {site!r}",
                        fix=f"point site {site!r} at its own shard folder")
    if meta.get("task") != task:
        raise DataError(f"site {site!r}: its shards are a {meta.get('task')!r} task, the federation trains {task!r}",
                        fix="preprocess the site with the federation's task")
    if tuple(meta.get("diseases", ())) != tuple(diseases):
        raise DataError(f"site {site!r}: its shards have diseases {meta.get('diseases')}, the federation trains "
                        f"{list(diseases)}", fix="preprocess the site again with this version of fedauc")


def federation_config(federation: Federation, shards_root: Path, settings: dict) -> TrainConfig:
    """``settings`` (a TrainConfig without sites) on every site's shards ``<shards_root>/<site>``, in the
    federation's order, each checked with :func:`check_shard`."""
    if "sites" in settings:
        raise ConfigError("the training settings list sites; the federation YAML decides them",
                          fix="remove 'sites' from the settings")
    sites = []
    for site in federation.sites:
        shard_dir = Path(shards_root) / site.name
        check_shard(site.name, shard_dir, federation.task, site.diseases)
        sites.append(ShardSite(name=site.name, path=shard_dir))
    return TrainConfig.model_validate({**settings, "sites": sites})


def site_names(config: TrainConfig) -> list[str]:
    """The name of every site of ``config`` without reading any data (another machine's shards are not
    here): a shard site's ``name``, else its folder's; ``synthetic<k>`` / ``site<k>`` as their loaders do."""
    names = []
    for k, spec in enumerate(config.sites):
        if isinstance(spec, ShardSite):
            names.append(spec.name or spec.path.name)
        elif isinstance(spec, SyntheticSite):
            names.append(f"synthetic{k}")
        else:
            assert isinstance(spec, TensorSite)
            names.append(spec.name or f"site{k}")
    return names


def site_index(config: TrainConfig, name: str) -> int:
    names = site_names(config)
    if name not in names:
        raise ConfigError(f"site {name!r} is not in the config (its sites: {', '.join(names)})",
                          fix="pass one of the config's site names")
    return names.index(name)
