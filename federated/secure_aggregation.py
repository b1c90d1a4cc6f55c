"""Pairwise-masked secure aggregation (Bonawitz et al., "Practical Secure Aggregation for Privacy-Preserving
Machine Learning", CCS 2017, without its dropout recovery): whoever combines the sites' contributions (the
NVIDIA FLARE server, or every rank of an all-gather) receives from each site a vector that is uniform over
the ring Z_(2^64) whatever the site's values, and can decode only the sum over all sites.

``TrainConfig.secure_aggregation`` wraps the run's transport in :class:`SecureTransport`, so every ``mean_``
(the declared MEAN and SUM tensors, the global model, the label counts and the evaluation's summed
histograms) goes through it, on every transport alike (docs/algorithms.md section 13):

1. Key agreement, once per run: every site draws a fresh X25519 key pair; the public keys go to every
   site through the transport (over FLARE signed with the site's consortium key and checked against the
   consortium's root CA: federated/flare/site/keys.py); each pair (i, j) derives the X25519 shared secret.
2. Fixed point: site k sends v_k = round(2^F * w_k * x_k) as an int64, w_k its aggregation weight (1 for
   a SUM). A value with |v_k| >= 2^(63 - ceil(log2 K)) stops the run with a :class:`SecureAggregationError`
   naming the site, round and tensor, so the sum of K contributions cannot leave int64.
3. Masks: for collective number ``seq`` the pair's seed is HKDF-SHA256(shared secret, salt = every public
   key, info = i, j, seq), expanded by ChaCha20 into one uint64 per value; site i adds the mask of every
   pair (i, j > i) and subtracts that of every pair (j < i, i) modulo 2^64. The masks cancel in the sum.
   The pairs: every two sites, or with SecAgg+ the edges of a public random graph of degree O(log K)
   (``TrainConfig.secure_neighbours``, federated/secagg_graph.py).
4. The combiner adds the K vectors modulo 2^64 (``federated.backends.ring_sum``, every transport's one integer
   reduction: an integer sum has no order, so every transport gets the same bits); each site decodes sum / 2^F.

Rounding: |decoded - sum_k w_k x_k| <= K * 2^-(F+1) + 2^-53 * sum_k |w_k x_k| before the cast to the
tensor's dtype (docs/algorithms.md section 13 states the bound and what it means for a float32 model).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from common.errors import FedaucError
from federated.backends import unflatten_into
from federated.secagg_graph import neighbours

FRACTION_BITS = 32  # F: the fixed-point resolution is 2^-32 (float32 near 1 resolves 2^-24)
RING_BYTES = 8  # one int64 per value on the wire, whatever the tensor's dtype
PUBLIC_KEY_BYTES = 32


class SecureAggregationError(FedaucError, RuntimeError):
    """A value secure aggregation cannot carry (outside the fixed-point range, or not finite), or a key
    exchange that went wrong."""


def value_limit(num_sites: int) -> float:
    """What |w_k x_k| must stay below at every site: 2^(63 - F - ceil(log2 K)), so that K contributions sum
    inside int64."""
    return 2.0 ** (63 - FRACTION_BITS - math.ceil(math.log2(max(num_sites, 1))))


def rounding_bound(num_sites: int, magnitudes: torch.Tensor | float = 0.0) -> torch.Tensor | float:
    """The bound on |decoded - sum_k w_k x_k| per value, given sum_k |w_k x_k| (``magnitudes``)."""
    return num_sites * 2.0 ** -(FRACTION_BITS + 1) + magnitudes * 2.0 ** -53


def new_key() -> tuple[X25519PrivateKey, bytes]:
    """A fresh X25519 key pair and its raw 32-byte public key."""
    private = X25519PrivateKey.generate()
    return private, private.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


class PairMasks:
    """Site ``site``'s masks: its shared secrets with its neighbours, from its private key and everyone's
    public key (in site order). ``degree``: SecAgg+'s neighbour count (federated/secagg_graph.py), on the
    graph every site derives from the public keys; None: every other site (the full graph). The masks
    cancel in the sum on any symmetric graph, so the decoded sum does not depend on it."""

    def __init__(self, site: int, private: X25519PrivateKey, public_keys: Sequence[bytes], degree: int | None = None):
        if len(set(public_keys)) != len(public_keys):
            raise SecureAggregationError("two sites presented the same public key for secure aggregation: "
                                         "the key exchange was tampered with; the job stops")
        self.site = site
        self.salt = b"".join(public_keys)
        self.secrets = {j: private.exchange(X25519PublicKey.from_public_bytes(public_keys[j]))
                        for j in neighbours(site, len(public_keys), degree, self.salt)}

    def stream(self, other: int, seq: int, count: int) -> np.ndarray:
        """The pair (site, other)'s mask for collective ``seq``: ``count`` uniform uint64 values."""
        i, j = sorted((self.site, other))
        seed = HKDF(algorithm=hashes.SHA256(), length=32, salt=self.salt,
                    info=f"fedauc secure aggregation pair {i} {j} collective {seq}".encode()
                    ).derive(self.secrets[other])
        keystream = Cipher(algorithms.ChaCha20(seed, bytes(16)), mode=None).encryptor()
        return np.frombuffer(keystream.update(bytes(RING_BYTES * count)), dtype=np.uint64)

    def mask(self, encoded: torch.Tensor, seq: int) -> torch.Tensor:
        """``encoded`` (int64) plus the masks of this site's pairs, modulo 2^64."""
        out = encoded.numpy().view(np.uint64).copy()
        for other in self.secrets:
            if other > self.site:
                out += self.stream(other, seq, out.size)
            else:
                out -= self.stream(other, seq, out.size)
        return torch.from_numpy(out.view(np.int64))


class SecureTransport:
    """``inner`` (any transport, federated/transport.py) with every ``mean_`` made a masked fixed-point sum;
    gathers, barriers and the key exchange are ``inner``'s.

    ``site_names``: the names of this process's sites (errors name them). ``round`` is set by the engine
    at each round so that an error says where it happened. The public keys are exchanged once, through
    ``inner.exchange_public_keys`` (signed and checked over NVIDIA FLARE)."""

    def __init__(self, inner, site_names: Sequence[str], degree: int | None = None):
        self.inner = inner
        self.num_sites = inner.num_sites
        self.local_sites = inner.local_sites
        self.device = inner.device
        self.site_names = dict(zip(inner.local_sites, site_names))
        self.round: int | None = None
        self._seq = 0
        keys = {k: new_key() for k in inner.local_sites}
        public_keys = inner.exchange_public_keys({k: public for k, (_, public) in keys.items()})
        self.masks = {k: PairMasks(k, private, public_keys, degree) for k, (private, _) in keys.items()}

    def gather(self, per_site: list[torch.Tensor]) -> torch.Tensor:
        return self.inner.gather(per_site)

    def ring_sum(self, per_site: list[torch.Tensor]) -> torch.Tensor:
        return self.inner.ring_sum(per_site)

    def exchange_public_keys(self, own: dict[int, bytes]) -> list[bytes]:
        return self.inner.exchange_public_keys(own)

    def barrier(self) -> None:
        self.inner.barrier()

    def close(self) -> None:
        self.inner.close()

    def _where(self, site: int, names: Sequence[str], sizes: list[int], position: int) -> str:
        ends = np.cumsum(sizes)
        at = int(np.searchsorted(ends, position, side="right"))
        tensor = repr(names[at]) if at < len(names) else f"#{at}"
        when = "before the first round" if self.round is None else f"round {self.round}"
        return (f"site {self.site_names[site]!r} (index {site}), {when}, tensor {tensor} "
                f"element {position - int(ends[at] - sizes[at])}")

    def encode(self, site: int, tensors: Sequence[torch.Tensor], weight: float, names: Sequence[str] = ()
               ) -> torch.Tensor:
        """Site ``site``'s fixed-point contribution round(2^F * weight * x) as int64, checked against the range."""
        sizes = [t.numel() for t in tensors]
        flat = torch.cat([t.detach().reshape(-1).to("cpu", torch.float64) for t in tensors])
        scaled = torch.round(flat * (weight * 2.0 ** FRACTION_BITS))
        limit = value_limit(self.inner.num_sites)
        bad = ~(scaled.abs() < limit * 2.0 ** FRACTION_BITS)  # NaN fails the comparison too
        if bool(bad.any()):
            at = int(bad.nonzero()[0, 0])
            value = float(flat[at])
            what = "is not finite" if not math.isfinite(value) else (
                f"= {value:.4g} (times weight {weight:.4g}) exceeds the fixed-point range +-{limit:.4g} "
                f"(2^(63 - {FRACTION_BITS} - ceil(log2 K)), K = {self.inner.num_sites}): the sum could overflow "
                "the int64 ring")
            raise SecureAggregationError(
                f"secure aggregation: {self._where(site, names, sizes, at)} {what}; the job stops",
                fix="the training diverged: lower lr (or check the site's data)")
        return scaled.to(torch.int64)

    def mean_(self, per_site: list[list[torch.Tensor]], weights: Sequence[float], robust=None,
              names: Sequence[str] = ()) -> None:
        """Replace every site's tensors by sum_k weights[k] * tensors_k, computed as a masked ring sum."""
        if robust is not None:  # TrainConfig refuses the combination: a robust rule needs every site's values
            raise ValueError("secure aggregation decodes sums only: no robust aggregation rule over its values")
        if not per_site or not per_site[0]:
            return
        self._seq += 1
        masked = [self.masks[k].mask(self.encode(k, tensors, w, names), self._seq)
                  for k, tensors, w in zip(self.inner.local_sites, per_site, weights)]
        total = self.inner.ring_sum(masked).to(torch.float64) / 2.0 ** FRACTION_BITS
        for tensors in per_site:
            unflatten_into(total.to(tensors[0].device), tensors)

