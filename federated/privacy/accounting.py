"""The mechanism a site applies and the accountant that composes its applications, as objects a newcomer can add
to: today one mechanism, the subsampled Gaussian (Poisson sampling at rate q, Gaussian noise of standard deviation
sigma x sensitivity, applied ``steps`` times: a DP-SGD training, or q = 1 for a noised evaluation release), and two
accountants, Opacus's RDP (Mironov, "Renyi Differential Privacy", CSF 2017) and PRV (Gopi et al., "Numerical
Composition of Differential Privacy", NeurIPS 2021).

Which accountant composes a site's ledger is the site's choice (its budget's ``accountant``), never the job's: the
number a hospital signs must not depend on what the centre submits.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


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
        if not history:
            return 0.0
        acc = self._opacus()
        acc.history = history
        return float(acc.get_epsilon(delta))

    def noise_multiplier(self, target_epsilon: float, delta: float, sample_rate: float, steps: int) -> float:
        """The sigma whose ``steps`` applications at ``sample_rate`` spend ``target_epsilon`` at ``delta``."""
        from opacus.accountants.utils import get_noise_multiplier

        return float(get_noise_multiplier(target_epsilon=target_epsilon, target_delta=delta, sample_rate=sample_rate,
                                          steps=steps, accountant=self.name))


RDP = Accountant("rdp")
PRV = Accountant("prv")
ACCOUNTANTS: dict[str, Accountant] = {a.name: a for a in (RDP, PRV)}
