"""What a training's differential privacy is (``DPConfig``), what a hospital allows (``SiteBudget``) and how a
site refuses (``PrivacyRefused``, in one line; docs/privacy.md). What DP refuses of a job, which asks the
algorithms, is ``federated.dp.refusals``, above them.

The unit of privacy is one record of a site's training split (one image with its labels; splits are by patient,
so a patient's images are in one split). The guarantee is (epsilon, delta) record-level DP of everything the
site releases in a training, by the Gaussian mechanism on Poisson-subsampled per-sample-clipped gradients
(Abadi et al., "Deep Learning with Differential Privacy", CCS 2016; for the min-max AUC losses DP-SGDA, Yang et
al., "Differentially Private SGDA for Minimax Problems", UAI 2022), composed by Opacus's accountant.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from common.accounting import AccountantName
from common.errors import ConfigError
from common.privacy_budget import PrivacyBudget


class PrivacyRefused(ConfigError):
    """A site (or the job) refuses a training under its privacy budget or under DP; the message is one line."""


def refuse_release(site: str, budget: PrivacyBudget | None, what: str) -> None:
    """A site with a budget releases nothing that no accountant counts: refuse ``what`` in one line."""
    if budget is not None:
        raise PrivacyRefused(f"site {site!r} refuses {what}: it has a privacy budget (epsilon {budget.epsilon:g}, "
                             f"delta {budget.delta:g}) and {what} is released without differential privacy")


# The site YAML's ``privacy:`` block, as the ledger keeps it.
SiteBudget = PrivacyBudget


class DPConfig(BaseModel):
    """A training's DP settings (``fedauc train --dp``). Either ``noise_multiplier`` (sigma: the noise's standard
    deviation is sigma x max_grad_norm) or ``target_epsilon`` (each site derives its own sigma from its sampling
    rate and delta, so that the training's steps spend that epsilon there; noised evaluations add to it)."""

    model_config = ConfigDict(extra="forbid")
    noise_multiplier: float | None = Field(default=None, gt=0)
    target_epsilon: float | None = Field(default=None, gt=0)
    max_grad_norm: float = Field(default=1.0, gt=0)  # C: the L2 bound of one record's gradient
    # delta where a site has no budget (a site with one uses its own)
    delta: float = Field(default=1e-5, gt=0, lt=1)
    # at sites without a budget (a site with one composes with its own, common/accounting.py)
    accountant: AccountantName = "rdp"
    # The class prior p of the AUC losses comes from every site's label counts (per disease: positives, known
    # labels; records), which leave before the training as without DP: a DP job declares them public (published
    # prevalences), and they are not counted in the ledger (docs/privacy.md section 2).
    prior: Literal["public"] = "public"
    # The evaluations during training: None, none (the sites release no evaluation); a number sigma_e, each site
    # releases its valid and test score histograms with N(0, (sigma_e sqrt(C))^2) on every bin (one record moves
    # one bin per disease by 1) and no per-site metric; each evaluation is charged to its ledger.
    eval_noise_multiplier: float | None = Field(default=None, gt=0)

    @model_validator(mode="after")
    def _one_noise(self) -> DPConfig:
        if (self.noise_multiplier is None) == (self.target_epsilon is None):
            raise ValueError("DP needs exactly one of noise_multiplier (--noise-multiplier) and target_epsilon "
                             "(--target-epsilon)")
        return self
