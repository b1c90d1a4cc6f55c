"""A site's declared privacy budget (``privacy:`` in its YAML, preprocessing/sites.py). Its own light module
(pydantic only): the training's settings (federated/settings.py) check a DP training against it without loading
the dataset adapters (pandas, pydicom) that reading a site's YAML needs."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from common.accounting import AccountantName


class PrivacyBudget(BaseModel):
    """``privacy: {epsilon, delta}``: what every training on this site's records together may spend (the site's
    ledger, in its state directory, composes them; federated/privacy/ledger.py)."""

    model_config = ConfigDict(extra="forbid")
    epsilon: float = Field(gt=0)
    delta: float = Field(gt=0, lt=1)
    # How the site composes its releases into its spend (common/accounting.py): the site's choice, not
    # a job's. RDP (Mironov 2017) or PRV (Gopi et al. 2021), both Opacus's.
    accountant: AccountantName = "rdp"
