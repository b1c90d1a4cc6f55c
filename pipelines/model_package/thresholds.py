"""Operating points: per disease, the score from which an image counts as positive.

Read from score histograms (C, 2, B: positives' and negatives' counts in B equal bins of [0, 1], the ones the
federated evaluation sums over sites), so the pooled validation split gives them without any per-image score
leaving a site. Thresholds are bin edges b / B: an image is positive when its probability is >= the
threshold, which counts bins b .. B-1 exactly, so the sensitivity and specificity stated with each point are
exact on the histograms they were read from.

Points: ``sens90`` and ``sens95`` (the highest threshold whose sensitivity reaches 0.90 / 0.95: the best
specificity at that sensitivity) and ``youden`` (the largest sensitivity + specificity - 1). A disease without
a labelled positive or negative has no points (its reason is recorded instead).

At one hospital ``fedauc thresholds`` reads them again from its own validation split (scores that stay
there) into a file of its own, which predict and the PACS job then prefer (``hospital_file``), together with
the out-of-distribution threshold read from the same split's distances at the contract's false-refusal rate and
the calibration map refitted on its histograms (docs/algorithms.md sections 15 and 16): a site whose images lie
in the pooled distances' tail is held to the stated rate by a threshold of its own, and none of it leaves.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
from pydantic import BaseModel, ConfigDict

from common.formats import check as check_format
from common.formats import stamp
from federated.config import TrainConfig
from federated.ood import OodReference
from pipelines.model_package.calibration import Calibration

# The bins of a hospital's own histograms: those of the federated evaluation (TrainConfig.eval_bins).
HISTOGRAM_BINS = TrainConfig.model_fields["eval_bins"].default
TARGET_SENSITIVITIES = {"sens90": 0.90, "sens95": 0.95}
POINTS = (*TARGET_SENSITIVITIES, "youden")
DEFAULT_POINT = "youden"


class OperatingPoint(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    threshold: float
    sensitivity: float
    specificity: float


class OperatingPoints(BaseModel):
    """Per disease, each point of ``POINTS`` (or why it has none), and what they were read from."""

    model_config = ConfigDict(extra="forbid")
    source: str  # "pooled validation of federation X" or "validation split of site Y"
    positives: dict[str, int]
    negatives: dict[str, int]
    points: dict[str, dict[str, OperatingPoint]]
    undefined: dict[str, str] = {}
    # Read at one hospital only (a hospital file): its own refusal threshold and calibration map, which replace
    # the registered ones where it scores; None in the registered points and in a file written before them.
    ood: OodReference | None = None
    calibration: Calibration | None = None

    def thresholds(self, point: str, diseases: list[str]) -> dict[str, float | None]:
        if point not in POINTS:
            raise ValueError(f"unknown operating point {point!r}; expected one of {list(POINTS)}")
        return {d: self.points[d][point].threshold if d in self.points else None for d in diseases}


def from_histograms(histograms: np.ndarray, diseases: list[str], source: str) -> OperatingPoints:
    """The operating points of each disease from its histograms ``(C, 2, B)``."""
    histograms = np.asarray(histograms, dtype=np.float64)
    bins = histograms.shape[-1]
    points, undefined, positives, negatives = {}, {}, {}, {}
    for c, disease in enumerate(diseases):
        hp, hn = histograms[c]
        P, N = hp.sum(), hn.sum()
        positives[disease], negatives[disease] = int(P), int(N)
        if P == 0 or N == 0:
            undefined[disease] = f"no labelled {'positive' if P == 0 else 'negative'} image"
            continue
        # Threshold b / B for b = 0 .. B: sensitivity = positives in bins >= b, specificity = negatives below b.
        sens = np.concatenate([np.cumsum(hp[::-1])[::-1], [0.0]]) / P
        spec = np.concatenate([[0.0], np.cumsum(hn)]) / N
        chosen = {name: int(np.flatnonzero(sens >= target - 1e-12).max()) for name, target in TARGET_SENSITIVITIES.items()}
        chosen["youden"] = int(np.argmax(sens + spec - 1.0))
        points[disease] = {name: OperatingPoint(threshold=b / bins, sensitivity=float(sens[b]),
                                                specificity=float(spec[b])) for name, b in chosen.items()}
    return OperatingPoints(source=source, positives=positives, negatives=negatives, points=points, undefined=undefined)


def hospital_file(shards_root: str | Path, site: str, model_name: str, version: str) -> Path:
    """Where a hospital keeps its own operating points for one registered version: beside its shards."""
    return Path(shards_root) / "thresholds" / site / f"{model_name}-v{version}.json"


def write(points: OperatingPoints, path: Path) -> Path:
    """Written whole or not at all (a temporary file renamed), readable by the hospital only."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(stamp("thresholds", points.model_dump(mode="json")), indent=2))
    os.chmod(tmp, 0o600)
    os.replace(tmp, path)
    return path


def read(path: Path) -> OperatingPoints:
    return OperatingPoints.model_validate(check_format("thresholds", json.loads(Path(path).read_text()), path))
