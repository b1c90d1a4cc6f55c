"""Scores of a network on host images: the one prediction path for evaluation, ROC plots and serving."""

from __future__ import annotations

import contextlib

import numpy as np
import torch
from torch import nn

from federated.data import to_model_input


@torch.no_grad()
def predict_scores(
    model: nn.Module,
    images: np.ndarray | torch.Tensor,
    device: torch.device,
    batch_size: int = 256,
    amp: bool = False,
    channels_last: bool = False,
) -> np.ndarray:
    """sigmoid(model(x)) for every row of ``images`` (uint8 images or float features), float32 (N, C).

    ``amp`` (bfloat16 autocast) and ``channels_last`` apply on CUDA only; on CPU the result is float32 and
    deterministic. The model is used as given: put an ``nn.Module`` in eval mode first (a model loaded from
    MLflow's pt2 format is already an inference graph and refuses ``eval()``).
    """
    cuda = device.type == "cuda"
    autocast = torch.autocast("cuda", dtype=torch.bfloat16) if amp and cuda else contextlib.nullcontext()
    out = []
    for start in range(0, len(images), batch_size):
        x = to_model_input(images[start : start + batch_size], device)
        if channels_last and cuda and x.ndim == 4:
            x = x.contiguous(memory_format=torch.channels_last)
        with autocast:
            out.append(torch.sigmoid(model(x).float()).reshape(len(x), -1).cpu())
    if not out:
        return np.zeros((0, 0), dtype=np.float32)
    return torch.cat(out).numpy()
