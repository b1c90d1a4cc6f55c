"""The out-of-distribution model's mixture (federated/ood_fit.py): fitted from the sites' sums alone, it gives a
site whose images differ from the others' a component of its own, so that one registered threshold holds the
stated rate at every site (docs/algorithms.md section 15)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from federated import ood, ood_fit
from federated.backends import InProcessTransport


def _bytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


def _fit(per_site: list[np.ndarray], blocks) -> ood.Gaussian:
    return _fit_and_sent(per_site, blocks)[0]


def _fit_and_sent(per_site: list[np.ndarray], blocks) -> tuple[ood.Gaussian, list[int]]:
    """Steps 1-3 as the engine runs them, over an in-process transport that sums what each site sends; and the
    bytes each site sent for the mixture's steps."""
    transport = InProcessTransport(len(per_site))
    sums = [torch.from_numpy(ood.feature_sums(f, blocks)) for f in per_site]
    transport.mean_([[s] for s in sums], [1.0] * len(per_site))
    fitted, sent = ood_fit.fit_mixture(sums[0].numpy(), [f.astype(np.float32) for f in per_site], blocks, transport,
                                       torch.device("cpu"), _bytes)
    assert len(sent) == len(per_site)
    return fitted, sent


def _sites(rng, n: int) -> dict[str, np.ndarray]:
    """Three sites alike and one whose features sit elsewhere and spread wider (the demo's San Juan)."""
    alike = [rng.normal(size=(n, 6)) @ np.diag([1.0, 0.8, 0.6, 0.5, 0.4, 0.3]) for _ in range(3)]
    apart = rng.normal(size=(n, 6)) * 1.3 + np.array([3.0, -2.0, 0, 0, 1.0, 0])
    return {"a": alike[0], "b": alike[1], "c": alike[2], "apart": apart}


def test_one_threshold_holds_the_rate_at_a_site_unlike_the_others_where_one_gaussian_does_not():
    rng = np.random.default_rng(0)
    train, valid, test = _sites(rng, 1000), _sites(rng, 100), _sites(rng, 2000)
    blocks = (6,)
    fitted = _fit(list(train.values()), blocks)
    assert len(fitted.mean) >= 2 and fitted.precision.shape[1:] == (6, 6)

    def own(model: ood.Gaussian, site: str) -> np.ndarray:
        return ood.distance_histogram(model.distances(np.concatenate([train[site], valid[site]])))

    def refused_per_site(model: ood.Gaussian, threshold: float) -> dict[str, float]:
        return {s: float((model.distances(test[s]) > threshold).mean()) for s in test}

    single, _ = ood.gaussian(sum(ood.feature_sums(f, blocks) for f in train.values()), blocks)
    pooled, _ = ood.threshold_at(sum(own(single, s) for s in train), 0.01)
    assert refused_per_site(single, pooled)["apart"] > 0.03  # one Gaussian: the site apart carries the pooled tail
    # The registered threshold: the pooled quantile, or the smallest edge at which no site has more than 1 % of its
    # own images beyond, where that is larger (each site holds 1100 train and validation images: 11 beyond).
    pooled, _ = ood.threshold_at(sum(own(fitted, s) for s in train), 0.01)
    threshold = max(pooled, ood_fit.every_site_threshold(sum(ood_fit.over_rate(own(fitted, s), 0.01) for s in train)))
    # A site of a few hundred images flags nothing: its 1 % quantile would be a few images' distances.
    assert not ood_fit.over_rate(ood.distance_histogram(fitted.distances(valid["apart"])), 0.01).any()
    assert max(refused_per_site(fitted, threshold).values()) <= 0.02  # the stated 1 % + 1 point, at every site

    # What the sums give does not depend on how the images are spread over sites: one site holding them all
    # fits the same mixture.
    together = _fit([np.concatenate(list(train.values()))], blocks)
    np.testing.assert_allclose(together.mean, fitted.mean, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(together.precision, fitted.precision, rtol=1e-7, atol=1e-9)


def test_a_federation_too_small_for_two_components_keeps_one():
    rng = np.random.default_rng(1)
    blocks = (6,)
    per_site = [rng.normal(size=(10, 6)), rng.normal(size=(10, 6)) + 3]  # 20 images: under 2 x 6 per component
    fitted, sent = _fit_and_sent(per_site, blocks)
    assert sent == [0, 0]  # no split tried: no site sends a component's sums
    single, _ = ood.gaussian(sum(ood.feature_sums(f, blocks) for f in per_site), blocks)
    assert fitted.mean.shape == (1, 6)
    np.testing.assert_allclose(fitted.precision, single.precision)


def test_a_contract_from_before_the_mixture_reads_back_as_one_component():
    rng = np.random.default_rng(2)
    features = rng.normal(size=(50, 3))
    one, _ = ood.gaussian(ood.feature_sums(features, (3,)), (3,))
    old = {"mean": one.mean[0], "precision": one.precision[0], "blocks": np.array([3])}  # as it was saved
    np.testing.assert_allclose(ood.Gaussian.from_arrays(old).distances(features), one.distances(features))


def test_a_hospitals_refit_never_tightens_the_registered_threshold():
    """A site nearer the training images than the pool reads a smaller median: the scaled threshold would refuse
    more of its own images than the registered one (the demo's NIH: 2.5 % against none)."""
    rng = np.random.default_rng(3)
    pooled = ood.distance_histogram(np.abs(rng.normal(1.0, 0.2, 4000)))
    threshold, refused = ood.threshold_at(pooled, 0.01)
    registered = ood.OodReference(members={"penultimate": 8}, threshold=threshold, target_false_refusal=0.01,
                                  valid_false_refusal=refused, valid_median=ood.median_of(pooled),
                                  test_false_refusal=None, train_images=4000, source="pooled")
    near = ood.distance_histogram(np.abs(rng.normal(0.8, 0.2, 40)))
    own, how = ood.site_threshold(near, registered)
    assert own == threshold and how.startswith("the registered threshold, kept: the pooled threshold x 0.")
    wider = ood.distance_histogram(np.abs(rng.normal(1.2, 0.25, 40)))
    own, how = ood.site_threshold(wider, registered)
    assert own > threshold and how.startswith("the pooled threshold x 1.")


def test_a_refusal_model_the_sites_could_not_sum_is_refused_before_the_first_round():
    """The linear network's penultimate member is its input: 12,288 values for a 64 px colour image, whose second
    moments (1.2 GB a site) were found too large only after the last round. Refused when the engine is built,
    naming the member and the two ways out; without a refusal model the same training builds."""
    from common.errors import ConfigError
    from federated import SyntheticSite, TrainConfig
    from federated.engine import Engine

    sites = [SyntheticSite(n_train=16, shape=(3, 64, 64), num_classes=1, pos_rate=0.3, shift=k) for k in range(2)]
    settings = dict(algorithm="fedavg", sites=sites, network="linear", rounds=1, local_steps=1, batch_size=8,
                    progress=False, loader_workers=0)
    with pytest.raises(ConfigError) as refused:
        Engine(TrainConfig(**settings))
    assert "penultimate: 12,288 values" in str(refused.value) and "--ood-false-refusal 0" in refused.value.fix
    assert Engine(TrainConfig(**settings, ood_false_refusal=0)).sites
    # Under differential privacy no refusal model is fitted: nothing to refuse either.
    assert Engine(TrainConfig(**settings, dp={"noise_multiplier": 1.0, "max_grad_norm": 1.0})).sites
