"""The server's half of a collective: wait for every site's contribution, combine them in site order once,
hand every site the result. Pure Python and torch (no NVFlare), so it is tested on its own."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from federated.aggregation import combine_payloads
from federated.backends import SiteFailure, ring_sum, weighted_sum
from federated.flare.protocol import Collective


@dataclass
class _Round:
    contributions: dict[int, Any] = field(default_factory=dict)
    result: Any = None
    done: bool = False
    failure: str | None = None
    collected: int = 0


class Rendezvous:
    """Collective number ``seq`` completes when all ``len(site_names)`` sites contributed to it.

    Every site runs the same engine, so the sites' k-th collectives are the same operation; ``what``
    names it and must agree. A site that has not contributed ``timeout_s`` after the first one did fails
    the collective for every waiting site with a ``SiteFailure`` naming it."""

    def __init__(self, site_names: list[str], timeout_s: float):
        self.site_names = list(site_names)
        self.timeout_s = timeout_s
        self._rounds: dict[int, _Round] = {}
        self._whats: dict[int, str] = {}
        self._cond = threading.Condition()
        self._failure: str | None = None
        self._failed_site: str | None = None

    def contribute(self, seq: int, what: str, site: int, payload: Any, combine: Callable[[list[Any]], Any]) -> Any:
        K = len(self.site_names)
        with self._cond:
            if self._failure is not None:
                raise SiteFailure(self._failure)
            if self._whats.setdefault(seq, what) != what:
                raise SiteFailure(f"collective #{seq}: site {self.site_names[site]!r} runs {what!r}, another "
                                  f"site {self._whats[seq]!r}: the sites run different code or configs")
            entry = self._rounds.setdefault(seq, _Round())
            if site in entry.contributions:
                raise SiteFailure(f"collective #{seq}: site {self.site_names[site]!r} contributed twice")
            entry.contributions[site] = payload
            if len(entry.contributions) == K:
                # The last arrival combines, in site order, whatever order the sites arrived in.
                entry.result = combine([entry.contributions[k] for k in range(K)])
                entry.contributions.clear()
                entry.done = True
                self._cond.notify_all()
            deadline = time.monotonic() + self.timeout_s
            while not entry.done and self._failure is None:
                left = deadline - time.monotonic()
                if left <= 0:
                    missing = [self.site_names[k] for k in range(K) if k not in entry.contributions]
                    self._failure = (f"site(s) {', '.join(missing)} did not reach {what} (collective #{seq}) within "
                                     f"{self.timeout_s:g} s: crashed, disconnected or too slow; the job stops")
                    self._failed_site = missing[0] if len(missing) == 1 else None
                    self._cond.notify_all()
                    break
                self._cond.wait(left)
            if not entry.done:
                raise SiteFailure(self._failure)
            entry.collected += 1
            if entry.collected == K:
                del self._rounds[seq]
                del self._whats[seq]
            return entry.result

    @property
    def failure(self) -> str | None:
        """Why the collectives stopped (the site that failed or never came), once they have."""
        with self._cond:
            return self._failure

    @property
    def failed_site(self) -> str | None:
        """The one site the failure names, where it names one."""
        with self._cond:
            return self._failed_site

    def fail(self, message: str, site: str | None = None) -> None:
        """Stop every waiting and future collective with ``message`` (a site's training failed: ``site``)."""
        with self._cond:
            if self._failure is None:
                self._failure, self._failed_site = message, site
            self._cond.notify_all()


def _mean(payloads: list[dict]) -> list[torch.Tensor]:
    weights = [p["weight"] for p in payloads]
    return [weighted_sum([p["flats"][g] for p in payloads], weights) for g in range(len(payloads[0]["flats"]))]


# How the server combines each kind of collective (FlareTransport's payloads), in site order; INPUTS: every
# site's model input (shape, classes) once before training, at INPUTS_SEQ (FlareTransport numbers from 1).
# Secure aggregation: KEYS hands every site's signed public key to every site (each checks them all),
# RING_SUM adds the masked int64 vectors modulo 2^64, the one sum the server can decode.
# RESUME: every site's committed checkpoint rounds, before the model inputs (federated/flare/site/resume.py).
COMBINE: dict[str, Callable[[list[Any]], Any]] = {
    Collective.MEAN: _mean,
    Collective.ROBUST_MEAN: combine_payloads,  # --aggregation median | trimmed-mean (federated/aggregation.py)
    Collective.GATHER: lambda payloads: torch.cat(payloads, dim=0),
    Collective.BARRIER: lambda payloads: None,
    Collective.INPUTS: lambda payloads: payloads,
    Collective.KEYS: lambda payloads: payloads,
    Collective.RING_SUM: ring_sum,
    Collective.RESUME: lambda payloads: payloads,
}
