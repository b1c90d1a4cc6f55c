"""CODA+ (Yuan, Guo, Xu, Ying, Yang: "Federated Deep AUC Maximization for Heterogeneous Data with a
Constant Communication Complexity", ICML 2021), docs/algorithms.md sections 1.2, 5 and 11.

Objective: the AUC-margin min-max (1.2) with the global prior p per disease, primal v = (w, a, b),
dual alpha >= 0, plus the proximal term (1/(2 gamma)) ||v - v_ref||^2 of the stagewise framework.
Per site, local step t with minibatch xi (g = stochastic gradient of the AUC-M loss):
    w     <- w - lr (clip(g_w) + prox (w - w_ref)) - lr wd w      clip: element-wise at ``clip``
    a, b  <- the same, unclipped
    alpha <- clamp(alpha + lr d_alpha, 0, 999)                    d_alpha = 2(m + b - a) - 2 alpha,
                                                                  at the updated a, b (closed form),
                                                                  or the stochastic gradient
Every I steps: average (w, a, b, alpha) and BN running statistics (section 9).
Every T0 steps (a stage; T0 derived from the run's T iterations with ``stages``, docs/algorithms.md
section 12): lr <- lr / lr_decay; v_ref <- mean over sites and over the stage's iterates;
and with ``stage_restart`` (the paper's Algorithm) the next stage starts from that mean: v <- v_ref and
alpha <- the stage's mean alpha. By default (``stage_restart=False``, the authors' code) the iterate continues.
For a disease without both classes in the batch, its loss term and its alpha step are 0.
Plain SGD, no PESG momentum (section 9).
Recipe (docs/algorithms.md section 12): LibAUC's cross-entropy warm-up is ``TrainConfig.warmup_rounds``
(FedAvg rounds, then this algorithm from the warm network; off by default, docs/claims.md measures it),
AUC-M's imratio p is ``TrainConfig.prior`` (global by default) and ``guarantee_positives`` puts a
positive in every batch.
"""

from __future__ import annotations

import math
from typing import Literal

import torch
from pydantic import BaseModel, ConfigDict, Field

from federated.algorithms.base import Algorithm, Site
from federated.data import Batch
from federated.registry import register
from federated.state import Comm
from models.objectives import (
    auc_margin_dual_direction,
    auc_margin_loss,
    auc_margin_terms,
    clamp_alpha,
)


class CODAPlusParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    margin: float = Field(default=1.0, gt=0)  # m of AUC-M
    gamma: float | None = Field(default=500.0, gt=0)  # prox = 1/gamma; None drops the proximal term
    # Stage length in iterations; None derives it from the run's length T: ``stages`` stages of T / stages
    # iterations each, rounded up to a multiple of I. The defaults are LibAUC's stagewise recipe: two stages,
    # lr / 10 at the boundary, weight decay 1e-4, the iterate carrying on (docs/algorithms.md section 12, and
    # docs/claims.md "Stagewise defaults" for the measurement against one constant-lr stage).
    T0: int | None = Field(default=None, gt=0)
    stages: int = Field(default=2, ge=1)  # with T0 None; 1: one stage, constant lr
    lr_decay: float = Field(default=10.0, ge=1)  # lr divisor at each stage boundary
    clip: float | None = Field(default=1.0, gt=0)  # element-wise clip of g_w; None: no clipping
    weight_decay: float = Field(default=1e-4, ge=0)
    dual: Literal["closed_form", "gradient"] = "closed_form"
    # True: each stage starts from the previous stage's mean iterate (v and alpha), as the papers'
    # Algorithms do (CODASCA also restarts its control variates at 0); False: only v_ref moves there and
    # the iterate carries on, as the authors' code and LibAUC's PESG do (docs/algorithms.md section 5).
    # The restart measured worse on image federations trained from scratch: the mean over a whole first stage
    # includes its early iterates (docs/claims.md "Stagewise defaults").
    stage_restart: bool = False
    # "identity" feeds raw logits to the loss: the linear-score AUC regression (convex-concave) of the
    # drift tests; "sigmoid" is the deep AUC setting (docs/algorithms.md section 0).
    score: Literal["sigmoid", "identity"] = "sigmoid"


def derived_stage_length(iterations: int, local_steps: int, stages: int) -> int | None:
    """T0 for ``stages`` stages over a run of ``iterations``: stage boundaries fall on communication rounds,
    so T0 is a multiple of I, rounded up so that the run never starts a stage beyond the ``stages``-th."""
    if stages == 1:
        return None
    return max(1, math.ceil(iterations / (stages * local_steps))) * local_steps


@register
class CODAPlus(Algorithm):
    name = "codaplus"
    dp_method = "DP-SGDA"  # (w, a, b, alpha) clipped together per record
    Params = CODAPlusParams

    def __init__(self, params, fed):
        super().__init__(params, fed)
        self.stage_length = self.p.T0 or derived_stage_length(fed.iterations, fed.local_steps, self.p.stages)

    # --- state --------------------------------------------------------------------------------
    def primal_names(self, site: Site) -> list[str]:
        return [f"w.{n}" for n in site.parameter_names()] + ["a", "b"]

    def primal(self, site: Site) -> list[torch.Tensor]:
        return self.params(site) + [site.state["a"], site.state["b"]]

    def group(self, site: Site, kind: str) -> list[torch.Tensor]:
        return [site.state[f"{kind}.{n}"] for n in self.primal_names(site)]

    def averaged_names(self, site: Site) -> list[str]:
        """What a stage averages over its iterates: v (for v_ref), and alpha too when the next stage restarts."""
        return self.primal_names(site) + (["alpha"] if self.p.stage_restart else [])

    def averaged(self, site: Site) -> list[torch.Tensor]:
        return self.primal(site) + ([site.state["alpha"]] if self.p.stage_restart else [])

    def state_spec(self, site: Site):
        spec = {"a": Comm.MEAN, "b": Comm.MEAN, "alpha": Comm.MEAN}
        spec |= {f"ref.{n}": Comm.LOCAL for n in self.primal_names(site)}
        if self.stage_length:
            spec |= {f"stage_sum.{n}": Comm.LOCAL for n in self.averaged_names(site)}
            spec["stage_count"] = Comm.LOCAL
        return spec

    def init_site_state(self, site: Site):
        C, dev = self.fed.num_classes, self.fed.device
        state = {"a": torch.zeros(C, device=dev), "b": torch.zeros(C, device=dev),
                 "alpha": torch.zeros(C, device=dev)}
        site.state = state  # primal() reads a and b from here
        for n, v in zip(self.primal_names(site), self.primal(site)):
            state[f"ref.{n}"] = v.detach().clone()  # v_ref starts at v0 (section 5)
        if self.stage_length:
            state.update({f"stage_sum.{n}": torch.zeros_like(v)
                          for n, v in zip(self.averaged_names(site), self.averaged(site))})
            state["stage_count"] = torch.zeros((), dtype=torch.float64)
        return state

    # --- one local step -----------------------------------------------------------------------
    def scores(self, site: Site, batch: Batch) -> torch.Tensor:
        return self.score_of(self.logits(site, batch))

    def score_of(self, logits: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(logits) if self.p.score == "sigmoid" else logits

    def primal_direction(self, site: Site, v: list[torch.Tensor], g: list[torch.Tensor]) -> list[torch.Tensor]:
        n_w = len(v) - 2
        d = list(g)
        if self.p.clip is not None:  # multi-tensor: a clamp per tensor was ~360 kernel launches a step (DenseNet121)
            d[:n_w] = torch._foreach_clamp_min(torch._foreach_clamp_max(d[:n_w], self.p.clip), -self.p.clip)
        if self.p.gamma is not None:
            d = torch._foreach_add(d, torch._foreach_sub(v, self.group(site, "ref")), alpha=1.0 / self.p.gamma)
        if self.p.weight_decay:
            d = torch._foreach_add(d, v, alpha=self.p.weight_decay)
        return d

    def gradients(self, site: Site, batch: Batch):
        """(loss, raw gradient of the primal v = (w, a, b), stochastic alpha gradient, (C,) 1 for the
        diseases with both classes in the batch) of the AUC-M loss."""
        a, b, alpha = (site.state[k].detach().requires_grad_() for k in ("a", "b", "alpha"))
        # Under DP (w, a, b, alpha) are clipped together per record (DP-SGDA).
        loss, grads = self.differentiate(site, batch, lambda: auc_margin_loss(
            self.scores(site, batch), batch.y, a, b, alpha, site.prior, self.p.margin, mask=batch.mask), [a, b, alpha])
        return loss, grads[:-1], grads[-1], self.stepped_diseases(site, batch).to(alpha.dtype)

    def sample_loss(self, site, logits, y, mask, extras):
        a, b, alpha = extras
        s = self.score_of(logits)
        return auc_margin_terms(s, y * mask, (1 - y) * mask, a, b, alpha, site.prior, self.p.margin).sum() / len(s)

    def dual_direction(self, site: Site, g_alpha: torch.Tensor, defined: torch.Tensor) -> torch.Tensor:
        """d_alpha at the current (already updated) a, b: closed form or the stochastic gradient."""
        st = site.state
        d_alpha = (auc_margin_dual_direction(st["a"], st["b"], st["alpha"], self.p.margin)
                   if self.p.dual == "closed_form" else g_alpha)
        return d_alpha * defined

    def end_of_step(self, site: Site) -> None:
        """Add the updated iterate to the stage's running sums (v_ref and the restart point of the next stage)."""
        if self.stage_length:
            torch._foreach_add_([site.state[f"stage_sum.{n}"] for n in self.averaged_names(site)],
                                self.averaged(site))
            site.state["stage_count"] += 1

    def stage_lr(self, site: Site) -> float:
        """This stage's lr, lr / lr_decay ** stage: a Python number from the step count, not a state tensor
        read back every step (a host sync where the state lives on a GPU)."""
        stage = site.iteration // self.stage_length if self.stage_length else 0
        return self.fed.lr / self.p.lr_decay ** stage

    def local_step(self, site: Site, batch: Batch) -> torch.Tensor:
        st, lr = site.state, self.stage_lr(site)
        loss, g, g_alpha, defined = self.gradients(site, batch)
        with torch.no_grad():
            v = self.primal(site)
            torch._foreach_add_(v, self.primal_direction(site, v, g), alpha=-lr)
            st["alpha"].copy_(clamp_alpha(st["alpha"] + lr * self.dual_direction(site, g_alpha, defined)))
            self.end_of_step(site)
        return loss

    # --- stages -------------------------------------------------------------------------------
    def stage_statistics(self, site: Site):
        count = float(site.state["stage_count"])
        return {f"mean.{n}": site.state[f"stage_sum.{n}"] / count for n in self.averaged_names(site)}

    def stage_spec(self, site: Site):
        # The mean of the stage's iterates of the global model, which the aggregation weights define.
        return dict.fromkeys((f"mean.{n}" for n in self.averaged_names(site)), Comm.MEAN)

    def stage_start(self, site: Site, stats) -> None:
        for n in self.primal_names(site):
            site.state[f"ref.{n}"].copy_(stats[f"mean.{n}"])
        if self.p.stage_restart:
            with torch.no_grad():
                torch._foreach_copy_(self.averaged(site), [stats[f"mean.{n}"] for n in self.averaged_names(site)])
        for n in self.averaged_names(site):
            site.state[f"stage_sum.{n}"].zero_()
        site.state["stage_count"].zero_()
