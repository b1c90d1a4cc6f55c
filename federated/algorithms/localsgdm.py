"""LocalSGDM: Local SGD with heavy-ball momentum (Yu, Jin, Yang, ICML 2019). docs/algorithms.md section 4.

FedAvg plus, per site, momentum buffers m (averaged with the model every I steps):
    m <- mu * m + (grad BCE + wd * w);   w <- w - lr * m
mu = 0 is FedAvg.
"""

from __future__ import annotations

import torch
from pydantic import Field

from federated.algorithms.base import Site
from federated.algorithms.fedavg import FedAvg, FedAvgParams
from federated.registry import register
from federated.state import Comm


class LocalSGDMParams(FedAvgParams):
    momentum: float = Field(default=0.9, ge=0, lt=1)  # mu; 0 gives FedAvg


@register
class LocalSGDM(FedAvg):
    name = "localsgdm"
    dp_method = "DP-SGD"
    Params = LocalSGDMParams

    def state_spec(self, site: Site):
        return {f"momentum.{n}": Comm.MEAN for n in site.parameter_names()}

    def init_site_state(self, site: Site):
        return {f"momentum.{n}": torch.zeros_like(p) for n, p in self.named_params(site)}

    def direction(self, site: Site, grads):
        buffers = [site.state[f"momentum.{n}"] for n in site.parameter_names()]
        torch._foreach_mul_(buffers, self.p.momentum)
        torch._foreach_add_(buffers, super().direction(site, grads))
        return buffers
