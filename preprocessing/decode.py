"""Decode one image file (DICOM, PNG, JPEG) into float32 intensities in [0, 1], the way preprocessing does.

The decoder keeps full precision (float32 holds every 16-bit value exactly) until the final 8-bit
quantisation in ``preprocessing.resize``. DICOM follows docs/datasets.md section 10:

1. pixel data through pydicom 3 and its pylibjpeg plugins (JPEG baseline/lossless, JPEG-LS, JPEG 2000,
   RLE); YBR colour (e.g. YBR_FULL_422 dermoscopy) comes back as RGB from pydicom;
2. the Modality LUT (LUT sequence or RescaleSlope/RescaleIntercept) with ``apply_modality_lut``;
3. the VOI transform: a VOI LUT sequence (``apply_voi``) or WindowCenter/WindowWidth (``apply_windowing``),
   scaled from that transform's output range to [0, 1]; without either, min-max over the image;
4. MONOCHROME1 inverted so that high values are bright, as in MONOCHROME2.

PNG/JPEG: 8-bit divides by 255; 16-bit PNG (PadChest: 10 or 12 bits stored in 16, the stored depth is not
in the file) is min-max scaled, like a DICOM without a window, so a 12-bit image is not left at 1/16
brightness.

Every failure is a ``DecodeError`` carrying the quarantine ``Reason`` and a detail naming the file.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pydicom
from PIL import Image, UnidentifiedImageError
from pydicom.errors import InvalidDicomError
from pydicom.pixels import apply_modality_lut, apply_voi, apply_windowing, get_decoder

from preprocessing.quarantine import Reason

# Part of the shard content hash: bump it whenever decoded intensities can change for the same file.
DECODER_VERSION = "1"

# Modality (0008,0060) values a task accepts; a file without the tag (PNG, JPEG, sparse DICOM) is accepted.
# XC (external-camera photography) is what dermoscopy DICOMs such as SIIM-ISIC 2020 carry; OT is "other".
ALLOWED_MODALITIES: dict[str, frozenset[str]] = {
    "chest-xray": frozenset({"CR", "DX", "DR"}),
    "melanoma": frozenset({"XC", "OT", "GM"}),
}

_PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
_JPEG_MAGIC = b"\xff\xd8\xff"
_DICOM_SUFFIXES = (".dcm", ".dicom", ".dic")
# ITU-R BT.601 luma, the weights Pillow's RGB -> L conversion uses, so a colour file fed to a grayscale
# task looks the same whichever library converted it.
_LUMA = np.array([0.299, 0.587, 0.114], dtype=np.float32)


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
    format: str  # "dicom", "png" or "jpeg"
    modality: str | None  # None when the file has no Modality tag (always for PNG/JPEG)
    photometric: str  # PhotometricInterpretation for DICOM, the Pillow mode for PNG/JPEG
    bits_stored: int
    transfer_syntax: str | None
    rows: int
    columns: int
    frames: int  # multi-frame DICOM: frame 0 is the image, the count is reported
    intensity: str  # "voi_lut", "window", "minmax" or "fixed" (divided by the format's maximum)
    inverted: bool  # MONOCHROME1 turned into MONOCHROME2
    raw_min: float  # stored values before any transform
    raw_max: float

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class DecodedImage:
    pixels: np.ndarray  # float32 in [0, 1]; (H, W) for 1 channel, (H, W, 3) for 3
    info: ImageInfo


def decode_image(
    path: str | Path,
    *,
    channels: int | None = None,
    allowed_modalities: frozenset[str] | None = None,
    min_size: int = 0,
) -> DecodedImage:
    """Decode ``path`` to float32 in [0, 1].

    ``channels`` (1 or 3) converts colour to luma or replicates gray; None keeps what the file holds.
    ``allowed_modalities`` rejects a DICOM whose Modality is present and not listed (WRONG_MODALITY).
    ``min_size`` rejects images whose shorter side is below it (IMAGE_TOO_SMALL).
    Raises ``DecodeError`` with the quarantine reason on any failure.
    """
    path = Path(path)
    if channels not in (None, 1, 3):
        raise ValueError(f"channels must be 1, 3 or None, got {channels!r}")
    try:
        with path.open("rb") as handle:
            head = handle.read(132)
    except FileNotFoundError:
        raise DecodeError(Reason.MISSING_FILE, f"{path}: file not found") from None
    except OSError as err:
        raise DecodeError(Reason.UNREADABLE_FILE, f"{path}: {err}") from None

    if head.startswith(_PNG_MAGIC) or head.startswith(_JPEG_MAGIC):
        pixels, info = _decode_pillow(path)
    elif head[128:132] == b"DICM" or path.suffix.lower() in _DICOM_SUFFIXES:
        pixels, info = _decode_dicom(path, allowed_modalities)
    else:
        raise DecodeError(
            Reason.UNREADABLE_FILE,
            f"{path}: not a DICOM, PNG or JPEG file (starts with {head[:8]!r}, {len(head)} bytes read)",
        )

    if min(info.rows, info.columns) < min_size:
        raise DecodeError(
            Reason.IMAGE_TOO_SMALL,
            f"{path}: {info.rows}x{info.columns} pixels, the shorter side is below min_image_size={min_size}",
        )
    return DecodedImage(_to_channels(pixels, channels), info)


def _decode_pillow(path: Path) -> tuple[np.ndarray, ImageInfo]:
    try:
        with Image.open(path) as image:
            image.load()
            mode = image.mode
            file_format = (image.format or "").lower()
            stored = np.asarray(image)
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as err:
        raise DecodeError(Reason.UNREADABLE_FILE, f"{path}: {err}") from None

    if mode == "P" or mode == "PA":
        raise DecodeError(Reason.UNREADABLE_FILE, f"{path}: palette image (mode {mode}) is not a photograph")
    if stored.ndim == 3 and stored.shape[2] == 4:
        stored = stored[..., :3]  # an alpha channel carries no intensity
    if stored.ndim == 3 and stored.shape[2] == 2:
        stored = stored[..., 0]  # LA: luminance plus alpha
    raw_min, raw_max = float(stored.min()), float(stored.max())
    if stored.dtype == np.uint8 or mode == "1":
        pixels = stored.astype(np.float32) / np.float32(255.0 if mode != "1" else 1.0)
        intensity, bits = "fixed", 8 if mode != "1" else 1
    else:
        pixels, intensity, bits = _minmax(stored.astype(np.float32)), "minmax", 16
    info = ImageInfo(
        path=str(path),
        format="jpeg" if file_format in ("jpeg", "mpo") else file_format,
        modality=None,
        photometric=mode,
        bits_stored=bits,
        transfer_syntax=None,
        rows=int(stored.shape[0]),
        columns=int(stored.shape[1]),
        frames=1,
        intensity=intensity,
        inverted=False,
        raw_min=raw_min,
        raw_max=raw_max,
    )
    return pixels, info


def _decode_dicom(path: Path, allowed_modalities: frozenset[str] | None) -> tuple[np.ndarray, ImageInfo]:
    try:
        # force: some archives store DICOM without the 128-byte preamble; the check below catches garbage.
        ds = pydicom.dcmread(path, force=True)
        identified = "SOPClassUID" in ds or "PixelData" in ds
    except (InvalidDicomError, OSError, ValueError, EOFError, KeyError, TypeError) as err:
        raise DecodeError(Reason.UNREADABLE_FILE, f"{path}: pydicom cannot parse it: {err}") from None
    if not identified:
        raise DecodeError(Reason.UNREADABLE_FILE, f"{path}: not a DICOM file (no SOP Class UID, no pixel data)")

    modality = str(ds.get("Modality", "") or "").strip().upper() or None
    if allowed_modalities is not None and modality is not None and modality not in allowed_modalities:
        raise DecodeError(
            Reason.WRONG_MODALITY,
            f"{path}: Modality {modality!r}, expected one of {sorted(allowed_modalities)}",
        )
    if not any(tag in ds for tag in ("PixelData", "FloatPixelData", "DoubleFloatPixelData")):
        sop_class = ds.get("SOPClassUID")
        kind = sop_class.name if sop_class is not None else "unknown SOP class"
        raise DecodeError(Reason.NOT_AN_IMAGE, f"{path}: DICOM object without pixel data ({kind})")

    transfer_syntax = getattr(ds, "file_meta", pydicom.Dataset()).get("TransferSyntaxUID")
    if transfer_syntax is None:
        raise DecodeError(Reason.UNREADABLE_FILE, f"{path}: no (0002,0010) Transfer Syntax UID in the file meta")
    if transfer_syntax.is_compressed:
        try:
            decoder = get_decoder(transfer_syntax)
        except NotImplementedError:
            decoder = None
        if decoder is None or not decoder.is_available:
            raise DecodeError(
                Reason.UNSUPPORTED_TRANSFER_SYNTAX,
                f"{path}: no installed decoder for transfer syntax {transfer_syntax.name} ({transfer_syntax})",
            )

    frames = int(ds.get("NumberOfFrames", 1) or 1)
    try:
        # index=0 decodes only the first frame of a multi-frame object instead of all of them.
        stored = ds.pixel_array if frames == 1 else pydicom.pixels.pixel_array(ds, index=0)
    except Exception as err:  # pydicom and its plugins raise many types for truncated or corrupt data
        raise DecodeError(
            Reason.UNREADABLE_FILE, f"{path}: pixel data cannot be decoded ({type(err).__name__}: {err})"
        ) from None

    photometric = str(ds.get("PhotometricInterpretation", "")).strip().upper()
    if stored.ndim not in (2, 3) or (stored.ndim == 3 and stored.shape[2] != 3):
        raise DecodeError(Reason.NOT_AN_IMAGE, f"{path}: pixel array of shape {stored.shape} is not one 2-D image")
    raw_min, raw_max = float(stored.min()), float(stored.max())

    if stored.ndim == 3:
        # Colour: pydicom already returns RGB for YBR_* data; no LUT or window applies to colour.
        depth = int(ds.get("BitsStored", 8))
        pixels = stored.astype(np.float32) / np.float32(2**depth - 1)
        intensity, inverted = "fixed", False
    else:
        pixels, intensity = _grayscale_intensity(stored, ds, path)
        inverted = photometric == "MONOCHROME1"
        if inverted:
            pixels = 1.0 - pixels

    info = ImageInfo(
        path=str(path),
        format="dicom",
        modality=modality,
        photometric=photometric,
        bits_stored=int(ds.get("BitsStored", 0) or 0),
        transfer_syntax=str(transfer_syntax.name),
        rows=int(stored.shape[0]),
        columns=int(stored.shape[1]),
        frames=frames,
        intensity=intensity,
        inverted=inverted,
        raw_min=raw_min,
        raw_max=raw_max,
    )
    return np.clip(pixels, 0.0, 1.0, out=pixels), info


def _grayscale_intensity(stored: np.ndarray, ds: pydicom.Dataset, path: Path) -> tuple[np.ndarray, str]:
    """Modality LUT then VOI, scaled to [0, 1] over the VOI output range (DICOM PS3.3 C.11)."""
    values = apply_modality_lut(stored, ds)
    try:
        if ds.get("VOILUTSequence"):
            # A LUT indexes by integer stored value; the rescale turned them into integral floats.
            windowed = apply_voi(np.rint(values).astype(np.int64) if values.dtype.kind == "f" else values, ds)
            # The LUT's own table bounds its output; evaluating it over its input domain yields the table.
            descriptor = ds.VOILUTSequence[0].LUTDescriptor
            domain = np.arange(descriptor[1], descriptor[1] + (descriptor[0] or 2**16))
            table = apply_voi(domain, ds)
            return _scale(windowed, float(table.min()), float(table.max())), "voi_lut"
        if "WindowCenter" in ds and "WindowWidth" in ds:
            windowed = apply_windowing(values, ds)
            # A window maps everything below it to its output minimum and above it to its maximum.
            low, high = apply_windowing(np.array([-np.inf, np.inf]), ds)
            return _scale(windowed, float(low), float(high)), "window"
    except (ValueError, NotImplementedError, AttributeError, IndexError) as err:
        raise DecodeError(Reason.UNREADABLE_FILE, f"{path}: invalid VOI LUT or window: {err}") from None
    return _minmax(values.astype(np.float32)), "minmax"


def _scale(values: np.ndarray, low: float, high: float) -> np.ndarray:
    if high <= low:
        return np.zeros(values.shape, dtype=np.float32)
    return ((values - low) / (high - low)).astype(np.float32)


def _minmax(values: np.ndarray) -> np.ndarray:
    """Min-max to [0, 1]; a constant image becomes all zeros rather than NaN."""
    return _scale(values, float(values.min()), float(values.max()))


def _to_channels(pixels: np.ndarray, channels: int | None) -> np.ndarray:
    if channels is None:
        return pixels
    if channels == 1 and pixels.ndim == 3:
        return np.ascontiguousarray(pixels @ _LUMA)
    if channels == 3 and pixels.ndim == 2:
        return np.repeat(pixels[..., None], 3, axis=2)
    return pixels


def inspect_file(path: str | Path) -> dict:
    """Decode ``path`` the way preprocessing does and describe it, for ``fedauc inspect``.

    Returns the ``ImageInfo`` fields plus shape, dtype, min/max after decoding and ``error`` (None, or the
    quarantine reason and detail); never raises for a bad file.
    """
    try:
        decoded = decode_image(path)
    except DecodeError as err:
        return {"path": str(path), "error": {"reason": err.reason.value, "detail": err.detail}}
    summary = decoded.info.as_dict()
    summary.update(
        shape=list(decoded.pixels.shape),
        dtype=str(decoded.pixels.dtype),
        min=float(decoded.pixels.min()),
        max=float(decoded.pixels.max()),
        error=None,
    )
    return summary
