"""FedSGDA+ (Wu, Sun, Huang, Huang: "Solving a Class of Non-Convex Minimax Optimization in Federated
Learning", NeurIPS 2023, Algorithm 1), on the AUC square min-max (1.1). docs/algorithms.md section 8.

x = (w, a, b) minimised, y = alpha maximised; the anchor x~ is refreshed every S rounds.
Per site, Q = I local SGDA steps from the round's global (x, y), minibatch xi:
    x <- x - c_hat grad_x f(x, y; xi)          c_hat = the engine's lr
    y <- y + c grad_y f(x~, y; xi)             c = ``dual_lr``; the dual gradient at the anchor model
                                               (as the authors' code does; the paper's display leaves x~ unused)
Server, after averaging: x <- x_prev + eta_x (mean_k x_k - x_prev),  y <- y_prev + eta_y (mean_k y_k - y_prev)
(x_prev, y_prev = the previous global iterate, kept by every site). eta_x = eta_y = 1 is Local SGDA+.
Every S rounds: x~ <- x. The anchor is a network; a and b do not enter grad_y f, so they are not kept.
BN running statistics are averaged with the model and take no server step.
"""

from __future__ import annotations

import torch
from pydantic import Field

from federated.algorithms.base import Site
from federated.algorithms.minimax import FedSGDA, FedSGDAParams
from federated.data import Batch
from federated.registry import register
from federated.state import Comm


class FedSGDAPlusParams(FedSGDAParams):
    eta_x: float = Field(default=1.0, gt=0)  # server step on x; 1 = plain averaging, > 1 extrapolates
    eta_y: float = Field(default=1.0, gt=0)  # server step on y
    anchor_every: int = Field(default=1, gt=0)  # S: rounds between anchor refreshes


@register
class FedSGDAPlus(FedSGDA):
    name = "fedsgda_plus"
    Params = FedSGDAPlusParams

    def w_names(self, site: Site) -> list[str]:
        return self.x_names(site)[:-2]

    def state_spec(self, site: Site):
        spec = {"a": Comm.MEAN, "b": Comm.MEAN, "alpha": Comm.MEAN}
        spec |= {f"prev_global.{n}": Comm.LOCAL for n in self.x_names(site) + ["alpha"]}
        return spec | {f"anchor.{n}": Comm.LOCAL for n in self.w_names(site)}

    def init_site_state(self, site: Site):
        C, dev = self.fed.num_classes, self.fed.device
        site.state = {k: torch.zeros(C, device=dev) for k in ("a", "b", "alpha")}
        xy = self.x(site) + [site.state["alpha"]]
        site.state |= {f"prev_global.{n}": t.detach().clone() for n, t in zip(self.x_names(site) + ["alpha"], xy)}
        site.state |= {f"anchor.{n}": p.detach().clone() for n, p in zip(self.w_names(site), self.params(site))}
        return site.state

    def local_step(self, site: Site, batch: Batch) -> torch.Tensor:
        st = site.state
        ab_alpha = [st["a"], st["b"], st["alpha"]]
        loss, g_w, g_a, g_b, _ = self.gradients_at(site, batch, None, ab_alpha)
        *_, g_alpha = self.gradients_at(site, batch, self.group(site, "anchor", self.w_names(site)), ab_alpha)
        with torch.no_grad():
            torch._foreach_add_(self.x(site), g_w + [g_a, g_b], alpha=-self.fed.lr)
            st["alpha"].add_(g_alpha, alpha=self.p.dual_lr)
        return loss

    def round_end(self, site: Site) -> None:
        with torch.no_grad():
            for current, prev, eta in ((self.x(site), self.group(site, "prev_global"), self.p.eta_x),
                                       ([site.state["alpha"]], [site.state["prev_global.alpha"]], self.p.eta_y)):
                if eta != 1.0:
                    torch._foreach_copy_(current, torch._foreach_add(prev, torch._foreach_sub(current, prev), alpha=eta))
                torch._foreach_copy_(prev, current)
            if (site.iteration // self.fed.local_steps) % self.p.anchor_every == 0:
                torch._foreach_copy_(self.group(site, "anchor", self.w_names(site)), self.params(site))
