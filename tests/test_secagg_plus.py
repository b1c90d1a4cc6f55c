"""SecAgg+ (federated/secagg_graph.py, ``TrainConfig.secure_neighbours="secagg+"``): the masking graph is
regular, symmetric and the same at every site; its neighbour count follows the stated collusion assumption,
with the full graph for small consortia; its decoded sum is the full graph's bit for bit; and what the
combiner receives from a site stays uniform and uncorrelated with its update, even when every other site but
one honest neighbour colludes and hands over its pair secrets."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from scipy import stats
from test_secure_aggregation import ObservedTransport, _as_unit

from federated import SyntheticSite, TrainConfig, train
from federated.secagg_graph import cut_probability, degree, neighbours, ring_order
from federated.secure_aggregation import SecureTransport, rounding_bound


def _secure(K: int, k: int | None):
    inner = ObservedTransport(K)
    return SecureTransport(inner, [f"hosp-{i}" for i in range(K)], k), inner


def _honest_connected(K: int, k: int, colluders: set[int]) -> bool:
    """Whether the sites outside ``colluders`` stay connected in H(K, k) on the ring 0, 1, ..., K - 1."""
    honest = [i for i in range(K) if i not in colluders]
    reached, todo = {honest[0]}, [honest[0]]
    while todo:
        i = todo.pop()
        for j in {(i + d) % K for s in range(1, k // 2 + 1) for d in (s, -s)} - colluders - reached:
            reached.add(j)
            todo.append(j)
    return len(reached) == len(honest)


def test_the_graph_is_regular_symmetric_and_the_same_from_the_same_keys():
    K, k = 64, 8
    seed = bytes(range(32)) * 2
    graph = {i: neighbours(i, K, k, seed) for i in range(K)}
    assert all(len(n) == k and i not in n for i, n in graph.items())
    assert all(i in graph[j] for i, n in graph.items() for j in n)
    assert graph == {i: neighbours(i, K, k, seed) for i in range(K)}  # every site derives the same graph
    assert sorted(ring_order(K, seed)) == list(range(K))
    assert ring_order(K, seed) != ring_order(K, seed[::-1])  # other keys, another graph
    assert neighbours(3, K, None, seed) == [i for i in range(K) if i != 3]
    with pytest.raises(ValueError, match="even number of neighbours"):
        neighbours(0, K, 3, seed)


def test_the_neighbour_count_follows_the_collusion_assumption_with_the_full_graph_for_small_consortia():
    assert degree(4, 1 / 3, 40) == 3 and degree(8, 1 / 3, 40) == 7  # small: the full graph
    at_64 = degree(64, 1 / 3, 40)
    assert at_64 < 63 / 2 and cut_probability(64, at_64, 21) <= 2.0 ** -40
    assert cut_probability(64, at_64 - 2, 21) > 2.0 ** -40  # the smallest that meets the bound
    assert degree(64, 0.1, 40) < at_64 < degree(64, 0.5, 40)  # more colluders, more neighbours
    assert degree(64, 1 / 3, 80) >= at_64
    # Logarithmic: from 64 to 1024 sites the degree grows by a small additive amount, not 16-fold.
    assert degree(1024, 1 / 3, 40) <= at_64 + 24


def test_the_cut_bound_holds_against_every_placement_of_the_colluders():
    """Exact over all placements on a small ring: the share of colluder sets that cut the honest sites apart
    is at most the bound the degree is chosen by."""
    K, k = 14, 4
    for c in (4, 5, 6):
        cut = sum(not _honest_connected(K, k, set(s)) for s in itertools.combinations(range(K), c))
        exact = cut / sum(1 for _ in itertools.combinations(range(K), c))
        assert exact <= cut_probability(K, k, c), c
        assert (exact > 0) == (cut_probability(K, k, c) > 0), c  # cuts exist exactly where the bound allows
    assert cut_probability(K, k, 3) == 0.0  # two runs of k/2 colluders need k of them


def test_the_secagg_plus_sum_is_the_full_graphs_bit_for_bit_and_the_plain_sum_within_the_bound():
    K = 32
    gen = torch.Generator().manual_seed(5)
    values = [torch.randn(3_000, generator=gen, dtype=torch.float64) * (1 + k) for k in range(K)]
    weights = [float(w) for w in torch.rand(K, generator=gen, dtype=torch.float64)]
    sums = {}
    for k in (None, 4, 8):
        secure, _ = _secure(K, k)
        assert all(len(m.secrets) == (K - 1 if k is None else k) for m in secure.masks.values())
        per_site = [[v.clone()] for v in values]
        secure.mean_(per_site, weights)
        sums[k] = per_site[0][0]
        assert all(torch.equal(sums[k], p[0]) for p in per_site)
    assert torch.equal(sums[4], sums[None]) and torch.equal(sums[8], sums[None])
    exact = sum(w * v for w, v in zip(weights, values))
    magnitudes = sum(abs(w * v) for w, v in zip(weights, values))
    assert bool(((sums[4] - exact).abs() <= rounding_bound(K, magnitudes) + 1e-12 * magnitudes).all())


def test_one_honest_neighbours_mask_alone_hides_a_site_and_a_cut_reveals_it():
    """Every site but sites a and b colludes with the combiner and hands over its pair secrets: the combiner
    strips their masks off a's vector. With b a's neighbour, what is left (a's value plus the one mask of the
    pair (a, b)) is uniform and uncorrelated with a's update (the statistics of
    tests/test_secure_aggregation.py). With no honest neighbour left, the same stripping recovers a's value
    exactly: the graph's connectivity is what protects, and the test can fail."""
    K, k, n = 16, 2, 60_000
    update = torch.linspace(-3, 3, n, dtype=torch.float64)
    secure, inner = _secure(K, k)
    a = 0
    values = [[update.clone() if i == a else torch.zeros(n, dtype=torch.float64)] for i in range(K)]
    secure.mean_(values, [1.0] * K)
    (received,) = inner.received

    def stripped(honest: set[int]) -> torch.Tensor:
        out = received[a].numpy().view(np.uint64).copy()
        for j in secure.masks[a].secrets:
            if j in honest:
                continue
            stream = secure.masks[j].stream(a, 1, n)  # the colluder's copy of the pair's mask
            if j > a:
                out -= stream
            else:
                out += stream
        return torch.from_numpy(out.view(np.int64))

    b = next(iter(secure.masks[a].secrets))
    hidden = stripped({a, b})
    unit = _as_unit(hidden)
    top = (hidden.numpy().view(np.uint64) >> np.uint64(56)).astype(np.int64)
    assert stats.chisquare(np.bincount(top, minlength=256)).pvalue > 1e-3
    assert stats.kstest(unit, "uniform").pvalue > 1e-3
    assert abs(np.corrcoef(unit, update.numpy())[0, 1]) < 5 / np.sqrt(n)
    revealed = stripped({a})
    assert torch.equal(revealed, secure.encode(a, [update], 1.0))  # no honest neighbour: a's value in the clear
    assert abs(np.corrcoef(_as_unit(revealed), update.numpy())[0, 1]) > 0.5


def test_a_secagg_plus_training_equals_the_full_graphs():
    sites = [SyntheticSite(n_train=24, n_test=20, shape=(6,), num_classes=1, pos_rate=0.3, task_seed=3, shift=0.1 * k)
             for k in range(20)]
    cfg = TrainConfig(algorithm="fedavg", sites=sites, network="mlp", rounds=2, local_steps=2, batch_size=8, lr=0.1,
                      progress=False, loader_workers=0, secure_aggregation=True, secure_colluding=0.2)
    sparse = train(cfg.model_copy(update={"secure_neighbours": "secagg+"}))
    assert sparse.config.mask_degree() < 19
    full = train(cfg)
    for key, value in full.global_state.items():
        assert torch.equal(sparse.global_state[key], value), key
