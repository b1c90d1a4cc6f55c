"""Site data: memory-mapped shards (docs/shards.md) or in-memory tensors, and the per-site batch loader.

Images stay uint8 on the host (memory-mapped, so a site's data set never has to fit in RAM) and are
converted to float on the training device, where the division costs nothing next to the network.
Missing labels (NaN) become ``mask = 0``; they are never read as negatives. Every batch carries the
dataset indices of its samples (KL-OPAUC keeps one state value per positive sample, docs/algorithms.md section 1.5).
"""

from __future__ import annotations

from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from common.errors import DataError
from preprocessing.shard_format import SPLITS, read_shard_info, read_split
from preprocessing.shard_integrity import check_shard_files


@dataclass
class Batch:
    x: torch.Tensor  # float, (B, channels, H, W) for images or (B, D) for feature vectors
    y: torch.Tensor  # float {0, 1}, (B, C); missing labels are 0 here and 0 in ``mask``
    mask: torch.Tensor  # float {0, 1}, (B, C): 1 where the label is known
    index: torch.Tensor  # int64 (B,): row of each sample in its split


@dataclass
class SplitData:
    """One split of one site. ``images`` is uint8 (N, H, W) / (N, H, W, 3) or float features (N, ...)."""

    images: np.ndarray | torch.Tensor
    labels: np.ndarray  # float32 (N, C), NaN = missing

    def __post_init__(self):
        if len(self.images) != len(self.labels):
            raise ValueError(f"{len(self.images)} images but {len(self.labels)} label rows")
        if self.labels.ndim != 2:
            raise ValueError(f"labels must be (N, C), got shape {self.labels.shape}")
        # Checked here, where labels enter: the losses skip this check inside the engine's local steps (it would be
        # a host sync per step on a GPU, models/value_checks.py).
        bad = ~(np.isnan(self.labels) | (self.labels == 0) | (self.labels == 1))
        if bad.any():
            row, col = (int(v) for v in np.argwhere(bad)[0])
            raise ValueError(f"labels must be 0, 1 or NaN (missing); row {row}, disease column {col} holds "
                             f"{float(self.labels[row, col])!r} ({int(bad.sum())} such entries)")

    def __len__(self) -> int:
        return len(self.labels)


@dataclass
class SiteData:
    name: str
    diseases: tuple[str, ...]
    splits: dict[str, SplitData]  # "train" always; "valid", "test" when the site has them

    @property
    def train(self) -> SplitData:
        return self.splits["train"]


def learned(data: SiteData, diseases: tuple[str, ...] | None) -> SiteData:
    """``data`` with the label columns of ``diseases`` only, in that order (None: all of them): what a training
    that learns fewer diseases than its sites label reads."""
    if diseases is None or tuple(diseases) == data.diseases:
        return data
    unknown = [d for d in diseases if d not in data.diseases]
    if unknown:
        raise DataError(f"site {data.name!r}: its shards label {list(data.diseases)}, not {unknown}",
                        fix="name only diseases of the federation's task in its `diseases:`")
    columns = [data.diseases.index(d) for d in diseases]
    return SiteData(data.name, tuple(diseases),
                    {split: SplitData(part.images, part.labels[:, columns]) for split, part in data.splits.items()})


def load_shard(site_dir: str | Path) -> SiteData:
    """Open a site shard written by ``fedauc preprocess`` (docs/shards.md), images memory-mapped."""
    info = read_shard_info(site_dir)
    check_shard_files(site_dir, info)  # a damaged file named before numpy maps it
    diseases = tuple(info["diseases"])
    splits = {split: SplitData(*arrays) for split in SPLITS
              if (arrays := read_split(site_dir, split, diseases)) is not None}
    if "train" not in splits:
        raise DataError(f"{site_dir}: the shard has no train split",
                        fix="give the site training records (its split settings) and run `fedauc preprocess` again")
    return SiteData(str(info.get("site", Path(site_dir).name)), diseases, splits)


def to_model_input(images: np.ndarray | torch.Tensor, device: torch.device) -> torch.Tensor:
    """Host rows -> float model input on ``device``: uint8 images become (B, ch, H, W) in [0, 1]."""
    host = host_rows(images)
    return device_images(host.pin_memory() if device.type == "cuda" and host.device.type == "cpu" else host, device)


def host_rows(images: np.ndarray | torch.Tensor) -> torch.Tensor:
    """A batch's rows as a tensor; a slice of the read-only memory map is copied once, into its own buffer."""
    if isinstance(images, np.ndarray):
        return torch.from_numpy(images if images.flags.writeable and images.flags.c_contiguous else np.array(images))
    return images


def device_images(images: torch.Tensor, device: torch.device) -> torch.Tensor:
    """Rows -> float model input on ``device``; uint8 travels as uint8 (a quarter of float's bytes) and is
    converted there. The copy is asynchronous when ``images`` is in page-locked host memory."""
    if images.dtype != torch.uint8:
        return images.to(device, dtype=torch.float32, non_blocking=True)
    x = images.to(device, non_blocking=True)
    # (N, H, W) is single-channel, (N, H, W, 3) is RGB in channels-last order. The model's input is laid out
    # channels first whatever the stored order (the engine alone chooses channels-last, on CUDA): torch 2.13's
    # oneDNN on AVX2 CPUs corrupts the heap in the weight gradient of a 1x1 stride-2 convolution (small_resnet's
    # shortcut) fed channels-last RGB, and the training dies of SIGABRT or SIGSEGV.
    x = x.unsqueeze(1) if x.ndim == 3 else x.permute(0, 3, 1, 2)
    return x.to(torch.float32, memory_format=torch.contiguous_format).div_(255.0)


def augment(x: torch.Tensor, flip: bool, max_shift: int) -> torch.Tensor:
    """Random horizontal flips and translations (replicate-padded, up to ``max_shift`` pixels) of an
    image batch (B, ch, H, W), on the batch's device with the current torch RNG (the site's stream)."""
    B, _, H, W = x.shape
    if flip:
        flipped = torch.rand(B, device=x.device) < 0.5
        x = torch.where(flipped[:, None, None, None], x.flip(-1), x)
    if max_shift > 0:
        padded = torch.nn.functional.pad(x, (max_shift,) * 4, mode="replicate")
        dy, dx = torch.randint(0, 2 * max_shift + 1, (2, B), device=x.device)
        rows = (torch.arange(H, device=x.device)[None] + dy[:, None])[:, None, :, None].expand(B, x.shape[1], H, W + 2 * max_shift)
        x = padded.gather(2, rows)
        cols = (torch.arange(W, device=x.device)[None] + dx[:, None])[:, None, None, :].expand(B, x.shape[1], H, W)
        x = x.gather(3, cols)
    return x


class SiteLoader:
    """Endless seeded minibatches of one split; the state (RNG and queue) is checkpointable.

    Sampling is without replacement within an epoch; the tail of an epoch is completed by the next
    epoch's permutation, so every sample is visited once per epoch. ``guarantee_positives`` replaces a
    random slot by a random positive of every disease that has positives at the site but none in the
    batch (for heavily imbalanced tasks, where AUC losses need both classes in a batch).
    ``workers`` threads read the next batches from the memory map while the current one trains; on CUDA
    they also page-lock each batch, so that its copies to the GPU are asynchronous (``non_blocking``) and
    overlap the computation. ``flip`` / ``max_shift`` augment image batches on the training device (see
    :func:`augment`).
    """

    def __init__(self, split: SplitData, batch_size: int, seed: int, device: torch.device,
                 guarantee_positives: bool = False, workers: int = 2, prefetch: int = 4,
                 flip: bool = False, max_shift: int = 0):
        self.split = split
        self.batch_size = min(batch_size, len(split))
        self.device = device
        self.guarantee_positives = guarantee_positives
        self.rng = np.random.default_rng(seed)
        self.queue = np.empty(0, dtype=np.int64)
        self.positives = [np.flatnonzero(split.labels[:, c] == 1.0) for c in range(split.labels.shape[1])]
        self.workers = workers
        self.prefetch = prefetch
        self.flip, self.max_shift = flip, max_shift
        self._pool = ThreadPoolExecutor(workers) if workers > 0 else None

    def next_indices(self) -> np.ndarray:
        while len(self.queue) < self.batch_size:
            self.queue = np.concatenate([self.queue, self.rng.permutation(len(self.split))])
        idx, self.queue = self.queue[: self.batch_size].copy(), self.queue[self.batch_size :]
        if self.guarantee_positives:
            protected = np.zeros(len(idx), dtype=bool)
            for c, pos in enumerate(self.positives):
                if len(pos) == 0:
                    continue
                hits = self.split.labels[idx, c] == 1.0
                if hits.any():
                    protected |= hits
                    continue
                free = np.flatnonzero(~protected)
                if len(free) == 0:
                    continue  # every slot already holds a positive that another disease needed
                slot = free[self.rng.integers(len(free))]
                idx[slot] = pos[self.rng.integers(len(pos))]
                protected[slot] = True
        return idx

    def _read(self, idx: np.ndarray):
        # Sorted reads are sequential in the memory map; the batch keeps the sampled order.
        order = np.argsort(idx, kind="stable")
        rows = np.empty_like(order)
        rows[order] = np.arange(len(idx))
        images = np.asarray(self.split.images[idx[order]])[rows] if isinstance(self.split.images, np.ndarray) \
            else self.split.images[torch.from_numpy(idx)]
        labels = self.split.labels[idx]
        host = (host_rows(images), torch.from_numpy(np.nan_to_num(labels, nan=0.0)),
                torch.from_numpy((~np.isnan(labels)).astype(np.float32)), torch.from_numpy(idx))
        if self.device.type == "cuda":
            host = tuple(t.pin_memory() if t.device.type == "cpu" else t for t in host)
        return host

    def _to_batch(self, host) -> Batch:
        images, y, mask, idx = host
        x = device_images(images, self.device)
        if x.ndim == 4 and (self.flip or self.max_shift):
            x = augment(x, self.flip, self.max_shift)
        return Batch(x, y.to(self.device, non_blocking=True), mask.to(self.device, non_blocking=True),
                     idx.to(self.device, non_blocking=True))

    def batches(self, n: int):
        """The next ``n`` batches; indices are drawn up front (deterministic), reads run ahead in threads."""
        indices = [self.next_indices() for _ in range(n)]
        if self._pool is None:
            for idx in indices:
                yield self._to_batch(self._read(idx))
            return
        pending: deque[Future] = deque()
        it = iter(indices)
        for idx in it:
            pending.append(self._pool.submit(self._read, idx))
            if len(pending) >= self.prefetch:
                break
        while pending:
            host = pending.popleft().result()
            nxt = next(it, None)
            if nxt is not None:
                pending.append(self._pool.submit(self._read, nxt))
            yield self._to_batch(host)

    def state_dict(self) -> dict:
        return {"rng": self.rng.bit_generator.state, "queue": self.queue.copy()}

    def load_state_dict(self, state: dict) -> None:
        self.rng.bit_generator.state = state["rng"]
        self.queue = np.asarray(state["queue"], dtype=np.int64)


def label_counts(labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per disease: number of positives and number of known labels (NaN excluded)."""
    known = ~np.isnan(labels)
    return (labels == 1.0).sum(axis=0).astype(np.float64), known.sum(axis=0).astype(np.float64)


def synthetic_site(name: str, n: dict[str, int], shape: tuple[int, ...], num_classes: int,
                   pos_rate: float | list[float], shift: float, signal: float, task_seed: int,
                   site_seed: int) -> SiteData:
    """A Gaussian multi-label site: x = noise + shift * u_site + signal * sum_c y_c w_c.

    ``w_c`` come from ``task_seed`` (shared by all sites: one task), ``u_site`` and the noise from
    ``site_seed`` (heterogeneous inputs, as FeDXL's site-specific input shift, docs/algorithms.md section 10 (b)).
    """
    dim = int(np.prod(shape))
    w = np.random.default_rng(task_seed).standard_normal((num_classes, dim)).astype(np.float32) / np.sqrt(dim)
    rng = np.random.default_rng(site_seed)
    u = rng.standard_normal(dim).astype(np.float32) / np.sqrt(dim)
    rates = np.broadcast_to(np.asarray(pos_rate, dtype=np.float64), (num_classes,))
    splits = {}
    for split, count in n.items():
        if count <= 0:
            continue
        y = (rng.random((count, num_classes)) < rates).astype(np.float32)
        x = rng.standard_normal((count, dim)).astype(np.float32) + shift * np.sqrt(dim) * u + signal * y @ w * np.sqrt(dim)
        splits[split] = SplitData(torch.from_numpy(x.reshape(count, *shape)), y)
    return SiteData(name, tuple(f"class{c}" for c in range(num_classes)), splits)


def usable_prior(positives: torch.Tensor, known: torch.Tensor) -> torch.Tensor:
    """positives / known, kept inside (0, 1) for a disease with one class only (no positive anywhere in a
    small federation, or at one site with a local prior). Such a disease never has both classes in a
    batch, so its AUC loss is zero whatever the prior; the clamp only keeps the losses' check meaningful."""
    known = known.clamp_min(1)
    eps = 0.5 / known
    return (positives / known).clamp(min=eps, max=1 - eps).float()
