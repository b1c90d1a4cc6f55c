"""The out-of-distribution model fitted across the federation from sums (docs/algorithms.md section 15): a
mixture of at most ``COMPONENTS`` Gaussians over ``federated/ood.py``'s feature ensemble, and the threshold read
from the sites' summed distance histograms.

One Gaussian describes a federation whose sites image alike; a site whose films differ from the others' (the
demo's San Juan: 16-bit CR, white collimation borders) then lies in that Gaussian's tail, and a threshold that
holds the pooled rate refuses several times it of that site's images. A mixture gives such images a component of
their own. It is fitted by hard expectation-maximisation (classification EM, Celeux and Govaert 1992), started by
splitting each component in two (Linde, Buzo and Gray 1980), and every step's statistics are sums:

1. Each site sums its training split's member vectors (``ood.feature_sums``): one component.
2. Split: each site assigns each training image to a child of its nearest component (``split_sides``) and sends
   each child's sums (``component_sums``); every process fits the children from the pooled sums.
3. Refine, ``REFINE_STEPS`` times: each image to its likeliest component (``log_densities``), each
   component's sums, refit.
   The split is kept where it lowers Akaike's criterion (``Fit.criterion``, from the sums); a split or step that
   would leave a component under ``MIN_IMAGES_PER_DIMENSION`` x the largest member's dimension training images
   is undone: the mixture keeps the components it had (a small federation keeps one).
4. Each site counts its train, valid and test distances (to the nearest component) in ``ood.distance_edges``'
   bins, and flags each bin edge beyond which more than the rate of its own train and validation distances lie
   (``over_rate``; only a site with at least ``ood.TAIL_IMAGES`` images beyond its own quantile, 1000 train and
   validation images at 1 %); counts and flags are summed. The threshold is the larger of the pooled train and
   validation quantile and the smallest edge no site flags (``every_site_threshold``): it holds the rate on every
   such site's own images, not only on the pool, where a big site's images would outweigh another's tail. The summed flags say, per edge, how many sites' (1 - rate)
   quantiles lie beyond it: under secure aggregation the sites' quantiles without their names.

Every process decides alike from the same pooled sums; no image's features leave a site. The features of a
site's training split are held in memory (float32, as the network gives them) for the steps' passes.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from common.errors import ConfigError
from federated.ood import (
    DISTANCE_BINS,
    TAIL_IMAGES,
    Gaussian,
    OodModel,
    OodReference,
    distance_edges,
    distance_histogram,
    feature_sums,
    gaussian,
    median_of,
    member_slices,
    members,
    quadratic_form,
    refused_fraction,
    scores_and_features,
    threshold_at,
)

# At most four components, each of at least twice the largest member's dimension in training images (256 for
# ``small_resnet``): measured on the demo's champions (docs/algorithms.md section 15), the chest federation's 2160
# images give two (San Juan's films, and the others'), the melanoma's 2166 four. Smaller components fit the
# training images the threshold is read from too closely: assigned by distance, eight components of about 270
# chest images refused 2 to 3 % of the sites' test images.
COMPONENTS = 4
REFINE_STEPS = 4
MIN_IMAGES_PER_DIMENSION = 2


def mixture(components: list[Gaussian]) -> Gaussian:
    return Gaussian(np.concatenate([c.mean for c in components]), np.concatenate([c.precision for c in components]),
                    components[0].blocks)


def component_sums(features: np.ndarray, blocks, assignment: np.ndarray, components: int) -> np.ndarray:
    """``feature_sums`` of the rows assigned to each component, concatenated: what a site sends per step."""
    return np.concatenate([feature_sums(features[assignment == k], blocks) for k in range(components)])


def split_sides(fitted: Gaussian, features: np.ndarray) -> np.ndarray:
    """Each row's child in a split of its nearest component: 2k or 2k + 1 by its side of the hyperplane through
    the component's mean across the penultimate member's direction of largest variance. The direction's sign is
    fixed (its largest entry positive) so that every site splits alike."""
    nearest = fitted.component_distances(features).argmin(axis=1)
    first = member_slices(fitted.blocks)[0]
    side = np.zeros(len(features), dtype=np.int64)
    for k, (mean, precision) in enumerate(zip(fitted.mean, fitted.precision)):
        direction = np.linalg.eigh(precision[first, first])[1][:, 0]  # the precision's smallest: largest variance
        direction = direction * np.sign(direction[np.argmax(np.abs(direction))])
        rows = nearest == k
        side[rows] = (features[rows][:, first] - mean[first]) @ direction > 0
    return 2 * nearest + side


def log_densities(fitted: Gaussian, features: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """(N, K): each row's log density under each component, weighted by its share of the training images (up to a
    constant). Hard EM assigns by it, not by the distance alone: a broad component would be every image's nearest
    by distance and take the others' images."""
    features = np.asarray(features, dtype=np.float64)
    out = np.tile(np.log(counts / counts.sum()), (len(features), 1))
    for k, (mean, precision) in enumerate(zip(fitted.mean, fitted.precision)):
        centred = features - mean
        for part in member_slices(fitted.blocks):
            square = quadratic_form(centred[:, part], precision[part, part])
            out[:, k] += 0.5 * np.linalg.slogdet(precision[part, part])[1] - 0.5 * square
    return out


@dataclass
class Fit:
    """A mixture and the pooled sums it was fitted from, one row of ``feature_sums`` per component."""

    mixture: Gaussian
    sums: np.ndarray  # (K, 1 + sum of d + d^2)

    @property
    def counts(self) -> np.ndarray:
        return self.sums[:, 0]

    def criterion(self) -> float:
        """Akaike's information criterion (Akaike 1974) of the hard assignment the sums were summed under, from the
        sums alone: each component's log likelihood of its images is -n/2 (tr(P C) - log det P + d log 2 pi), C
        their covariance about the component's mean, P its shrunk precision; a component costs its weight and
        each member's mean and covariance in parameters. Smaller is better. Not Schwarz's criterion: its log n
        per parameter assumes far more images than parameters, and a component of ``small_resnet``'s ensemble has
        10,680 parameters for the demo's 2,166 melanoma images (it kept one Gaussian there, where two hold
        New York's images to the rate)."""
        total, log_likelihood, parameters = self.counts.sum(), 0.0, 0
        for sums, precision in zip(self.sums, self.mixture.precision):
            n, offset = sums[0], 1
            log_likelihood += n * np.log(n / total)
            for part in member_slices(self.mixture.blocks):
                d = part.stop - part.start
                mean = sums[offset : offset + d] / n
                covariance = sums[offset + d : offset + d + d * d].reshape(d, d) / n - np.outer(mean, mean)
                offset += d + d * d
                block = precision[part, part]
                log_likelihood -= n / 2 * (np.trace(block @ covariance) - np.linalg.slogdet(block)[1]
                                           + d * np.log(2 * np.pi))
                parameters += d + d * (d + 1) // 2
            parameters += 1
        return -2 * log_likelihood + 2 * (parameters - 1)


def _pooled_components(features: list[np.ndarray], assignments: list[np.ndarray], count: int, blocks, transport,
                       device: torch.device, bytes_of) -> tuple[Fit | None, list[int]]:
    """The mixture refitted from the sites' sums per component (a collective), and the bytes each site sent; None
    where a component would hold too few training images to fit."""
    sums = [torch.from_numpy(component_sums(f, blocks, a, count)).to(device) for f, a in zip(features, assignments)]
    transport.mean_([[s] for s in sums], [1.0] * len(sums), names=("ood.component_sums",))
    parts = sums[0].cpu().numpy().reshape(count, -1)
    sent = [bytes_of(s) for s in sums]
    if (parts[:, 0] < MIN_IMAGES_PER_DIMENSION * max(blocks)).any():
        return None, sent
    return Fit(mixture([gaussian(part, blocks)[0] for part in parts]), parts), sent


def _could_split(fitted: Fit, blocks) -> bool:
    """Whether the training images could fill twice ``fitted``'s components with the minimum each
    (``_pooled_components``). Where they could not, the split would cost each site a d x d eigendecomposition per
    component and a collective of 2K (1 + d + d^2) sums, all for nothing: 8.6 CPU s and 150 MB a site for a
    linear network's penultimate member on 32 px colour images (d = 3,072). Every process decides alike, from
    the pooled counts."""
    return fitted.counts.sum() >= 2 * len(fitted.counts) * MIN_IMAGES_PER_DIMENSION * max(blocks)


def fit_mixture(pooled_sums: np.ndarray, features: list[np.ndarray], blocks, transport, device: torch.device,
                bytes_of) -> tuple[Gaussian, list[int]]:
    """Steps 2 and 3 from the pooled ``feature_sums`` of every training image (one component); and the bytes each
    site sent. A split is kept where it lowers the information criterion: a federation that images alike keeps
    one Gaussian, since splitting one cluster in two leaves halves whose outer tails the halves' Gaussians
    refuse."""
    sent = [0] * len(features)

    def step(assignments, count):
        nonlocal sent
        refitted, step_sent = _pooled_components(features, assignments, count, blocks, transport, device, bytes_of)
        sent = [a + b for a, b in zip(sent, step_sent)]
        return refitted

    fitted = Fit(gaussian(pooled_sums, blocks)[0], pooled_sums[None])
    while len(fitted.counts) < COMPONENTS and _could_split(fitted, blocks):
        candidate = step([split_sides(fitted.mixture, f) for f in features], 2 * len(fitted.counts))
        for _ in range(REFINE_STEPS if candidate is not None else 0):
            refined = step([log_densities(candidate.mixture, f, candidate.counts).argmax(axis=1) for f in features],
                           len(candidate.counts))
            if refined is None:
                break
            candidate = refined
        if candidate is None or candidate.criterion() >= fitted.criterion():
            break
        fitted = candidate
    return fitted.mixture, sent


def over_rate(histogram: np.ndarray, rate: float) -> np.ndarray:
    """Per bin b, 1 where more than ``rate`` of one site's distances lie beyond the bin's upper edge: what the site
    sends so that the threshold holds at every site. Summed, it counts the sites a threshold at that edge would
    refuse more than the rate of. A site with fewer than ``TAIL_IMAGES`` images beyond its own (1 - rate) quantile
    flags nothing: its quantile would be a few images' distances (its largest, under 1 / rate images), which
    would loosen everyone's threshold to one image of its own and stand for that image at the centre."""
    total = histogram.sum()
    if total * rate < TAIL_IMAGES:
        return np.zeros(DISTANCE_BINS)
    beyond = 1 - np.cumsum(histogram) / total
    return (beyond > rate + 1e-12).astype(np.float64)


def every_site_threshold(sites_over: np.ndarray) -> float:
    """The smallest upper bin edge at which no site's train and validation distances lie beyond it at more than
    the rate; infinite where only the open top bin would do."""
    b = int(np.flatnonzero(sites_over <= 0.5)[0])
    return float("inf") if b == DISTANCE_BINS - 1 else float(distance_edges()[b + 1])


def site_images_are_pictures(sites) -> bool:
    """Whether the federation's rows are images (uint8 (N, H, W[, 3])), not feature vectors: every site's shard
    has the same input shape, so every process decides alike."""
    return np.ndim(sites[0].data.train.images) >= 3 if sites else True


# The largest member a site sums for the fit: its second moments are d x d float64 (8 d^2 bytes a site, sent at
# every step) and the fit costs O(d^3). 8,192 values: 0.5 GB. The linear network's penultimate member is its input
# itself: 150,528 values for a 224 px colour image, 181 GB, found only after the last round.
MAX_MEMBER_DIM = 8192


def check_member_sizes(model: nn.Module, sites) -> None:
    """Refuse, before the first round, a refusal model the sites could not sum: one member over ``MAX_MEMBER_DIM``."""
    too_large = {name: d for name, d in members(model, site_images_are_pictures(sites)).items() if d > MAX_MEMBER_DIM}
    if too_large:
        listed = ", ".join(f"{name}: {d:,} values" for name, d in too_large.items())
        raise ConfigError(f"the out-of-distribution refusal model cannot be fitted for this network ({listed}; at most "
                          f"{MAX_MEMBER_DIM:,}): its sums would be {8 * max(too_large.values()) ** 2 / 1e9:,.1f} GB a site",
                          fix="train a network whose head sees learned features (small_resnet, densenet121), or train "
                              "without a refusal model: --ood-false-refusal 0")


def federated_statistics(model: nn.Module, sites, transport, device: torch.device, rate: float, source: str,
                         bytes_of, amp: bool = False, channels_last: bool = False) -> tuple[OodModel | None, list[int]]:
    """Steps 1-4 over ``sites`` (this process's; a collective: every process calls it): the OOD model of
    ``model`` (the global one, as it is registered) and the bytes each site here sent (``bytes_of(tensor)``,
    what the transport moves for a summed tensor). None where the federation holds fewer than two training
    images or no validation image to read a threshold from: the model then refuses nothing as out of
    distribution and its contract has no ``ood``."""
    dims = members(model, site_images_are_pictures(sites))
    blocks = tuple(dims.values())
    features = [scores_and_features(model, site.data.train.images, device, amp, channels_last)[1].astype(np.float32)
                if len(site.data.train) else np.zeros((0, sum(blocks)), dtype=np.float32) for site in sites]
    sums = [torch.from_numpy(feature_sums(f, blocks)).to(device) for f in features]
    transport.mean_([[s] for s in sums], [1.0] * len(sites), names=("ood.feature_sums",))
    if float(sums[0][0]) < 2:
        return None, [bytes_of(s) for s in sums]
    n = int(round(float(sums[0][0])))
    fitted, sent = fit_mixture(sums[0].cpu().numpy(), features, blocks, transport, device, bytes_of)
    distances = [{"train": fitted.distances(train)} for train in features]
    for site, own in zip(sites, distances):
        for split in ("valid", "test"):
            part = site.data.splits.get(split)
            own[split] = (fitted.distances(scores_and_features(model, part.images, device, amp, channels_last)[1])
                          if part is not None and len(part) else np.zeros(0))
    # Each site's flags come from its own train and validation distances, before anything is summed.
    summed = {"over": [over_rate(distance_histogram(np.concatenate([own["train"], own["valid"]])), rate)
                       for own in distances]}
    summed.update({split: [distance_histogram(own[split]) for own in distances] for split in ("train", "valid", "test")})
    histograms = {}
    for name, per_site in summed.items():
        tensors = [torch.from_numpy(values).to(device) for values in per_site]
        transport.mean_([[t] for t in tensors], [1.0] * len(sites),
                        names=("ood.sites_over_rate" if name == "over" else "ood.distance_histograms",))
        histograms[name] = tensors[0].cpu().numpy()
    # the sums, the mixture's steps, the flags and the three splits' histograms
    sent = [bytes_of(s) + extra + 4 * bytes_of(tensors[0]) for s, extra in zip(sums, sent)]
    if histograms["valid"].sum() <= 0:
        return None, sent
    pooled, _ = threshold_at(histograms["train"] + histograms["valid"], rate)
    threshold = max(pooled, every_site_threshold(histograms["over"]))
    reference = OodReference(members=dims, components=len(fitted.mean), threshold=threshold,
                             target_false_refusal=rate, valid_median=median_of(histograms["valid"]),
                             valid_false_refusal=refused_fraction(histograms["valid"], threshold),
                             test_false_refusal=refused_fraction(histograms["test"], threshold),
                             train_images=n, source=source)
    return OodModel(fitted, reference, histograms["valid"], histograms["test"]), sent
