"""Centralized: all sites' data at one site, the upper reference of FeDXL (Guo et al., ICML 2023, section 7).

The Local Pair estimator (KL-OPAUC over the batch's pairs, u per positive, gradient EMA) run by a single
site that holds the union of every site's data: every pair is a current pair and no pool is needed.
``centralize(config)`` builds that one-site run from a federated config, with a batch of K * B rows so
an iteration sees as many samples as one federated iteration does over all sites.
"""

from __future__ import annotations

import numpy as np
import torch

from federated.algorithms.localpair import LocalPair
from federated.config import TensorSite, TrainConfig, load_sites
from federated.registry import register


@register
class Centralized(LocalPair):
    name = "centralized"
    dp_refusal = "it pools every site's records at one place, which DP at the site cannot cover"
    pools_sites = True

    def __init__(self, params: dict, fed):
        super().__init__(params, fed)
        if fed.num_sites != 1:
            raise ValueError(f"algorithm 'centralized' needs exactly one site holding all data, got "
                             f"{fed.num_sites} sites; build the config with "
                             "federated.algorithms.centralized.centralize(config)")


def _concat(parts: list) -> np.ndarray | torch.Tensor:
    if all(isinstance(p, torch.Tensor) for p in parts):
        return torch.cat(parts)
    return np.concatenate([np.asarray(p) for p in parts])


def pooled(config: TrainConfig) -> TrainConfig:
    """The run as it pools ``config``'s K sites, its sites still named: the algorithm ``centralized`` and a
    batch of K x B rows, so that an iteration sees what a federated one sees (what the run records)."""
    return config.model_copy(update={"algorithm": "centralized", "batch_size": config.batch_size * len(config.sites)})


def centralize(config: TrainConfig) -> TrainConfig:
    """:func:`pooled` with every site's splits concatenated into one in-memory site (loads all data)."""
    datas = load_sites(config.sites, list(range(len(config.sites))), config.diseases)
    splits = {}
    for split in ("train", "valid", "test"):
        present = [d.splits[split] for d in datas if split in d.splits]
        if present:
            splits[split] = (_concat([p.images for p in present]), np.concatenate([p.labels for p in present]))
    site = TensorSite(name="centralized", diseases=datas[0].diseases, **splits)
    return pooled(config).model_copy(update={"sites": [site]})
