"""FeDXL's score pools (Guo et al., ICML 2023; docs/algorithms.md section 7): the component FeDXL1 and FeDXL2 use for
their passive scores.

A pool entry is a prediction score of one class (``pos`` or ``neg``) for one disease, with optional extra
fields (FeDXL2: the positive's u). Per round a site

1. records the scores of its local steps in a round buffer (``record``),
2. sends a payload of exactly ``size`` = P entries per class and disease (``payload``): P rows drawn
   uniformly **with replacement** from the round's recorded rows of that class (independently per
   disease, so a row does not link two diseases of one image),
3. receives the K gathered payloads; they replace the oldest of ``tau`` pool slots (``receive``),
4. draws ``draws`` passive entries per class and disease uniformly with replacement from the pool slots
   in its local steps (``draw``).

Why with replacement and exactly P: the payload's size and its content (no padding) are the same
whatever the site's positive count, so the count cannot be read from it. The estimator stays the
paper's: there every site samples B1 positives and B2 negatives per step, so each site adds the same
number of scores per round to the merged pool and a passive draw is uniform over sites and, within a
site, uniform over its round's scores; a draw with replacement of P rows per site and round is an
unbiased sample of exactly that mixture. What remains readable: the number of *distinct* values of a
column is at most the number of rows it was drawn from (a lower bound on the site's count in that round,
informative only when the count is below P).

A round without any recorded row of a class for a disease (no positive of that disease in the round's
batches) resends the site's previous payload column for it (stale, but the site's own scores). A site
whose whole training split has no row of a class for a disease sends that column as NaN, every round:
the only thing the payload says about counts is this site-level "the disease has no positive (negative)
here", which the federation's aggregate label counts already imply.
"""

from __future__ import annotations

import torch

from federated.algorithms.base import FederationContext, Site
from federated.data import Batch
from federated.state import Comm

KINDS = {"pos": 1.0, "neg": 0.0}


class ScorePool:
    """Pools of ``fields`` per class (``{"pos": ("pos_score", ...), "neg": ("neg_score",)}``; the first
    field of a class is its score) with payload size ``size`` (P), ``tau`` rounds kept, ``draws`` passive
    entries per class and disease per step. State tensors (declared by ``state_spec``):
    ``pool.<field>`` (P, C) GATHER: the payload, then the K * P gathered rows;
    ``passive.<field>`` (tau * K * P, C): the pool slots; ``last.<field>`` (P, C): the previous payload;
    ``buffer.<field>`` and ``buffer.label`` (I * B, C): the round's recorded scores and labels."""

    def __init__(self, fields: dict[str, tuple[str, ...]], size: int, tau: int, draws: int,
                 fed: FederationContext):
        self.fields, self.size, self.tau, self.draws, self.fed = fields, size, tau, draws, fed

    def names(self) -> list[str]:
        return [f for fields in self.fields.values() for f in fields]

    def state_spec(self) -> dict[str, Comm]:
        spec = {"buffer.label": Comm.LOCAL}
        for f in self.names():
            spec |= {f"pool.{f}": Comm.GATHER, f"passive.{f}": Comm.LOCAL, f"last.{f}": Comm.LOCAL,
                     f"buffer.{f}": Comm.LOCAL}
        return spec

    def init_state(self, site: Site, capacity: int, first_payload: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Empty pools and a round buffer of ``capacity`` rows; ``first_payload`` ({field: (P, C)}) is sent
        before round 0 (the initial scoring pass)."""
        C, dev = self.fed.num_classes, self.fed.device
        rows = self.tau * self.fed.num_sites * self.size
        state = {"buffer.label": torch.full((capacity, C), float("nan"), device=dev)}
        for f in self.names():
            state[f"passive.{f}"] = torch.full((rows, C), float("nan"), device=dev)
            state[f"buffer.{f}"] = torch.zeros(capacity, C, device=dev)
            state[f"pool.{f}"] = first_payload[f]
            state[f"last.{f}"] = first_payload[f].clone()
        return state

    def sample(self, candidates: torch.Tensor) -> torch.Tensor | None:
        """P indices drawn uniformly with replacement from ``candidates`` (site RNG); None if it is empty."""
        if len(candidates) == 0:
            return None
        return candidates[torch.randint(len(candidates), (self.size,)).to(candidates.device)]

    # --- a round ------------------------------------------------------------------------------
    def record(self, site: Site, batch: Batch, values: dict[str, torch.Tensor]) -> None:
        """Append one step's (B, C) field values and the batch's labels (NaN = unknown) to the round
        buffer: rows of the round's step j are j * B ... j * B + B - 1."""
        B = len(batch.y)
        start = (site.iteration % self.fed.local_steps) * site.loader.batch_size
        label = torch.where(batch.mask > 0, batch.y, torch.full_like(batch.y, float("nan")))
        site.state["buffer.label"][start : start + B] = label
        for f, v in values.items():
            site.state[f"buffer.{f}"][start : start + B] = v

    def payload(self, site: Site, sendable: dict[str, torch.Tensor] | None = None) -> None:
        """Fill ``pool.*`` with this round's P entries per class and disease and clear the buffer.
        ``sendable[kind]`` (rows, C) bool excludes buffer rows (FeDXL2: positives without a u)."""
        label = site.state["buffer.label"]
        out = {f: site.state[f"last.{f}"].clone() for f in self.names()}  # kept where a class has no row
        for c in range(self.fed.num_classes):
            for kind, value in KINDS.items():
                ok = label[:, c] == value
                if sendable and kind in sendable:
                    ok &= sendable[kind][:, c]
                rows = self.sample(torch.nonzero(ok).flatten())
                if rows is not None:
                    for f in self.fields[kind]:
                        out[f][:, c] = site.state[f"buffer.{f}"][rows, c]
        for f, t in out.items():
            site.state[f"pool.{f}"] = t
            site.state[f"last.{f}"].copy_(t)
        label.fill_(float("nan"))

    def receive(self, site: Site) -> None:
        """The gathered payloads (K * P rows) replace the oldest of the tau pool slots."""
        rows = self.fed.num_sites * self.size
        slot = (site.iteration // self.fed.local_steps) % self.tau
        for f in self.names():
            gathered = site.state[f"pool.{f}"]
            if gathered.shape[0] != rows:
                raise RuntimeError(f"gathered pool.{f} has {gathered.shape[0]} rows, expected K * P = {rows}")
            site.state[f"passive.{f}"][slot * rows : (slot + 1) * rows] = gathered

    def draw(self, site: Site, kind: str) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        """``draws`` entries per disease drawn uniformly with replacement from the pool of ``kind``:
        fields (draws, C) with invalid entries set to 0, and the (draws, C) bool validity (False where a
        disease's pool is empty)."""
        fields = self.fields[kind]
        valid = ~torch.isnan(site.state[f"passive.{fields[0]}"])  # (M, C)
        weights = valid.T.float()
        # An empty column draws anything; its validity stays False. (torch.where: a boolean index is a host sync.)
        weights = torch.where(weights.sum(1, keepdim=True) == 0, 1.0, weights)
        idx = torch.multinomial(weights, self.draws, replacement=True)  # (C, draws)
        drawn_valid = valid.T.gather(1, idx).T
        drawn = {f: torch.nan_to_num(site.state[f"passive.{f}"].T.gather(1, idx).T) for f in fields}
        return drawn, drawn_valid
