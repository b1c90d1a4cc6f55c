"""The federated state schema (docs/algorithms.md section 3): named per-site tensors and what a round does
with each of them.

An algorithm declares ``{name: Comm}`` for its own tensors; the model's parameters and buffers are added
by the engine (parameters are averaged; BN running statistics are averaged unless the config keeps them
local; integer buffers such as ``num_batches_tracked`` advance identically on every site and stay local).
Everything the engine communicates is derived from this declaration, and so is the byte accounting.
"""

from __future__ import annotations

from enum import Enum

import torch
from torch import nn


class Comm(str, Enum):
    """What one communication round does with a declared tensor."""

    MEAN = "mean"  # all-reduce average over sites; every site receives the mean
    GATHER = "gather"  # concatenate every site's rows in site order along dim 0; every site receives all
    LOCAL = "local"  # never leaves the site
    # Stage statistics only (Algorithm.stage_spec): sums and counts whose ratio is the pooled mean over
    # all sites' samples, whatever the aggregation weights.
    SUM = "sum"


MODEL_PREFIX = "model."


def model_state_spec(model: nn.Module, bn_stats: str) -> dict[str, Comm]:
    """The declaration of a network's own state: ``model.<name>`` for every parameter and buffer."""
    if bn_stats not in ("mean", "local"):
        raise ValueError(f"bn_stats must be 'mean' or 'local', got {bn_stats!r}")
    spec: dict[str, Comm] = {}
    for name, _ in model.named_parameters():
        spec[MODEL_PREFIX + name] = Comm.MEAN
    for name, buf in model.named_buffers():
        if not buf.is_floating_point():
            spec[MODEL_PREFIX + name] = Comm.LOCAL
        else:
            spec[MODEL_PREFIX + name] = Comm.MEAN if bn_stats == "mean" else Comm.LOCAL
    return spec


def model_tensors(model: nn.Module) -> dict[str, torch.Tensor]:
    """The live tensors of a network under their ``model.`` names (views, not copies)."""
    out = {MODEL_PREFIX + n: p.data for n, p in model.named_parameters()}
    out.update({MODEL_PREFIX + n: b for n, b in model.named_buffers()})
    return out


def nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def check_layout(algorithm: str, tensors: list[dict[str, torch.Tensor]], names: list[str], layout: dict) -> None:
    """MEAN tensors keep their declared shape and dtype (``layout``: name -> (shape, dtype)) for the whole run: an
    all-reduce needs identical buffers at every site, and the byte accounting relies on the declared sizes."""
    for t in tensors:
        for n in names:
            if (tuple(t[n].shape), t[n].dtype) != layout[n]:
                raise RuntimeError(f"algorithm {algorithm!r}: MEAN tensor {n!r} is now {tuple(t[n].shape)} "
                                   f"{t[n].dtype}, declared {layout[n]}; a MEAN tensor must keep its shape and dtype")
