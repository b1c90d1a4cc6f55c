"""Local Pair: FeDXL2's KL-OPAUC estimator on local current pairs only (Guo et al., ICML 2023, baseline).
docs/algorithms.md sections 1.5 and 7.

Per site k and disease c, each local step t (P_c / N_c the batch's positives / negatives):
    g_i = mean_{j in N_c} exp(l(s_i - s_j) / lam);  u_i <- (1 - gamma) u_i + gamma g_i
    G = (1/C) sum_c mean_{i in P_c, j in N_c} [exp(l_ij / lam) / u_i]_detached * l_ij   (gradient through s_i and s_j)
    v <- (1 - beta) v + beta grad G;   w <- w - lr_t v      (v_1 = grad G_1, as FeDXL2)
Every I steps: average models and v. No pools: nothing beyond FeDXL2's model and v is communicated,
and pairs never cross sites (what FeDXL2's pools add is exactly the cross-site pairs).
"""

from __future__ import annotations

import torch

from federated.algorithms.base import Site
from federated.algorithms.pairwise import KLOPAUC, KLOPAUCParams, PairwiseAlgorithm, PairwiseParams
from federated.data import Batch
from federated.registry import register


class LocalPairParams(PairwiseParams, KLOPAUCParams):
    pass


@register
class LocalPair(KLOPAUC, PairwiseAlgorithm):
    name = "localpair"
    Params = LocalPairParams

    def objective(self, site: Site, batch: Batch, s: torch.Tensor) -> torch.Tensor:
        terms = []
        for c in range(self.fed.num_classes):
            terms.append(self.positive_term(site, batch, s, c, s[:, c], (1 - batch.y[:, c]) * batch.mask[:, c]))
        return torch.stack(terms).sum() / self.fed.num_classes
