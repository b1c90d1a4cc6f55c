"""What the pairwise algorithms share (Guo et al., ICML 2023; docs/algorithms.md sections 1.4, 1.5 and 7): FeDXL1,
FeDXL2, Local Pair and Centralized.

``PairwiseAlgorithm``: the local step of all of them, on active scores s = sigmoid(model(x)):
    G = objective(batch, s);   w <- w - lr_t direction(grad G),   lr_t = lr * lr_decay ** (t // lr_decay_every)
``KLOPAUC``: the KL-OPAUC pieces of FeDXL2 and Local Pair: a stored inner mean u per training row and
disease (never leaves the site except as FeDXL2 pool entries), the positives' surrogate term with its u
update (1.5), and the gradient EMA v <- (1 - beta) v + beta grad G as the direction, started at the first
gradient (v_1 = grad G_1, the FeDXL paper's and its authors' initialisation; v averaged with the model every
round: all of v, docs/algorithms.md sections 7 and 9).
"""

from __future__ import annotations

import torch
from pydantic import BaseModel, ConfigDict, Field

from federated.algorithms.base import Algorithm, Site
from federated.data import Batch
from federated.state import Comm
from models.objectives import Surrogate, get_surrogate, kl_opauc_ema


class PairwiseParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    surrogate: str = "squared_hinge"  # any of models.objectives.SURROGATES
    margin: float = Field(default=1.0, gt=0)  # squared_hinge / square / hinge
    temperature: float | None = Field(default=None, gt=0)  # logistic / sigmoid; None = objectives' default
    lr_decay: float = Field(default=0.1, gt=0, le=1)  # lr factor every lr_decay_every iterations
    lr_decay_every: int = Field(default=0, ge=0)  # 0 = constant lr (authors: /10 every 5000 iterations)


class KLOPAUCParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    lam: float = Field(default=1.0, gt=0)  # KL temperature; smaller focuses on the hardest negatives (low FPR)
    gamma: float = Field(default=0.1, gt=0, le=1)  # u EMA weight on the new g (authors 0.1-0.2); 1 = no memory
    beta: float = Field(default=0.1, gt=0, le=1)  # gradient EMA weight on the new gradient; 1 = plain SGD


def masked_kl_opauc_surrogate(pos_scores: torch.Tensor, neg_scores: torch.Tensor, u_pos: torch.Tensor,
                              is_pos: torch.Tensor, is_neg: torch.Tensor, lam: float, loss_fn: Surrogate) -> torch.Tensor:
    """``models.objectives.kl_opauc_surrogate`` of the scores where the float masks ``is_pos`` and ``is_neg`` are 1,
    computed on all pairs and masked, so that no step selects rows (a host sync on a GPU): the same mean over
    the selected pairs, 0 (connected to the graph) when there is none. ``u_pos`` may hold anything outside
    the pairs."""
    losses = loss_fn(pos_scores[:, None] - neg_scores[None, :])
    pairs = is_pos[:, None] * is_neg[None, :]
    # where, not a product: outside the pairs u may be 0 and the weight infinite
    weights = torch.where(pairs > 0, torch.exp(losses.detach() / lam - torch.log(u_pos[:, None])), 0.0)
    return (weights * losses).sum() / pairs.sum().clamp_min(1)


class PairwiseAlgorithm(Algorithm):
    """A local step on a pairwise objective of the batch's active scores."""

    dp_refusal = ("its loss pairs each record with other records' scores and it gathers per-sample scores (score "
                  "pools): one record moves many terms and leaves the site in the clear, so per-sample clipping "
                  "bounds nothing")

    def __init__(self, params: dict, fed):
        super().__init__(params, fed)
        self.loss_fn = get_surrogate(self.p.surrogate, self.p.margin, self.p.temperature)

    def lr(self, site: Site) -> float:
        if not self.p.lr_decay_every:
            return self.fed.lr
        return self.fed.lr * self.p.lr_decay ** (site.iteration // self.p.lr_decay_every)

    def objective(self, site: Site, batch: Batch, s: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError(f"{type(self).__name__} must implement objective")

    def direction(self, site: Site, grads: list[torch.Tensor]) -> list[torch.Tensor]:
        return grads

    def observe(self, site: Site, batch: Batch, s: torch.Tensor) -> None:
        """After the step's objective: the active scores (detached), e.g. for the round's pool payload."""

    def local_step(self, site: Site, batch: Batch) -> torch.Tensor:
        self.zero_grad(site)
        s = torch.sigmoid(self.logits(site, batch))
        loss = self.objective(site, batch, s)
        loss.backward()
        self.observe(site, batch, s.detach())
        with torch.no_grad():
            torch._foreach_add_(self.params(site), self.direction(site, self.grads(site)), alpha=-self.lr(site))
        return loss.detach()


class KLOPAUC:
    """Mixin for a ``PairwiseAlgorithm`` whose objective is KL-OPAUC (1.5) with gradient EMA."""

    def state_spec(self, site: Site):
        spec = {"u": Comm.LOCAL} | {f"momentum.{n}": Comm.MEAN for n in site.parameter_names()}
        return super().state_spec(site) | spec

    def init_site_state(self, site: Site):
        state = super().init_site_state(site)
        state["u"] = torch.zeros(len(site.data.train), self.fed.num_classes, device=self.fed.device)
        state.update({f"momentum.{n}": torch.zeros_like(p) for n, p in self.named_params(site)})
        return state

    def positive_term(self, site: Site, batch: Batch, s: torch.Tensor, c: int, negatives: torch.Tensor,
                      is_neg: torch.Tensor) -> torch.Tensor:
        """Update u of the batch's positives of disease c against the ``negatives`` where ``is_neg`` is 1 and return
        their surrogate (0, connected to the scores' graph, without a positive or a negative). Masks, not selected
        rows: a boolean selection is a host sync on a GPU."""
        is_pos, is_neg = batch.y[:, c] * batch.mask[:, c], is_neg.to(s.dtype)
        with torch.no_grad():
            # g_i = mean over the negatives of exp(l_ij / lam) (kl_opauc_inner_mean), as a masked logsumexp
            losses = self.loss_fn(s[:, c, None] - negatives[None, :]) / self.p.lam
            n_neg = is_neg.sum()
            g = torch.exp(torch.logsumexp(losses + torch.log(is_neg), dim=1) - torch.log(n_neg.clamp_min(1)))
            active = (is_pos > 0) & (n_neg > 0)
            u = site.state["u"][batch.index, c]
            u = torch.where(active, kl_opauc_ema(u, g, self.p.gamma), u)
            site.state["u"][batch.index, c] = u
        return masked_kl_opauc_surrogate(s[:, c], negatives, u, is_pos, is_neg, self.p.lam, self.loss_fn)

    def direction(self, site: Site, grads: list[torch.Tensor]) -> list[torch.Tensor]:
        v = [site.state[f"momentum.{n}"] for n in site.parameter_names()]
        # Weight 1 at the first step: v starts at the first gradient, not at beta times it (section 7).
        torch._foreach_lerp_(v, grads, 1.0 if site.iteration == 0 else self.p.beta)
        return v
