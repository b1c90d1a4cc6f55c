"""CoDA (Guo, Liu, Yuan, Shen, Liu, Yang, "Communication-efficient distributed stochastic AUC
maximization with deep neural networks", ICML 2020), as CODASCA's baseline (docs/algorithms.md section 5).

CODA+ plus one step at every stage start: alpha is reset from the primal through pooled class means
of the scores over all sites,
    alpha <- max(0, m + mean(s | y=0) - mean(s | y=1)),
the maximiser of the AUC-M objective in alpha at a = E[s|y=1], b = E[s|y=0]. Sites share only
aggregate statistics: per-disease sums and counts of their scores by class over the stage's local
steps (summed over sites, so the ratio is the pooled mean). A disease without positives or
negatives anywhere keeps its alpha.
"""

from __future__ import annotations

import torch
from pydantic import model_validator

from federated.algorithms.base import Site
from federated.algorithms.codaplus import CODAPlus, CODAPlusParams
from federated.data import Batch
from federated.registry import register
from federated.state import Comm

_CLASS_STATS = ("pos_sum", "pos_count", "neg_sum", "neg_count")


class CoDAParams(CODAPlusParams):
    # CoDA's alpha reset needs stages: CODA+'s default two of T/2, or a given T0.
    @model_validator(mode="after")
    def _needs_stages(self):
        if self.T0 is None and self.stages == 1:
            raise ValueError("CoDA resets alpha at stage boundaries: with one stage it is CODA+; set stages >= 2 "
                             "(CoDA's default 2) or T0")
        return self


@register
class CoDA(CODAPlus):
    name = "coda"
    dp_refusal = "its stage statistics are per-class sums of the site's own scores, released without noise"
    Params = CoDAParams

    def state_spec(self, site: Site):
        return {**super().state_spec(site), **dict.fromkeys(_CLASS_STATS, Comm.LOCAL)}

    def init_site_state(self, site: Site):
        state = super().init_site_state(site)
        state.update({k: torch.zeros(self.fed.num_classes, device=self.fed.device) for k in _CLASS_STATS})
        return state

    def scores(self, site: Site, batch: Batch) -> torch.Tensor:
        s = super().scores(site, batch)
        with torch.no_grad():
            pos, neg = batch.y * batch.mask, (1 - batch.y) * batch.mask
            site.state["pos_sum"] += (s.detach() * pos).sum(0)
            site.state["pos_count"] += pos.sum(0)
            site.state["neg_sum"] += (s.detach() * neg).sum(0)
            site.state["neg_count"] += neg.sum(0)
        return s

    def stage_statistics(self, site: Site):
        return {**super().stage_statistics(site), **{k: site.state[k].clone() for k in _CLASS_STATS}}

    def stage_spec(self, site: Site):
        # Summed, not averaged with the aggregation weights: sum_k pos_sum_k / sum_k pos_count_k is the
        # pooled class mean over every site's scores, whatever the weights.
        return super().stage_spec(site) | dict.fromkeys(_CLASS_STATS, Comm.SUM)

    def stage_start(self, site: Site, stats) -> None:
        super().stage_start(site, stats)
        known = (stats["pos_count"] > 0) & (stats["neg_count"] > 0)
        mean_pos = stats["pos_sum"] / stats["pos_count"].clamp_min(1e-12)
        mean_neg = stats["neg_sum"] / stats["neg_count"].clamp_min(1e-12)
        reset = (self.p.margin + mean_neg - mean_pos).clamp_min(0.0)
        site.state["alpha"].copy_(torch.where(known, reset, site.state["alpha"]))
        for k in _CLASS_STATS:
            site.state[k].zero_()
