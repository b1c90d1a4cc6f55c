"""Secure aggregation (federated/secure_aggregation.py): what the combiner receives is uniform over the ring
and uncorrelated with the sites' values, the decoded sum is the plain one within the bound that
docs/algorithms.md section 13 states, masks are fresh every collective, and a value outside the
fixed-point range stops the run naming the site, round and tensor."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
import torch
from scipy import stats

import federated
from federated import SyntheticSite, TrainConfig
from federated.backends import InProcessTransport
from federated.engine import Engine
from federated.secure_aggregation import (
    FRACTION_BITS,
    SecureAggregationError,
    SecureTransport,
    rounding_bound,
    value_limit,
)


class ObservedTransport(InProcessTransport):
    """The in-process transport, keeping what each site handed to the ring sum: the combiner's view."""

    def __init__(self, num_sites: int):
        super().__init__(num_sites)
        self.received: list[list[torch.Tensor]] = []

    def ring_sum(self, per_site):
        self.received.append([v.clone() for v in per_site])
        return super().ring_sum(per_site)


def _secure(K: int):
    inner = ObservedTransport(K)
    return SecureTransport(inner, [f"hosp-{k}" for k in range(K)]), inner


def _as_unit(v: torch.Tensor) -> np.ndarray:
    """Ring elements as reals in [0, 1)."""
    return v.numpy().view(np.uint64).astype(np.float64) / 2.0 ** 64


def test_what_the_combiner_receives_is_uniform_over_the_ring_and_uncorrelated_with_the_update():
    K, n = 3, 60_000
    gen = torch.Generator().manual_seed(0)
    # Updates with structure a combiner could exploit: a ramp, a sparse spike pattern, a constant.
    updates = [torch.linspace(-3, 3, n), (torch.rand(n, generator=gen) < 0.01).float() * 50, torch.full((n,), 0.25)]
    secure, inner = _secure(K)
    secure.mean_([[u.clone()] for u in updates], [1 / K] * K)
    (received,) = inner.received
    for k, (update, vector) in enumerate(zip(updates, received)):
        unit = _as_unit(vector)
        # Uniform: the top byte over 256 bins (chi-square) and the whole value (Kolmogorov-Smirnov).
        top = (vector.numpy().view(np.uint64) >> np.uint64(56)).astype(np.int64)
        assert stats.chisquare(np.bincount(top, minlength=256)).pvalue > 1e-3, k
        assert stats.kstest(unit, "uniform").pvalue > 1e-3, k
        # Uncorrelated with the site's update (and with its fixed-point encoding, which is the update).
        if update.std() > 0:
            assert abs(np.corrcoef(unit, update.numpy())[0, 1]) < 5 / np.sqrt(n), k
            # The same statistic finds the update in the unmasked fixed-point contribution: the test has power.
            assert abs(np.corrcoef(_as_unit(secure.encode(k, [update], 1 / K)), update.numpy())[0, 1]) > 0.5, k
    # The same update sent again (the next collective) looks fresh: the masks change every collective.
    secure.mean_([[u.clone()] for u in updates], [1 / K] * K)
    again = inner.received[1]
    for first, second in zip(received, again):
        assert (first != second).float().mean() > 0.999
        assert abs(np.corrcoef(_as_unit(first), _as_unit(second))[0, 1]) < 5 / np.sqrt(n)


def test_the_decoded_sum_is_the_plain_sum_within_the_stated_bound():
    K = 4
    gen = torch.Generator().manual_seed(1)
    values = [torch.randn(2_000, generator=gen, dtype=torch.float64) * 10.0 ** (k - 1) for k in range(K)]
    for weights in ([1 / K] * K, [0.1, 0.2, 0.3, 0.4], [1.0] * K):
        secure, _ = _secure(K)
        per_site = [[v.clone()] for v in values]
        secure.mean_(per_site, weights)
        decoded = per_site[0][0]
        assert all(torch.equal(decoded, p[0]) for p in per_site)  # every site decodes the same sum
        exact = [sum((Fraction(w) * Fraction(float(v[i])) for w, v in zip(weights, values)), Fraction(0))
                 for i in range(len(decoded))]
        errors = torch.tensor([float(abs(Fraction(float(d)) - e)) for d, e in zip(decoded, exact)], dtype=torch.float64)
        magnitudes = sum(abs(w * v) for w, v in zip(weights, values))
        assert bool((errors <= rounding_bound(K, magnitudes)).all())
        assert errors.max() > 0  # not exact by chance: the bound is what holds
    # float32 tensors (the model): the bound, then the cast to float32 (half an ulp of the result). The plain
    # float32 mean has its own rounding (K float32 steps over the partial sums), within K ulps of sum |w x|.
    model = [torch.randn(5_000, generator=gen) for _ in range(K)]
    exact = sum(m.double() for m in model) / K  # exact: m / 4 and sums of 4 float32 values fit float64
    secure, _ = _secure(K)
    masked = [[m.clone()] for m in model]
    secure.mean_(masked, [1 / K] * K)
    magnitudes = sum(m.double().abs() for m in model) / K
    half_ulp = torch.finfo(torch.float32).eps / 2 * exact.abs()
    assert bool(((masked[0][0].double() - exact).abs() <= rounding_bound(K, magnitudes) + half_ulp * 1.001).all())
    plain = [[m.clone()] for m in model]
    InProcessTransport(K).mean_(plain, [1 / K] * K)
    assert bool(((plain[0][0].double() - exact).abs() <= K * torch.finfo(torch.float32).eps * magnitudes).all())


def test_counts_and_sums_of_integers_are_exact():
    K = 3
    counts = [torch.tensor([17.0, 0.0, 123_456.0], dtype=torch.float64) * (k + 1) for k in range(K)]
    secure, _ = _secure(K)
    per_site = [[c.clone()] for c in counts]
    secure.mean_(per_site, [1.0] * K)
    assert torch.equal(per_site[0][0], sum(counts))


def test_the_fixed_point_range_is_a_power_of_two_that_keeps_the_sum_inside_int64():
    for K in (1, 2, 3, 4, 5, 64):
        limit = value_limit(K)
        assert K * limit * 2.0 ** FRACTION_BITS <= 2.0 ** 63
    secure, _ = _secure(3)
    secure.round = 4
    edge = torch.tensor([value_limit(3) * 0.999, -value_limit(3) * 0.999], dtype=torch.float64)
    per_site = [[edge.clone()] for _ in range(3)]
    secure.mean_(per_site, [1.0] * 3, names=["model.edge"])  # every site at the edge: the sum still decodes
    assert torch.allclose(per_site[0][0], 3 * edge, rtol=1e-12)
    with pytest.raises(SecureAggregationError, match=r"site 'hosp-1' \(index 1\), round 4, tensor 'state.v' element 2 ="):
        secure.mean_([[torch.zeros(3)], [torch.tensor([0.0, 0.0, value_limit(3) * 2])], [torch.zeros(3)]],
                     [1.0] * 3, names=["state.v"])


def _cfg(**kw) -> TrainConfig:
    sites = [SyntheticSite(n_train=48, n_test=40, shape=(6,), num_classes=2, pos_rate=0.3, task_seed=3, shift=0.4 * k)
             for k in range(3)]
    base = dict(algorithm="fedavg", sites=sites, network="mlp", rounds=3, local_steps=3, batch_size=8, lr=0.1,
                progress=False, loader_workers=0, secure_aggregation=True)
    base.update(kw)
    return TrainConfig(**base)


@pytest.mark.parametrize(("value", "says"), [(1e12, r"2 = 1e\+12 \(times weight 0.3333\) exceeds the fixed-point range"),
                                             (float("nan"), r"\d+ is not finite")])
def test_a_value_outside_the_range_stops_the_run_naming_site_round_and_tensor(value, says):
    start = federated.train(_cfg(secure_aggregation=False, rounds=1)).global_state
    poisoned = {k: v.clone() for k, v in start.items()}
    name = next(iter(poisoned))  # the first tensor exchanged: a NaN spreads to the others in the local steps
    poisoned[name].view(-1)[2] = value
    engine = Engine(_cfg(), initial_state=poisoned)
    with pytest.raises(SecureAggregationError,
                       match=rf"site 'synthetic0' \(index 0\), round 0, tensor 'model.{name}' element {says}") as err:
        engine.run()
    assert "fix: the training diverged" in str(err.value)


@pytest.mark.parametrize(("algorithm", "params"), [("codasca", {"T0": 6}), ("coda", {"T0": 6})])
def test_a_secure_training_matches_the_plain_one_within_the_rounding_and_repeats_bit_for_bit(algorithm, params):
    """CODASCA (MEAN model, duals and control variates), CoDA (SUM stage statistics); weighted aggregation."""
    cfg = _cfg(algorithm=algorithm, params=params, aggregation="weighted", rounds=4)
    secure, again = federated.train(cfg), federated.train(cfg)  # fresh keys, the same sums
    plain = federated.train(cfg.model_copy(update={"secure_aggregation": False}))
    for key, value in plain.global_state.items():
        assert torch.equal(secure.global_state[key], again.global_state[key]), key
        assert torch.allclose(secure.global_state[key].float(), value.float(), atol=1e-5), key
    auc = "test/pooled/auc_macro"
    assert secure.history[-1]["metrics"][auc] == pytest.approx(plain.history[-1]["metrics"][auc], abs=1e-3)
    # Every MEAN value travels as one 8-byte ring element: twice float32's bytes (round 0: no stage, no evaluation).
    assert secure.history[0]["bytes_sent"] == [2 * b for b in plain.history[0]["bytes_sent"]]
