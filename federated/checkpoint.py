"""Per-round checkpoints: every site's full state, RNG states and the round number.

Layout: ``<dir>/round_<r>/site_<k>.pt`` (one per site, written by the process that holds the site),
``<dir>/round_<r>/meta.pt`` (round, history) and ``<dir>/LATEST`` naming the newest complete round.
``LATEST`` is replaced atomically after every site file is on disk, so a crash mid-write leaves the
previous checkpoint valid. With the distributed backend across machines, ``checkpoint_dir`` must be a
shared file system (or each machine resumes from its own copy holding its sites' files).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import torch

from federated.algorithms.base import Site


def site_state(site: Site) -> dict:
    return {
        "model": site.model.state_dict(),
        "state": site.state,
        "loader": site.loader.state_dict(),
        "iteration": site.iteration,
        "rng_state": site.rng_state,
        "cuda_rng_state": site.cuda_rng_state,
    }


def load_site_state(site: Site, saved: dict) -> None:
    site.model.load_state_dict(saved["model"])
    missing = set(site.state) ^ set(saved["state"])
    if missing:
        raise ValueError(f"checkpoint of site {site.index} does not match the algorithm's state: "
                         f"differing tensors {sorted(missing)}")
    for name, t in saved["state"].items():
        site.state[name] = t.to(site.state[name].device)
    site.loader.load_state_dict(saved["loader"])
    site.iteration = saved["iteration"]
    site.rng_state = saved["rng_state"]
    site.cuda_rng_state = saved["cuda_rng_state"]


def save_round(ckpt_dir: Path, round_index: int, sites: list[Site], meta: dict | None, barrier) -> None:
    """Write this process's sites; ``meta`` (only from the process holding site 0) commits the round."""
    round_dir = ckpt_dir / f"round_{round_index:06d}"
    round_dir.mkdir(parents=True, exist_ok=True)
    for site in sites:
        tmp = round_dir / f"site_{site.index}.pt.tmp"
        torch.save(site_state(site), tmp)
        os.replace(tmp, round_dir / f"site_{site.index}.pt")
    barrier()
    if meta is not None:
        torch.save(meta, round_dir / "meta.pt")
        tmp = ckpt_dir / "LATEST.tmp"
        tmp.write_text(round_dir.name)
        os.replace(tmp, ckpt_dir / "LATEST")
        for old in ckpt_dir.glob("round_*"):
            if old.is_dir() and old.name < round_dir.name:
                shutil.rmtree(old, ignore_errors=True)
    barrier()


def latest_round_dir(ckpt_dir: Path) -> Path | None:
    pointer = ckpt_dir / "LATEST"
    if not pointer.is_file():
        return None
    round_dir = ckpt_dir / pointer.read_text().strip()
    if not (round_dir / "meta.pt").is_file():
        raise FileNotFoundError(f"{pointer} names {round_dir.name} but {round_dir / 'meta.pt'} is missing")
    return round_dir


def load_round(round_dir: Path, sites: list[Site]) -> dict:
    for site in sites:
        path = round_dir / f"site_{site.index}.pt"
        if not path.is_file():
            raise FileNotFoundError(f"{path}: checkpoint of site {site.index} missing")
        # On the CPU first: RNG states must stay CPU byte tensors; tensors are moved where they live.
        load_site_state(site, torch.load(path, map_location="cpu", weights_only=False))
    return torch.load(round_dir / "meta.pt", weights_only=False)
