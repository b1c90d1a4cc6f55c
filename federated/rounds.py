"""A round's bookkeeping: the bytes each site sends and receives (``Traffic``), and the round's record
(federated/schema.py ``RoundRecord``) made from the round's one per-site gather (federated/engine.py).

Bytes are counted as the README's "A round" (item 6) says: what a site hands the transport, before the gather
that carries them to the process writing the record; an evaluation's exchange, whose payload has one size at
every site, is added to every site's after it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from federated.schema import RoundRecord

if TYPE_CHECKING:
    from federated.evaluation import Evaluation


@dataclass(frozen=True)
class Traffic:
    """The bytes each site of this process sent and received, in site order."""

    sent: list[int]
    received: list[int]

    @classmethod
    def none(cls, num_sites: int) -> Traffic:
        return cls([0] * num_sites, [0] * num_sites)

    def __add__(self, other: Traffic) -> Traffic:
        return Traffic([a + b for a, b in zip(self.sent, other.sent)],
                       [a + b for a, b in zip(self.received, other.received)])

    def each_plus(self, both_ways: int) -> Traffic:
        """Every site sent and received ``both_ways`` more bytes (a stage boundary's means)."""
        return Traffic([b + both_ways for b in self.sent], [b + both_ways for b in self.received])


def round_record(round_index: int, iteration: int, lr: float, per_site: torch.Tensor, health: dict, timing: dict,
                 evaluated: Evaluation | None) -> RoundRecord:
    """Round ``round_index``'s record from ``per_site`` (the gathered rows of federated/health.py ``site_row``:
    index, bytes sent, bytes received, mean loss, ...), the health check's and the clock's fields, and the
    evaluation the round ended with, if any."""
    sent, received = per_site[:, 1].tolist(), per_site[:, 2].tolist()
    if evaluated is not None:
        sent = [b + evaluated.bytes_sent[0] for b in sent]
        received = [b + evaluated.bytes_received[0] for b in received]
    record: RoundRecord = {"round": round_index, "iteration": iteration, "bytes_sent": [int(v) for v in sent],
                           "bytes_received": [int(v) for v in received], "train_loss": float(per_site[:, 3].mean()),
                           "lr": lr, **health, **timing}
    if evaluated is not None:
        record["metrics"], record["suppressed"] = evaluated.metrics, evaluated.suppressed
    return record
