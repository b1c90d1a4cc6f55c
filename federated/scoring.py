"""Registered models scored at the sites: what travels to a site and what comes back.

A :class:`ModelToScore` names a network (``TrainConfig.network`` / ``network_kwargs``), its input shape and
its classes; its weights travel beside it as a state dict of tensors: no code and no pickled object. The
site rebuilds the network with the fedauc it installed (``federated.network.build_named``) and loads the
weights into it. :func:`score_site` is what a site returns for them: per model, per split of
``federated.evaluation.SPLITS``, the site-local summary that training's evaluation rounds exchange
(``evaluation.split_summary``: per-site metrics with small counts suppressed, score histograms), so an
in-process evaluation, an evaluation at the hospitals over NVIDIA FLARE and a training's evaluation run
the same site-local code; ``evaluation.combine_sites`` pools the summaries wherever they arrive. An evaluation
job's summaries also carry the site's subgroup cells (``federated.subgroups``: small cells leave as counts "<N"
only), which a training's evaluation rounds do not exchange.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, Field
from torch import nn

from common.errors import DataError
from federated.data import SiteData, learned
from federated.evaluation import SPLITS, absent_summary, site_summary
from federated.network import build_named, model_input_shape
from federated.predict import predict_scores
from federated.subgroups import CELL, cell_summaries

Summary = dict[str, tuple[np.ndarray, np.ndarray]]  # split -> (report, histograms) of evaluation.site_summary
# An evaluation job's results: per site (federation order) one summary per model; site -> shard hash; site -> what
# the job spent of its privacy budget (None: an exact release, federated/dp/evaluation.py).
Scores = tuple[list[list[Summary]], dict[str, str], dict[str, dict | None]]


class ModelToScore(BaseModel):
    model_config = ConfigDict(extra="forbid")
    label: str  # how tables and records name it: the registered version, e.g. "3"
    network: str
    network_kwargs: dict[str, Any] = Field(default_factory=dict)
    input_shape: tuple[int, ...]
    num_classes: int = Field(gt=0)
    diseases: tuple[str, ...] | None = None  # its outputs, when fewer than the shards label (federated/data.py learned)

    def build(self, state: dict[str, torch.Tensor]) -> nn.Module:
        """The network in eval mode with the weights ``state`` (BatchNorm: the registered model's statistics)."""
        model = build_named(self.network, self.network_kwargs, self.input_shape, self.num_classes)
        model.load_state_dict(state)
        return model.eval()


def score_site(site: str, models: list[ModelToScore], states: list[dict[str, torch.Tensor]], data: SiteData, bins: int,
               min_count: int, device: torch.device, groups: dict[str, dict[str, np.ndarray]] | None = None
               ) -> list[Summary]:
    """Site ``site``'s summaries of its own valid and test splits, one per model in ``models``' order (weights
    ``states``), and with ``groups`` (split -> subgroup -> row mask, ``federated.subgroups.split_groups``) its
    subgroup cells under ``<split>@<group>``. A model whose input or classes do not fit the site's shards is an
    error naming the site."""
    shape = model_input_shape(data)
    summaries = []
    for spec, state in zip(models, states, strict=True):
        outputs = learned(data, spec.diseases)
        if tuple(spec.input_shape) != tuple(shape) or spec.num_classes != len(outputs.diseases):
            raise DataError(f"site {site!r}: model {spec.label} takes input {tuple(spec.input_shape)} with "
                            f"{spec.num_classes} classes, this site's shards give {tuple(shape)} with "
                            f"{len(outputs.diseases)}", fix="evaluate a model trained on this federation's task and image size")
        model = spec.build(state).to(device)
        summary: Summary = {}
        for split in SPLITS:
            part = outputs.splits.get(split)
            if part is None or len(part) == 0:
                summary[split] = absent_summary(spec.num_classes, bins)
                continue
            scores = predict_scores(model, part.images, device)
            summary[split] = site_summary(part.labels, scores, bins, min_count)
            cells = cell_summaries(part.labels, scores, (groups or {}).get(split, {}), bins, min_count,
                                   summary[split][0].shape[1])
            summary.update({f"{split}{CELL}{group}": cell for group, cell in cells.items()})
        summaries.append(summary)
    return summaries
