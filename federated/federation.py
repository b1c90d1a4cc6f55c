"""What every site learns of the federation before the first round (docs/algorithms.md section 0): the sum over
sites of their label counts (positives and known labels per disease, records), hence the global class prior, the
aggregation weights and each site's prior, all in the algorithms' ``FederationContext``. Aggregate counts only:
one collective, in every process alike (federated/engine.py)."""

from __future__ import annotations

import torch

from common.errors import DataError
from federated.algorithms.base import FederationContext
from federated.config import TrainConfig
from federated.data import SiteData, label_counts, usable_prior
from federated.transport import Transport


def federation_context(config: TrainConfig, datas: list[SiteData], transport: Transport, device: torch.device
                       ) -> tuple[FederationContext, list[float], list[torch.Tensor]]:
    """The federation's context, the aggregation weight and the class prior of each site of this process
    (``datas``, in site order) from the sites' aggregate label counts."""
    diseases = datas[0].diseases
    counts = []
    for data in datas:
        pos, known = label_counts(data.train.labels)
        counts.append([torch.tensor(pos), torch.tensor(known), torch.tensor([float(len(data.train))])])
    local = [[t.clone() for t in c] for c in counts]
    K = transport.num_sites
    on_device = [[t.to(device) for t in c] for c in counts]  # NCCL reduces device tensors only
    transport.mean_(on_device, [1.0] * len(counts))  # weights 1: the sum over sites, exact counts
    pos, known, n = (t.cpu() for t in on_device[0])
    for c, name in enumerate(diseases):
        if known[c] == 0:  # the command line refuses this before anything starts (pipelines/checks.py)
            raise DataError(f"disease {name!r} has no known label at any site",
                            fix="list the diseases the sites label under `diseases:` in the federation YAML")
    prior = usable_prior(pos, known)
    weights = ([1.0 / K] * len(datas) if config.aggregation == "uniform"
               else [float(c[2][0] / n[0]) for c in local])
    if config.prior == "local":
        priors = [usable_prior(c[0], c[1]).to(device) for c in local]
    else:
        priors = [prior.to(device)] * len(datas)
    fed = FederationContext(K, config.local_steps, config.lr, diseases, prior.to(device),
                            pos.float(), (known - pos).float(), device,
                            config.amp and device.type == "cuda",
                            config.channels_last and device.type == "cuda",
                            iterations=config.rounds * config.local_steps)
    return fed, weights, priors
