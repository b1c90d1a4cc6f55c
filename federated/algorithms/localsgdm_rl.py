"""LocalSGDM_RL: LocalSGDM with the ratio loss (Wang et al., AAAI 2021). docs/algorithms.md sections 1.6 and 4.

LocalSGDM (heavy-ball local SGD, momentum averaged with the model every I steps) whose loss is the
class-weighted BCE with positive weight ``1 + 0.1 * min(R, 5000)`` per disease.

Deviation from the paper: R is estimated on a balanced auxiliary set held by the server there;
hospitals share no such data, so R = n_neg / n_pos per disease comes from the federation's global
label counts (``Federation.positives`` / ``negatives``, aggregate statistics only).
"""

from __future__ import annotations

import torch

from federated.algorithms.base import Site
from federated.algorithms.localsgdm import LocalSGDM
from federated.data import Batch
from federated.registry import register
from models.objectives import masked_bce_with_logits, ratio_positive_weight


@register
class LocalSGDMRatioLoss(LocalSGDM):
    name = "localsgdm_rl"
    dp_refusal = ("its ratio loss weights positives by the federation's class counts, which it does not release "
                  "with noise")

    def __init__(self, params: dict, fed):
        super().__init__(params, fed)
        # Once, on the device: the counts live on the CPU, and copying them to a GPU every step waits for its queue.
        self.pos_weight = ratio_positive_weight(fed.positives, fed.negatives).to(fed.device)

    def loss(self, site: Site, batch: Batch) -> torch.Tensor:
        return masked_bce_with_logits(self.logits(site, batch), batch.y, batch.mask, pos_weight=self.pos_weight)
