"""What a job's (epsilon, delta) allows a membership attack at most (docs/privacy.md section 1).

Telling whether one record was in a site's training, from everything the site released, is a test between two
neighbouring datasets. An (epsilon, delta)-DP release bounds every such test: at false positive rate x its true
positive rate is at most ``min(1, delta + e^eps x, 1 - e^-eps (1 - delta - x))`` (Kairouz, Oh and Viswanath, "The
Composition Theorem for Differential Privacy", ICML 2015, Theorem 2.1; Dong, Roth and Su, "Gaussian Differential
Privacy", JRSS-B 2022, section 2). A release that is DP at several pairs (its accountant's privacy profile,
epsilon as a function of delta) is bounded by each, so by their minimum: a lower, truer ceiling than one pair's.

The ceiling bounds the attack's ROC curve, so its area bounds the attack's AUC, and its largest height above the
diagonal bounds the attack's advantage TPR - FPR (Yeom et al., "Privacy Risk in Machine Learning", CSF 2018).
For one pair both have closed forms: advantage ``delta + (1 - delta) tanh(eps / 2)``, AUC
``delta + (1 - delta) (e^eps + delta) / (1 + e^eps)`` (at delta 0: the logistic function of epsilon).
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import combinations

import numpy as np

Profile = Sequence[tuple[float, float]]  # (epsilon, delta) pairs at which one release is DP


@dataclass(frozen=True)
class AttackBound:
    advantage: float  # the largest TPR - FPR of any membership test
    auc: float  # the largest AUC of any membership attack


def _lines(profile: Profile) -> list[tuple[float, float]]:
    """The ceiling's lines (intercept, slope): TPR <= 1 and each pair's two inequalities."""
    lines = [(1.0, 0.0)]
    for eps, delta in profile:
        if eps < 0 or not 0 <= delta < 1:
            raise ValueError(f"(epsilon {eps}, delta {delta}) is no privacy guarantee: epsilon >= 0, 0 <= delta < 1")
        lines += [(delta, math.exp(eps)), (1.0 - math.exp(-eps) * (1.0 - delta), math.exp(-eps))]
    return lines


def tpr_ceiling(fpr: np.ndarray | float, profile: Profile) -> np.ndarray:
    """The largest true positive rate any membership test of the release reaches at false positive rate ``fpr``."""
    x = np.asarray(fpr, dtype=np.float64)
    return np.min([a + b * x for a, b in _lines(profile)], axis=0)


def attack_bound(profile: Profile) -> AttackBound:
    """The largest advantage and AUC any membership attack on the release reaches. The ceiling is the lower envelope
    of straight lines, so it is linear between their crossings: evaluated at every crossing in [0, 1] (and at 0 and
    1) its area by the trapezoid rule and its largest height above the diagonal are exact."""
    lines = _lines(profile)
    xs = {0.0, 1.0}
    for (a1, b1), (a2, b2) in combinations(lines, 2):
        if b1 != b2 and 0.0 < (x := (a2 - a1) / (b1 - b2)) < 1.0:
            xs.add(x)
    x = np.array(sorted(xs))
    y = tpr_ceiling(x, profile)
    return AttackBound(float(np.max(y - x)), float(np.sum((y[1:] + y[:-1]) * np.diff(x)) / 2))


def privacy_profile(epsilon_at: Callable[[float], float], deltas: Sequence[float]) -> list[tuple[float, float]]:
    """The pairs (epsilon_at(delta), delta): an accountant's epsilon at each delta, every one a valid guarantee. At a
    large delta an RDP conversion can return an epsilon below 0, where the guarantee it proves holds at 0 too."""
    return [(max(epsilon_at(delta), 0.0), delta) for delta in deltas]


def main(argv: list[str] | None = None) -> None:
    """The table of docs/privacy.md section 1: per epsilon, the bounds of the single pair (epsilon, delta), and of
    the privacy profile (RDP, Opacus) of the DP-SGD training that spends that epsilon at the given rate and steps."""
    from opacus.accountants import RDPAccountant
    from opacus.accountants.utils import get_noise_multiplier

    parser = argparse.ArgumentParser(prog="python -m federated.privacy.meaning", description=main.__doc__)
    parser.add_argument("--epsilon", type=float, nargs="+", default=[1.0, 3.0, 8.0])
    parser.add_argument("--delta", type=float, default=1e-5)
    parser.add_argument("--sample-rate", type=float, default=0.24)
    parser.add_argument("--steps", type=int, default=240)
    args = parser.parse_args(argv)
    print("| epsilon | advantage (pair) | AUC (pair) | sigma | advantage (profile) | AUC (profile) |")
    print("|---:|---:|---:|---:|---:|---:|")
    for eps in args.epsilon:
        pair = attack_bound([(eps, args.delta)])
        sigma = get_noise_multiplier(target_epsilon=eps, target_delta=args.delta, sample_rate=args.sample_rate,
                                     steps=args.steps, accountant="rdp")
        accountant = RDPAccountant()
        accountant.history = [(sigma, args.sample_rate, args.steps)]
        deltas = [args.delta, *np.logspace(-9, -0.31, 60)]
        profile = attack_bound(privacy_profile(accountant.get_epsilon, deltas))
        print(f"| {eps:g} | {pair.advantage:.3f} | {pair.auc:.3f} | {sigma:.2f} | {profile.advantage:.3f} | "
              f"{profile.auc:.3f} |")


if __name__ == "__main__":
    main()
