"""What the engine needs from whatever connects the sites: the ``Transport`` protocol.

A transport holds some of a federation's sites (``local_sites``: all of them in one process, one per process
under torchrun or NVIDIA FLARE) and runs the collectives the engine asks for, always with one contribution per
local site and always in site order. The engine calls nothing else, never asks a transport what it is, and
works the same whichever one it is given; a new transport (another engine, a cloud batch system) implements
these members and nothing more:

- ``num_sites``: K, the federation's size; ``local_sites``: the indices of the sites this process holds.
- ``device``: the device this process trains on; collectives take tensors there (NCCL reduces device
  tensors only) and give results back there.
- ``mean_(per_site, weights, robust=None, names=())``: replace every local site's tensors, in place, by
  ``sum_k weights[k] * tensors_k`` over all K sites (weights sum to 1 for a mean, are all 1 for a sum), or by
  the robust rule ``robust`` (federated/aggregation.py) over every site's values. ``names`` name the tensors,
  for the errors of a transport that checks values (secure aggregation).
- ``gather(per_site)``: every site's rows concatenated in site order (on this process's device).
- ``ring_sum(per_site)``: the sum modulo 2^64 of every site's int64 vector (secure aggregation's one
  reduction, ``federated.backends.ring_sum``), on the CPU.
- ``exchange_public_keys(own)``: every site's 32-byte public key for secure aggregation, in site order, from
  ``own`` (local site -> its key). Within one trust domain the keys travel through ``gather``
  (:func:`gathered_public_keys`); across hospitals a transport signs and checks them against the
  consortium's certificates (federated/flare/site/keys.py) and never falls back to unchecked keys.
- ``barrier()``: return when every site reached it; ``close()``: release what the transport holds (a process
  group); idempotent.

Errors: a site that stops answering is a ``federated.backends.SiteFailure`` naming the collective.
Implementations: ``InProcessTransport`` and ``DistributedTransport`` (federated/backends.py),
``FlareTransport`` (federated/flare/site/backend.py) and ``SecureTransport`` (federated/secure_aggregation.py), which
wraps any other.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import torch


@runtime_checkable
class Transport(Protocol):
    num_sites: int
    local_sites: list[int]
    device: torch.device

    def mean_(self, per_site: list[list[torch.Tensor]], weights: Sequence[float], robust=None,
              names: Sequence[str] = ()) -> None: ...

    def gather(self, per_site: list[torch.Tensor]) -> torch.Tensor: ...

    def ring_sum(self, per_site: list[torch.Tensor]) -> torch.Tensor: ...

    def exchange_public_keys(self, own: dict[int, bytes]) -> list[bytes]: ...

    def barrier(self) -> None: ...

    def close(self) -> None: ...


def gathered_public_keys(transport: Transport, own: dict[int, bytes]) -> list[bytes]:
    """Every site's public key through ``transport.gather``: the key exchange of a transport whose sites share
    one trust domain (one process, or processes of one data centre)."""
    rows = [torch.tensor(list(own[k]), dtype=torch.uint8, device=transport.device).reshape(1, -1)
            for k in transport.local_sites]
    return [bytes(row.cpu().tolist()) for row in transport.gather(rows)]
