"""FedAvg / Local SGD (McMahan et al. 2017; Stich 2019), binary cross-entropy. docs/algorithms.md section 4.

Per site k, each local step on a minibatch xi:
    w_k <- w_k - lr * (grad BCE(w_k; xi) + wd * w_k)
Every I steps (communication): w_k <- mean_k w_k (parameters and, by default, BN running statistics).
Missing labels are masked out of the BCE (models.objectives.masked_bce_with_logits: per disease mean
over the batch's known labels, then mean over diseases).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from pydantic import BaseModel, ConfigDict, Field

from federated.algorithms.base import Algorithm, Site
from federated.data import Batch
from federated.registry import register
from models.objectives import masked_bce_with_logits


class FedAvgParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    weight_decay: float = Field(default=0.0, ge=0)  # L2 term of the local objective; 0 = plain BCE


@register
class FedAvg(Algorithm):
    name = "fedavg"
    dp_method = "DP-SGD"  # per-record BCE, clipped and noised (federated/dp/sgd.py)
    Params = FedAvgParams

    def loss(self, site: Site, batch: Batch) -> torch.Tensor:
        return masked_bce_with_logits(self.logits(site, batch), batch.y, batch.mask)

    def direction(self, site: Site, grads: list[torch.Tensor]) -> list[torch.Tensor]:
        """The local update direction d (w <- w - lr d); variants override this."""
        if self.p.weight_decay:
            return torch._foreach_add(grads, self.params(site), alpha=self.p.weight_decay)
        return grads

    def sample_loss(self, site, logits, y, mask, extras):
        return (F.binary_cross_entropy_with_logits(logits, y, reduction="none") * mask).sum() / len(logits)

    def local_step(self, site: Site, batch: Batch) -> torch.Tensor:
        loss, grads = self.differentiate(site, batch, lambda: self.loss(site, batch))
        with torch.no_grad():
            torch._foreach_add_(self.params(site), self.direction(site, grads), alpha=-self.fed.lr)
        return loss.detach()
