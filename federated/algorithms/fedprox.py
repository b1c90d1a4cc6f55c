"""FedProx (Li et al., MLSys 2020). docs/algorithms.md section 4.

FedAvg whose local objective adds a proximal term to the model received at the round start w0:
    w <- w - lr * (grad BCE + wd * w + mu * (w - w0))
mu = 0 is FedAvg; larger mu keeps sites closer to the global model (less drift, slower local progress).
"""

from __future__ import annotations

import torch
from pydantic import Field

from federated.algorithms.base import Site
from federated.algorithms.fedavg import FedAvg, FedAvgParams
from federated.registry import register
from federated.state import Comm


class FedProxParams(FedAvgParams):
    mu: float = Field(default=0.01, ge=0)


@register
class FedProx(FedAvg):
    name = "fedprox"
    dp_method = "DP-SGD"  # the proximal term does not depend on records
    Params = FedProxParams

    def state_spec(self, site: Site):
        return {f"round_start.{n}": Comm.LOCAL for n in site.parameter_names()}

    def init_site_state(self, site: Site):
        return {f"round_start.{n}": p.detach().clone() for n, p in self.named_params(site)}

    def _round_start(self, site: Site) -> list[torch.Tensor]:
        return [site.state[f"round_start.{n}"] for n in site.parameter_names()]

    def direction(self, site: Site, grads):
        d = super().direction(site, grads)
        pull = torch._foreach_sub(self.params(site), self._round_start(site))
        return torch._foreach_add(d, pull, alpha=self.p.mu)

    def round_end(self, site: Site) -> None:
        torch._foreach_copy_(self._round_start(site), self.params(site))
