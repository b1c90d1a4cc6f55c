"""One-way partial AUC (docs/algorithms.md section 1.5): KL-OPAUC's functional pieces and its per-positive
loss, the two-way KL-TPAUC, and the CVaR-OPAUC counterpart."""

from __future__ import annotations

import abc
import math

import torch
from torch import Tensor, nn

from models import value_checks
from models.objectives.batch import Reduction, compute_dtype, prepare, reduce_terms
from models.objectives.pairwise import Surrogate, get_surrogate


def _pair_losses(pos_scores: Tensor, neg_scores: Tensor, loss_fn: Surrogate) -> Tensor:
    if pos_scores.dim() != 1 or neg_scores.dim() != 1:
        raise ValueError(f"pos_scores and neg_scores must be 1-D (one disease), got shapes "
                         f"{tuple(pos_scores.shape)} and {tuple(neg_scores.shape)}")
    dtype = compute_dtype(pos_scores.dtype)
    return loss_fn(pos_scores.to(dtype).unsqueeze(1) - neg_scores.to(dtype).unsqueeze(0))


def kl_opauc_inner_mean(pos_scores: Tensor, neg_scores: Tensor, lam: float = 1.0,
                        surrogate: str | Surrogate = "squared_hinge", margin: float = 1.0,
                        temperature: float | None = None) -> Tensor:
    """``g_i = mean_j exp(l(s_i - s_j) / lam)`` for each positive i (detached), one disease.

    Surrogates are non-negative, so g_i >= 1. Computed through logsumexp; in float32 it overflows only
    when ``max l / lam`` exceeds about 88 (squared hinge with m = 1: lam below about 0.05).
    """
    if not lam > 0:
        raise ValueError(f"lam must be positive, got {lam}")
    with torch.no_grad():
        losses = _pair_losses(pos_scores, neg_scores, get_surrogate(surrogate, margin, temperature))
        if losses.shape[1] == 0:
            raise ValueError("kl_opauc_inner_mean needs at least one negative score")
        return torch.exp(torch.logsumexp(losses / lam, dim=1) - math.log(losses.shape[1]))


def kl_opauc_ema(u: Tensor, g: Tensor, gamma: float) -> Tensor:
    """``u <- (1 - gamma) u + gamma g`` (EMA with weight gamma on the new value, docs/algorithms.md section 1.5).

    ``u == 0`` marks a positive never visited (every real u is >= 1): its first visit sets u = g.
    """
    if not 0 < gamma <= 1:
        raise ValueError(f"gamma must lie in (0, 1], got {gamma}")
    g = g.to(u.dtype)
    return torch.where(u == 0, g, (1 - gamma) * u + gamma * g)


def kl_opauc_surrogate(pos_scores: Tensor, neg_scores: Tensor, u_pos: Tensor, lam: float = 1.0,
                       surrogate: str | Surrogate = "squared_hinge", margin: float = 1.0,
                       temperature: float | None = None) -> Tensor:
    """``mean_i mean_j [exp(l_ij / lam) / u_i]_detached * l_ij`` for one disease (docs/algorithms.md section 1.5).

    Its gradient is the exact gradient of ``mean_i lam log(mean_j exp(l_ij / lam))`` with the inner mean
    g_i replaced by ``u_pos`` (no extra 1/lam factor). ``u_pos`` (P,) are the already updated u values
    of the positives; for FeDXL2's passive part they are the communicated ones. Returns 0 (connected to
    the scores' graph) when there is no positive or no negative.
    """
    if u_pos.shape != pos_scores.shape:
        raise ValueError(f"u_pos must have pos_scores' shape {tuple(pos_scores.shape)}, got {tuple(u_pos.shape)}")
    losses = _pair_losses(pos_scores, neg_scores, get_surrogate(surrogate, margin, temperature))
    if losses.numel() == 0:
        return losses.sum()
    u = u_pos.to(losses.dtype).unsqueeze(1)
    if value_checks.enabled() and bool((u <= 0).any()):
        raise ValueError("u_pos must be positive (update it with kl_opauc_ema before use)")
    weights = torch.exp(losses.detach() / lam - torch.log(u))
    return (weights * losses).mean()


class _PerPositiveLoss(nn.Module, abc.ABC):
    """Shared machinery of the partial-AUC losses that keep one state value per positive sample.

    ``forward(scores, labels, index, mask=None, reduction="mean")``: ``index`` (N,) holds the dataset
    index of each batch row. For every disease with a present positive and a present negative in the
    batch, :meth:`_disease_term` receives the positives' and negatives' scores and the positives' dataset
    indices; other diseases contribute 0 (connected to the scores' graph).
    """

    def __init__(self, num_samples: int, num_diseases: int, margin: float, surrogate: str | Surrogate,
                 temperature: float | None):
        super().__init__()
        if num_samples < 1 or num_diseases < 1:
            raise ValueError(f"num_samples and num_diseases must be positive, got {num_samples}, {num_diseases}")
        self.num_samples, self.num_diseases = num_samples, num_diseases
        self.loss_fn = get_surrogate(surrogate, margin, temperature)

    @abc.abstractmethod
    def _disease_term(self, c: int, pos_s: Tensor, neg_s: Tensor, rows: Tensor) -> Tensor:
        """Disease c's loss term; updates the state of the positives at dataset indices ``rows``."""

    def forward(self, scores: Tensor, labels: Tensor, index: Tensor, mask: Tensor | None = None,
                reduction: Reduction = "mean") -> Tensor:
        batch = prepare(scores, labels, mask)
        s = batch.scores
        if s.shape[1] != self.num_diseases:
            raise ValueError(f"scores have {s.shape[1]} disease columns, the loss was built for {self.num_diseases}")
        state_device = next(self.buffers()).device
        index = torch.as_tensor(index, device=state_device)
        if index.shape != (s.shape[0],) or index.is_floating_point():
            raise ValueError(f"index must be an integer tensor of shape ({s.shape[0]},) (the dataset index of "
                             f"each batch row), got {index.dtype} {tuple(index.shape)}")
        if bool(((index < 0) | (index >= self.num_samples)).any()):
            raise IndexError(f"index values must lie in [0, {self.num_samples}); got min {int(index.min())}, "
                             f"max {int(index.max())}")
        terms = []
        for c in range(self.num_diseases):
            is_pos, is_neg = batch.pos[:, c] > 0, batch.neg[:, c] > 0
            pos_s, neg_s = s[is_pos, c], s[is_neg, c]
            if pos_s.numel() == 0 or neg_s.numel() == 0:
                terms.append((s[:, c] * 0).sum())
                continue
            terms.append(self._disease_term(c, pos_s, neg_s, index[is_pos.to(state_device)]))
        return reduce_terms(torch.stack(terms), reduction)


def _check_lam_gamma(lam: float, gamma: float) -> None:
    if not lam > 0:
        raise ValueError(f"lam must be positive, got {lam}")
    if not 0 < gamma <= 1:
        raise ValueError(f"gamma must lie in (0, 1], got {gamma}")


class KLOPAUCLoss(_PerPositiveLoss):
    """KL-OPAUC one-way partial-AUC loss with a stored inner mean u per positive (Zhu et al. 2022; FeDXL2).

    ``F = (1/n+) sum_i lam log((1/n-) sum_j exp(l(s_i - s_j) / lam))`` per disease; each call updates
    ``u[index_i, c]`` for the batch's positives of disease c with :func:`kl_opauc_ema` before computing
    :func:`kl_opauc_surrogate` against the batch's negatives. ``u`` is a buffer of shape
    (num_samples, num_diseases), 0 until a positive is first visited; a row listed twice in one batch
    gets one of its updates. Small ``lam`` focuses on the hardest negatives (lower FPR); ``gamma`` close
    to 1 trusts the current batch, close to 0 averages over many visits.
    """

    u: Tensor

    def __init__(self, num_samples: int, num_diseases: int, lam: float = 1.0, gamma: float = 0.9,
                 margin: float = 1.0, surrogate: str | Surrogate = "squared_hinge",
                 temperature: float | None = None):
        super().__init__(num_samples, num_diseases, margin, surrogate, temperature)
        _check_lam_gamma(lam, gamma)
        self.lam, self.gamma = float(lam), float(gamma)
        self.register_buffer("u", torch.zeros(num_samples, num_diseases))

    def _update_u(self, c: int, pos_s: Tensor, neg_s: Tensor, rows: Tensor) -> Tensor:
        g = kl_opauc_inner_mean(pos_s, neg_s, self.lam, self.loss_fn)
        u_new = kl_opauc_ema(self.u[rows, c], g.to(self.u.device), self.gamma)
        self.u[rows, c] = u_new
        return u_new.to(pos_s.device)

    def _disease_term(self, c: int, pos_s: Tensor, neg_s: Tensor, rows: Tensor) -> Tensor:
        return kl_opauc_surrogate(pos_s, neg_s, self._update_u(c, pos_s, neg_s, rows), self.lam, self.loss_fn)


class KLTPAUCLoss(KLOPAUCLoss):
    """Two-way partial AUC by KL-DRO over negatives and positives (KL-TPAUC, Zhu et al. 2022).

    ``F = lam_pos log( (1/n+) sum_i exp(F_i / lam_pos) )`` with ``F_i = lam log(mean_j exp(l_ij / lam))``
    the one-way term of :class:`KLOPAUCLoss`: the outer KL weighting emphasises the positives with the
    largest loss (the low-TPR region). Its gradient is ``mean_i [g_i^(lam/lam_pos) / V] grad F_i``
    with ``V = mean_i g_i^(lam/lam_pos)``; g_i is tracked by u as in KL-OPAUC and V by one value ``v``
    per disease, ``v <- (1 - gamma_v) v + gamma_v mean_batch u^(lam/lam_pos)`` (first update sets v).
    Small ``lam_pos`` concentrates on the hardest positives; large ``lam_pos`` recovers KL-OPAUC.
    """

    v: Tensor

    def __init__(self, num_samples: int, num_diseases: int, lam: float = 1.0, lam_pos: float = 1.0,
                 gamma: float = 0.9, gamma_v: float = 0.9, margin: float = 1.0,
                 surrogate: str | Surrogate = "squared_hinge", temperature: float | None = None):
        super().__init__(num_samples, num_diseases, lam, gamma, margin, surrogate, temperature)
        _check_lam_gamma(lam_pos, gamma_v)
        self.lam_pos, self.gamma_v = float(lam_pos), float(gamma_v)
        self.register_buffer("v", torch.zeros(num_diseases))

    def _disease_term(self, c: int, pos_s: Tensor, neg_s: Tensor, rows: Tensor) -> Tensor:
        u_pos = self._update_u(c, pos_s, neg_s, rows)
        # u^(lam/lam_pos) in the log domain: u >= 1 and a small lam_pos would overflow the power
        log_outer = (self.lam / self.lam_pos) * torch.log(u_pos)
        batch_mean = torch.exp(torch.logsumexp(log_outer, 0) - math.log(log_outer.numel())).to(self.v.device)
        v_old = self.v[c]
        self.v[c] = batch_mean if v_old == 0 else (1 - self.gamma_v) * v_old + self.gamma_v * batch_mean
        losses = _pair_losses(pos_s, neg_s, self.loss_fn)
        weights = torch.exp(log_outer.unsqueeze(1) - torch.log(self.v[c].to(losses.dtype))
                            + losses.detach() / self.lam - torch.log(u_pos.to(losses.dtype)).unsqueeze(1))
        return (weights.detach() * losses).mean()


def cvar_opauc_surrogate(pos_scores: Tensor, neg_scores: Tensor, thresholds: Tensor, beta: float,
                         surrogate: str | Surrogate = "squared_hinge", margin: float = 1.0,
                         temperature: float | None = None) -> Tensor:
    """``mean_i [t_i + (1/beta) mean_j (l_ij - t_i)_+]``, the CVaR-OPAUC objective for one disease.

    Minimised over the thresholds t_i it equals the mean over positives of the average of the largest
    beta fraction of their pair losses (Rockafellar-Uryasev), the one-way partial AUC surrogate for
    FPR <= beta (Zhu et al. 2022). ``thresholds`` (P,) are treated as constants here.
    """
    if not 0 < beta <= 1:
        raise ValueError(f"beta must lie in (0, 1], got {beta}")
    losses = _pair_losses(pos_scores, neg_scores, get_surrogate(surrogate, margin, temperature))
    t = thresholds.detach().to(losses.dtype).unsqueeze(1)
    return (t[:, 0] + torch.clamp(losses - t, min=0).mean(1) / beta).mean()


def cvar_threshold_gradient(pos_scores: Tensor, neg_scores: Tensor, thresholds: Tensor, beta: float,
                            surrogate: str | Surrogate = "squared_hinge", margin: float = 1.0,
                            temperature: float | None = None) -> Tensor:
    """d/dt_i of the CVaR objective: ``1 - (1/beta) mean_j [l_ij > t_i]`` (P,), detached."""
    with torch.no_grad():
        losses = _pair_losses(pos_scores, neg_scores, get_surrogate(surrogate, margin, temperature))
        return 1 - (losses > thresholds.to(losses.dtype).unsqueeze(1)).to(losses.dtype).mean(1) / beta


class CVaROPAUCLoss(_PerPositiveLoss):
    """CVaR one-way partial-AUC loss, FPR <= beta, with a threshold t per positive (Zhu et al. 2022).

    Each call returns :func:`cvar_opauc_surrogate` at the stored thresholds of the batch's positives,
    then moves those thresholds one SGD step ``t <- t - eta * cvar_threshold_gradient`` (they are
    primal variables of the min; the step is taken here so optimisers only see network weights).
    ``t`` starts at 0; ``eta`` is its learning rate: larger tracks the (1 - beta) quantile of the pair
    losses faster but noisier.
    """

    t: Tensor

    def __init__(self, num_samples: int, num_diseases: int, beta: float = 0.3, eta: float = 0.1,
                 margin: float = 1.0, surrogate: str | Surrogate = "squared_hinge",
                 temperature: float | None = None):
        super().__init__(num_samples, num_diseases, margin, surrogate, temperature)
        if not 0 < beta <= 1:
            raise ValueError(f"beta must lie in (0, 1], got {beta}")
        if not eta > 0:
            raise ValueError(f"eta must be positive, got {eta}")
        self.beta, self.eta = float(beta), float(eta)
        self.register_buffer("t", torch.zeros(num_samples, num_diseases))

    def _disease_term(self, c: int, pos_s: Tensor, neg_s: Tensor, rows: Tensor) -> Tensor:
        t = self.t[rows, c].to(pos_s.device)
        value = cvar_opauc_surrogate(pos_s, neg_s, t, self.beta, self.loss_fn)
        step = cvar_threshold_gradient(pos_s, neg_s, t, self.beta, self.loss_fn)
        self.t[rows, c] = (t - self.eta * step).to(self.t.device, self.t.dtype)
        return value
