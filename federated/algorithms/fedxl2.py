"""FeDXL2: federated KL-OPAUC, one-way partial AUC (Guo et al., ICML 2023). docs/algorithms.md sections 1.5, 7 and 11.

FeDXL1 with the non-linear outer function of KL-OPAUC and a stored inner mean u_i per positive.
Per site k and disease c, each local step t (l_ij = l(s_i - s_j), lam the KL temperature):
    active part, local positives i in P_c against B passive negatives s^-_j from the pools:
        g_i = mean_j exp(l(s_i - s^-_j) / lam);  u_i <- (1 - gamma) u_i + gamma g_i   (first visit: u_i = g_i)
        A_c = mean_{i, j} [exp(l(s_i - s^-_j) / lam) / u_i]_detached * l(s_i - s^-_j)
    passive part, B pool positives s^+_i with their communicated u^+_i against local negatives j in N_c:
        Q_c = mean_{i, j} [exp(l(s^+_i - s_j) / lam) / u^+_i]_detached * l(s^+_i - s_j)
    G = (1/C) sum_c (A_c + Q_c);   v <- (1 - beta) v + beta grad G;   w <- w - lr_t v
    (v starts at the first gradient, v_1 = grad G_1, as in the paper and the authors' code)
Every I steps: average models and v (all of v, docs/algorithms.md section 9); gather the pool payload (FeDXL1's
scores plus the u of the sent positives: 3 * P * C * 4 bytes per site per round).
u lives per training row and disease at its site and never leaves it except as pool entries.
Round 0's pool positives get u = g against the site's own P initial negative scores (the only
negatives a site can see before the first exchange).
"""

from __future__ import annotations

import torch

from federated.algorithms.base import Site
from federated.algorithms.fedxl1 import FeDXL1, FeDXL1Params
from federated.algorithms.pairwise import KLOPAUC, KLOPAUCParams, masked_kl_opauc_surrogate
from federated.data import Batch
from federated.registry import register
from models.objectives import kl_opauc_inner_mean


class FeDXL2Params(FeDXL1Params, KLOPAUCParams):
    pass


@register
class FeDXL2(KLOPAUC, FeDXL1):
    name = "fedxl2"
    Params = FeDXL2Params
    pool_fields = {"pos": ("pos_score", "pos_u"), "neg": ("neg_score",)}

    def complete_initial_payload(self, site: Site, payload: dict[str, torch.Tensor]) -> None:
        for c in range(self.fed.num_classes):
            pos, neg = payload["pos_score"][:, c], payload["neg_score"][:, c]
            if bool(torch.isnan(neg).any()):  # no negative at this site: the positives cannot carry a u
                payload["pos_score"][:, c] = float("nan")
            elif not bool(torch.isnan(pos).any()):
                payload["pos_u"][:, c] = kl_opauc_inner_mean(pos, neg, self.p.lam, self.loss_fn)

    def buffer_values(self, site: Site, batch: Batch, s: torch.Tensor) -> dict[str, torch.Tensor]:
        return super().buffer_values(site, batch, s) | {"pos_u": site.state["u"][batch.index]}

    def sendable(self, site: Site) -> dict[str, torch.Tensor]:
        return {"pos": site.state["buffer.pos_u"] > 0}  # a positive never scored against negatives has no u

    def objective(self, site: Site, batch: Batch, s: torch.Tensor) -> torch.Tensor:
        neg_drawn, vn = self.pool.draw(site, "neg")
        pos_drawn, vp = self.pool.draw(site, "pos")
        terms = []
        for c in range(self.fed.num_classes):
            active = self.positive_term(site, batch, s, c, neg_drawn["neg_score"][:, c], vn[:, c])
            passive = masked_kl_opauc_surrogate(pos_drawn["pos_score"][:, c], s[:, c], pos_drawn["pos_u"][:, c],
                                                vp[:, c].to(s.dtype), (1 - batch.y[:, c]) * batch.mask[:, c],
                                                self.p.lam, self.loss_fn)
            terms.append(active + passive)
        return torch.stack(terms).sum() / self.fed.num_classes
