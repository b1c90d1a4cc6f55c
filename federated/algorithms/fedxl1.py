"""FeDXL1: federated pairwise X-risk, linear outer function (Guo et al., ICML 2023). docs/algorithms.md sections 1.4 and 7.

Per site k and disease c, each local step t on a minibatch (active scores s = sigmoid(model(x)), through
which gradients flow; P_c / N_c = the batch's positives / negatives of disease c):
    draw B passive negatives s^-_j and B passive positives s^+_i uniformly (with replacement) from the pools
    G = (1/C) sum_c [ mean_{i in P_c, j} l(s_i - s^-_j) + mean_{i, j in N_c} l(s^+_i - s_j) ]
    w <- w - lr_t grad G,       lr_t = lr * lr_decay ** (t // lr_decay_every)
with l a pairwise surrogate of models.objectives (squared hinge by default; ``sigmoid`` is the
label-noise-robust one). Every I steps: average the models; every site sends its *pool payload* and the
gathered payloads of all sites are the pools of the next round (the newest ``tau`` rounds are kept).
Round 0's pools come from an initial scoring pass with the initial model (one gather before round 0,
``Algorithm.initial_gather``): for each disease, P random positives and P random negatives of the
site are scored.

Pool payload, the one thing beyond parameters a site sends (docs/algorithms.md section 3): per round and disease,
exactly P = ``pool_size`` positive scores and P negative scores (float32: 2 * P * C * 4 bytes per site
per round; FeDXL2 adds the positives' u values, 3 * P * C * 4), drawn with replacement from the round's
active scores by federated/algorithms/score_pool.py, which says why that keeps the paper's estimator
and hides the site's counts. No image, per-image label, or index is sent; a column says only which
disease an entry is for. The engine counts these bytes like any other state.

Multi-label deviation: the paper draws B1 positives and B2 negatives per task; here one batch of the
engine's loader serves every disease (set ``guarantee_positives`` under heavy imbalance).
"""

from __future__ import annotations

import numpy as np
import torch
from pydantic import Field

from federated.algorithms.base import Site
from federated.algorithms.pairwise import PairwiseAlgorithm, PairwiseParams
from federated.algorithms.score_pool import KINDS, ScorePool
from federated.data import Batch, to_model_input
from federated.registry import register
from models.compositional import functional_forward
from models.objectives import pairwise_auc_loss


class FeDXL1Params(PairwiseParams):
    pool_size: int = Field(default=32, gt=0)  # P per class per disease per site per round: payload and pool size
    tau: int = Field(default=1, gt=0)  # rounds of pools kept; larger = more, staler passive scores
    passive_batch: int = Field(default=32, gt=0)  # passive scores drawn per class per disease per step (B1 = B2)


@register
class FeDXL1(PairwiseAlgorithm):
    name = "fedxl1"
    Params = FeDXL1Params
    initial_gather = True
    pool_fields = {"pos": ("pos_score",), "neg": ("neg_score",)}  # what a pool entry carries, per class

    def __init__(self, params: dict, fed):
        super().__init__(params, fed)
        self.pool = ScorePool(self.pool_fields, self.p.pool_size, self.p.tau, self.p.passive_batch, fed)

    # --- state --------------------------------------------------------------------------------
    def state_spec(self, site: Site):
        return super().state_spec(site) | self.pool.state_spec()

    def init_site_state(self, site: Site):
        capacity = self.fed.local_steps * site.loader.batch_size  # one round's batches
        return super().init_site_state(site) | self.pool.init_state(site, capacity, self.initial_payload(site))

    def initial_payload(self, site: Site) -> dict[str, torch.Tensor]:
        """Round 0's payload: P rows drawn with replacement among the site's positives (and negatives) of
        each disease, scored by the initial model; NaN columns where the site has no such row."""
        labels = torch.from_numpy(np.array(site.data.train.labels))  # a copy: shard labels are read-only
        picks = {}
        for c in range(self.fed.num_classes):
            for kind, value in KINDS.items():
                rows = self.pool.sample(torch.nonzero(labels[:, c] == value).flatten())
                if rows is not None:
                    picks[kind, c] = rows.numpy()
        union = np.unique(np.concatenate([np.zeros(0, dtype=np.int64), *picks.values()]))
        scores = self.score_rows(site, union)
        out = {f: torch.full((self.p.pool_size, self.fed.num_classes), float("nan"), device=self.fed.device)
               for f in self.pool.names()}
        for (kind, c), rows in picks.items():
            out[f"{kind}_score"][:, c] = scores[np.searchsorted(union, rows), c]
        self.complete_initial_payload(site, out)
        return out

    def complete_initial_payload(self, site: Site, payload: dict[str, torch.Tensor]) -> None:
        """Fill payload fields other than scores (FeDXL2: the positives' u)."""

    @torch.no_grad()
    def score_rows(self, site: Site, rows: np.ndarray) -> torch.Tensor:
        """Scores of training rows (sorted: sequential reads of a memory-mapped shard) in train mode with
        batch statistics, as active scores get them, without touching the BatchNorm running statistics."""
        out = [torch.zeros(0, self.fed.num_classes, device=self.fed.device)]
        # Near-equal chunks: a BatchNorm forward in train mode fails on a chunk of one row.
        for chunk in np.array_split(rows, max(1, -(-len(rows) // site.loader.batch_size))):
            if len(chunk) == 0:  # a site without any labelled row has nothing to score
                continue
            x = to_model_input(site.data.train.images[chunk], self.fed.device)
            with self.autocast():
                logits = functional_forward(site.model, {}, x)
            out.append(torch.sigmoid(logits.float()).reshape(len(x), -1))
        return torch.cat(out)

    # --- the pool's round -----------------------------------------------------------------------
    def observe(self, site: Site, batch: Batch, s: torch.Tensor) -> None:
        self.pool.record(site, batch, self.buffer_values(site, batch, s))

    def buffer_values(self, site: Site, batch: Batch, s: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"pos_score": s, "neg_score": s}

    def sendable(self, site: Site) -> dict[str, torch.Tensor]:
        """Buffer rows that may not enter the payload, per class (none here)."""
        return {}

    def before_communication(self, site: Site) -> None:
        self.pool.payload(site, self.sendable(site))

    def round_end(self, site: Site) -> None:
        self.pool.receive(site)

    # --- the step -----------------------------------------------------------------------------
    def objective(self, site: Site, batch: Batch, s: torch.Tensor) -> torch.Tensor:
        pos, neg = batch.y * batch.mask, (1 - batch.y) * batch.mask
        neg_drawn, vn = self.pool.draw(site, "neg")
        pos_drawn, vp = self.pool.draw(site, "pos")
        pn, pp = neg_drawn["neg_score"], pos_drawn["pos_score"]
        return (pairwise_auc_loss(torch.cat([s, pn]), torch.cat([torch.ones_like(s), torch.zeros_like(pn)]),
                                  self.loss_fn, mask=torch.cat([pos, vn.float()]))
                + pairwise_auc_loss(torch.cat([pp, s]), torch.cat([torch.ones_like(pp), torch.zeros_like(s)]),
                                    self.loss_fn, mask=torch.cat([vp.float(), neg])))
