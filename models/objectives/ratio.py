"""The ratio loss (docs/algorithms.md section 1.6) and the masked multi-label BCE it weights."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from models.objectives.batch import Reduction, per_disease_param, prepare, reduce_terms

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
    batch = prepare(logits, labels, mask, what="logits")
    z = batch.scores
    weight = None if pos_weight is None else per_disease_param(pos_weight, z.shape[1], z, "pos_weight")
    per_sample = F.binary_cross_entropy_with_logits(z, batch.pos, pos_weight=weight, reduction="none")
    per_disease = (per_sample * batch.valid).sum(0) / batch.valid.sum(0).clamp(min=1.0)
    return reduce_terms(per_disease, reduction)


def ratio_loss(logits: Tensor, labels: Tensor, n_pos: Tensor, n_neg: Tensor, mask: Tensor | None = None,
               reduction: Reduction = "mean") -> Tensor:
    """Ratio loss (Wang et al. AAAI 2021; LocalSGDM_RL): BCE with positive weight from the global counts."""
    weight = ratio_positive_weight(n_pos, n_neg).to(logits.device)
    return masked_bce_with_logits(logits, labels, mask, pos_weight=weight, reduction=reduction)
