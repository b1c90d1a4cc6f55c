"""The site's half of a collective: one call to the server's published ``collective`` per mean, gather,
barrier, ring sum or key exchange, carrying exactly the tensors the engine hands over (flattened per dtype
group, as every transport does) and returning the combined result. One serialisation each way per collective.
With secure aggregation the server receives only masked ring elements (``ring_sum``) and signed public keys
(``exchange_public_keys``, federated/flare/site/keys.py)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from federated.backends import SiteFailure, dtype_groups, flatten, unflatten_into
from federated.flare.protocol import Collective
from federated.flare.site.keys import SiteKeys

# (seq, what, site, payload) -> combined result; in a job: the server proxy's ``collective``.
CollectiveCall = Callable[[int, str, int, object], object]


class FlareTransport:
    """Site ``site`` of ``num_sites``, its collectives made through ``call`` (the engine's transport at a
    hospital, federated/transport.py); ``keys`` signs and checks secure aggregation's public keys."""

    def __init__(self, num_sites: int, site: int, call: CollectiveCall, device: torch.device,
                 keys: SiteKeys | None = None):
        self.num_sites = num_sites
        self.site = site
        self.local_sites = [site]
        self.device = device
        self.keys = keys
        self._call = call
        self._seq = 0

    def _collective(self, what: str, payload):
        self._seq += 1
        try:
            return self._call(self._seq, what, self.site, payload)
        except SiteFailure:
            raise
        except Exception as err:  # the transport's own error types (CollabCallError, timeouts)
            raise SiteFailure(f"site {self.site}: {what} failed: {err}") from err

    def mean_(self, per_site: list[list[torch.Tensor]], weights: Sequence[float], robust=None,
              names: Sequence[str] = ()) -> None:
        (tensors,) = per_site
        if not tensors:
            return
        (w,) = weights
        groups = list(dtype_groups(tensors).values())
        flats = [flatten([tensors[i] for i in idx]).cpu() for idx in groups]
        if robust is None:
            means = self._collective(Collective.MEAN, {"weight": float(w), "flats": flats})
        else:  # federated/aggregation.py at the server (rendezvous.COMBINE[Collective.ROBUST_MEAN])
            means = self._collective(Collective.ROBUST_MEAN, {"robust": robust.payload(), "flats": flats})
        for idx, mean in zip(groups, means):
            unflatten_into(mean.to(self.device), [tensors[i] for i in idx])

    def gather(self, per_site: list[torch.Tensor]) -> torch.Tensor:
        (local,) = per_site
        return self._collective(Collective.GATHER, local.cpu()).to(local.device)

    def ring_sum(self, per_site: list[torch.Tensor]) -> torch.Tensor:
        (local,) = per_site
        return self._collective(Collective.RING_SUM, local.cpu())

    def exchange_public_keys(self, own: dict[int, bytes]) -> list[bytes]:
        if self.keys is None:  # never fall back to unchecked keys at a site that may be in a consortium
            raise RuntimeError("secure aggregation over FLARE needs the site's SiteKeys (federated/flare/site/job.py)")
        return self.keys.verified(self._collective(Collective.KEYS, self.keys.signed(self.site, own[self.site])))

    def barrier(self) -> None:
        self._collective(Collective.BARRIER, None)

    def close(self) -> None:
        """Nothing to release: NVIDIA FLARE's client owns the connection."""
