"""What decoding produces (``preprocessing.decode``): the image, what was found and done, and the error a
file that cannot become a training image raises; the intensity scaling both decoders share."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from preprocessing.quarantine import Reason


class DecodeError(Exception):
    """A file that cannot become a training image; ``reason`` is its quarantine reason."""

    def __init__(self, reason: Reason, detail: str):
        super().__init__(f"{reason.value}: {detail}")
        self.reason = reason
        self.detail = detail


@dataclass(frozen=True)
class ImageInfo:
    """What decoding found and did; ``fedauc inspect`` prints it and the QC report aggregates it."""

    path: str
    format: str  # "dicom", "png", "jpeg" or "tiff"
    modality: str | None  # None when the file has no Modality tag (always for PNG/JPEG/TIFF)
    photometric: str  # PhotometricInterpretation for DICOM, the Pillow mode for PNG/JPEG/TIFF
    bits_stored: int
    transfer_syntax: str | None
    rows: int
    columns: int
    frames: int  # multi-frame DICOM: frame 0 is the image, the count is reported
    intensity: str  # "voi_lut", "window", "minmax" or "fixed" (divided by the format's maximum)
    inverted: bool  # MONOCHROME1 turned into MONOCHROME2
    raw_min: float  # stored values before any transform (8-bit decoded at the tile size: of the block means)
    raw_max: float
    # DICOM Manufacturer (the model card's subgroups, federated/subgroups.py); None for PNG/JPEG/TIFF or no tag
    manufacturer: str | None = None
    bits_allocated: int = 0  # bits per stored sample: DICOM BitsAllocated, the Pillow mode's
    body_part: str | None = None  # DICOM BodyPartExamined and Anatomic Region codes, "; "-joined; None: none named
    view_position: str | None = None  # DICOM ViewPosition (PA, AP, LL...); None: not named

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class DecodedImage:
    pixels: np.ndarray  # float32 in [0, 1]; (H, W) for 1 channel, (H, W, 3) for 3
    info: ImageInfo


def scale_to_unit(values: np.ndarray, low: float, high: float) -> np.ndarray:
    if high <= low:
        return np.zeros(values.shape, dtype=np.float32)
    return ((values - low) / (high - low)).astype(np.float32)


def minmax(values: np.ndarray) -> np.ndarray:
    """Min-max to [0, 1]; a constant image becomes all zeros rather than NaN."""
    return scale_to_unit(values, float(values.min()), float(values.max()))
