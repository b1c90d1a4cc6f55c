"""What every system in python -m benchmarks.peers trains with, and nothing more: imported by the peers' own virtual
environments (Flower's, LibAUC's) as well as fedauc's, so it needs only torch and numpy (and the repository's
``models.networks`` on the path, for the same network).

A site's training split is exported once by the peers benchmark as ``<data>/<site>.npz`` (the shard's uint8 images and
labels, exactly the rows fedauc's loader reads) and becomes the model's input as fedauc makes it
(``federated.data.device_images``: channels first, divided by 255). A local step is fedauc's FedAvg step
(federated/algorithms/fedavg.py): plain SGD on the masked BCE's gradient, no momentum, no weight decay. Batches
are drawn as fedauc's ``SiteLoader`` draws them (without replacement within an epoch, epochs run on).
"""

from __future__ import annotations

import json
import os
import resource
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

REPO = Path(__file__).resolve().parents[2]


def network(spec: dict) -> torch.nn.Module:
    """The benchmark's network, with the initial weights every system starts from."""
    from models.networks import build_network

    model = build_network(spec["network"], spec["classes"], spec["channels"])
    model.load_state_dict(torch.load(spec["init"], weights_only=True))
    return model


def site_tensors(data: Path, site: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(float images (N, ch, H, W) in [0, 1], labels (N, C) with NaN as 0 and their mask stacked: (N, 2C))."""
    arrays = np.load(data / f"{site}.npz")
    x = torch.from_numpy(arrays["images"])
    x = (x.unsqueeze(1) if x.ndim == 3 else x.permute(0, 3, 1, 2)).float().div_(255.0).contiguous()
    labels = arrays["labels"]
    y = torch.from_numpy(np.nan_to_num(labels, nan=0.0)).float()
    mask = torch.from_numpy(~np.isnan(labels)).float()
    return x, torch.cat([y, mask], 1)


class Batches:
    """Minibatch indices without replacement within an epoch; the epoch's tail runs into the next permutation."""

    def __init__(self, n: int, batch: int, seed: int):
        self.n, self.batch = n, min(batch, n)
        self.rng = np.random.default_rng(seed)
        self.queue = np.empty(0, dtype=np.int64)

    def next(self) -> torch.Tensor:
        while len(self.queue) < self.batch:
            self.queue = np.concatenate([self.queue, self.rng.permutation(self.n)])
        idx, self.queue = self.queue[: self.batch], self.queue[self.batch:]
        return torch.from_numpy(idx)


def masked_bce(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """models.objectives.masked_bce_with_logits: per disease the mean over the batch's known labels, then the mean."""
    classes = logits.shape[1]
    y, mask = target[:, :classes], target[:, classes:]
    per = F.binary_cross_entropy_with_logits(logits, y, reduction="none") * mask
    return (per.sum(0) / mask.sum(0).clamp_min(1)).mean()


def local_train(model: torch.nn.Module, x: torch.Tensor, target: torch.Tensor, batches: Batches, steps: int,
                lr: float) -> float:
    """``steps`` FedAvg local steps; returns their wall seconds (the site's compute)."""
    started = time.perf_counter()
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    for _ in range(steps):
        idx = batches.next()
        loss = masked_bce(model(x[idx]), target[idx])
        grads = torch.autograd.grad(loss, params)
        with torch.no_grad():
            torch._foreach_add_(params, grads, alpha=-lr)
    return time.perf_counter() - started


def log_round(out: Path, system: str, site: str, round_: int, compute_s: float) -> None:
    """One line per site and round: when its local training started (this machine's clock), its seconds, its
    process's CPU seconds and peak RSS so far."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    line = {"site": site, "round": round_, "start": time.time() - compute_s, "compute_s": compute_s,
            "pid": os.getpid(), "cpu_s": usage.ru_utime + usage.ru_stime, "rss_mb": usage.ru_maxrss / 1024}
    with open(out / f"{system}-rounds.jsonl", "a") as f:
        f.write(json.dumps(line) + "\n")


def state_bytes(model: torch.nn.Module) -> int:
    return sum(t.numel() * t.element_size() for t in model.state_dict().values())
