"""CODASCA (Yuan, Guo, Xu, Ying, Yang, ICML 2021; Algorithms 3 and 4 of the arXiv long version),
docs/algorithms.md sections 5 and 11.

CODA+ plus SCAFFOLD-style control variates on primal v = (w, a, b) and dual alpha, and a global
extrapolation step eta_g. Per site k, local step:
    v     <- v - lr (grad_v F + prox (v - v_ref) - c_k,v + c_v)       (grad_v F clipped as in CODA+)
    alpha <- clamp(alpha + lr (d_alpha - c_k,alpha + c_alpha), 0, 999)
Round end:
    c_k   <- mean of the round's raw (unclipped) gradients grad_v F and of d_alpha;  c <- mean_k c_k
             (d_alpha at the alpha each step ascended from, the paper's rule; ``dual_variate="post_step"``:
             at the alpha after the step, as the authors' code)
    v_bar <- mean_k v_k;  v <- v_prev + eta_g (v_bar - v_prev)     (same for alpha; v_prev = the global
                                                                    model after the previous round)
eta_g = 1 is plain averaging (the authors' code default). With c = c_k = 0 the first round is CODA+.
Stages as CODA+; with ``stage_restart`` (not the default) a stage is a fresh run of the paper's inner algorithm
from the previous stage's mean iterate, so c = c_k = 0 again and its first round is again CODA+'s.
A site sends v, alpha and c_k: twice CODA+'s bytes.
Recipe (docs/algorithms.md section 12): LibAUC's cross-entropy warm-up is ``TrainConfig.warmup_rounds``
(FedAvg rounds, then this algorithm from the warm network; off by default, docs/claims.md measures it),
AUC-M's imratio p is ``TrainConfig.prior`` (global by default) and ``guarantee_positives`` puts a
positive in every batch.
"""

from __future__ import annotations

from typing import Literal

import torch
from pydantic import Field, model_validator

from federated.algorithms.base import Site
from federated.algorithms.codaplus import CODAPlus, CODAPlusParams
from federated.registry import register
from federated.state import Comm
from models.objectives import clamp_alpha


class CODASCAParams(CODAPlusParams):
    eta_g: float = Field(default=1.0, gt=0)  # global step; > 1 extrapolates past the site mean
    # Which alpha the round's mean d_alpha (c_k,alpha) is evaluated at: "pre_step", the alpha the step
    # ascended from (the paper's SCAFFOLD rule: c_k is the mean of the directions the steps took);
    # "post_step", the alpha after the step, as the authors' code. Closed-form dual only.
    dual_variate: Literal["pre_step", "post_step"] = "pre_step"

    @model_validator(mode="after")
    def _post_step_needs_closed_form(self):
        if self.dual_variate == "post_step" and self.dual != "closed_form":
            raise ValueError("dual_variate='post_step' re-evaluates the closed-form d_alpha after the step; "
                             "it needs dual='closed_form'")
        return self


@register
class CODASCA(CODAPlus):
    name = "codasca"
    dp_method = "DP-SGDA"  # its control variates are means of noised gradients
    Params = CODASCAParams

    def variate_names(self, site: Site) -> list[str]:
        return self.primal_names(site) + ["alpha"]

    def variates(self, site: Site, kind: str) -> list[torch.Tensor]:
        return [site.state[f"{kind}.{n}"] for n in self.variate_names(site)]

    def state_spec(self, site: Site):
        spec = super().state_spec(site)
        for n in self.variate_names(site):
            spec[f"c_site.{n}"] = Comm.LOCAL
            spec[f"c.{n}"] = Comm.MEAN  # holds c_k when sent; the mean received is the new c
            spec[f"grad_sum.{n}"] = Comm.LOCAL
            if self.p.eta_g != 1.0:
                spec[f"prev_global.{n}"] = Comm.LOCAL
        return spec

    def init_site_state(self, site: Site):
        state = super().init_site_state(site)
        site.state = state
        values = self.primal(site) + [state["alpha"]]
        for n, v in zip(self.variate_names(site), values):
            for kind in ("c_site", "c", "grad_sum"):
                state[f"{kind}.{n}"] = torch.zeros_like(v)
            if self.p.eta_g != 1.0:
                state[f"prev_global.{n}"] = v.detach().clone()
        return state

    def local_step(self, site: Site, batch) -> torch.Tensor:
        st, lr = site.state, self.stage_lr(site)
        loss, g, g_alpha, defined = self.gradients(site, batch)
        c_site, c, grad_sum = (self.variates(site, kind) for kind in ("c_site", "c", "grad_sum"))
        n = len(g)
        with torch.no_grad():
            v = self.primal(site)
            torch._foreach_add_(grad_sum[:n], g)  # c_k is the mean of the raw, unclipped gradients
            d = torch._foreach_add(torch._foreach_sub(self.primal_direction(site, v, g), c_site[:n]), c[:n])
            torch._foreach_add_(v, d, alpha=-lr)
            d_alpha = self.dual_direction(site, g_alpha, defined)
            st["alpha"].copy_(clamp_alpha(st["alpha"] + lr * (d_alpha - c_site[n] + c[n])))
            if self.p.dual_variate == "post_step":
                d_alpha = self.dual_direction(site, g_alpha, defined)
            grad_sum[n] += d_alpha
            self.end_of_step(site)
        return loss

    def before_communication(self, site: Site) -> None:
        grad_sum = self.variates(site, "grad_sum")
        torch._foreach_mul_(grad_sum, 1.0 / self.fed.local_steps)
        torch._foreach_copy_(self.variates(site, "c_site"), grad_sum)
        torch._foreach_copy_(self.variates(site, "c"), grad_sum)
        torch._foreach_zero_(grad_sum)

    def stage_start(self, site: Site, stats) -> None:
        super().stage_start(site, stats)
        if not self.p.stage_restart:
            return
        # The restarted stage's control variates start at 0 and its global iterate is the restart point.
        for kind in ("c_site", "c"):
            torch._foreach_zero_(self.variates(site, kind))
        if self.p.eta_g != 1.0:
            with torch.no_grad():
                torch._foreach_copy_(self.variates(site, "prev_global"), self.primal(site) + [site.state["alpha"]])

    def round_end(self, site: Site) -> None:
        if self.p.eta_g == 1.0:
            return
        with torch.no_grad():
            current = self.primal(site) + [site.state["alpha"]]
            prev = self.variates(site, "prev_global")
            step = torch._foreach_sub(current, prev)
            torch._foreach_add_(prev, step, alpha=self.p.eta_g)
            torch._foreach_copy_(current, prev)
            site.state["alpha"].copy_(clamp_alpha(site.state["alpha"]))
            site.state["prev_global.alpha"].copy_(site.state["alpha"])
