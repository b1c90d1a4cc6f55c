"""A federation's sites as training sites: one named ``ShardSite`` per hospital, checked against the federation.

Every launcher's training is built here (``federation_config``: in-process, ``torchrun``, NVIDIA FLARE), so a
site's name, its shard folder and the check that its shards fit the federation (task, diseases) are decided
once; every launcher's result is checked here too (``check_site_reports``).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from pydantic import ValidationError

from common.errors import ConfigError, DataError, problem_message
from federated.config import ShardSite, SyntheticSite, TensorSite, TrainConfig, TrainSettings
from preprocessing.qc_counts import SAMPLE_GRID_FILE, central_summary, qc_counts
from preprocessing.shard_format import (
    QC_DIR,
    SHARD_FILE,
    float_columns,
    is_finished,
    manifest_path,
    read_shard_info,
    shard_content_hash,
)
from preprocessing.sharing import SharingPolicy

if TYPE_CHECKING:  # a hospital's training process has no federation YAML to read (nor its dataset adapters)
    from preprocessing.federation import Federation


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


def site_shard_dirs(federation: Federation, shards_root: Path) -> list[Path]:
    """Each site's shard folder ``<shards_root>/<site>``, in the federation's order, checked where the shards
    are read: every site that was not preprocessed named at once, then each with :func:`check_shard` (its
    name, task and diseases)."""
    dirs = [Path(shards_root) / site.name for site in federation.sites]
    missing = [str(d) for d in dirs if not is_finished(d)]
    if missing:
        raise DataError(f"federation {federation.name!r}: no shards at {', '.join(missing)}",
                        fix=f"run `fedauc preprocess <site.yaml> --out {shards_root}` for each of those sites first, "
                            "or point --shards at where they were written")
    for site, shard_dir in zip(federation.sites, dirs):
        check_shard(site.name, shard_dir, federation.task, site.diseases)
    check_shards_fit(federation.sites, dirs)
    return dirs


def check_shards_fit(sites: list, dirs: list[Path]) -> None:
    """A ``DataError`` naming every site and its tiles unless all shards hold tiles of one size and channel count:
    one model reads them all (a site YAML changed after its shards were written is caught here, not in a round)."""
    tiles = [(site.name, *(read_shard_info(d).get(key) for key in ("image_size", "channels")))
             for site, d in zip(sites, dirs)]
    if len({(size, channels) for _, size, channels in tiles}) > 1:
        shown = ", ".join(f"{name} {size} px x {channels} channel(s)" for name, size, channels in tiles)
        raise DataError(f"the sites' shards do not fit together: {shown}",
                        fix="give every site's YAML the same image_size and run `fedauc preprocess` again for the "
                            "sites whose shards differ")


def training_settings(settings: TrainSettings | dict, names: Mapping[str, str] | None = None) -> TrainSettings:
    """``settings`` with the algorithm's hyperparameters, validated: the one check of a training's settings,
    whoever gives them (``fedauc train``, a flow's or a deployment's ``config``), before any shard is read. A bad
    value is a ConfigError, one line per problem, naming the setting as ``names`` has it (a field's dotted path,
    or the start of one, -> how the caller spells it: the command line's options), else by its field. Settings
    this function returned before come back as they are: the layers they pass through trust them."""
    from federated.registry import get_algorithm

    if isinstance(settings, TrainSettings) and settings.checked:
        return settings
    if isinstance(settings, dict) and "sites" in settings:
        raise ConfigError("the training settings list sites; the federation YAML decides them",
                          fix="remove 'sites' from the settings")
    try:
        validated = TrainSettings.model_validate(settings)
    except ValidationError as err:
        raise _settings_error(err, (), names or {}) from None
    try:
        get_algorithm(validated.algorithm).Params(**validated.params)
    except ValidationError as err:
        raise _settings_error(err, ("params",), names or {}) from None
    return validated.mark_checked()


def _settings_error(err: ValidationError, within: tuple[str, ...], names: Mapping[str, str]) -> ConfigError:
    lines = []
    for error in err.errors():
        path = ".".join(str(part) for part in (*within, *error["loc"]))
        if names:  # a setting as the caller spells it; a check of several (no path) says its own words
            where = _named(path, names) or path
        else:
            where = f"training config: {path}" if path else "training config"
        lines.append(f"{where}: {problem_message(error)}" if where else problem_message(error))
    return ConfigError("\n".join(lines), fix="see `fedauc train --help`; hyperparameters per algorithm: "
                                           "federated/algorithms/")


def _named(path: str, names: Mapping[str, str]) -> str | None:
    """How ``names`` spells the setting at ``path``: its own entry, or its longest named start with the rest
    after a space (``params.T0`` -> ``--param T0``)."""
    for field in sorted(names, key=len, reverse=True):
        if path == field:
            return names[field]
        if path.startswith(field + "."):
            return f"{names[field]} {path[len(field) + 1:]}"
    return None


def federation_config(federation: Federation, shards_root: Path, settings: TrainSettings | dict,
                      read_shards: bool = True) -> TrainConfig:
    """The training: ``settings`` (checked by :func:`training_settings`) on every site's shards
    ``<shards_root>/<site>``, in the federation's order. ``read_shards``: the shards are on this machine and are
    checked (:func:`site_shard_dirs`); otherwise (a running consortium) each hospital checks its own and the
    folders here are names only."""
    settings = training_settings(settings)
    settings = settings.model_copy(update={"diseases": learned_diseases(federation, settings.diseases)})
    dirs = (site_shard_dirs(federation, shards_root) if read_shards
            else [Path(shards_root) / site.name for site in federation.sites])
    if read_shards:
        check_learnable(federation, dirs, settings.diseases or federation.sites[0].diseases)
    return TrainConfig.on_sites(settings, [ShardSite(name=site.name, path=shard_dir)
                                           for site, shard_dir in zip(federation.sites, dirs)])


def learned_diseases(federation: Federation, named: tuple[str, ...] | None) -> tuple[str, ...] | None:
    """The diseases a training learns, in the task's order: those it names, else the federation's ``diseases:``;
    None when that is every disease its shards label (the model's outputs as before)."""
    labelled = tuple(federation.sites[0].diseases)
    chosen = named or federation.diseases
    unknown = [d for d in chosen if d not in labelled]
    if unknown:
        raise ConfigError(f"disease(s) {unknown} are not diseases of the {federation.task} task {list(labelled)}",
                          fix="name diseases of the task, as spelt there")
    chosen = tuple(d for d in labelled if d in chosen)
    return None if chosen == labelled else chosen


def trained_diseases(config: TrainConfig, federation: Federation) -> tuple[str, ...]:
    """The outputs of a model ``config`` trained on ``federation``, in order."""
    return tuple(config.diseases or federation.sites[0].diseases)


def check_learnable(federation: Federation, dirs: list[Path], diseases: tuple[str, ...]) -> None:
    """A ``ConfigError`` naming the first of ``diseases`` that no site's training split labels (the model could not
    learn it, nor its AUC be measured), before anything starts."""
    # The manifests' label columns only: the images are the integrity check's to open (a truncated image file is
    # named there, not met as an mmap error here).
    known = sum(np.sum(~np.isnan(float_columns(manifest_path(d, "train"), diseases, "run `fedauc preprocess` again "
                                               "for this site")), axis=0)
                for d in dirs if manifest_path(d, "train").is_file())
    for disease, count in zip(diseases, known):
        if count == 0:
            rest = [d for d, c in zip(diseases, known) if c > 0]
            raise ConfigError(f"federation {federation.name!r}: disease {disease!r} has no label in any site's "
                              f"training split, so no model can learn it",
                              fix=f"train on the diseases the sites label: `diseases: {rest}` in {federation.path}, "
                                  f"or `fedauc train --disease ...` for each")


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


def site_report(name: str, shard_dir: Path, sharing: SharingPolicy, input_shape: tuple[int, ...],
                num_classes: int, private: bool = False) -> dict:
    """What the centre records about a site's data, computed where the shards are: their content hash,
    task and diseases, the QC summary as the site's ``sharing`` policy lets it leave (aggregate counts,
    small ones suppressed: ``preprocessing.qc_counts.central_summary``), the sample grid's PNG bytes only where
    the policy opts in (``qc_grid``) and the training is not ``private`` (under DP: real training images, which no
    accountant counts), and the model input shape and class count the site trains with.
    Nothing per image. An NVIDIA FLARE site returns it with its result, so the centre needs no shards."""
    info = read_shard_info(shard_dir)
    grid = Path(shard_dir) / QC_DIR / SAMPLE_GRID_FILE
    return {
        "site": name,
        "shard_hash": shard_content_hash(shard_dir),
        "task": info.get("task"),
        "diseases": list(info.get("diseases", ())),
        "qc": central_summary(qc_counts(Path(shard_dir)), sharing.min_count, sharing.qc_grid),
        "qc_grid": grid.read_bytes() if sharing.qc_grid and not private and grid.is_file() else None,
        "input_shape": [int(n) for n in input_shape],
        "num_classes": int(num_classes),
    }


def check_site_reports(reports: list[dict], sites: list[str], task: str, diseases: tuple[str, ...]) -> None:
    """Raise a ``DataError`` naming the first site whose report does not fit the federation (``sites`` in
    order, ``task``, ``diseases``) or the first site's model input (shape, classes)."""
    names = [r.get("site") for r in reports]
    if names != list(sites):
        raise DataError(f"the sites reported as {names}, the federation lists {list(sites)}",
                        fix="start every hospital from its own kit of this federation")
    for report in reports:
        site = report["site"]
        if report["task"] != task or tuple(report["diseases"]) != tuple(diseases):
            raise DataError(f"site {site!r}: its shards are a {report['task']!r} task with diseases "
                            f"{report['diseases']}, the federation trains {task!r} with {list(diseases)}",
                            fix=f"preprocess site {site!r} with the federation's site YAML")
    check_model_inputs(reports)


def check_model_inputs(reports: list[dict]) -> None:
    """Raise a ``DataError`` naming the first site whose model input (``input_shape``, ``num_classes``)
    differs from the first report's: the sites could not share one model."""
    first = reports[0]
    for report in reports:
        for field_, what in (("input_shape", "model input shape"), ("num_classes", "number of classes")):
            if report[field_] != first[field_]:
                raise DataError(f"site {report['site']!r}: its {what} is {report[field_]}, site {first['site']!r}'s "
                                f"is {first[field_]}: the sites cannot share one model",
                                fix="preprocess every site with the same image_size and colour mode")
