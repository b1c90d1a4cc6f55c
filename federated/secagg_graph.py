"""SecAgg+'s masking graph (Bell, Bonawitz, Gascon, Lepoint, Raykova, "Secure Single-Server Aggregation with
(Poly)Logarithmic Overhead", CCS 2020): each site masks with its neighbours on a public random regular graph
instead of with all K - 1 other sites, so its key agreements and keystreams per collective grow with the
degree, O(log K), not with K (docs/algorithms.md section 13).

The graph is a Harary graph H(K, k) on a random ring order of the sites: each site is joined to the k / 2
sites before it and the k / 2 after it on the ring. The ring order is a Fisher-Yates shuffle driven by
SHA-256 of every site's fresh public key of the run (the secure aggregation's salt), so every site derives
the same graph with no extra message, and nobody knows it before the run's keys exist.

What it must guarantee: the pair masks hide a site's contribution from the combiner and the sites colluding
with it as long as the honest sites stay connected through pairs of honest sites (each connected component of
the honest sites reveals its own sum, Bell et al. section 3). On the ring, the honest sites are cut apart only
by two separate runs of at least k / 2 consecutive colluding sites, so with c colluding sites

    P(cut) <= K (K - 1) / 2 * prod_{i < k} (c - i) / (K - i)        (0 when k > c)

over the random ring order (the colluders are fixed before the run's keys are drawn). ``degree`` picks the
smallest even k with that bound under the stated failure probability; where that saves less than half of
the full graph's K - 1 neighbours (small consortia), the full graph is used, which holds against any number
of colluders.
"""

from __future__ import annotations

import hashlib
import math

GRAPH_INFO = b"fedauc secagg+ graph"


def cut_probability(num_sites: int, degree: int, colluding: int) -> float:
    """The bound above on the probability that ``colluding`` sites cut the honest sites of H(K, degree) apart."""
    half = degree // 2
    if 2 * half > colluding or num_sites - colluding < 2:
        return 0.0
    p = 1.0
    for i in range(2 * half):
        p *= (colluding - i) / (num_sites - i)
    return min(1.0, num_sites * (num_sites - 1) / 2 * p)


def degree(num_sites: int, colluding_fraction: float, failure_bits: int) -> int:
    """How many neighbours each site masks with: the smallest even k whose cut probability with
    floor(colluding_fraction * K) colluders is at most 2^-failure_bits; K - 1 (the full graph) where k would
    be at least (K - 1) / 2."""
    full = num_sites - 1
    colluding = math.floor(colluding_fraction * num_sites)
    for k in range(2, full, 2):
        if 2 * k >= full:
            break
        if cut_probability(num_sites, k, colluding) <= 2.0 ** -failure_bits:
            return k
    return full


def _uniform_below(key: bytes, bound: int, counter: list[int]) -> int:
    """A uniform integer in [0, bound) from SHA-256 in counter mode (rejection sampling: no modulo bias)."""
    limit = (1 << 64) - (1 << 64) % bound
    while True:
        block = hashlib.sha256(key + counter[0].to_bytes(8, "big")).digest()
        counter[0] += 1
        value = int.from_bytes(block[:8], "big")
        if value < limit:
            return value % bound


def ring_order(num_sites: int, seed: bytes) -> list[int]:
    """The sites in the graph's ring order: a Fisher-Yates shuffle of 0..K-1 keyed by ``seed``, the same on
    every machine (no library's random generator, whose streams may differ between versions)."""
    key = hashlib.sha256(GRAPH_INFO + seed).digest()
    counter = [0]
    order = list(range(num_sites))
    for i in range(num_sites - 1, 0, -1):
        j = _uniform_below(key, i + 1, counter)
        order[i], order[j] = order[j], order[i]
    return order


def neighbours(site: int, num_sites: int, k: int | None, seed: bytes) -> list[int]:
    """Site ``site``'s neighbours in H(K, k) on the ring order of ``seed``, ascending; every other site when
    ``k`` is None or at least K - 1. Symmetric: j is i's neighbour exactly when i is j's."""
    if k is None or k >= num_sites - 1:
        return [j for j in range(num_sites) if j != site]
    if k < 2 or k % 2:
        raise ValueError(f"SecAgg+ needs an even number of neighbours, at least 2 (got {k})")
    order = ring_order(num_sites, seed)
    at = order.index(site)
    return sorted({order[(at + d) % num_sites] for step in range(1, k // 2 + 1) for d in (step, -step)})
