"""Batch preparation shared by every AUC loss (the package docstring states the conventions): labels,
masks and NaN-missing labels into per-class indicators, per-disease parameters, and the reduction."""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

from models import value_checks

Reduction = Literal["mean", "sum", "none"]
REDUCTIONS = ("mean", "sum", "none")


class Batch:
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


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    # Half precision cannot hold squared-score sums over a batch accurately; float64 stays float64.
    return torch.float64 if dtype == torch.float64 else torch.float32


def prepare(scores: Tensor, labels: Tensor, mask: Tensor | None, *, what: str = "scores") -> Batch:
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
    dtype = compute_dtype(scores.dtype)
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
    return Batch(scores.to(dtype), pos, valid - pos, valid)


def per_disease_param(value: float | Tensor, num_diseases: int, like: Tensor, name: str) -> Tensor:
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


def check_prior(prior: Tensor) -> None:
    if value_checks.enabled() and bool(((prior <= 0) | (prior >= 1) | torch.isnan(prior)).any()):
        raise ValueError(f"prior must lie strictly between 0 and 1 for every disease (the AUC losses weight "
                         f"each class by the other's prior), got {prior.detach().cpu().tolist()}")


def reduce_terms(per_disease: Tensor, reduction: Reduction) -> Tensor:
    if reduction == "mean":
        return per_disease.sum() / per_disease.numel()
    if reduction == "sum":
        return per_disease.sum()
    if reduction == "none":
        return per_disease
    raise ValueError(f"reduction must be one of {REDUCTIONS}, got {reduction!r}")


def defined_diseases(labels: Tensor, mask: Tensor | None = None) -> Tensor:
    """(C,) bool: the disease has at least one present positive and one present negative in the batch.

    Algorithms use it to skip a disease (for example not to move its alpha) on batches where its loss
    term is 0 by definition.
    """
    return prepare(torch.zeros_like(labels, dtype=torch.float32), labels, mask).defined


def masked_batch_mean(per_sample: Tensor, batch: Batch) -> Tensor:
    """Mean over the present samples of each disease; 0 with zero gradient where undefined."""
    n_present = batch.valid.sum(0).clamp(min=1.0)  # clamp keeps the backward of an unused branch finite
    mean = (per_sample * batch.valid).sum(0) / n_present
    return torch.where(batch.defined, mean, torch.zeros_like(mean))
