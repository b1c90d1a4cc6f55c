"""Out-of-distribution refusal: what the federation's training images look like to the network, learnt from sums.

The model (docs/algorithms.md section 15): one Gaussian over the penultimate features (the input of the network's
last linear layer) of every site's training images, and the Mahalanobis distance of an image's features to it
(Lee et al., "A Simple Unified Framework for Detecting Out-of-Distribution Samples and Adversarial Attacks",
NeurIPS 2018, with one class-independent Gaussian: the labels are multi-label, so per-class means do not partition
the images). Its sufficient statistics are sums, so they travel like any other released sum (``transport.mean_``
with weights 1, secure aggregation included) and no image's features leave a site:

1. Each site sums its training split's features: the image count n, sum f and sum f f^T (float64).
2. Every process turns the pooled sums into the mean and a shrunk covariance, ``gaussian``.
3. Each site counts its valid and test splits' distances in ``DISTANCE_BINS`` log-spaced bins (``distance_edges``);
   the counts are summed like the evaluation's score histograms.
4. The threshold is the smallest bin edge that keeps at least 1 - rate of the pooled validation distances
   (``threshold_at``): the false-refusal rate on the pooled validation split is at most ``rate``, exactly, on the
   histogram it was read from.

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
# The distance divided by sqrt(dimension), whose square averages 1 over the images the Gaussian was fitted on,
# binned log-uniformly over five decades: a bin is 1.2 % wide, and the top bin also counts every larger distance.
_LOG10_RANGE = (-2.0, 3.0)


class OodReference(BaseModel):
    """What the model contract says of the refusal: the threshold and what it was read from. The mean and
    precision matrix travel beside the contract in a file of their own (``Gaussian``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    method: str = "mahalanobis, penultimate features, one Gaussian (Lee et al. 2018)"
    dimension: int
    threshold: float  # Mahalanobis distance above which an image is refused
    target_false_refusal: float  # the rate the threshold was read at
    valid_false_refusal: float  # the pooled validation split's refused fraction at the threshold
    test_false_refusal: float | None  # the pooled test split's (None: no site holds one)
    train_images: int  # images the Gaussian was fitted on, summed over sites
    source: str


@dataclass
class Gaussian:
    mean: np.ndarray  # (d,)
    precision: np.ndarray  # (d, d): the shrunk covariance's inverse

    def distances(self, features: np.ndarray) -> np.ndarray:
        centred = np.asarray(features, dtype=np.float64) - self.mean
        return np.sqrt(np.maximum(np.einsum("nd,de,ne->n", centred, self.precision, centred), 0.0))

    def arrays(self) -> dict[str, np.ndarray]:
        return {"mean": self.mean, "precision": self.precision}


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
    return {"mean": torch.from_numpy(model.gaussian.mean), "precision": torch.from_numpy(model.gaussian.precision),
            "reference": model.reference.model_dump(), "valid_histogram": torch.from_numpy(model.valid_histogram),
            "test_histogram": torch.from_numpy(model.test_histogram)}


def from_saved(saved: dict | None) -> OodModel | None:
    if saved is None:
        return None
    return OodModel(Gaussian(saved["mean"].numpy(), saved["precision"].numpy()),
                    OodReference.model_validate(saved["reference"]), saved["valid_histogram"].numpy(),
                    saved["test_histogram"].numpy())


def head_layer(model: nn.Module) -> nn.Linear:
    """The network's last linear layer: its input is the penultimate feature vector (SmallResNet's ``head``,
    MONAI DenseNet121's ``class_layers.out``, MONAI ResNet's ``fc``)."""
    linear = [m for m in model.modules() if isinstance(m, nn.Linear)]
    if not linear:
        raise ValueError(f"{type(model).__name__} has no linear layer whose input could serve as its features")
    return linear[-1]


def scores_and_features(model: nn.Module, images, device: torch.device, amp: bool = False,
                        channels_last: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """``predict_scores`` of ``images`` and, from the same forward pass, their penultimate features (N, d) float64."""
    head = head_layer(model)
    captured: list[torch.Tensor] = []
    handle = head.register_forward_hook(
        lambda _module, inputs, _output: captured.append(inputs[0].detach().float().reshape(len(inputs[0]), -1).cpu()))
    try:
        scores = predict_scores(model, images, device, amp=amp, channels_last=channels_last)
    finally:
        handle.remove()
    features = torch.cat(captured).double().numpy() if captured else np.zeros((0, head.in_features))
    return scores, features


def feature_sums(features: np.ndarray, dimension: int) -> np.ndarray:
    """``[n, sum f (d), sum f f^T (d * d)]`` of one site's features, float64: what step 1 sends."""
    features = np.asarray(features, dtype=np.float64).reshape(-1, dimension)
    return np.concatenate([[len(features)], features.sum(axis=0), (features.T @ features).ravel()])


def gaussian(sums: np.ndarray, dimension: int) -> tuple[Gaussian, int]:
    """The mean and precision from pooled ``feature_sums``; and n. The covariance is shrunk towards its mean
    variance times the identity with weight d / (n + d) (a prior worth d images: a Ledoit-Wolf-like target
    without the fourth moments, which would cost another d^2 sum), so that n < d images still give an
    invertible matrix and the rare directions of the training features are not trusted beyond what n supports."""
    n = float(sums[0])
    if n < 2:
        raise ValueError(f"{n:.0f} training images in the federation: too few to fit the feature distribution")
    mean = sums[1 : 1 + dimension] / n
    second = sums[1 + dimension :].reshape(dimension, dimension) / n
    covariance = (second - np.outer(mean, mean)) * n / (n - 1)
    covariance = (covariance + covariance.T) / 2
    weight = dimension / (n + dimension)
    scale = max(float(np.trace(covariance)) / dimension, 1e-12)
    shrunk = (1 - weight) * covariance + weight * scale * np.eye(dimension)
    return Gaussian(mean, np.linalg.inv(shrunk)), int(round(n))


def distance_edges(dimension: int) -> np.ndarray:
    """The ``DISTANCE_BINS + 1`` bin edges of the Mahalanobis distance."""
    return np.sqrt(dimension) * np.logspace(*_LOG10_RANGE, DISTANCE_BINS + 1)


def distance_histogram(distances: np.ndarray, dimension: int) -> np.ndarray:
    """Counts of ``distances`` per bin; below the first edge in the first bin, above the last in the last."""
    edges = distance_edges(dimension)
    index = np.clip(np.searchsorted(edges, np.asarray(distances, dtype=np.float64), side="right") - 1,
                    0, DISTANCE_BINS - 1)
    return np.bincount(index, minlength=DISTANCE_BINS).astype(np.float64)


def threshold_at(histogram: np.ndarray, dimension: int, rate: float) -> tuple[float, float]:
    """(threshold, refused fraction): the smallest upper bin edge below which at least 1 - ``rate`` of the
    histogram's distances lie; an image is refused when its distance exceeds it."""
    total = histogram.sum()
    if total <= 0:
        raise ValueError("no validation distance to read a threshold from")
    kept = np.cumsum(histogram) / total
    b = int(np.flatnonzero(kept >= 1 - rate - 1e-12)[0])
    if b == DISTANCE_BINS - 1:  # the top bin is open: nothing it holds may be refused
        return float("inf"), 0.0
    return float(distance_edges(dimension)[b + 1]), float(1 - kept[b])


def refused_fraction(histogram: np.ndarray, dimension: int, threshold: float) -> float | None:
    """The fraction of a histogram's distances above ``threshold`` (a bin edge); None for an empty histogram."""
    total = histogram.sum()
    if total <= 0:
        return None
    upper = distance_edges(dimension)[1:]
    return float(histogram[upper > threshold * (1 + 1e-12)].sum() / total)


def federated_statistics(model: nn.Module, sites, transport, device: torch.device, rate: float, source: str,
                         bytes_of, amp: bool = False, channels_last: bool = False) -> tuple[OodModel | None, list[int]]:
    """Steps 1-4 over ``sites`` (this process's; a collective: every process calls it): the OOD model of
    ``model`` (the global one, as it is registered) and the bytes each site here sent (``bytes_of(tensor)``,
    what the transport moves for a summed tensor). None where the federation holds fewer than two training
    images or no validation image to read a threshold from: the model then refuses nothing as out of
    distribution and its contract has no ``ood``. Every process decides alike, from the same pooled sums."""
    dimension = head_layer(model).in_features
    sums = []
    for site in sites:
        train = site.data.train
        _, features = scores_and_features(model, train.images, device, amp, channels_last) if len(train) else (
            None, np.zeros((0, dimension)))
        sums.append(torch.from_numpy(feature_sums(features, dimension)).to(device))
    transport.mean_([[s] for s in sums], [1.0] * len(sites))
    if float(sums[0][0]) < 2:
        return None, [bytes_of(s) for s in sums]
    fitted, n = gaussian(sums[0].cpu().numpy(), dimension)
    histograms = {}
    for split in ("valid", "test"):
        counts = []
        for site in sites:
            part = site.data.splits.get(split)
            distances = np.zeros(0)
            if part is not None and len(part):
                distances = fitted.distances(scores_and_features(model, part.images, device, amp, channels_last)[1])
            counts.append(torch.from_numpy(distance_histogram(distances, dimension)).to(device))
        transport.mean_([[c] for c in counts], [1.0] * len(sites))
        histograms[split] = counts[0].cpu().numpy()
    sent = [bytes_of(s) + 2 * bytes_of(counts[0]) for s in sums]  # the sums and the two splits' histograms
    if histograms["valid"].sum() <= 0:
        return None, sent
    threshold, valid_refused = threshold_at(histograms["valid"], dimension, rate)
    reference = OodReference(dimension=dimension, threshold=threshold, target_false_refusal=rate,
                             valid_false_refusal=valid_refused,
                             test_false_refusal=refused_fraction(histograms["test"], dimension, threshold),
                             train_images=n, source=source)
    return OodModel(fitted, reference, histograms["valid"], histograms["test"]), sent

