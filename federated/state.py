"""The federated state schema (docs/algorithms.md section 3): named per-site tensors and what a round does
with each of them.

An algorithm declares ``{name: Comm}`` for its own tensors; the model's parameters and buffers are added
by the engine (parameters are averaged; BN running statistics are averaged unless the config keeps them
local; integer buffers such as ``num_batches_tracked`` advance identically on every site and stay local).
Everything the engine communicates is derived from this declaration, and so is the byte accounting.
"""

from __future__ import annotations

import weakref
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


# Per network, where each of its tensors lives: (name, owning module, its local name), parameters then buffers.
# The engine asks for a site's tensors a few times a round; walking the module tree each time was most of an
# in-process round's overhead (python -m benchmarks.peers, docs/performance.md "Against the peers").
_SLOTS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _slots(model: nn.Module) -> tuple[list, list]:
    if model not in _SLOTS:
        modules = dict(model.named_modules(remove_duplicate=False))

        def owner(name: str) -> tuple[nn.Module, str]:
            path, _, local = name.rpartition(".")
            return modules[path], local

        _SLOTS[model] = ([(n, *owner(n)) for n, _ in model.named_parameters()],
                         [(n, *owner(n)) for n, _ in model.named_buffers()])
    return _SLOTS[model]


def model_tensors(model: nn.Module) -> dict[str, torch.Tensor]:
    """The live tensors of a network under their ``model.`` names (views, not copies). Each is read from its
    module at every call, so a parameter or buffer that was reassigned is the new one."""
    parameters, buffers = _slots(model)
    out = {MODEL_PREFIX + n: module._parameters[local].data for n, module, local in parameters}
    out.update({MODEL_PREFIX + n: module._buffers[local] for n, module, local in buffers})
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
