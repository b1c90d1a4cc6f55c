"""Which site holds a round up: each site's compute and wait seconds per round, in the round's record, and what
the round cost in CPU seconds (which a machine's other load does not stretch).

A site's *compute* is the wall time of its local steps in the round (on CUDA up to a device synchronisation,
so the queued kernels count where they run); its *wait* is the rest of its round up to the round's per-site
gather: the collectives, which return only when the slowest site has contributed. Its *compute CPU* is the
CPU seconds of the thread that ran its local steps while it ran them, and its *process CPU* the CPU seconds of
its whole process from the round's start to the gather (under NVIDIA FLARE the transport's threads, idle polling
included; in-process the one process every site shares, so each site's figure is that process's). All four
ride as more columns of the round's per-site gather (federated/health.py ``site_row``, federated/engine.py),
which every site already makes, so no message is added and the centre sees four aggregate numbers per site a
round, nothing per image.

In the record: ``site_compute_s``, ``site_wait_s``, ``site_compute_cpu_s`` and ``site_process_cpu_s`` (per site,
in site order) and ``slowest``: the site
with the longest compute, its compute, and ``held_up_s``, how much longer than the next slowest site it took,
the time the round would have been shorter without its delay (0 with one site); ``seconds``, the round's wall
time in the process that writes the record.

Under differential privacy every site sends NaN in its timing columns and the record's ``seconds`` is NaN, with
no ``slowest``: a site's compute time grows with its secret Poisson batch sizes (docs/privacy.md section 5).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import TypeVar

import torch

COLUMNS = 4  # compute, wait, compute CPU, process CPU: the last columns of a site's row
T = TypeVar("T")


class RoundClock:
    """Times the sites of this process through one round: ``time`` runs each site's local steps, in site
    order, then ``row(i)`` once the round's collectives have returned."""

    def __init__(self, num_sites: int, device: torch.device, withheld: bool = False):
        self.started = time.perf_counter()
        self.started_cpu = time.process_time()
        self.device = device
        self.withheld = withheld
        self.compute = [0.0] * num_sites
        self.compute_cpu = [0.0] * num_sites
        self.ended = [0.0] * num_sites
        self._next = 0

    def time(self, local_steps: Callable[..., T], *args) -> T:
        """``local_steps(*args)``, timed as the next site's compute."""
        i, start, start_cpu = self._next, time.perf_counter(), time.thread_time()
        out = local_steps(*args)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self.ended[i] = time.perf_counter()
        self.compute[i] = self.ended[i] - start
        self.compute_cpu[i] = time.thread_time() - start_cpu
        self._next += 1
        return out

    def row(self, i: int) -> torch.Tensor:
        """Site ``i``'s columns (float64, CPU): its compute, its wait from then until now, its compute's CPU
        seconds and its process's since the round started; NaN if withheld."""
        if self.withheld:
            return torch.full((1, COLUMNS), float("nan"), dtype=torch.float64)
        return torch.tensor([[self.compute[i], time.perf_counter() - self.ended[i], self.compute_cpu[i],
                              time.process_time() - self.started_cpu]], dtype=torch.float64)

    def record(self, per_site: torch.Tensor, site_names: list[str]) -> dict:
        """The round record's timing keys: the round's seconds so far and ``record_times`` of the gathered rows."""
        seconds = float("nan") if self.withheld else time.perf_counter() - self.started
        return {"seconds": seconds, **record_times(per_site, site_names)}


def with_times(row: torch.Tensor, times: torch.Tensor) -> torch.Tensor:
    """A site's gather row with its timing columns appended (on the row's device)."""
    return torch.cat([row, times.to(row.device)], dim=1)


def record_times(per_site: torch.Tensor, site_names: list[str]) -> dict:
    """The round record's timing keys from every site's gathered row (timing in the last COLUMNS)."""
    compute, wait, compute_cpu, process_cpu = (per_site[:, k].tolist() for k in range(-COLUMNS, 0))
    times = {"site_compute_s": compute, "site_wait_s": wait, "site_compute_cpu_s": compute_cpu,
             "site_process_cpu_s": process_cpu}
    if any(math.isnan(c) for c in compute):  # withheld (differential privacy): no site is named
        return times
    order = sorted(range(len(compute)), key=lambda k: compute[k], reverse=True)
    slowest = order[0]
    held_up = compute[slowest] - compute[order[1]] if len(order) > 1 else 0.0
    return {**times, "slowest": {"site": site_names[slowest], "compute_s": compute[slowest], "held_up_s": held_up}}
