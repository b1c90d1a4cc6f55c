"""FedSGDA-M (Wu, Sun, Huang, Huang, NeurIPS 2023, Algorithm 2): FedSGDA with two-point STORM momentum,
on the AUC square min-max (1.1, strongly concave in alpha). docs/algorithms.md section 8.

Per site, x = (w, a, b), y = alpha, effective rates c_hat eta = the engine's lr, c eta = ``dual_lr``:
    step t on minibatch B (the same batch at both points):
        u <- grad_x f(x_t, y_t; B) + (1 - storm_x) (u - grad_x f(x_{t-1}, y_{t-1}; B))      (t = 0: u = grad_x f)
        v <- grad_y f(x_t, y_t; B) + (1 - storm_y) (v - grad_y f(x_{t-1}, y_{t-1}; B))
        (x_{t-1}, y_{t-1}) <- (x_t, y_t);   x <- x - c_hat eta u;   y <- y + c eta v
    every Q = I steps: average x, y, u, v, i.e. x <- mean_k (x_k - c_hat eta u_k) as in the paper.
After a sync, the "previous iterate" of the correction is the site's own pre-sync iterate (x_{k,t-1} is
kept locally, never averaged): the paper leaves this open; it is the point the site's u was built at.
storm = 1 is local SGDA with averaged gradients; smaller values carry more of the past (variance
reduction). The gradient at x_{t-1} uses batch statistics in BatchNorm and leaves the running ones alone.
A sibling of FedSGDA+ (federated/algorithms/minimax.py holds what they share): no server step, no anchor.
"""

from __future__ import annotations

import torch
from pydantic import Field

from federated.algorithms.base import Site
from federated.algorithms.minimax import FedSGDA, FedSGDAParams
from federated.data import Batch
from federated.registry import register
from federated.state import Comm


class FedSGDAMParams(FedSGDAParams):  # defaults from the sweep in docs/sweeps.md (engine lr 0.1 there)
    storm_x: float = Field(default=0.5, gt=0, le=1)  # a: weight of the fresh gradient in u; 1 = no momentum
    storm_y: float = Field(default=0.1, gt=0, le=1)  # b: the same for v


@register
class FedSGDAM(FedSGDA):
    name = "fedsgda_m"
    Params = FedSGDAMParams

    def state_spec(self, site: Site):
        names = self.x_names(site)
        spec = {"a": Comm.MEAN, "b": Comm.MEAN, "alpha": Comm.MEAN, "v": Comm.MEAN}
        spec |= {f"u.{n}": Comm.MEAN for n in names}
        return spec | {f"prev.{n}": Comm.LOCAL for n in names + ["alpha"]}

    def init_site_state(self, site: Site):
        C, dev = self.fed.num_classes, self.fed.device
        site.state = {k: torch.zeros(C, device=dev) for k in ("a", "b", "alpha", "v")}
        site.state |= {f"u.{n}": torch.zeros_like(t) for n, t in zip(self.x_names(site), self.x(site))}
        xy = self.x(site) + [site.state["alpha"]]
        site.state |= {f"prev.{n}": t.detach().clone() for n, t in zip(self.x_names(site) + ["alpha"], xy)}
        return site.state

    def local_step(self, site: Site, batch: Batch) -> torch.Tensor:
        st, names = site.state, self.x_names(site)
        u, prev = self.group(site, "u"), self.group(site, "prev", names + ["alpha"])
        loss, g_w, g_a, g_b, g_alpha = self.gradients_at(site, batch, None, [st["a"], st["b"], st["alpha"]])
        fresh = g_w + [g_a, g_b]
        with torch.no_grad():
            if site.iteration == 0:
                torch._foreach_copy_(u, fresh)
                st["v"].copy_(g_alpha)
        if site.iteration > 0:
            _, o_w, o_a, o_b, o_alpha = self.gradients_at(site, batch, prev[:-3], prev[-3:])
            with torch.no_grad():
                torch._foreach_add_(u, torch._foreach_neg(o_w + [o_a, o_b]))
                torch._foreach_mul_(u, 1 - self.p.storm_x)
                torch._foreach_add_(u, fresh)
                st["v"].copy_(g_alpha + (1 - self.p.storm_y) * (st["v"] - o_alpha))
        with torch.no_grad():
            torch._foreach_copy_(prev, self.x(site) + [st["alpha"]])
            torch._foreach_add_(self.x(site), u, alpha=-self.fed.lr)
            st["alpha"].add_(st["v"], alpha=self.p.dual_lr)
        return loss
