"""The square min-max losses: AUC square (docs/algorithms.md section 1.1) and AUC-margin (section 1.2),
with the closed-form AUC-M dual direction and the clamp of alpha."""

from __future__ import annotations

from torch import Tensor

from models.objectives.batch import (
    Batch,
    Reduction,
    check_prior,
    masked_batch_mean,
    per_disease_param,
    prepare,
    reduce_terms,
)

# Upper bound of alpha in the closed-form AUC-M ascent (docs/algorithms.md section 1.2, the authors' clamp).
ALPHA_MAX = 999.0


def _min_max_inputs(scores: Tensor, labels: Tensor, mask: Tensor | None, prior: float | Tensor, a, b, alpha
                    ) -> tuple[Batch, Tensor, Tensor, Tensor, Tensor]:
    """The batch and the validated (C,) prior, a, b and alpha of the square min-max losses (1.1, 1.2)."""
    batch = prepare(scores, labels, mask)
    s, C = batch.scores, batch.scores.shape[1]
    p = per_disease_param(prior, C, s, "prior")
    check_prior(p)
    a, b, alpha = (per_disease_param(v, C, s, n) for v, n in ((a, "a"), (b, "b"), (alpha, "alpha")))
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
    per_sample = auc_square_terms(batch.scores, batch.pos, batch.neg, a, b, alpha, p)
    return reduce_terms(masked_batch_mean(per_sample, batch), reduction)


def auc_square_terms(s: Tensor, pos: Tensor, neg: Tensor, a: Tensor, b: Tensor, alpha: Tensor, p: Tensor) -> Tensor:
    """The AUC square term of each sample and disease (``pos``, ``neg``: 1 where the label is a present positive,
    negative); unchecked, so that it runs under ``torch.func.vmap`` (DP's per-sample gradients)."""
    return ((1 - p) * (s - a) ** 2 * pos + p * (s - b) ** 2 * neg
            + 2 * (1 + alpha) * (p * s * neg - (1 - p) * s * pos)
            - p * (1 - p) * alpha ** 2)


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
    per_sample = auc_margin_terms(batch.scores, batch.pos, batch.neg, a, b, alpha, p, margin)
    return reduce_terms(masked_batch_mean(per_sample, batch), reduction)


def auc_margin_terms(s: Tensor, pos: Tensor, neg: Tensor, a: Tensor, b: Tensor, alpha: Tensor, p: Tensor,
                     margin: float) -> Tensor:
    """The AUC-M term of each sample and disease (``pos``, ``neg``: 1 where the label is a present positive,
    negative); unchecked, so that it runs under ``torch.func.vmap`` (DP's per-sample gradients)."""
    return ((1 - p) * (s - a) ** 2 * pos + p * (s - b) ** 2 * neg
            + 2 * alpha * (p * (1 - p) * margin + p * s * neg - (1 - p) * s * pos)
            - p * (1 - p) * alpha ** 2)


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
