"""federated/privacy/meaning.py: the most a membership attack can reach under (epsilon, delta), against closed forms."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.stats import norm

from federated.privacy.meaning import attack_bound, privacy_profile, tpr_ceiling


@pytest.mark.parametrize("eps, delta", [(0.0, 0.0), (1.0, 0.0), (1.0, 1e-5), (3.0, 1e-5), (8.0, 1e-5), (0.5, 0.1)])
def test_one_pair_gives_the_closed_forms(eps, delta):
    bound = attack_bound([(eps, delta)])
    assert bound.advantage == pytest.approx(delta + (1 - delta) * math.tanh(eps / 2), abs=1e-12)
    assert bound.auc == pytest.approx(delta + (1 - delta) * (math.exp(eps) + delta) / (1 + math.exp(eps)), abs=1e-12)


def test_pure_dp_auc_is_the_logistic_function_and_no_privacy_loss_is_a_coin():
    assert attack_bound([(1.0, 0.0)]).auc == pytest.approx(1 / (1 + math.exp(-1.0)), abs=1e-12)
    assert (attack_bound([(0.0, 0.0)]).auc, attack_bound([(0.0, 0.0)]).advantage) == (0.5, 0.0)


def test_the_ceiling_of_one_pair_at_chosen_rates():
    eps, delta = math.log(3.0), 0.01
    x = np.array([0.0, 0.1, 0.2475, 0.5, 0.99, 1.0])
    want = [0.01, 0.31, 0.7525, 1 - (1 - 0.01 - 0.5) / 3, 1.0, 1.0]
    np.testing.assert_allclose(tpr_ceiling(x, [(eps, delta)]), want, atol=1e-12)


def test_a_profile_bounds_below_each_of_its_pairs():
    pairs = [(1.0, 1e-5), (0.6, 1e-2)]
    both = attack_bound(pairs)
    assert both.auc < min(attack_bound([p]).auc for p in pairs)
    assert both.advantage <= min(attack_bound([p]).advantage for p in pairs)


def test_the_gaussian_mechanisms_profile_gives_its_roc_auc():
    """The Gaussian mechanism of sensitivity 1 and noise 1/mu: its exact privacy profile (Balle and Wang, ICML 2018,
    Theorem 8) bounds the attack by its own ROC curve, N(0, 1) against N(mu, 1), whose AUC is Phi(mu / sqrt 2)."""
    mu = 1.0

    def delta_at(eps):
        return norm.cdf(-eps / mu + mu / 2) - math.exp(eps) * norm.cdf(-eps / mu - mu / 2)

    grid = np.linspace(0.0, 6.0, 400)
    bound = attack_bound([(eps, delta_at(eps)) for eps in grid])
    assert norm.cdf(mu / math.sqrt(2)) <= bound.auc <= norm.cdf(mu / math.sqrt(2)) + 2e-3
    assert bound.advantage == pytest.approx(2 * norm.cdf(mu / 2) - 1, abs=2e-3)  # the ROC's largest TPR - FPR


def test_an_accountants_profile_clamps_negative_epsilons_and_refuses_no_guarantee():
    assert privacy_profile(lambda delta: math.log(0.5 / delta), [1e-5, 0.9]) == [(math.log(5e4), 1e-5), (0.0, 0.9)]
    with pytest.raises(ValueError, match="is no privacy guarantee"):
        attack_bound([(1.0, 1.0)])
