"""Robust aggregation of a round's MEAN tensors: the coordinate-wise median or trimmed mean over sites
(docs/algorithms.md section 14).

Yin, Chen, Ramchandran and Bartlett, "Byzantine-Robust Distributed Learning: Towards Optimal Statistical
Rates", ICML 2018: every coordinate of the aggregate is the median of the K sites' values of that
coordinate (``median``), or the mean of what is left after dropping the ``b`` largest and ``b`` smallest
(``trimmed-mean``, b = max(1, floor(trim_fraction * K)), so K must exceed 2b). Either stays within the range
of the honest sites' values at every coordinate as long as fewer than half (median) or than b (trimmed
mean) of the sites are broken, whatever the broken sites send; the plain mean moves with any one site.

When it helps: a site that sends garbage (a broken export, a wrong label mapping, a bug at one hospital) is
outvoted instead of averaged in. What it costs: every site's values must reach the combiner (no secure
aggregation, which shows it sums only; refused together), a sort over K values per coordinate (memory K
times the model at the combiner), and the aggregation weights are ignored: on honest non-IID sites the
median is a noisier, biased estimate of the mean (the median of K site updates is not their average), so
convergence is slower than FedAvg's there. Stage statistics, the federation's counts and the evaluation's
histograms stay exact sums and means.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from common.errors import ConfigError
from federated.settings import RULES


@dataclass(frozen=True)
class Robust:
    """A robust rule for a round's MEAN tensors (``rule`` of ``RULES`` other than ``mean``)."""

    rule: str
    trim_fraction: float = 0.2

    def trimmed(self, num_sites: int) -> int:
        """How many sites' values are dropped at each end of every coordinate (trimmed mean)."""
        return max(1, int(self.trim_fraction * num_sites))

    def check(self, num_sites: int) -> None:
        if self.rule == "trimmed-mean" and num_sites <= 2 * self.trimmed(num_sites):
            raise ConfigError(f"--aggregation trimmed-mean drops {self.trimmed(num_sites)} site(s) at each end of "
                              f"every coordinate, which leaves none of {num_sites} sites",
                              fix="use --aggregation median, or a federation of at least 3 sites")

    def __call__(self, flats: Sequence[torch.Tensor], weights: Sequence[float]) -> torch.Tensor:
        """The rule over every site's flat tensor (weights are not used: every site counts once)."""
        ordered = torch.stack(list(flats)).sort(dim=0).values
        K = ordered.shape[0]
        if self.rule == "median":
            # Even K: the mean of the two middle values (torch.median would take the lower one, a bias).
            return ordered[K // 2] if K % 2 else 0.5 * (ordered[K // 2 - 1] + ordered[K // 2])
        b = self.trimmed(K)
        return ordered[b:K - b].mean(dim=0)

    def payload(self) -> dict:
        """What a transport carries to its combiner (NVIDIA FLARE's server: ``from_payload``)."""
        return {"rule": self.rule, "trim_fraction": self.trim_fraction}


def from_payload(payload: dict | None) -> Robust | None:
    return None if payload is None else Robust(payload["rule"], float(payload["trim_fraction"]))


def robust_rule(rule: str, trim_fraction: float, num_sites: int) -> Robust | None:
    """The config's rule for ``num_sites`` sites, checked: None for the plain (weighted) mean."""
    if rule not in RULES:
        raise ConfigError(f"aggregation {rule!r} is not one of {', '.join(RULES)}", fix="--aggregation median")
    if rule == "mean":
        return None
    robust = Robust(rule, trim_fraction)
    robust.check(num_sites)
    return robust



def combine_payloads(payloads: list[dict]) -> list[torch.Tensor]:
    """NVIDIA FLARE's server: every site's flat tensors (``FlareTransport`` payloads, in site order) under the rule
    the sites sent (the same at every site: one job config)."""
    robust = from_payload(payloads[0]["robust"])
    return [robust([p["flats"][g] for p in payloads], []) for g in range(len(payloads[0]["flats"]))]
