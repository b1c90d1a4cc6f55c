"""Out-of-distribution refusal: what the federation's training images look like, learnt from sums.

The model (docs/algorithms.md section 15): a feature ensemble (Lee et al., "A Simple Unified Framework for
Detecting Out-of-Distribution Samples and Adversarial Attacks", NeurIPS 2018, section 2.2) of three members, each
one Gaussian over a vector every image gives: the penultimate features (the input of the network's last linear
layer), the network's input average-pooled to ``THUMBNAIL_SIDE`` x ``THUMBNAIL_SIDE`` (its layout: where the
bright and dark parts of the film lie) and its histogram of ``INTENSITY_BINS`` grey levels. An image's distance
is the largest of its Mahalanobis distances to the members, each divided by the square root of the member's
dimension (so that each averages about 1 on the images it was fitted on), to the nearest component of a mixture
of such Gaussians (``Gaussian``: one component where the federation images alike, more where a site's films differ
from the others'). Class-independent components: the labels are multi-label, so per-class means do not partition
the images. The sufficient statistics are sums, so they travel like any other released sum (``transport.mean_``
with weights 1, secure aggregation included) and no image's features leave a site; ``federated/ood_fit.py`` fits
the mixture and reads the threshold across the federation:

- ``feature_sums``: what a site sends of its training split (per component in the mixture's steps): the image
  count n, and per member sum f and sum f f^T; ``gaussian`` turns pooled sums into each member's mean and shrunk
  covariance.
- ``distance_histogram``: a split's distances in ``DISTANCE_BINS`` log-spaced bins (``distance_edges``), summed
  over sites like the evaluation's score histograms.
- ``threshold_at``: the smallest bin edge that keeps at least 1 - rate of a histogram's distances, so the
  false-refusal rate on the split it was read from is at most ``rate``, exactly. A hospital reads its own
  threshold from its own validation split (``site_threshold``, ``fedauc thresholds``): nothing of it leaves the
  site.

Under differential privacy none of this is computed (docs/privacy.md section 5, ``ood.*``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict
from torch import nn

from federated.predict import predict_scores

DISTANCE_BINS = 1000
# The distance (each member's divided by sqrt(its dimension), so about 1 on the images the Gaussians were fitted
# on) binned log-uniformly over five decades: a bin is 1.2 % wide, and the top bin also counts every larger one.
_LOG10_RANGE = (-2.0, 3.0)
# The input-level members. 8 x 8 keeps the film's layout (lung fields, mediastinum, borders) at 64 values; 16 grey
# levels its exposure and how much of it is background. A CT slice exported as PNG (a bright oval on black) sits
# within the penultimate features' spread of a small network's chest films but far from both (section 15).
THUMBNAIL_SIDE = 8
INTENSITY_BINS = 16
PENULTIMATE, THUMBNAIL, INTENSITY = "penultimate", "thumbnail", "intensity"


class OodReference(BaseModel):
    """What the model contract says of the refusal: the threshold and what it was read from. The mean and
    precision matrix travel beside the contract in a file of their own (``Gaussian``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    method: str = ("mahalanobis feature ensemble (Lee et al. 2018): penultimate features, 8 x 8 input thumbnail, "
                   "16-level intensity histogram; the largest distance over sqrt(dimension), to the nearest "
                   "component of a mixture fitted by classification EM from the sites' sums")
    members: dict[str, int]  # each member's dimension, in the order its vector comes in the features
    components: int = 1  # the mixture's Gaussians (federated/ood_fit.py); 1 in a contract registered before it
    threshold: float  # the ensemble distance above which an image is refused
    target_false_refusal: float  # the rate the threshold was read at
    valid_false_refusal: float  # the pooled validation split's refused fraction at the threshold
    # The pooled validation distances' median (a bin edge): what a hospital's refit scales the threshold by
    # (``site_threshold``); None in a contract registered before it.
    valid_median: float | None = None
    test_false_refusal: float | None  # the pooled test split's (None: no site holds one)
    train_images: int  # images the Gaussian was fitted on, summed over sites
    source: str


@dataclass
class Gaussian:
    """The mixture's components side by side, each the members' Gaussians: a mean vector and a block-diagonal
    precision matrix per component."""

    mean: np.ndarray  # (K, D): per component, the members' means concatenated
    precision: np.ndarray  # (K, D, D): per component, each member's shrunk covariance's inverse on its block
    blocks: tuple[int, ...]  # each member's dimension

    def component_distances(self, features: np.ndarray) -> np.ndarray:
        """(N, K): each row's ensemble distance to each component, the largest member distance / sqrt(d)."""
        features = np.asarray(features, dtype=np.float64)
        out = np.zeros((len(features), len(self.mean)))
        for k, (mean, precision) in enumerate(zip(self.mean, self.precision)):
            centred = features - mean
            for part in member_slices(self.blocks):
                square = quadratic_form(centred[:, part], precision[part, part])
                out[:, k] = np.maximum(out[:, k], np.sqrt(np.maximum(square, 0.0) / (part.stop - part.start)))
        return out

    def distances(self, features: np.ndarray) -> np.ndarray:
        """The distance of each row of ``features`` (N, D): to its nearest component."""
        return self.component_distances(features).min(axis=1)

    def arrays(self) -> dict[str, np.ndarray]:
        return {"mean": self.mean, "precision": self.precision, "blocks": np.asarray(self.blocks, dtype=np.int64)}

    @classmethod
    def from_arrays(cls, arrays) -> Gaussian:
        """Read back; a contract registered before the mixture holds one component's (D,) and (D, D)."""
        mean, precision = np.asarray(arrays["mean"]), np.asarray(arrays["precision"])
        return cls(mean.reshape(-1, mean.shape[-1]), precision.reshape(-1, *precision.shape[-2:]),
                   tuple(int(b) for b in np.asarray(arrays["blocks"])))


def quadratic_form(centred: np.ndarray, precision: np.ndarray) -> np.ndarray:
    """(N,): each row's x^T P x. Through a matrix product: ``einsum("nd,de,ne->n")`` runs as one loop without
    BLAS, 20 times slower at d = 3,072 (a linear network's penultimate member on 32 px colour images)."""
    return np.einsum("ne,ne->n", centred @ precision, centred)


def member_slices(blocks) -> list[slice]:
    ends = np.cumsum([0, *blocks])
    return [slice(int(a), int(b)) for a, b in zip(ends[:-1], ends[1:])]


@dataclass
class OodModel:
    gaussian: Gaussian
    reference: OodReference
    valid_histogram: np.ndarray  # (DISTANCE_BINS,) pooled counts
    test_histogram: np.ndarray


def to_saved(model: OodModel | None) -> dict | None:
    """``model`` as ``torch.load(weights_only=True)`` reads it back (a torchrun training's result file)."""
    if model is None:
        return None
    return {**{key: torch.from_numpy(value) for key, value in model.gaussian.arrays().items()},
            "reference": model.reference.model_dump(), "valid_histogram": torch.from_numpy(model.valid_histogram),
            "test_histogram": torch.from_numpy(model.test_histogram)}


def from_saved(saved: dict | None) -> OodModel | None:
    if saved is None:
        return None
    return OodModel(Gaussian.from_arrays({key: saved[key].numpy() for key in ("mean", "precision", "blocks")}),
                    OodReference.model_validate(saved["reference"]), saved["valid_histogram"].numpy(),
                    saved["test_histogram"].numpy())


def head_layer(model: nn.Module) -> nn.Linear:
    """The network's last linear layer: its input is the penultimate feature vector (SmallResNet's ``head``,
    MONAI DenseNet121's ``class_layers.out``, MONAI ResNet's ``fc``)."""
    linear = [m for m in model.modules() if isinstance(m, nn.Linear)]
    if not linear:
        raise ValueError(f"{type(model).__name__} has no linear layer whose input could serve as its features")
    return linear[-1]


def members(model: nn.Module, pictures: bool = True) -> dict[str, int]:
    """Each member's dimension for ``model``: the input-level members only where its input is an image."""
    dims = {PENULTIMATE: head_layer(model).in_features}
    if pictures:
        dims.update({THUMBNAIL: THUMBNAIL_SIDE * THUMBNAIL_SIDE, INTENSITY: INTENSITY_BINS})
    return dims


def _input_members(x: torch.Tensor) -> torch.Tensor:
    """The thumbnail and grey-level histogram of each image of a (B, ch, H, W) batch in [0, 1], (B, 64 + 16)."""
    grey = x.detach().float().mean(dim=1, keepdim=True)
    thumbnail = nn.functional.adaptive_avg_pool2d(grey, THUMBNAIL_SIDE).flatten(1)
    level = (grey.flatten(1) * INTENSITY_BINS).long().clamp(0, INTENSITY_BINS - 1)
    counts = torch.zeros(len(grey), INTENSITY_BINS, device=grey.device).scatter_add_(
        1, level, torch.ones_like(level, dtype=torch.float32))
    return torch.cat([thumbnail, counts / level.shape[1]], dim=1)


def scores_and_features(model: nn.Module, images, device: torch.device, amp: bool = False,
                        channels_last: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """``predict_scores`` of ``images`` and, from the same forward pass, each image's member vectors
    concatenated in ``members`` order (N, D) float64."""
    head = head_layer(model)
    inputs_seen: list[torch.Tensor] = []
    captured: list[torch.Tensor] = []
    handles = [model.register_forward_pre_hook(
                   lambda _module, args: inputs_seen.append(_input_members(args[0]).cpu()) if args[0].ndim == 4 else None),
               head.register_forward_hook(lambda _module, inputs, _output: captured.append(
                   inputs[0].detach().float().reshape(len(inputs[0]), -1).cpu()))]
    try:
        scores = predict_scores(model, images, device, amp=amp, channels_last=channels_last)
    finally:
        for handle in handles:
            handle.remove()
    if not captured:
        return scores, np.zeros((0, sum(members(model, np.ndim(images) >= 3).values())))
    features = torch.cat(captured)
    if inputs_seen:
        features = torch.cat([features, torch.cat(inputs_seen)], dim=1)
    return scores, features.double().numpy()


def feature_sums(features: np.ndarray, blocks) -> np.ndarray:
    """``[n, then per member: sum f (d), sum f f^T (d * d)]`` of one site's features, float64: what step 1 sends."""
    features = np.asarray(features, dtype=np.float64).reshape(-1, sum(blocks))
    parts = [features[:, part] for part in member_slices(blocks)]
    return np.concatenate([[len(features)], *(np.concatenate([f.sum(axis=0), (f.T @ f).ravel()]) for f in parts)])


def _shrunk_precision(n: float, mean: np.ndarray, second: np.ndarray) -> np.ndarray:
    """The inverse of the covariance shrunk towards its mean variance times the identity with weight
    d / (n + d) (a prior worth d images: a Ledoit-Wolf-like target without the fourth moments, which would cost
    another d^2 sum), so that n < d images still give an invertible matrix and the rare directions of the
    training features are not trusted beyond what n supports."""
    dimension = len(mean)
    covariance = (second - np.outer(mean, mean)) * n / (n - 1)
    covariance = (covariance + covariance.T) / 2
    weight = dimension / (n + dimension)
    scale = max(float(np.trace(covariance)) / dimension, 1e-12)
    return np.linalg.inv((1 - weight) * covariance + weight * scale * np.eye(dimension))


def gaussian(sums: np.ndarray, blocks) -> tuple[Gaussian, int]:
    """One component: each member's mean and precision from pooled ``feature_sums``; and n."""
    n = float(sums[0])
    if n < 2:
        raise ValueError(f"{n:.0f} training images in the federation: too few to fit the feature distribution")
    means, precision, offset = [], np.zeros((sum(blocks), sum(blocks))), 1
    for part in member_slices(blocks):
        d = part.stop - part.start
        mean = sums[offset : offset + d] / n
        second = sums[offset + d : offset + d + d * d].reshape(d, d) / n
        offset += d + d * d
        means.append(mean)
        precision[part, part] = _shrunk_precision(n, mean, second)
    return Gaussian(np.concatenate(means)[None], precision[None], tuple(blocks)), int(round(n))


def distance_edges() -> np.ndarray:
    """The ``DISTANCE_BINS + 1`` bin edges of the ensemble distance."""
    return np.logspace(*_LOG10_RANGE, DISTANCE_BINS + 1)


def distance_histogram(distances: np.ndarray) -> np.ndarray:
    """Counts of ``distances`` per bin; below the first edge in the first bin, above the last in the last."""
    edges = distance_edges()
    index = np.clip(np.searchsorted(edges, np.asarray(distances, dtype=np.float64), side="right") - 1,
                    0, DISTANCE_BINS - 1)
    return np.bincount(index, minlength=DISTANCE_BINS).astype(np.float64)


def threshold_at(histogram: np.ndarray, rate: float) -> tuple[float, float]:
    """(threshold, refused fraction): the smallest upper bin edge below which at least 1 - ``rate`` of the
    histogram's distances lie; an image is refused when its distance exceeds it."""
    total = histogram.sum()
    if total <= 0:
        raise ValueError("no validation distance to read a threshold from")
    kept = np.cumsum(histogram) / total
    b = int(np.flatnonzero(kept >= 1 - rate - 1e-12)[0])
    if b == DISTANCE_BINS - 1:  # the top bin is open: nothing it holds may be refused
        return float("inf"), 0.0
    return float(distance_edges()[b + 1]), float(1 - kept[b])


def median_of(histogram: np.ndarray) -> float:
    """The smallest upper bin edge below which at least half of the histogram's distances lie."""
    return threshold_at(histogram, 0.5)[0]


# A site's own (1 - rate) quantile is read directly only when at least this many of its validation images lie
# beyond it; fewer, and its largest distance, one image's, would set it.
TAIL_IMAGES = 10


def site_threshold(histogram: np.ndarray, registered: OodReference) -> tuple[float, str]:
    """A hospital's own threshold from its validation distances' histogram, and how it was read: its
    (1 - rate) quantile where ``TAIL_IMAGES`` lie beyond it; else the pooled threshold scaled by the ratio of the
    site's median distance to the pooled one (its distances taken as the pool's, stretched: the median is
    estimable from a few dozen images, the 1 % tail is not).

    It only ever loosens the registered threshold: that one holds the stated rate on every training site's own
    train and validation images (federated/ood_fit.py), and a tighter one read from a few dozen of a site's images refused more of its own (the demo's NIH: 2.5 % of its
    test images, under 1 % at the registered threshold). Nor does it loosen for a site whose median distance lies
    beyond the registered threshold: its typical image is unlike the federation's training images (a hospital
    that did not train, imaging unlike every site's), and a threshold loosened to take it would take foreign
    images too."""
    rate, images = registered.target_false_refusal, float(histogram.sum())
    if median_of(histogram) > registered.threshold:
        return registered.threshold, ("the registered threshold, kept: over half of its validation images lie "
                                      "beyond it, unlike the federation's training images")
    if images * rate >= TAIL_IMAGES or registered.valid_median is None:
        threshold, how = threshold_at(histogram, rate)[0], f"its {1 - rate:.0%} quantile"
    else:
        scale = median_of(histogram) / registered.valid_median
        edges = distance_edges()  # on a bin edge, as every threshold, so that the histograms count it exactly
        threshold = float(edges[min(np.searchsorted(edges, registered.threshold * scale * (1 - 1e-12)), DISTANCE_BINS)])
        how = (f"the pooled threshold x {scale:.2f}, its median over the pooled one ({images:.0f} validation "
               f"images, under {TAIL_IMAGES} beyond a {rate:.0%} quantile)")
    if threshold < registered.threshold:
        return registered.threshold, f"the registered threshold, kept: {how} ({threshold:.2f}) is tighter"
    return threshold, how


def refused_fraction(histogram: np.ndarray, threshold: float) -> float | None:
    """The fraction of a histogram's distances above ``threshold`` (a bin edge); None for an empty histogram."""
    total = histogram.sum()
    if total <= 0:
        return None
    upper = distance_edges()[1:]
    return float(histogram[upper > threshold * (1 + 1e-12)].sum() / total)
