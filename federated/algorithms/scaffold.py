"""SCAFFOLD, option II (Karimireddy et al., ICML 2020). docs/algorithms.md section 4.

Per site k, local step with control variates c_k (local) and c (global):
    w <- w - lr * (g - c_k + c),      g = grad BCE(w; xi) + wd * w
Round end (option II): c_k <- c_k - c + (w_round_start - w_k) / (I lr), which for these plain SGD
steps equals the mean of the round's gradients g; then c <- mean_k c_k. The site sends w_k and c_k
(twice FedAvg's bytes). c = c_k = 0 at the start makes the first round plain FedAvg.
"""

from __future__ import annotations

import torch

from federated.algorithms.base import Site
from federated.algorithms.fedavg import FedAvg
from federated.registry import register
from federated.state import Comm


@register
class Scaffold(FedAvg):
    name = "scaffold"
    dp_method = "DP-SGD"  # its control variates are means of noised gradients

    def state_spec(self, site: Site):
        spec = {}
        for n in site.parameter_names():
            spec[f"c_site.{n}"] = Comm.LOCAL
            spec[f"c.{n}"] = Comm.MEAN  # set to c_site before communication: the mean is the new c
            spec[f"grad_sum.{n}"] = Comm.LOCAL
        return spec

    def init_site_state(self, site: Site):
        return {f"{kind}.{n}": torch.zeros_like(p) for n, p in self.named_params(site)
                for kind in ("c_site", "c", "grad_sum")}

    def _get(self, site: Site, kind: str) -> list[torch.Tensor]:
        return [site.state[f"{kind}.{n}"] for n in site.parameter_names()]

    def direction(self, site: Site, grads):
        g = super().direction(site, grads)
        torch._foreach_add_(self._get(site, "grad_sum"), g)
        corrected = torch._foreach_sub(g, self._get(site, "c_site"))
        return torch._foreach_add(corrected, self._get(site, "c"))

    def before_communication(self, site: Site) -> None:
        grad_sum = self._get(site, "grad_sum")
        torch._foreach_mul_(grad_sum, 1.0 / self.fed.local_steps)
        torch._foreach_copy_(self._get(site, "c_site"), grad_sum)
        torch._foreach_copy_(self._get(site, "c"), grad_sum)
        torch._foreach_zero_(grad_sum)
