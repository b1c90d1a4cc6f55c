"""The heterogeneous federation of claim (a)'s benchmark (benchmarks/claims/heterogeneous.py, docs/claims.md): the
skews it states are the skews it makes. On a small constructed pool of uniform-grey images, so that any difference
between the sites' image statistics is their acquisition's; under 10 s."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks.claims.heterogeneous import Heterogeneity, draw, heterogeneous_federation
from benchmarks.claims.runs import CLINICS, Pool


def grey_pool(n_train: int = 400, n_eval: int = 120) -> Pool:
    """Every clinic: mid-grey 16 px images with a fine checkerboard (the detail a half resolution removes), 30 %
    positives, so that the images themselves carry no site difference."""
    checker = np.indices((16, 16)).sum(0) % 2 * 40 + 108
    image = np.repeat(checker[:, :, None], 3, axis=2).astype(np.uint8)

    def split(n):
        return np.repeat(image[None], n, axis=0), (np.arange(n) % 10 < 3).astype(np.int64)
    return Pool({profile: {"train": split(n_train), "valid": split(n_eval), "test": split(n_eval)}
                 for profile, _ in CLINICS})


def test_positives_follow_the_dirichlet_draw_and_a_smaller_alpha_skews_the_rates_more():
    h = Heterogeneity(sites=12, rows=1440, rate=0.1, alpha=0.3)
    d = draw(h, 0)
    assert d.sizes.sum() == h.rows and d.sizes.min() >= h.min_rows
    assert d.positives.sum() == round(h.rate * h.rows) and d.positives.min() >= 1
    assert np.all(d.positives < d.sizes)
    # The positives are the draw's shares of the federation's, up to rounding and the floor of one per site.
    assert np.abs(d.positives - d.shares * d.positives.sum()).max() <= h.sites
    assert np.corrcoef(d.positives, d.shares)[0, 1] > 0.95
    spread = {alpha: np.mean([draw(Heterogeneity(sites=12, rows=1440, alpha=alpha), seed).rates.std()
                              for seed in range(20)]) for alpha in (0.3, 100.0)}
    assert spread[0.3] > 3 * spread[100.0]  # alpha 100 is nearly every site at the federation's rate
    # The draw is the seed's: a rerun resumes on the same federation, another seed is another federation.
    assert np.array_equal(draw(h, 0).positives, d.positives)
    assert not np.array_equal(draw(h, 1).positives, d.positives)


def test_sites_get_the_drawn_rows_and_differ_in_their_image_statistics():
    h = Heterogeneity(sites=8, rows=480, rate=0.1, alpha=0.3, min_rows=20)
    sites, d = heterogeneous_federation(grey_pool(), h, 3)
    assert [len(s.train[1]) for s in sites] == list(d.sizes)
    assert [int(s.train[1].sum()) for s in sites] == list(d.positives)
    # Each site's test rows are its own share of its clinic's test split, through the same acquisition.
    means = np.array([s.train[0].reshape(-1, 3).mean(0) for s in sites])
    assert np.allclose(means, [s.test[0].reshape(-1, 3).mean(0) for s in sites])
    assert np.ptp(means, axis=0).min() > 20  # the same grey seen by eight acquisitions: every channel differs
    # A site at half resolution has lost the checkerboard: its neighbouring pixels are equal in 2 x 2 blocks.
    halved = [k for k, a in enumerate(d.acquisitions) if a.downsample == 2]
    assert halved and len(halved) < h.sites
    for k, site in enumerate(sites):
        image = site.train[0][0].astype(int)
        assert (np.abs(np.diff(image[::2], axis=1)[:, ::2]).max() == 0) == (k in halved)
    flat = heterogeneous_federation(grey_pool(), Heterogeneity(sites=8, rows=480, min_rows=20, acquisition=0.0), 3)[0]
    assert np.ptp([s.train[0].mean() for s in flat]) == 0  # strength 0: no feature skew


def test_a_federation_larger_than_the_pool_says_what_to_change():
    with pytest.raises(ValueError, match="build the pool larger or the federation smaller"):
        heterogeneous_federation(grey_pool(n_train=60), Heterogeneity(sites=8, rows=480, min_rows=20), 0)
    with pytest.raises(ValueError, match="raise rows or rate"):
        Heterogeneity(sites=16, rows=400, rate=0.02, min_rows=20)


def test_the_window_plan_chooses_on_validation_seeds_only_and_trains_the_extremes_of_I_first(tmp_path):
    from benchmarks.claims import window_runs
    from benchmarks.claims.runs import Setting

    setting = Setting(pool=10, size=16, iterations=64, periods=(1, 4, 16), lr_grid=(0.1, 1.0), seeds=(0, 1, 2))
    runner = window_runs.WindowRunner(grey_pool(), setting, tmp_path / "runs.jsonl", tmp_path, "t")
    steps = window_runs.plan(runner, runner, ["premise"])
    assert [what for _, what, _ in steps] == ["codaplus I=(1, 16) validation", "codaplus I=(1, 16) reported",
                                              "codaplus I=(4,) validation", "codaplus I=(4,) reported"]
    validation = steps[0][2]()
    assert {call[0][3] for call in validation} == set(window_runs.VALIDATION_SEEDS)
    assert [call[0][3] for call in validation] == sorted(call[0][3] for call in validation)  # seed by seed
    assert steps[1][2]() == []  # nothing reported before its choice is made
    # Stored validation runs where one stage at lr 1.0 is best at I = 1; a reported seed scoring higher elsewhere
    # must not move the choice.
    for args, kw in validation:
        schedule, lr, seed, I = args[1], args[2], args[3], args[4]
        best = schedule == window_runs.SCHEDULES["one stage"] and lr == 1.0
        runner._store({**runner.spec(*args, **kw), "auc": 0.8 if best == (I == 1) else 0.6})
    runner._store({**runner.spec("codaplus", window_runs.SCHEDULES["two stages"], 0.1, 0, 1), "auc": 0.99})
    chosen, means = window_runs.choose(runner, "codaplus", None, 1)
    assert chosen == (window_runs.SCHEDULES["one stage"], 1.0) and max(means) == 0.8
    reported = steps[1][2]()
    assert {(call[0][4], call[0][2]) for call in reported} == {(1, 1.0), (16, 0.1)}
    assert [call[0][3] for call in reported] == [0, 0, 1, 1, 2, 2]  # both extremes of I at each seed in turn
    # Stored reported seeds count in order up to the first missing one: pairs stay paired.
    for seed in (0, 2):
        runner._store({**runner.spec("codaplus", window_runs.SCHEDULES["one stage"], 1.0, seed, 1), "auc": 0.7})
    assert len(window_runs.reported(runner, "codaplus", chosen, 1)) == 1
