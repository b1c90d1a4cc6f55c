"""The privatized gradient of one local step: Poisson-sampled batch, per-sample gradients (torch.func), each
clipped to L2 norm C jointly over everything the step differentiates, summed, plus Gaussian noise of standard
deviation sigma x C from the site's own generator, over the expected batch size (Abadi et al. 2016, Algorithm 1;
for min-max losses the primal and dual parts together, Yang et al. UAI 2022).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import torch
from torch import Tensor, nn
from torch.func import functional_call, grad, vmap

from federated.data import SiteLoader

# sample_loss(logits (C,), labels (C,), mask (C,), extras) -> the loss of one record
SampleLoss = Callable[[Tensor, Tensor, Tensor, Sequence[Tensor]], Tensor]


class PoissonLoader(SiteLoader):
    """Each step's batch holds every record independently with probability q = batch_size / N (Poisson sampling,
    what the accountant's subsampled Gaussian assumes): batches vary in size, an empty one is possible. Its RNG
    is the site's own secret stream, not the run's seed: which records a step used must not be known elsewhere."""

    def __init__(self, loader: SiteLoader, seed: int):
        super().__init__(loader.split, loader.batch_size, seed, loader.device, False, loader.workers, loader.prefetch,
                         loader.flip, loader.max_shift)
        self.sample_rate = self.batch_size / len(self.split)

    def next_indices(self) -> np.ndarray:
        return np.flatnonzero(self.rng.random(len(self.split)) < self.sample_rate)


def per_sample_gradients(model: nn.Module, x: Tensor, y: Tensor, mask: Tensor, sample_loss: SampleLoss,
                         extras: Sequence[Tensor]) -> tuple[Tensor, list[Tensor]]:
    """Each record's loss (B,) and gradient (B, *shape) with respect to the network's parameters, then ``extras``."""
    params = {n: p.detach() for n, p in model.named_parameters()}
    buffers = dict(model.named_buffers())
    extras = [e.detach() for e in extras]

    def one(p, ex, xi, yi, mi):
        out = functional_call(model, (p, buffers), (xi.unsqueeze(0),)).reshape(-1).float()
        loss = sample_loss(out, yi, mi, ex)
        return loss, loss

    (g_params, g_extras), losses = vmap(grad(one, argnums=(0, 1), has_aux=True), in_dims=(None, None, 0, 0, 0),
                                        randomness="different")(params, extras, x, y, mask)
    return losses, [g_params[n] for n in params] + list(g_extras)


def clip_per_sample(grads: list[Tensor], max_norm: float) -> tuple[list[Tensor], Tensor]:
    """Scale each record's gradient (its slice of every tensor, one vector) to L2 norm at most ``max_norm``;
    returns the clipped per-sample gradients and the norms before clipping."""
    norms = torch.stack([g.reshape(len(g), -1).square().sum(1) for g in grads]).sum(0).sqrt()
    factor = (max_norm / (norms + 1e-6)).clamp(max=1.0)
    return [g * factor.view(-1, *([1] * (g.ndim - 1))) for g in grads], norms


def noised_sum(clipped: list[Tensor], std: float, generator: torch.Generator) -> list[Tensor]:
    """The sum over records of ``clipped`` plus N(0, std^2) on every coordinate, drawn from ``generator``."""
    return [g.sum(0) + torch.normal(0.0, std, g.shape[1:], generator=generator, device=g.device, dtype=g.dtype)
            for g in clipped]


def private_gradients(model: nn.Module, x: Tensor, y: Tensor, mask: Tensor, sample_loss: SampleLoss,
                      extras: Sequence[Tensor], max_norm: float, noise_multiplier: float, expected_batch: float,
                      generator: torch.Generator) -> tuple[Tensor, list[Tensor]]:
    """(mean loss of the batch, privatized gradients of the parameters then of ``extras``): the noised sum of
    clipped per-sample gradients over the expected batch size (fixed, so the batch's actual size stays secret)."""
    if len(x) == 0:  # a Poisson batch may be empty: the step is noise alone, as the accountant assumes
        shapes = [p.shape for p in model.parameters()] + [e.shape for e in extras]
        clipped = [torch.zeros((0, *s), device=mask.device) for s in shapes]
        loss = torch.zeros((), device=mask.device)
    else:
        losses, grads = per_sample_gradients(model, x, y, mask, sample_loss, extras)
        clipped, _ = clip_per_sample(grads, max_norm)
        loss = losses.mean()
    noised = noised_sum(clipped, noise_multiplier * max_norm, generator)
    return loss.detach(), torch._foreach_div(noised, expected_batch)
