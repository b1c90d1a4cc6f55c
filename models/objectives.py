"""AUC objectives for multi-label tasks, exactly as docs/algorithms.md section 1 defines them.

AUC square (1.1) and AUC-margin (1.2) min-max losses, pairwise X-risk with five surrogates (1.4),
KL-OPAUC with its functional pieces (1.5) plus CVaR-OPAUC and two-way KL-TPAUC, and the ratio loss
(1.6). The compositional inner step (1.3) is in ``models.compositional``.

Every AUC loss takes scores s = sigmoid(logit) in (0, 1) and labels of shape (N, C) (a 1-D batch is read
as C = 1), and per-disease parameters (a, b, alpha, prior) of shape (C,) or a scalar broadcast to all
diseases.

Missing labels. ``mask`` (N, C), bool or {0, 1} float, True = label present. A NaN label is treated as
masked too, so a shard's label columns (NaN = missing, docs/shards.md) can be passed as they are.

Edge cases (docs/algorithms.md section 0), the same for every AUC loss here:

* A disease whose batch has no present positive or no present negative is *undefined* for that batch
  (``defined_diseases``): its term is exactly 0 with zero gradient, never NaN. A disease masked
  everywhere is undefined. (The BCE losses need no pair: there only a disease without any present
  label contributes 0.)
* float16/bfloat16 scores are computed in float32 (the loss is float32; gradients flow back to the
  half-precision scores in their own dtype). The losses are polynomials or stable softplus/sigmoid
  expressions of bounded scores, so saturated scores (exactly 0 or 1) give finite values.
* Scores are not range-checked: the min-max losses are well defined for any real score (the engine's
  closed-form saddle tests use linear scores), but the margin m = 1 and the surrogates' defaults assume
  probabilities, so pass ``sigmoid(logits)``, not logits.

Reduction. ``reduction="mean"`` (the default) divides the sum of the per-disease terms by C, a
constant, so a disease's gradient does not change scale with how many other diseases happen to be
defined in the batch; ``"sum"`` adds them; ``"none"`` returns the (C,) vector of per-disease terms.
"""

from __future__ import annotations

import abc
import math
from collections.abc import Callable
from functools import partial
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from models import value_checks

Reduction = Literal["mean", "sum", "none"]
_REDUCTIONS = ("mean", "sum", "none")

# Upper bound of alpha in the closed-form AUC-M ascent (docs/algorithms.md section 1.2, the authors' clamp).
ALPHA_MAX = 999.0


# ---------------------------------------------------------------------------------------------------
# Batch preparation shared by every loss
# ---------------------------------------------------------------------------------------------------


class _Batch:
    """Scores in a float dtype able to hold the loss, and the per-class indicator matrices."""

    __slots__ = ("neg", "pos", "scores", "valid")

    def __init__(self, scores: Tensor, pos: Tensor, neg: Tensor, valid: Tensor):
        self.scores = scores
        self.pos = pos
        self.neg = neg
        self.valid = valid

    @property
    def defined(self) -> Tensor:
        return (self.pos.sum(0) > 0) & (self.neg.sum(0) > 0)


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    # Half precision cannot hold squared-score sums over a batch accurately; float64 stays float64.
    return torch.float64 if dtype == torch.float64 else torch.float32


def _prepare(scores: Tensor, labels: Tensor, mask: Tensor | None, *, what: str = "scores") -> _Batch:
    if not isinstance(scores, Tensor) or not isinstance(labels, Tensor):
        raise TypeError(f"{what} and labels must be torch tensors, got {type(scores).__name__} and "
                        f"{type(labels).__name__}")
    if scores.dim() == 1:
        scores = scores.unsqueeze(1)
    if labels.dim() == 1:
        labels = labels.unsqueeze(1)
    if scores.dim() != 2 or labels.shape != scores.shape:
        raise ValueError(f"{what} and labels must both have shape (N, C); got {what} "
                         f"{tuple(scores.shape)} and labels {tuple(labels.shape)}")
    if not scores.is_floating_point():
        raise TypeError(f"{what} must be floating point probabilities, got dtype {scores.dtype}")
    dtype = _compute_dtype(scores.dtype)
    y = labels.to(dtype)
    present = ~torch.isnan(y)
    if mask is not None:
        if mask.dim() == 1:
            mask = mask.unsqueeze(1)
        if mask.shape != labels.shape:
            raise ValueError(f"mask must have the labels' shape {tuple(labels.shape)}, got {tuple(mask.shape)}")
        present = present & mask.to(torch.bool)
    y = torch.where(present, y, torch.zeros_like(y))
    bad = present & (y != 0) & (y != 1)
    if value_checks.enabled() and bool(bad.any()):
        row, col = (int(v) for v in bad.nonzero()[0])
        raise ValueError(f"labels must be 0, 1 or NaN (missing); got {labels[row, col].item()!r} at row {row}, "
                         f"disease column {col} ({int(bad.sum())} such entries)")
    valid = present.to(dtype)
    pos = valid * y
    return _Batch(scores.to(dtype), pos, valid - pos, valid)


def _per_disease(value: float | Tensor, num_diseases: int, like: Tensor, name: str) -> Tensor:
    """A per-disease parameter as a (C,) tensor; scalars broadcast, tensors keep their autograd graph."""
    t = value if isinstance(value, Tensor) else torch.tensor(float(value))
    # a float64 parameter keeps float64; integer tensors (counts, priors given as ints) take the scores' dtype
    dtype = torch.promote_types(t.dtype, like.dtype) if t.is_floating_point() else like.dtype
    t = t.to(device=like.device, dtype=dtype)
    if t.dim() == 0:
        return t.expand(num_diseases)
    if t.shape != (num_diseases,):
        raise ValueError(f"{name} must be a scalar or have shape ({num_diseases},) (one per disease), "
                         f"got {tuple(t.shape)}")
    return t


def _check_prior(prior: Tensor) -> None:
    if value_checks.enabled() and bool(((prior <= 0) | (prior >= 1) | torch.isnan(prior)).any()):
        raise ValueError(f"prior must lie strictly between 0 and 1 for every disease (the AUC losses weight "
                         f"each class by the other's prior), got {prior.detach().cpu().tolist()}")


def _reduce(per_disease: Tensor, reduction: Reduction) -> Tensor:
    if reduction == "mean":
        return per_disease.sum() / per_disease.numel()
    if reduction == "sum":
        return per_disease.sum()
    if reduction == "none":
        return per_disease
    raise ValueError(f"reduction must be one of {_REDUCTIONS}, got {reduction!r}")


def defined_diseases(labels: Tensor, mask: Tensor | None = None) -> Tensor:
    """(C,) bool: the disease has at least one present positive and one present negative in the batch.

    Algorithms use it to skip a disease (for example not to move its alpha) on batches where its loss
    term is 0 by definition.
    """
    return _prepare(torch.zeros_like(labels, dtype=torch.float32), labels, mask).defined


def _masked_batch_mean(per_sample: Tensor, batch: _Batch) -> Tensor:
    """Mean over the present samples of each disease; 0 with zero gradient where undefined."""
    n_present = batch.valid.sum(0).clamp(min=1.0)  # clamp keeps the backward of an unused branch finite
    mean = (per_sample * batch.valid).sum(0) / n_present
    return torch.where(batch.defined, mean, torch.zeros_like(mean))


# ---------------------------------------------------------------------------------------------------
# 1.1 AUC square min-max and 1.2 AUC-margin
# ---------------------------------------------------------------------------------------------------


def _min_max_inputs(scores: Tensor, labels: Tensor, mask: Tensor | None, prior: float | Tensor, a, b, alpha
                    ) -> tuple[_Batch, Tensor, Tensor, Tensor, Tensor]:
    """The batch and the validated (C,) prior, a, b and alpha of the square min-max losses (1.1, 1.2)."""
    batch = _prepare(scores, labels, mask)
    s, C = batch.scores, batch.scores.shape[1]
    p = _per_disease(prior, C, s, "prior")
    _check_prior(p)
    a, b, alpha = (_per_disease(v, C, s, n) for v, n in ((a, "a"), (b, "b"), (alpha, "alpha")))
    return batch, p, a, b, alpha


def auc_square_loss(scores: Tensor, labels: Tensor, a: Tensor, b: Tensor, alpha: Tensor,
                    prior: float | Tensor, mask: Tensor | None = None,
                    reduction: Reduction = "mean") -> Tensor:
    """AUC square min-max loss (Ying et al. 2016; docs/algorithms.md section 1.1), minimised in (w, a, b), maximised in alpha.

    Per sample, for each disease with prior p:
    ``(1-p)(s-a)^2 [y=1] + p(s-b)^2 [y=0] + 2(1+alpha)(p s [y=0] - (1-p) s [y=1]) - p(1-p) alpha^2``,
    averaged over all present samples of the batch (not per-class means). alpha is unconstrained.
    The prior is passed explicitly (the global prior in a federation, section 0), never the batch ratio.
    """
    batch, p, a, b, alpha = _min_max_inputs(scores, labels, mask, prior, a, b, alpha)
    s = batch.scores
    per_sample = ((1 - p) * (s - a) ** 2 * batch.pos + p * (s - b) ** 2 * batch.neg
                  + 2 * (1 + alpha) * (p * s * batch.neg - (1 - p) * s * batch.pos)
                  - p * (1 - p) * alpha ** 2)
    return _reduce(_masked_batch_mean(per_sample, batch), reduction)


def auc_margin_loss(scores: Tensor, labels: Tensor, a: Tensor, b: Tensor, alpha: Tensor,
                    prior: float | Tensor, margin: float = 1.0, mask: Tensor | None = None,
                    reduction: Reduction = "mean") -> Tensor:
    """AUC-margin loss (AUC-M, Yuan et al. 2021; docs/algorithms.md section 1.2), the form CODASCA uses.

    Per sample, for each disease with prior p and margin m:
    ``(1-p)(s-a)^2 [y=1] + p(s-b)^2 [y=0] + 2 alpha (p(1-p) m + p s [y=0] - (1-p) s [y=1]) - p(1-p) alpha^2``,
    averaged over all present samples. Minimised in (w, a, b), maximised in alpha >= 0.

    The plain stochastic dual gradient is this loss's autograd gradient with respect to alpha; the
    closed-form direction the authors' code ascends is :func:`auc_margin_dual_direction`.
    """
    batch, p, a, b, alpha = _min_max_inputs(scores, labels, mask, prior, a, b, alpha)
    s = batch.scores
    per_sample = ((1 - p) * (s - a) ** 2 * batch.pos + p * (s - b) ** 2 * batch.neg
                  + 2 * alpha * (p * (1 - p) * margin + p * s * batch.neg - (1 - p) * s * batch.pos)
                  - p * (1 - p) * alpha ** 2)
    return _reduce(_masked_batch_mean(per_sample, batch), reduction)


def auc_margin_dual_direction(a: Tensor, b: Tensor, alpha: Tensor, margin: float = 1.0) -> Tensor:
    """Closed-form AUC-M ascent direction ``d_alpha = 2(m + b - a) - 2 alpha`` (docs/algorithms.md section 1.2).

    It is the expected alpha-gradient divided by p(1-p), with a ~ E[s|y=1] and b ~ E[s|y=0]; evaluate it
    after a and b have been updated, step ``alpha + lr * d_alpha`` and clamp with :func:`clamp_alpha`.
    It does not depend on the batch: gate it with :func:`defined_diseases` to freeze undefined diseases.
    """
    return 2 * (margin + b - a) - 2 * alpha


def clamp_alpha(alpha: Tensor) -> Tensor:
    """Project alpha onto [0, ALPHA_MAX] (AUC-M requires alpha >= 0; the upper bound is the authors')."""
    return alpha.clamp(0.0, ALPHA_MAX)


# ---------------------------------------------------------------------------------------------------
# 1.4 Pairwise surrogates and the pairwise X-risk
# ---------------------------------------------------------------------------------------------------

# Default temperatures. Logistic: log(1 + exp(-t/T)) with T = 1. Sigmoid: 1/(1 + exp(k t)) with k = 2,
# chosen by benchmarks/sigmoid_surrogate_temperature.py (pairwise training of a small MLP, 20% flipped
# labels, test AUC on clean labels, mean of 3 seeds): k = 1: 0.984, 2: 0.985, 5: 0.975, 10: 0.936,
# 20: 0.884, squared hinge 0.960; without flips every k from 1 to 5 reaches 0.998. Large k approaches
# the 0-1 step and its gradient vanishes away from t = 0; small k is close to the linear loss.
DEFAULT_TEMPERATURE = {"logistic": 1.0, "sigmoid": 2.0}


def _squared_hinge(t: Tensor, margin: float) -> Tensor:
    return torch.clamp(margin - t, min=0) ** 2


def _square(t: Tensor, margin: float) -> Tensor:
    return (margin - t) ** 2


def _hinge(t: Tensor, margin: float) -> Tensor:
    return torch.clamp(margin - t, min=0)


def _logistic(t: Tensor, temperature: float) -> Tensor:
    # softplus(x) = log(1 + e^x) without overflow for large x.
    return F.softplus(-t / temperature)


def _sigmoid(t: Tensor, temperature: float) -> Tensor:
    return torch.sigmoid(-temperature * t)


_MARGIN_SURROGATES = {"squared_hinge": _squared_hinge, "square": _square, "hinge": _hinge}
_TEMPERATURE_SURROGATES = {"logistic": _logistic, "sigmoid": _sigmoid}
SURROGATES = tuple(_MARGIN_SURROGATES) + tuple(_TEMPERATURE_SURROGATES)

Surrogate = Callable[[Tensor], Tensor]


def get_surrogate(name: str | Surrogate, margin: float = 1.0, temperature: float | None = None) -> Surrogate:
    """The pairwise surrogate l(t) of a score difference t = s_pos - s_neg (docs/algorithms.md section 1.4).

    ``squared_hinge`` (m - t)_+^2, ``square`` (m - t)^2 and ``hinge`` (m - t)_+ use ``margin``;
    ``logistic`` log(1 + exp(-t/T)) and ``sigmoid`` 1/(1 + exp(k t)) use ``temperature`` (defaults in
    ``DEFAULT_TEMPERATURE``) and have no margin. A callable is returned unchanged.
    """
    if callable(name):
        return name
    if name in _MARGIN_SURROGATES:
        if temperature is not None:
            raise ValueError(f"surrogate {name!r} takes a margin, not a temperature (temperature={temperature})")
        return partial(_MARGIN_SURROGATES[name], margin=float(margin))
    if name in _TEMPERATURE_SURROGATES:
        t = DEFAULT_TEMPERATURE[name] if temperature is None else float(temperature)
        if not t > 0:
            raise ValueError(f"surrogate {name!r} needs a positive temperature, got {temperature}")
        return partial(_TEMPERATURE_SURROGATES[name], temperature=t)
    raise ValueError(f"unknown surrogate {name!r}; valid choices: {', '.join(SURROGATES)}")


def pairwise_auc_loss(scores: Tensor, labels: Tensor, surrogate: str | Surrogate = "squared_hinge",
                      margin: float = 1.0, mask: Tensor | None = None, temperature: float | None = None,
                      reduction: Reduction = "mean") -> Tensor:
    """Pairwise X-risk with a linear outer function (FeDXL1; docs/algorithms.md section 1.4).

    For each disease, the mean over present positives i and present negatives j of ``l(s_i - s_j)``
    with l from :func:`get_surrogate`. Memory is O(N^2 C): meant for minibatches, not whole datasets.
    """
    batch = _prepare(scores, labels, mask)
    loss_fn = get_surrogate(surrogate, margin, temperature)
    s = batch.scores
    pairs = batch.pos.unsqueeze(1) * batch.neg.unsqueeze(0)  # (N_i, N_j, C): i positive, j negative
    diff = s.unsqueeze(1) - s.unsqueeze(0)
    n_pairs = pairs.sum((0, 1))
    per_disease = (loss_fn(diff) * pairs).sum((0, 1)) / n_pairs.clamp(min=1.0)
    per_disease = torch.where(n_pairs > 0, per_disease, torch.zeros_like(per_disease))
    return _reduce(per_disease, reduction)


# ---------------------------------------------------------------------------------------------------
# 1.5 KL-OPAUC (one-way partial AUC) and its CVaR counterpart
# ---------------------------------------------------------------------------------------------------


def _pair_losses(pos_scores: Tensor, neg_scores: Tensor, loss_fn: Surrogate) -> Tensor:
    if pos_scores.dim() != 1 or neg_scores.dim() != 1:
        raise ValueError(f"pos_scores and neg_scores must be 1-D (one disease), got shapes "
                         f"{tuple(pos_scores.shape)} and {tuple(neg_scores.shape)}")
    dtype = _compute_dtype(pos_scores.dtype)
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
        batch = _prepare(scores, labels, mask)
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
        return _reduce(torch.stack(terms), reduction)


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


# ---------------------------------------------------------------------------------------------------
# 1.6 Ratio loss and the BCE it weights
# ---------------------------------------------------------------------------------------------------

RATIO_CAP = 5000.0


def ratio_positive_weight(n_pos: Tensor, n_neg: Tensor, cap: float = RATIO_CAP) -> Tensor:
    """Per-disease positive weight ``1 + 0.1 * min(R, cap)`` with ``R = n_neg / n_pos`` (docs/algorithms.md section 1.6).

    Deviation from Wang et al. (AAAI 2021), who estimate R on a balanced auxiliary set held by the
    server: hospitals share no such data, so R comes from the global class counts. A disease without
    positives gets the cap (R is infinite); one without negatives gets weight 1.
    """
    n_pos = torch.as_tensor(n_pos, dtype=torch.float64)
    n_neg = torch.as_tensor(n_neg, dtype=torch.float64)
    if bool(((n_pos < 0) | (n_neg < 0)).any()):
        raise ValueError(f"class counts must be non-negative, got n_pos={n_pos.tolist()}, n_neg={n_neg.tolist()}")
    ratio = torch.where(n_pos > 0, n_neg / n_pos.clamp(min=1), torch.full_like(n_pos, cap))
    return (1 + 0.1 * ratio.clamp(max=cap)).to(torch.float32)


def masked_bce_with_logits(logits: Tensor, labels: Tensor, mask: Tensor | None = None,
                           pos_weight: Tensor | None = None, reduction: Reduction = "mean") -> Tensor:
    """Multi-label binary cross-entropy on logits, per disease averaged over its present labels.

    A disease with no present label contributes 0. ``pos_weight`` (C,) multiplies the positive terms.
    This is the CE of the baselines and of the compositional inner step (docs/algorithms.md sections 1.3, 4).
    """
    batch = _prepare(logits, labels, mask, what="logits")
    z = batch.scores
    weight = None if pos_weight is None else _per_disease(pos_weight, z.shape[1], z, "pos_weight")
    per_sample = F.binary_cross_entropy_with_logits(z, batch.pos, pos_weight=weight, reduction="none")
    per_disease = (per_sample * batch.valid).sum(0) / batch.valid.sum(0).clamp(min=1.0)
    return _reduce(per_disease, reduction)


def ratio_loss(logits: Tensor, labels: Tensor, n_pos: Tensor, n_neg: Tensor, mask: Tensor | None = None,
               reduction: Reduction = "mean") -> Tensor:
    """Ratio loss (Wang et al. AAAI 2021; LocalSGDM_RL): BCE with positive weight from the global counts."""
    weight = ratio_positive_weight(n_pos, n_neg).to(logits.device)
    return masked_bce_with_logits(logits, labels, mask, pos_weight=weight, reduction=reduction)
