"""Communication: the engine calls these with the tensors an algorithm declared.

Two of the engine's transports (the protocol: federated/transport.py). ``InProcessTransport`` holds all K
sites in one process and reduces with a plain loop (on CPU a loop over sites beats vmap, see CONTRIBUTING).
``DistributedTransport`` runs one site per process and uses ``torch.distributed`` collectives (gloo on CPU,
NCCL on GPU). Both flatten every dtype group into one buffer so a round costs one collective per kind, not
one per tensor.

Every transport reduces with :func:`weighted_sum`, in site order: float addition is not associative, and an
all-reduce sums in an order of its own (ring chunks), so a few ulps differ per round, and at the demo's
learning rates (element-wise clipped steps of size 1) those few ulps grew into a different model within
rounds. Summing the same numbers in the same order on every transport keeps one computation.
"""

from __future__ import annotations

import datetime as dt
import os
from collections.abc import Sequence

import numpy as np
import torch
import torch.distributed as dist

from common.errors import ConfigError
from federated.transport import gathered_public_keys


class SiteFailure(RuntimeError):
    """Another site stopped answering (crashed, killed, or slower than the configured timeout)."""


def dtype_groups(tensors: Sequence[torch.Tensor]) -> dict[tuple, list[int]]:
    groups: dict[tuple, list[int]] = {}
    for i, t in enumerate(tensors):
        groups.setdefault((t.dtype, t.device), []).append(i)
    return groups


def flatten(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    return torch.cat([t.reshape(-1) for t in tensors])


def weighted_sum(flats: Sequence[torch.Tensor], weights: Sequence[float]) -> torch.Tensor:
    """sum_k weights[k] * flats[k], accumulated in site order (the one reduction every transport uses)."""
    total = flats[0] * weights[0]
    for w, flat in zip(weights[1:], flats[1:]):
        total.add_(flat, alpha=w)
    return total


def ring_sum(vectors: Sequence[torch.Tensor]) -> torch.Tensor:
    """The sum modulo 2^64 of int64 vectors (secure aggregation's reduction, federated/secure_aggregation.py),
    as int64 on the CPU: numpy's unsigned addition wraps by definition, torch's signed one is undefined on
    overflow."""
    total = np.zeros(vectors[0].numel(), dtype=np.uint64)
    for v in vectors:
        total += v.cpu().numpy().view(np.uint64)
    return torch.from_numpy(total.view(np.int64))


def combine(flats: Sequence[torch.Tensor], weights: Sequence[float], robust=None) -> torch.Tensor:
    """One dtype group's reduction: the weighted sum in site order, or a robust rule over every site's values
    (``federated.aggregation.Robust``: a round's MEAN tensors under ``--aggregation median|trimmed-mean``)."""
    return weighted_sum(flats, weights) if robust is None else robust(flats, weights)


def unflatten_into(flat: torch.Tensor, tensors: Sequence[torch.Tensor]) -> None:
    # One multi-tensor copy, not a copy_ per tensor: on a GPU each copy_ is a kernel launch (about 600 per
    # site for DenseNet121), and launches, not the GPU, set the pace of a round (docs/performance.md, gpu.py).
    tensors = list(tensors)
    pieces = flat.split([t.numel() for t in tensors])
    torch._foreach_copy_(tensors, [piece.view_as(t) for piece, t in zip(pieces, tensors)])


class InProcessTransport:
    """All sites in this process; ``local_sites`` is every site index."""

    def __init__(self, num_sites: int, device: torch.device | str = "cpu"):
        self.num_sites = num_sites
        self.local_sites = list(range(num_sites))
        self.device = torch.device(device)

    def mean_(self, per_site: list[list[torch.Tensor]], weights: Sequence[float], robust=None,
              names: Sequence[str] = ()) -> None:
        """Replace every site's tensors by the weighted mean over sites (weights sum to 1), or by ``robust``
        (``combine``)."""
        if not per_site or not per_site[0]:
            return
        for _, idx in dtype_groups(per_site[0]).items():
            mean = combine([flatten([tensors[i] for i in idx]) for tensors in per_site], weights, robust)
            for tensors in per_site:
                unflatten_into(mean, [tensors[i] for i in idx])

    def gather(self, per_site: list[torch.Tensor]) -> torch.Tensor:
        """Rows of every site concatenated in site order."""
        return torch.cat(per_site, dim=0)

    def ring_sum(self, per_site: list[torch.Tensor]) -> torch.Tensor:
        """The sum modulo 2^64 of every site's int64 vector."""
        return ring_sum(per_site)

    def exchange_public_keys(self, own: dict[int, bytes]) -> list[bytes]:
        return gathered_public_keys(self, own)

    def barrier(self) -> None:
        """Nothing to wait for: every site runs in this process."""

    def close(self) -> None:
        """Nothing to release."""


class DistributedTransport:
    """One site per process. ``site`` is this process's site index, decided by the caller from the site's
    name (``federated.distributed --site``), never by the order in which processes reached the rendezvous:
    the transport learns which rank holds which site, and every reduction and gather runs in site order.
    ``site=None`` takes the local rank, which only a single-machine launch fixes. ``timeout_s`` bounds
    every collective."""

    def __init__(self, timeout_s: float, device: torch.device, site: int | None = None):
        if site is None:
            if int(os.environ.get("LOCAL_WORLD_SIZE", os.environ.get("WORLD_SIZE", "1"))) != int(
                    os.environ.get("WORLD_SIZE", "1")):
                raise ConfigError("processes run on several machines, so the rank of a process says nothing "
                                  "about which site it holds",
                                  fix="start every process with `--site <name>` (python -m federated.distributed)")
            site = int(os.environ.get("LOCAL_RANK", "0"))
        if not dist.is_initialized():
            backend = "nccl" if device.type == "cuda" else "gloo"
            dist.init_process_group(backend=backend, timeout=dt.timedelta(seconds=timeout_s))
        self.timeout_s = timeout_s
        self.device = device
        self.num_sites = dist.get_world_size()
        self.rank = dist.get_rank()
        self.site = site
        self.local_sites = [site]
        sites = [torch.zeros(1, dtype=torch.int64, device=device) for _ in range(self.num_sites)]
        self._run("all_gather (site of each process)",
                  lambda: dist.all_gather(sites, torch.tensor([site], dtype=torch.int64, device=device)))
        held = [int(s.item()) for s in sites]
        if sorted(held) != list(range(self.num_sites)):
            doubled = sorted({k for k in held if held.count(k) > 1})
            raise ConfigError(f"the {self.num_sites} processes hold sites {held} (by rank): site(s) {doubled} "
                              f"twice, site(s) {sorted(set(range(self.num_sites)) - set(held))} by none",
                              fix="give every process a different --site, one per site of the config")
        self.rank_of_site = [held.index(k) for k in range(self.num_sites)]

    def _run(self, what: str, fn):
        try:
            return fn()
        except (RuntimeError, dist.DistBackendError) as err:
            raise SiteFailure(
                f"site {self.site}: {what} failed: another site crashed or did not answer within "
                f"{self.timeout_s:.0f} s (see that site's log); the job stops here. Cause: {err}"
            ) from err

    def _all_gather(self, what: str, local: torch.Tensor) -> list[torch.Tensor]:
        """Every site's ``local`` (same shape everywhere), in site order."""
        out = [torch.empty_like(local) for _ in range(self.num_sites)]
        self._run(what, lambda: dist.all_gather(out, local))
        return [out[r] for r in self.rank_of_site]

    def mean_(self, per_site: list[list[torch.Tensor]], weights: Sequence[float], robust=None,
              names: Sequence[str] = ()) -> None:
        (tensors,) = per_site
        if not tensors:
            return
        (w,) = weights
        all_weights = [float(v) for v in self._all_gather(
            "all_gather (weights)", torch.tensor([w], dtype=torch.float64, device=self.device))]
        for _, idx in dtype_groups(tensors).items():
            group = [tensors[i] for i in idx]
            flats = self._all_gather("all_gather (mean)", flatten(group))
            unflatten_into(combine(flats, all_weights, robust), group)

    def gather(self, per_site: list[torch.Tensor]) -> torch.Tensor:
        (local,) = per_site
        rows = torch.tensor([local.shape[0]], device=local.device, dtype=torch.int64)
        sizes = [int(r.item()) for r in self._all_gather("all_gather (sizes)", rows)]
        # all_gather needs equal shapes: pad every site's rows to the longest, then trim.
        padded = local.new_zeros((max(sizes), *local.shape[1:]))
        padded[: local.shape[0]] = local
        out = self._all_gather("all_gather", padded)
        return torch.cat([o[:n] for o, n in zip(out, sizes)], dim=0)

    def ring_sum(self, per_site: list[torch.Tensor]) -> torch.Tensor:
        (local,) = per_site
        return ring_sum(self._all_gather("all_gather (secure sum)", local.to(self.device)))

    def exchange_public_keys(self, own: dict[int, bytes]) -> list[bytes]:
        return gathered_public_keys(self, own)

    def barrier(self) -> None:
        self._run("barrier", dist.barrier)

    def close(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()
