"""FeDXL2: federated KL-OPAUC, one-way partial AUC (Guo et al., ICML 2023). algorithms.md 1.5 and 7.

FeDXL1 with the non-linear outer function of KL-OPAUC and a stored inner mean u_i per positive.
Per site k and disease c, each local step t (l_ij = l(s_i - s_j), lam the KL temperature):
    active part, local positives i in P_c against B passive negatives s^-_j from the pools:
        g_i = mean_j exp(l(s_i - s^-_j) / lam);  u_i <- (1 - gamma) u_i + gamma g_i   (first visit: u_i = g_i)
        A_c = mean_{i, j} [exp(l(s_i - s^-_j) / lam) / u_i]_detached * l(s_i - s^-_j)
    passive part, B pool positives s^+_i with their communicated u^+_i against local negatives j in N_c:
        Q_c = mean_{i, j} [exp(l(s^+_i - s_j) / lam) / u^+_i]_detached * l(s^+_i - s_j)
    G = (1/C) sum_c (A_c + Q_c);   v <- (1 - beta) v + beta grad G;   w <- w - lr_t v
Every I steps: average models and v (all of v, algorithms.md 9); gather the pool payload (FeDXL1's
scores plus the u of the sent positives: 3 * P * C * 4 bytes per site per round).
u lives per training row and disease at its site and never leaves it except as pool entries.
Round 0's pool positives get u = g against the site's own P initial negative scores (the only
negatives a site can see before the first exchange).
"""

from __future__ import annotations

import torch
from pydantic import Field

from federated.algorithms.base import Site
from federated.algorithms.fedxl1 import FeDXL1, FeDXL1Params
from federated.data import Batch
from federated.registry import register
from federated.state import Comm
from models.objectives import kl_opauc_ema, kl_opauc_inner_mean, kl_opauc_surrogate


class FeDXL2Params(FeDXL1Params):
    lam: float = Field(default=1.0, gt=0)  # KL temperature; smaller focuses on the hardest negatives (low FPR)
    gamma: float = Field(default=0.1, gt=0, le=1)  # u EMA weight on the new g (authors 0.1-0.2); 1 = no memory
    beta: float = Field(default=0.1, gt=0, le=1)  # gradient EMA weight on the new gradient; 1 = plain SGD


@register
class FeDXL2(FeDXL1):
    name = "fedxl2"
    Params = FeDXL2Params
    pool_fields = {"pos": ("pos_score", "pos_u"), "neg": ("neg_score",)}

    def state_spec(self, site: Site):
        spec = {"u": Comm.LOCAL} | {f"momentum.{n}": Comm.MEAN for n, _ in site.model.named_parameters()}
        return super().state_spec(site) | spec

    def init_site_state(self, site: Site):
        state = super().init_site_state(site)
        state["u"] = torch.zeros(len(site.data.train), self.fed.num_classes, device=self.fed.device)
        state.update({f"momentum.{n}": torch.zeros_like(p) for n, p in site.model.named_parameters()})
        return state

    def complete_initial_pool(self, site: Site, pool: dict[str, torch.Tensor]) -> None:
        for c in range(self.fed.num_classes):
            pos, neg = pool["pool.pos_score"][:, c], pool["pool.neg_score"][:, c]
            pos, neg = pos[~torch.isnan(pos)], neg[~torch.isnan(neg)]
            if len(pos) and len(neg):
                pool["pool.pos_u"][: len(pos), c] = kl_opauc_inner_mean(pos, neg, self.p.lam, self.loss_fn)
            elif len(pos):  # no negative at this site: the entries cannot carry a u, so they are not sent
                pool["pool.pos_score"][:, c] = float("nan")

    def buffer_values(self, site: Site, batch: Batch, s: torch.Tensor) -> dict[str, torch.Tensor]:
        return super().buffer_values(site, batch, s) | {"pos_u": site.state["u"][batch.index]}

    def sendable(self, site: Site, kind: str, c: int) -> torch.Tensor:
        if kind == "neg":
            return super().sendable(site, kind, c)
        return site.state["buffer.pos_u"][:, c] > 0  # a positive never scored against negatives has no u

    def positive_term(self, site: Site, batch: Batch, s: torch.Tensor, c: int, negatives: torch.Tensor) -> torch.Tensor:
        """Update u of the batch's positives of disease c against ``negatives`` and return their surrogate."""
        is_pos = (batch.y[:, c] * batch.mask[:, c]) > 0
        pos_s, rows = s[is_pos, c], batch.index[is_pos]
        if len(pos_s) == 0 or len(negatives) == 0:
            return s[:, c].sum() * 0
        u = kl_opauc_ema(site.state["u"][rows, c], kl_opauc_inner_mean(pos_s, negatives, self.p.lam, self.loss_fn),
                         self.p.gamma)
        site.state["u"][rows, c] = u
        return kl_opauc_surrogate(pos_s, negatives, u, self.p.lam, self.loss_fn)

    def objective(self, site: Site, batch: Batch, s: torch.Tensor) -> torch.Tensor:
        neg_drawn, vn = self.passive(site, "neg")
        pos_drawn, vp = self.passive(site, "pos")
        terms = []
        for c in range(self.fed.num_classes):
            active = self.positive_term(site, batch, s, c, neg_drawn["neg_score"][vn[:, c], c])
            is_neg = ((1 - batch.y[:, c]) * batch.mask[:, c]) > 0
            pool_pos = pos_drawn["pos_score"][vp[:, c], c]
            passive = s[:, c].sum() * 0
            if len(pool_pos) and bool(is_neg.any()):
                passive = kl_opauc_surrogate(pool_pos, s[is_neg, c], pos_drawn["pos_u"][vp[:, c], c],
                                             self.p.lam, self.loss_fn)
            terms.append(active + passive)
        return torch.stack(terms).sum() / self.fed.num_classes

    def direction(self, site: Site, grads: list[torch.Tensor]) -> list[torch.Tensor]:
        v = [site.state[f"momentum.{n}"] for n, _ in site.model.named_parameters()]
        torch._foreach_lerp_(v, grads, self.p.beta)
        return v
