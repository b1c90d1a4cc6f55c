"""Evaluation of the federated model: the global model and its metrics on every site's valid/test split.

``global_model`` builds the serving model from the sites' models through the backend. ``evaluate``
scores it and returns the flat metrics dict the pipelines log (``<split>/site/<k>/<metric>``,
``<split>/pooled/<metric>``, ``<split>/macro_over_sites/<metric>``).
"""

from __future__ import annotations

import copy

import numpy as np
import torch
from torch import nn

from federated.algorithms.base import FederationContext, Site
from federated.predict import predict_scores
from federated.state import model_tensors
from models.metrics import per_site_and_pooled


def _batch_norms(model: nn.Module) -> list[nn.modules.batchnorm._NormBase]:
    return [m for m in model.modules()
            if isinstance(m, nn.modules.batchnorm._NormBase) and m.running_var is not None]


def global_model(sites: list[Site], backend, weights: list[float], bn_stats: str = "mean") -> nn.Module:
    """The global network (what is registered and served), in eval mode: the weighted mean of the site
    models' parameters.

    BatchNorm running statistics: with ``bn_stats="mean"`` they were averaged every round like the
    parameters, so the mean changes nothing. With ``bn_stats="local"`` every site keeps its own; the global model then carries the statistics of the sites'
    pooled feature distribution, not a plain mean of the site variances:
    ``running_mean = sum_k w_k mu_k`` and ``running_var = sum_k w_k (var_k + mu_k^2) - running_mean^2``
    (law of total variance; a mean of the variances drops the spread between the sites' means).
    """
    models = [copy.deepcopy(s.model) for s in sites]
    pooled_bn = bn_stats == "local"
    if pooled_bn:
        for m in models:
            for bn in _batch_norms(m):
                bn.running_var.add_(bn.running_mean.square())  # E[x^2] per site
    floats = [[t for t in model_tensors(m).values() if t.is_floating_point()] for m in models]
    backend.mean_(floats, weights)
    model = models[0]
    if pooled_bn:
        for bn in _batch_norms(model):
            bn.running_var.sub_(bn.running_mean.square()).clamp_min_(0.0)
    return model.eval()


def _scores(model: nn.Module, images, fed: FederationContext) -> torch.Tensor:
    scores = predict_scores(model, images, fed.device, amp=fed.amp, channels_last=fed.channels_last)
    return torch.from_numpy(scores).to(fed.device)  # NCCL gathers device tensors


def evaluate(model: nn.Module, sites: list[Site], backend, fed: FederationContext) -> dict[str, float]:
    """Metrics of ``model`` (models.metrics.per_site_and_pooled) on every site's ``valid`` and ``test``
    splits: keys ``<split>/site/<k>/<metric>``, ``<split>/pooled/<metric>`` (all sites' samples ranked
    together) and ``<split>/macro_over_sites/<metric>``; NaN = undefined."""
    result: dict[str, float] = {}
    for split in ("valid", "test"):
        scores, labels, site_ids = [], [], []
        for site in sites:
            part = site.data.splits.get(split)
            n = 0 if part is None else len(part)
            empty = torch.zeros(0, fed.num_classes, device=fed.device)
            scores.append(_scores(model, part.images, fed) if n else empty)
            labels.append(torch.tensor(part.labels, device=fed.device) if n else empty)
            site_ids.append(torch.full((n,), float(site.index), device=fed.device))
        s = backend.gather(scores).float().cpu().numpy()
        y = backend.gather(labels).cpu().numpy()
        ids = backend.gather(site_ids).cpu().numpy()
        if len(s) == 0:
            continue
        ks = [int(k) for k in np.unique(ids)]
        metrics = per_site_and_pooled({str(k): y[ids == k] for k in ks}, {str(k): s[ids == k] for k in ks},
                                      list(fed.diseases))
        result.update({f"{split}/{key}": float(value) for key, value in metrics.items()})
    return result
