"""FeDXL1: federated pairwise X-risk, linear outer function (Guo et al., ICML 2023). algorithms.md 1.4 and 7.

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

Pool payload, the one thing beyond parameters a site sends (algorithms.md 3): per round and disease, at
most P = ``pool_size`` positive scores and P negative scores (float32, padded with NaN to exactly P:
2 * P * C * 4 bytes per site per round; FeDXL2 adds the positives' u values, 3 * P * C * 4). They are
sampled uniformly without replacement from the round's active scores, independently per disease and
shuffled, so a row does not link two diseases of one image. No image, per-image label, or index is sent;
a column says only which disease an entry is for. The engine counts these bytes like any other state.

Multi-label deviation: the paper draws B1 positives and B2 negatives per task; here one batch of the
engine's loader serves every disease (set ``guarantee_positives`` under heavy imbalance).
"""

from __future__ import annotations

import contextlib

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, Field

from federated.algorithms.base import Algorithm, Site
from federated.data import Batch, to_model_input
from federated.registry import register
from federated.state import Comm
from models.compositional import functional_forward
from models.objectives import get_surrogate, pairwise_auc_loss


class FeDXL1Params(BaseModel):
    model_config = ConfigDict(extra="forbid")
    surrogate: str = "squared_hinge"  # any of models.objectives.SURROGATES
    margin: float = Field(default=1.0, gt=0)  # squared_hinge / square / hinge
    temperature: float | None = Field(default=None, gt=0)  # logistic / sigmoid; None = objectives' default
    pool_size: int = Field(default=32, gt=0)  # P per class per disease per site per round: payload and pool size
    tau: int = Field(default=1, gt=0)  # rounds of pools kept; larger = more, staler passive scores
    passive_batch: int = Field(default=32, gt=0)  # passive scores drawn per class per disease per step (B1 = B2)
    lr_decay: float = Field(default=0.1, gt=0, le=1)  # lr factor every lr_decay_every iterations
    lr_decay_every: int = Field(default=0, ge=0)  # 0 = constant lr (authors: /10 every 5000 iterations)


@contextlib.contextmanager
def site_generator(site: Site):
    """The site's own RNG stream as a generator, for hooks the engine runs outside the site's RNG context."""
    gen = torch.Generator()
    gen.set_state(site.rng_state)
    yield gen
    site.rng_state = gen.get_state()


@register
class FeDXL1(Algorithm):
    name = "fedxl1"
    Params = FeDXL1Params
    uses_pools = True
    initial_gather = True
    pool_fields = {"pos": ("pos_score",), "neg": ("neg_score",)}  # what a pool entry carries, per class

    def __init__(self, params: dict, fed):
        super().__init__(params, fed)
        self.loss_fn = get_surrogate(self.p.surrogate, self.p.margin, self.p.temperature)

    # --- state --------------------------------------------------------------------------------
    def _fields(self) -> list[str]:
        return [f for fields in self.pool_fields.values() for f in fields]

    def _capacity(self, site: Site) -> int:
        return self.fed.local_steps * site.loader.batch_size  # one round's batches

    def state_spec(self, site: Site):
        if not self.uses_pools:
            return {}
        spec = {"buffer.label": Comm.LOCAL}
        for f in self._fields():
            spec |= {f"pool.{f}": Comm.GATHER, f"passive.{f}": Comm.LOCAL, f"buffer.{f}": Comm.LOCAL}
        return spec

    def init_site_state(self, site: Site):
        if not self.uses_pools:
            return {}
        C, dev = self.fed.num_classes, self.fed.device
        passive_rows = self.p.tau * self.fed.num_sites * self.p.pool_size
        state = {"buffer.label": torch.full((self._capacity(site), C), float("nan"), device=dev)}
        for f in self._fields():
            state[f"passive.{f}"] = torch.full((passive_rows, C), float("nan"), device=dev)
            state[f"buffer.{f}"] = torch.zeros(self._capacity(site), C, device=dev)
        state.update(self.initial_pool(site))
        return state

    def initial_pool(self, site: Site) -> dict[str, torch.Tensor]:
        """Round 0's payload: P random positives and P random negatives per disease, scored by the initial model."""
        labels = site.data.train.labels
        with site_generator(site) as gen:
            picks = {}
            for c in range(self.fed.num_classes):
                for kind, value in (("pos", 1.0), ("neg", 0.0)):
                    rows = np.flatnonzero(labels[:, c] == value)
                    take = torch.randperm(len(rows), generator=gen)[: self.p.pool_size].numpy()
                    picks[kind, c] = rows[take]
        union = np.unique(np.concatenate(list(picks.values())))
        scores = self.score_rows(site, union)
        out = {f"pool.{f}": torch.full((self.p.pool_size, self.fed.num_classes), float("nan"), device=self.fed.device)
               for f in self._fields()}
        for (kind, c), rows in picks.items():
            if len(rows):
                out[f"pool.{kind}_score"][: len(rows), c] = scores[np.searchsorted(union, rows), c]
        self.complete_initial_pool(site, out)
        return out

    def complete_initial_pool(self, site: Site, pool: dict[str, torch.Tensor]) -> None:
        """Fill pool fields other than scores (FeDXL2: the positives' u)."""

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

    # --- pools --------------------------------------------------------------------------------
    def passive(self, site: Site, kind: str) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        """``passive_batch`` entries per disease drawn uniformly with replacement from the pool of ``kind``:
        fields (B, C) with invalid entries set to 0, and the (B, C) bool validity (False where a disease's
        pool is empty)."""
        fields = self.pool_fields[kind]
        valid = ~torch.isnan(site.state[f"passive.{fields[0]}"])  # (M, C)
        weights = valid.T.float()
        weights[weights.sum(1) == 0] = 1.0  # an empty column draws anything; its validity stays False
        idx = torch.multinomial(weights, self.p.passive_batch, replacement=True)  # (C, B)
        drawn_valid = valid.T.gather(1, idx).T
        drawn = {f: torch.nan_to_num(site.state[f"passive.{f}"].T.gather(1, idx).T) for f in fields}
        return drawn, drawn_valid

    def record(self, site: Site, batch: Batch, s: torch.Tensor) -> None:
        """Append this step's active scores to the round buffer (rows of step j are j*B .. j*B + B - 1)."""
        if not self.uses_pools:
            return
        B = len(batch.y)
        start = (site.iteration % self.fed.local_steps) * site.loader.batch_size
        label = torch.where(batch.mask > 0, batch.y, torch.full_like(batch.y, float("nan")))
        site.state["buffer.label"][start : start + B] = label
        for f, values in self.buffer_values(site, batch, s.detach()).items():
            site.state[f"buffer.{f}"][start : start + B] = values

    def buffer_values(self, site: Site, batch: Batch, s: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"pos_score": s, "neg_score": s}

    def sendable(self, site: Site, kind: str, c: int) -> torch.Tensor:
        """(capacity,) bool: buffer rows that may enter the payload of ``kind`` for disease c."""
        return torch.ones(len(site.state["buffer.label"]), dtype=torch.bool, device=self.fed.device)

    def before_communication(self, site: Site) -> None:
        if not self.uses_pools:
            return
        C, P = self.fed.num_classes, self.p.pool_size
        label = site.state["buffer.label"]
        out = {f"pool.{f}": torch.full((P, C), float("nan"), device=self.fed.device) for f in self._fields()}
        with site_generator(site) as gen:
            for c in range(C):
                for kind, value in (("pos", 1.0), ("neg", 0.0)):
                    rows = torch.nonzero((label[:, c] == value) & self.sendable(site, kind, c)).flatten()
                    rows = rows[torch.randperm(len(rows), generator=gen)[:P].to(rows.device)]
                    for f in self.pool_fields[kind]:
                        out[f"pool.{f}"][: len(rows), c] = site.state[f"buffer.{f}"][rows, c]
        site.state.update(out)
        label.fill_(float("nan"))

    def round_end(self, site: Site) -> None:
        """The gathered payloads (K * P rows) replace the oldest of the tau pool slots."""
        if not self.uses_pools:
            return
        rows = self.fed.num_sites * self.p.pool_size
        slot = (site.iteration // self.fed.local_steps) % self.p.tau
        for f in self._fields():
            gathered = site.state[f"pool.{f}"]
            if gathered.shape[0] != rows:
                raise RuntimeError(f"gathered pool.{f} has {gathered.shape[0]} rows, expected K * P = {rows}")
            site.state[f"passive.{f}"][slot * rows : (slot + 1) * rows] = gathered

    # --- the step -----------------------------------------------------------------------------
    def lr(self, site: Site) -> float:
        if not self.p.lr_decay_every:
            return self.fed.lr
        return self.fed.lr * self.p.lr_decay ** (site.iteration // self.p.lr_decay_every)

    def objective(self, site: Site, batch: Batch, s: torch.Tensor) -> torch.Tensor:
        pos, neg = batch.y * batch.mask, (1 - batch.y) * batch.mask
        neg_drawn, vn = self.passive(site, "neg")
        pos_drawn, vp = self.passive(site, "pos")
        pn, pp = neg_drawn["neg_score"], pos_drawn["pos_score"]
        return (pairwise_auc_loss(torch.cat([s, pn]), torch.cat([torch.ones_like(s), torch.zeros_like(pn)]),
                                  self.loss_fn, mask=torch.cat([pos, vn.float()]))
                + pairwise_auc_loss(torch.cat([pp, s]), torch.cat([torch.ones_like(pp), torch.zeros_like(s)]),
                                    self.loss_fn, mask=torch.cat([vp.float(), neg])))

    def direction(self, site: Site, grads: list[torch.Tensor]) -> list[torch.Tensor]:
        return grads

    def local_step(self, site: Site, batch: Batch) -> torch.Tensor:
        self.zero_grad(site)
        s = torch.sigmoid(self.logits(site, batch))
        loss = self.objective(site, batch, s)
        loss.backward()
        self.record(site, batch, s)
        with torch.no_grad():
            torch._foreach_add_(self.params(site), self.direction(site, self.grads(site)), alpha=-self.lr(site))
        return loss.detach()
