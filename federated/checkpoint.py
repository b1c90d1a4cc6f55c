"""Per-round checkpoints: every site's full state, RNG states and the round number, without pickle.

Layout: ``<dir>/round_<r>/site_<k>.pt`` (the site's tensors: model, algorithm state, torch RNG states,
loader queue; loaded with ``torch.load(weights_only=True)``, which builds tensors and plain containers and
refuses any other object, so a crafted file cannot run code), ``site_<k>.json`` (its iteration, the
loader's numpy RNG state and the fingerprint of its data), ``meta.json`` (round, history and the
fingerprint of the configuration) and ``<dir>/LATEST`` naming the newest complete round. ``LATEST`` is
replaced atomically after every site file is on disk, so a crash mid-write leaves the previous checkpoint
valid. Under torchrun across machines, ``checkpoint_dir`` must be a shared file system (or
each machine resumes from its own copy holding its sites' files).

Resuming checks that the checkpoint belongs to this run: the configuration fingerprint (every field that
changes the computation; ``rounds``, ``eval_every``, the device and the like may change) and
each site's data fingerprint (a shard's content hash, an in-memory site's array bytes) must match, or a
``ConfigError`` names what differs.
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import shutil
from pathlib import Path

import numpy as np
import torch

from common.errors import ConfigError, DataError
from common.formats import check as check_format
from common.formats import stamp
from federated.algorithms.base import Site
from federated.config import TrainConfig

LATEST = "LATEST"
# TrainConfig fields a resumed run may change: they do not change the model a round computes.
# ``lr`` among them: a diverged training continues from its last good round at a lower learning rate (every
# round's record says the rate it ran with).
RESUMABLE_FIELDS = frozenset({"rounds", "eval_every", "eval_bins", "eval_min_count", "device",
                              "timeout_s", "checkpoint_dir", "resume", "loader_workers", "progress", "lr",
                              "divergence_factor", "outlier_factor", "ood_false_refusal"})


# Settings added after checkpoints were first written, with the value that computes what a checkpoint without
# them computed: at that value they stay out of the fingerprint, so an older fedauc's checkpoint still resumes.
ADDED_SETTINGS = {"diseases": None}


def config_fingerprint(config: TrainConfig) -> dict:
    """The configuration as far as it determines the computation (the sites by kind; their data is
    fingerprinted per site)."""
    fields = config.model_dump(mode="json", exclude=set(RESUMABLE_FIELDS) | {"sites"})
    for name, unchanged in ADDED_SETTINGS.items():
        if fields.get(name) == unchanged:
            fields.pop(name, None)
    fields["sites"] = [site.kind for site in config.sites]
    return fields


def _digest(fields: dict) -> str:
    return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()


def _tensors(site: Site) -> dict:
    return {
        "model": site.model.state_dict(),
        "state": site.state,
        "rng_state": site.rng_state,
        "cuda_rng_state": site.cuda_rng_state,
        "loader_queue": torch.from_numpy(np.asarray(site.loader.state_dict()["queue"], dtype=np.int64)),
    }


def _write_atomic(path: Path, write) -> None:
    tmp = path.with_name(path.name + ".tmp")
    write(tmp)
    os.replace(tmp, path)


def _round_name(round_index: int) -> str:
    return f"round_{round_index:06d}"


def save_round(ckpt_dir: Path, round_index: int, sites: list[Site], meta: dict | None, barrier,
               config: TrainConfig, site_fingerprints: dict[int, str]) -> None:
    """Write this process's sites; ``meta`` (from the process holding site 0, or from every site where
    each keeps its own folder) commits the round."""
    round_dir = ckpt_dir / _round_name(round_index)
    round_dir.mkdir(parents=True, exist_ok=True)
    for site in sites:
        _write_atomic(round_dir / f"site_{site.index}.pt", lambda p, site=site: torch.save(_tensors(site), p))
        info = {"iteration": site.iteration, "loader_rng": site.loader.state_dict()["rng"],
                "data_fingerprint": site_fingerprints[site.index]}
        _write_atomic(round_dir / f"site_{site.index}.json",
                      lambda p, info=info: p.write_text(json.dumps(stamp("checkpoint", info))))
    barrier()
    if meta is not None:
        fields = config_fingerprint(config)
        body = stamp("checkpoint", {**meta, "config": fields, "config_fingerprint": _digest(fields)})
        _write_atomic(round_dir / "meta.json", lambda p: p.write_text(json.dumps(body)))
        point_latest(ckpt_dir, round_index)
        for old in ckpt_dir.glob("round_*"):
            if old.is_dir() and old.name < _round_name(round_index - 1):
                shutil.rmtree(old, ignore_errors=True)
    barrier()


def point_latest(ckpt_dir: Path, round_index: int) -> None:
    """Make round ``round_index`` (committed: its meta.json is written) the one a resume continues from."""
    _write_atomic(Path(ckpt_dir) / LATEST, lambda p: p.write_text(_round_name(round_index)))


def committed_rounds(ckpt_dir: Path) -> list[int]:
    """The rounds of ``ckpt_dir`` whose checkpoint is complete, oldest first."""
    return sorted(int(d.name.split("_")[1]) for d in Path(ckpt_dir).glob("round_*") if (d / "meta.json").is_file())


def latest_round_dir(ckpt_dir: Path) -> Path | None:
    pointer = ckpt_dir / LATEST
    if not pointer.is_file():
        return None
    round_dir = ckpt_dir / pointer.read_text().strip()
    if not (round_dir / "meta.json").is_file():
        raise DataError(f"{pointer} names {round_dir.name} but {round_dir / 'meta.json'} is missing",
                        fix=f"delete {ckpt_dir} to start over (it holds no complete checkpoint)")
    return round_dir


def _load_tensors(path: Path) -> dict:
    try:
        # On the CPU first: RNG states must stay CPU byte tensors; tensors are moved where they live.
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:
        raise DataError(f"{path}: refused to load: the file holds objects other than tensors, which is not "
                        f"what fedauc writes (a crafted or foreign file could run code). {err}".splitlines()[0],
                        fix="restore the checkpoint from a trusted copy or delete it and start the run over") from None


def load_round(round_dir: Path, sites: list[Site], config: TrainConfig, site_fingerprints: dict[int, str]) -> dict:
    """Restore this process's sites from ``round_dir`` after checking that it belongs to ``config`` and to
    these sites' data; returns the meta (round, history)."""
    # The round's meta.json and each site's JSON carry the format of the whole round (its tensors' file too).
    meta = check_format("checkpoint", json.loads((round_dir / "meta.json").read_text()), round_dir / "meta.json")
    fields = config_fingerprint(config)
    if meta.get("config_fingerprint") != _digest(fields):
        saved = meta.get("config", {})
        differ = sorted(k for k in set(fields) | set(saved) if fields.get(k) != saved.get(k))
        raise ConfigError(
            f"{round_dir.parent}: the checkpoint was written by another training configuration "
            f"(differs in: {', '.join(differ) or 'unknown fields'})",
            fix="resume with the configuration the checkpoint was written with, or train into a new checkpoint "
                "directory (only rounds, eval_every, device and the like may change on resume)")
    for site in sites:
        stem = round_dir / f"site_{site.index}"
        for path in (stem.with_suffix(".pt"), stem.with_suffix(".json")):
            if not path.is_file():
                raise DataError(f"{path}: checkpoint of site {site.index} missing",
                                fix="resume on the machine that holds this site's checkpoint files")
        info = check_format("checkpoint", json.loads(stem.with_suffix(".json").read_text()), stem.with_suffix(".json"))
        if info.get("data_fingerprint") != site_fingerprints[site.index]:
            raise ConfigError(
                f"{round_dir.parent}: site {site.index} ({site.data.name}) has other data than the checkpoint was "
                f"trained on (fingerprint {site_fingerprints[site.index][:12]}, checkpoint "
                f"{str(info.get('data_fingerprint'))[:12]})",
                fix="resume with the shards the checkpoint was trained on, or train into a new checkpoint directory")
        saved = _load_tensors(stem.with_suffix(".pt"))
        site.model.load_state_dict(saved["model"])
        differing = set(site.state) ^ set(saved["state"])
        if differing:
            raise ConfigError(f"checkpoint of site {site.index} does not match the algorithm's state: "
                              f"differing tensors {sorted(differing)}")
        for name, t in saved["state"].items():
            site.state[name] = t.to(site.state[name].device)
        site.loader.load_state_dict({"rng": info["loader_rng"], "queue": saved["loader_queue"].numpy()})
        site.iteration = info["iteration"]
        site.rng_state = saved["rng_state"]
        site.cuda_rng_state = saved["cuda_rng_state"]
    return meta

