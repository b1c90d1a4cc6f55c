"""Pairwise surrogates and the pairwise X-risk (docs/algorithms.md section 1.4)."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import torch
import torch.nn.functional as F
from torch import Tensor

from models.objectives.batch import Reduction, prepare, reduce_terms

# Default temperatures. Logistic: log(1 + exp(-t/T)) with T = 1. Sigmoid: 1/(1 + exp(k t)) with k = 2,
# chosen by benchmarks/studies/sigmoid_surrogate_temperature.py (pairwise training of a small MLP, 20% flipped
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
    batch = prepare(scores, labels, mask)
    loss_fn = get_surrogate(surrogate, margin, temperature)
    s = batch.scores
    pairs = batch.pos.unsqueeze(1) * batch.neg.unsqueeze(0)  # (N_i, N_j, C): i positive, j negative
    diff = s.unsqueeze(1) - s.unsqueeze(0)
    n_pairs = pairs.sum((0, 1))
    per_disease = (loss_fn(diff) * pairs).sum((0, 1)) / n_pairs.clamp(min=1.0)
    per_disease = torch.where(n_pairs > 0, per_disease, torch.zeros_like(per_disease))
    return reduce_terms(per_disease, reduction)
