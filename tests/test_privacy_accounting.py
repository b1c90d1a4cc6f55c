"""Every registered accountant keeps the contract (common/accounting.py) over every registered mechanism,
and the registry is what a site's budget and a training's DP settings choose from."""

from __future__ import annotations

import numpy as np
import pytest
import yaml

from common.accounting import ACCOUNTANTS, MECHANISMS, SubsampledGaussian
from common.privacy_budget import PrivacyBudget
from federated.privacy.policy import DPConfig
from preprocessing.sites import SiteConfigError, load_site

DELTA = 1e-5


@pytest.mark.parametrize("name", list(ACCOUNTANTS))
@pytest.mark.parametrize("mechanism", list(MECHANISMS.values()))
def test_every_registered_accountant_keeps_the_contract(name, mechanism):
    accountant = ACCOUNTANTS[name]
    assert accountant.name == name
    assert accountant.epsilon([], DELTA) == 0.0 and accountant.epsilon([mechanism(1.0, 0.01, 0)], DELTA) == 0.0
    spent = accountant.epsilon([mechanism(1.0, 0.01, 100)], DELTA)
    assert 0 < spent < accountant.epsilon([mechanism(1.0, 0.01, 400)], DELTA)  # more steps spend more
    assert accountant.epsilon([mechanism(2.0, 0.01, 100)], DELTA) < spent  # more noise spends less
    # Two applications composed spend as one of their summed steps.
    assert accountant.epsilon([mechanism(1.0, 0.01, 50)] * 2, DELTA) == pytest.approx(spent, rel=1e-3)
    sigma = accountant.noise_multiplier(2.0, DELTA, 0.01, 100)
    assert 1.9 < accountant.epsilon([mechanism(sigma, 0.01, 100)], DELTA) <= 2.0 + 1e-6  # the target, not over it


def test_rdp_composes_a_ledger_as_opacus_accountant_does():
    """The RDP accountant computes one step's RDP once per (sigma, q) and scales it: every ledger's epsilon is
    still the one Opacus's own accountant gives for the same history."""
    from opacus.accountants import RDPAccountant

    rng = np.random.default_rng(7)
    for _ in range(12):
        history = [(float(rng.choice([0.6, 1.0, 2.5])), float(rng.choice([0.01, 0.242, 1.0])), int(rng.integers(1, 300)))
                   for _ in range(int(rng.integers(1, 5)))]
        opacus = RDPAccountant()
        opacus.history = list(history)
        composed = ACCOUNTANTS["rdp"].epsilon([SubsampledGaussian(*entry) for entry in history], DELTA)
        assert composed == pytest.approx(float(opacus.get_epsilon(DELTA)), rel=1e-12), history


@pytest.mark.parametrize("name", list(ACCOUNTANTS))
def test_the_registry_makes_the_configs_choices(name, tmp_path):
    assert PrivacyBudget(epsilon=1, delta=DELTA, accountant=name).accountant == name
    assert DPConfig(noise_multiplier=1.0, accountant=name).accountant == name
    site = tmp_path / "site.yaml"
    site.write_text(yaml.safe_dump({"name": "a", "task": "chest-xray",
                                    "privacy": {"epsilon": 1, "delta": DELTA, "accountant": "gdp"}}))
    with pytest.raises(SiteConfigError, match=r"privacy\.accountant: no accountant is named 'gdp'; registered: "
                                              + ", ".join(ACCOUNTANTS)):
        load_site(site)
    with pytest.raises(ValueError, match="no accountant is named 'gdp'"):
        DPConfig(noise_multiplier=1.0, accountant="gdp")


def test_an_accountant_once_registered_is_a_choice_of_both_configs():
    """Opacus's GDP accountant, named only: the choice follows the registry, not a list beside it."""
    from common.accounting import Accountant, register_accountant

    register_accountant(Accountant("gdp"))
    try:
        assert PrivacyBudget(epsilon=1, delta=DELTA, accountant="gdp").accountant == "gdp"
        assert DPConfig(target_epsilon=1.0, accountant="gdp").accountant == "gdp"

        class Tighter(Accountant):
            pass

        with pytest.raises(ValueError, match="two accountants named 'rdp'"):
            register_accountant(Tighter("rdp"))
    finally:
        del ACCOUNTANTS["gdp"]
