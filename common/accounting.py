"""The mechanism a site applies and the accountants that compose its applications, and the one registry of them
that a site's budget (``privacy: {accountant: ...}``) and a training's DP settings (``dp.accountant``) choose
from: today one mechanism, the subsampled Gaussian (Poisson sampling at rate q, Gaussian noise of standard
deviation sigma x sensitivity, applied ``steps`` times: a DP-SGD training, or q = 1 for a noised evaluation
release), and two accountants, Opacus's RDP (Mironov, "Renyi Differential Privacy", CSF 2017) and PRV (Gopi et
al., "Numerical Composition of Differential Privacy", NeurIPS 2021).

Which accountant composes a site's ledger is the site's choice (its budget's ``accountant``), never the job's: the
number a hospital signs must not depend on what the centre submits.

The contract (tests/test_privacy_accounting.py runs every registered accountant through it, over every registered
mechanism): an accountant has a ``name``, ``epsilon(mechanisms, delta)`` (0 for none, growing with the steps,
shrinking with the noise) and ``noise_multiplier(target_epsilon, delta, sample_rate, steps)`` (the sigma whose
steps spend at most the target). Light on purpose (Opacus is imported when a number is asked for): the settings
and the site YAML check the names without torch. Adding one: docs/privacy.md section 1.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache
from typing import Annotated

from pydantic import AfterValidator


@dataclass(frozen=True)
class SubsampledGaussian:
    """``steps`` applications of the Gaussian mechanism with noise multiplier ``noise_multiplier`` on a Poisson
    sample of the records at rate ``sample_rate``."""

    noise_multiplier: float
    sample_rate: float
    steps: int


@dataclass(frozen=True)
class Accountant:
    """Composes mechanisms into one (epsilon, delta) guarantee; ``name`` is Opacus's ("rdp", "prv")."""

    name: str

    def _opacus(self):
        from opacus.accountants import PRVAccountant, RDPAccountant

        return {"rdp": RDPAccountant, "prv": PRVAccountant}[self.name]()

    def epsilon(self, mechanisms: Iterable[SubsampledGaussian], delta: float) -> float:
        """The epsilon at ``delta`` of ``mechanisms`` composed (0 for none)."""
        history = [(m.noise_multiplier, m.sample_rate, m.steps) for m in mechanisms if m.steps > 0]
        return self._composed(history, delta) if history else 0.0

    def _composed(self, history: list[tuple[float, float, int]], delta: float) -> float:
        acc = self._opacus()
        acc.history = history
        return float(acc.get_epsilon(delta))

    def noise_multiplier(self, target_epsilon: float, delta: float, sample_rate: float, steps: int) -> float:
        """The sigma whose ``steps`` applications at ``sample_rate`` spend ``target_epsilon`` at ``delta``."""
        from opacus.accountants.utils import get_noise_multiplier

        return float(get_noise_multiplier(target_epsilon=target_epsilon, target_delta=delta, sample_rate=sample_rate,
                                          steps=steps, accountant=self.name))


@dataclass(frozen=True)
class _CachedRdp(Accountant):
    """Opacus's RDP accountant, the same sum of the same arrays: RDP composes by adding (Mironov 2017,
    Proposition 1), so ``steps`` applications are ``steps`` times one application's RDP, which is computed once
    per (sigma, q). Each is a series per fractional order, about 0.1 s; a ledger is composed at every admission,
    with the same few mechanisms again and again."""

    def _composed(self, history: list[tuple[float, float, int]], delta: float) -> float:
        from opacus.accountants import RDPAccountant
        from opacus.accountants.analysis.rdp import get_privacy_spent

        rdp = sum([_one_step_rdp(sigma, q) * steps for sigma, q, steps in history])
        return float(get_privacy_spent(orders=RDPAccountant.DEFAULT_ALPHAS, rdp=rdp, delta=delta)[0])


@lru_cache(maxsize=1024)
def _one_step_rdp(noise_multiplier: float, sample_rate: float):
    from opacus.accountants import RDPAccountant
    from opacus.accountants.analysis.rdp import compute_rdp

    rdp = compute_rdp(q=sample_rate, noise_multiplier=noise_multiplier, steps=1, orders=RDPAccountant.DEFAULT_ALPHAS)
    rdp.flags.writeable = False  # shared by every later call
    return rdp


RDP = _CachedRdp("rdp")
PRV = Accountant("prv")
ACCOUNTANTS: dict[str, Accountant] = {}
MECHANISMS: dict[str, type] = {"subsampled-gaussian": SubsampledGaussian}


def register_accountant(accountant: Accountant) -> Accountant:
    if ACCOUNTANTS.get(accountant.name, accountant) != accountant:
        raise ValueError(f"two accountants named {accountant.name!r}")
    ACCOUNTANTS[accountant.name] = accountant
    return accountant


def _registered(name: str) -> str:
    if name not in ACCOUNTANTS:
        raise ValueError(f"no accountant is named {name!r}; registered: {', '.join(ACCOUNTANTS)}")
    return name


# The choice a budget or a DP setting makes: a registered accountant's name, checked when the YAML or the
# settings are read.
AccountantName = Annotated[str, AfterValidator(_registered)]

for _accountant in (RDP, PRV):
    register_accountant(_accountant)
