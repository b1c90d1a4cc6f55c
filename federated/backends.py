"""Communication backends: the engine calls these with the tensors an algorithm declared.

``InProcessBackend`` holds all K sites in one process and reduces with a plain loop (on CPU a loop over
sites beats vmap, see CONTRIBUTING). ``DistributedBackend`` runs one site per process and uses
``torch.distributed`` collectives (gloo on CPU, NCCL on GPU). Both flatten every dtype group into one
buffer so a round costs one collective per kind, not one per tensor.
"""

from __future__ import annotations

import datetime as dt
import os
from collections.abc import Sequence

import torch
import torch.distributed as dist


class SiteFailure(RuntimeError):
    """Another site stopped answering (crashed, killed, or slower than the configured timeout)."""


def _dtype_groups(tensors: Sequence[torch.Tensor]) -> dict[tuple, list[int]]:
    groups: dict[tuple, list[int]] = {}
    for i, t in enumerate(tensors):
        groups.setdefault((t.dtype, t.device), []).append(i)
    return groups


def _flatten(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    return torch.cat([t.reshape(-1) for t in tensors])


def _unflatten_into(flat: torch.Tensor, tensors: Sequence[torch.Tensor]) -> None:
    offset = 0
    for t in tensors:
        n = t.numel()
        t.copy_(flat[offset : offset + n].view_as(t))
        offset += n


class InProcessBackend:
    """All sites in this process; ``local_sites`` is every site index."""

    name = "inprocess"

    def __init__(self, num_sites: int):
        self.num_sites = num_sites
        self.local_sites = list(range(num_sites))

    def mean_(self, per_site: list[list[torch.Tensor]], weights: Sequence[float]) -> None:
        """Replace every site's tensors by the weighted mean over sites (weights sum to 1)."""
        if not per_site or not per_site[0]:
            return
        for _, idx in _dtype_groups(per_site[0]).items():
            flats = [_flatten([tensors[i] for i in idx]) for tensors in per_site]
            mean = flats[0] * weights[0]
            for w, flat in zip(weights[1:], flats[1:]):
                mean.add_(flat, alpha=w)
            for tensors in per_site:
                _unflatten_into(mean, [tensors[i] for i in idx])

    def gather(self, per_site: list[torch.Tensor]) -> torch.Tensor:
        """Rows of every site concatenated in site order."""
        return torch.cat(per_site, dim=0)

    def barrier(self) -> None:
        """Nothing to wait for: every site runs in this process."""


class DistributedBackend:
    """One site per process, site index = rank. ``timeout_s`` bounds every collective."""

    name = "distributed"

    def __init__(self, timeout_s: float, device: torch.device):
        if not dist.is_initialized():
            backend = "nccl" if device.type == "cuda" else "gloo"
            # Without it an NCCL collective whose peer died blocks forever instead of timing out.
            os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")
            dist.init_process_group(backend=backend, timeout=dt.timedelta(seconds=timeout_s))
        self.timeout_s = timeout_s
        self.num_sites = dist.get_world_size()
        self.rank = dist.get_rank()
        self.local_sites = [self.rank]

    def _run(self, what: str, fn):
        try:
            return fn()
        except (RuntimeError, dist.DistBackendError) as err:
            raise SiteFailure(
                f"site {self.rank}: {what} failed: another site crashed or did not answer within "
                f"{self.timeout_s:.0f} s (see that site's log); the job stops here. Cause: {err}"
            ) from err

    def mean_(self, per_site: list[list[torch.Tensor]], weights: Sequence[float]) -> None:
        (tensors,) = per_site
        if not tensors:
            return
        (w,) = weights
        for _, idx in _dtype_groups(tensors).items():
            group = [tensors[i] for i in idx]
            flat = _flatten(group).mul_(w)
            self._run("all_reduce (mean)", lambda flat=flat: dist.all_reduce(flat, op=dist.ReduceOp.SUM))
            _unflatten_into(flat, group)

    def gather(self, per_site: list[torch.Tensor]) -> torch.Tensor:
        (local,) = per_site
        rows = torch.tensor([local.shape[0]], device=local.device, dtype=torch.int64)
        all_rows = [torch.zeros_like(rows) for _ in range(self.num_sites)]
        self._run("all_gather (sizes)", lambda: dist.all_gather(all_rows, rows))
        sizes = [int(r.item()) for r in all_rows]
        # all_gather needs equal shapes: pad every site's rows to the longest, then trim.
        padded = local.new_zeros((max(sizes), *local.shape[1:]))
        padded[: local.shape[0]] = local
        out = [torch.empty_like(padded) for _ in range(self.num_sites)]
        self._run("all_gather", lambda: dist.all_gather(out, padded))
        return torch.cat([o[:n] for o, n in zip(out, sizes)], dim=0)

    def barrier(self) -> None:
        self._run("barrier", dist.barrier)

    def close(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()
