"""Decode one image file (DICOM, PNG, JPEG) into float32 intensities in [0, 1], the way preprocessing does.

The decoder keeps full precision (float32 holds every 16-bit value exactly) until the final 8-bit
quantisation in ``preprocessing.resize``. DICOM follows docs/datasets.md section 10:

1. pixel data through pydicom 3 and its pylibjpeg plugins (JPEG baseline/lossless, JPEG-LS, JPEG 2000,
   RLE); YBR colour (e.g. YBR_FULL_422 dermoscopy) comes back as RGB from pydicom;
2. the Modality LUT (LUT sequence or RescaleSlope/RescaleIntercept) with ``apply_modality_lut``;
3. the VOI transform: a VOI LUT sequence (``apply_voi``) or WindowCenter/WindowWidth (``apply_windowing``),
   scaled from that transform's output range to [0, 1]; without either, min-max over the image;
4. MONOCHROME1 inverted so that high values are bright, as in MONOCHROME2.

Decoding at the size preprocessing needs (``target_size``): JPEG data -- JPEG files and single-frame 8-bit
JPEG Baseline DICOM (colour, or gray under a window or VOI LUT) -- is decoded with libjpeg's DCT scaling
(1/2, 1/4 or 1/8, Pillow's ``draft``) to the smallest scale whose image still covers the tile, then resized
as usual. A 1/8-scale decode reads only the DC coefficient of each 8x8 block (the block mean): no inverse
DCT, no full-size float array (the entropy decoding of every block remains). The tile differs from
full-decode-then-resize by about 0.5 grey levels on average and by up to 16 at sharp edges
(tests/test_decode_at_size.py states the bounds). Other sources are block-averaged in Pillow before the
intensity mapping where that is exact (``resize.box_reduce``), which gives the same tiles up to float32
rounding. ``ImageInfo`` still reports the stored size. JPEG 2000, JPEG-LS and lossless JPEG DICOM decode at
full size: pylibjpeg-openjpeg and pylibjpeg-libjpeg expose no reduced-resolution option through pydicom.

PNG/JPEG/TIFF: 8-bit divides by 255; 16-bit PNG (PadChest: 10 or 12 bits stored in 16, the stored depth is not
in the file) is min-max scaled, like a DICOM without a window, so a 12-bit image is not left at 1/16
brightness.

Hostile files (``docs/quarantine.md``): a file is opened only when it is a regular file that resolves, after
symlinks, inside the site's data root (``check_file``); its header is read first and nothing is decoded
when it declares more than ``DecodeLimits`` allow (pixels, bits, frames, file and inflated bytes, and for
JPEG / JPEG 2000 DICOMs the codestream's own size): those checks are ``preprocessing.decode_limits``. NaN or
infinite rescale or window values, constant images and images a window turns into one value are rejected
after decoding. The per-file time limit is enforced by the worker pool (``preprocessing.pool``), which can
kill a stuck decoder.

This module picks the decoder by the file's signature (``preprocessing.decode_dicom``,
``preprocessing.decode_pillow``) and checks what comes back. Every failure is a ``DecodeError``
(``preprocessing.decoded``) carrying the quarantine ``Reason`` and a detail naming the file.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from preprocessing.decode_dicom import decode_dicom
from preprocessing.decode_limits import DEFAULT_LIMITS, DecodeLimits, check_file
from preprocessing.decode_pillow import decode_pillow
from preprocessing.decoded import DecodedImage, DecodeError, ImageInfo
from preprocessing.quarantine import Reason

# Part of the shard content hash: bump it whenever decoded intensities can change for the same file.
DECODER_VERSION = "3"  # 3: decoded at the tile size (JPEG DCT scaling)


# Modality (0008,0060) values a task accepts; a file without the tag (PNG, JPEG, sparse DICOM) is accepted.
# XC (external-camera photography) is what dermoscopy DICOMs such as SIIM-ISIC 2020 carry; OT is "other".
ALLOWED_MODALITIES: dict[str, frozenset[str]] = {
    "chest-xray": frozenset({"CR", "DX", "DR"}),
    "melanoma": frozenset({"XC", "OT", "GM"}),
}


_PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
_JPEG_MAGIC = b"\xff\xd8\xff"
_TIFF_MAGICS = (b"II*\x00", b"MM\x00*", b"II+\x00", b"MM\x00+")  # classic and BigTIFF, both byte orders
_DICOM_SUFFIXES = (".dcm", ".dicom", ".dic")


# ITU-R BT.601 luma, the weights Pillow's RGB -> L conversion uses, so a colour file fed to a grayscale
# task looks the same whichever library converted it.
_LUMA = np.array([0.299, 0.587, 0.114], dtype=np.float32)


def decode_image(
    path: str | Path,
    *,
    channels: int | None = None,
    allowed_modalities: frozenset[str] | None = None,
    min_size: int = 0,
    root: str | Path | None = None,
    limits: DecodeLimits = DEFAULT_LIMITS,
    target_size: int | None = None,
    body_parts: tuple[Sequence[str], Sequence[str]] | None = None,
) -> DecodedImage:
    """Decode ``path`` to float32 in [0, 1].

    ``channels`` (1 or 3) converts colour to luma or replicates gray; None keeps what the file holds.
    ``allowed_modalities`` rejects a DICOM whose Modality is present and not listed (WRONG_MODALITY).
    ``min_size`` rejects images whose shorter side is below it (IMAGE_TOO_SMALL).
    ``root``: the site's data root; a file resolving outside it is never opened (OUTSIDE_ROOT).
    ``limits``: what the header may declare (TOO_LARGE); ``timeout_s`` is the caller's to enforce.
    ``target_size``: the longer side the caller resizes to; the pixels may then come back smaller than
    stored but never below it (see the module docstring); None decodes at full size.
    ``body_parts``: the task's (BodyPartExamined values, Anatomic Region codes), ``preprocessing.body_parts``; a
    DICOM naming another body part is rejected (WRONG_BODY_PART); None accepts any.
    Raises ``DecodeError`` with the quarantine reason on any failure.
    """
    path = Path(path)
    if channels not in (None, 1, 3):
        raise ValueError(f"channels must be 1, 3 or None, got {channels!r}")
    resolved, size = check_file(path, root)
    if size > limits.max_file_bytes:
        raise DecodeError(
            Reason.TOO_LARGE, f"{path}: {size:,} bytes, more than max_file_bytes={limits.max_file_bytes:,}"
        )
    try:
        with resolved.open("rb") as handle:
            head = handle.read(132)
    except OSError as err:
        raise DecodeError(Reason.UNREADABLE_FILE, f"{path}: {err}") from None

    # "DICM" first: a DICOM preamble may hold a TIFF header (dual-personality files) and is then a DICOM.
    if head[128:132] == b"DICM":
        pixels, info = decode_dicom(resolved, path, allowed_modalities, limits, target_size, body_parts)
    elif head.startswith((_PNG_MAGIC, _JPEG_MAGIC, *_TIFF_MAGICS)):
        pixels, info = decode_pillow(resolved, path, limits, target_size)
    elif path.suffix.lower() in _DICOM_SUFFIXES:
        pixels, info = decode_dicom(resolved, path, allowed_modalities, limits, target_size, body_parts)
    else:
        raise DecodeError(
            Reason.UNREADABLE_FILE,
            f"{path}: not a DICOM, PNG, JPEG or TIFF file (starts with {head[:8]!r}, {len(head)} bytes read)",
        )

    if min(info.rows, info.columns) < min_size:
        raise DecodeError(
            Reason.IMAGE_TOO_SMALL,
            f"{path}: {info.rows}x{info.columns} pixels, the shorter side is below min_image_size={min_size}",
        )
    check_values(pixels, info, path)
    return DecodedImage(_to_channels(pixels, channels), info)


def check_values(pixels: np.ndarray, info: ImageInfo, path: Path) -> None:
    """Reject decoded images that carry no picture: NaN/inf values, one stored value, one value after VOI."""
    if not (np.isfinite(info.raw_min) and np.isfinite(info.raw_max) and np.isfinite(pixels).all()):
        raise DecodeError(Reason.NONFINITE_VALUES, f"{path}: NaN or infinite pixel values")
    per_channel = pixels.reshape(-1, pixels.shape[2]) if pixels.ndim == 3 else pixels.reshape(-1, 1)
    if not (per_channel.min(axis=0) == per_channel.max(axis=0)).all():
        return
    # No VOI transform applies to colour, so one colour everywhere means one stored value everywhere.
    if info.raw_min == info.raw_max or pixels.ndim == 3:
        raise DecodeError(Reason.CONSTANT_IMAGE, f"{path}: every pixel stores the same value")
    raise DecodeError(
        Reason.BLANK_AFTER_WINDOW,
        f"{path}: stored values {info.raw_min:g}..{info.raw_max:g} all become {float(pixels.min()):g} "
        f"after the {info.intensity} transform (the window lies outside the data)",
    )


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
    quarantine reason and detail); never raises for a bad file. Without a site there is no data root: only
    the regular-file check and the default limits apply.
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
