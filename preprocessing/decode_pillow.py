"""PNG, JPEG and TIFF through Pillow (see ``preprocessing.decode``): 8-bit divides by 255, 16-bit is min-max
scaled; JPEG decoded with DCT scaling at the tile size (``draft_at_least``), other modes block-averaged first."""

from __future__ import annotations

import math
import warnings
from pathlib import Path

import numpy as np
from PIL import Image, UnidentifiedImageError

from preprocessing.decode_limits import DecodeLimits, check_declared
from preprocessing.decoded import DecodeError, ImageInfo, scale_to_unit
from preprocessing.quarantine import Reason
from preprocessing.resize import box_reduce

# Pillow modes whose bands convert to float planes exactly (8-bit gray and colour, 16-bit gray).
_REDUCIBLE_MODES = ("L", "RGB", "I;16", "I;16B", "I;16L")


# Bits per sample of each Pillow mode; modes not listed (P, 1, RGB...) hold at most 8.
_PILLOW_MODE_BITS = {"I": 32, "F": 32, "I;16": 16, "I;16B": 16, "I;16L": 16, "I;16N": 16, "I;16S": 16}


def _check_pillow_header(image: Image.Image, shown: Path, limits: DecodeLimits) -> None:
    """TOO_LARGE from what ``Image.open`` parsed (size, mode, frames), before ``load`` allocates anything."""
    columns, rows = image.size
    bits = _PILLOW_MODE_BITS.get(image.mode, 8)
    frames = int(getattr(image, "n_frames", 1))
    check_declared(shown, rows, columns, bits, frames, limits)


def decode_pillow(
    path: Path, shown: Path, limits: DecodeLimits, target_size: int | None
) -> tuple[np.ndarray, ImageInfo]:
    try:
        with warnings.catch_warnings():
            # Pillow warns about large images at open; the limits below decide, before anything is decoded.
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            image = Image.open(path)
    except Image.DecompressionBombError as err:
        raise DecodeError(Reason.TOO_LARGE, f"{shown}: {err}") from None
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as err:
        raise DecodeError(Reason.UNREADABLE_FILE, f"{shown}: {err}") from None
    try:
        with image:
            _check_pillow_header(image, shown, limits)
            columns, rows = image.size
            if target_size:
                draft_at_least(image, target_size)
            image.load()
            mode = image.mode
            file_format = (image.format or "").lower()
            if target_size and mode in _REDUCIBLE_MODES:
                stored, eight_bit = _reduced_bands(image, target_size), mode in ("L", "RGB")
                # 16-bit is min-max scaled by the stored extremes, which block means do not keep; 8-bit is
                # divided by 255, and scanning the full image for its extremes would cost a sixth of a PNG
                # decode: those report the decoded blocks'.
                raw_min, raw_max = (None, None) if eight_bit else _extrema(image)
            else:
                stored = np.asarray(image)
                eight_bit = stored.dtype == np.uint8
                raw_min = raw_max = None
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as err:
        raise DecodeError(Reason.UNREADABLE_FILE, f"{shown}: {err}") from None

    if mode == "P" or mode == "PA":
        raise DecodeError(Reason.UNREADABLE_FILE, f"{shown}: palette image (mode {mode}) is not a photograph")
    if stored.ndim == 3 and stored.shape[2] == 4:
        stored = stored[..., :3]  # an alpha channel carries no intensity
    if stored.ndim == 3 and stored.shape[2] == 2:
        stored = stored[..., 0]  # LA: luminance plus alpha
    if raw_min is None:
        raw_min, raw_max = float(stored.min()), float(stored.max())
    if eight_bit or mode == "1":
        pixels = stored.astype(np.float32) / np.float32(255.0 if mode != "1" else 1.0)
        intensity, bits = "fixed", 8 if mode != "1" else 1
    else:
        # The stored extremes, not the block averages', so reducing first maps intensities the same way.
        pixels, intensity, bits = scale_to_unit(stored.astype(np.float32), raw_min, raw_max), "minmax", 16
    info = ImageInfo(
        path=str(shown),
        format="jpeg" if file_format in ("jpeg", "mpo") else file_format,
        modality=None,
        photometric=mode,
        bits_stored=bits,
        transfer_syntax=None,
        rows=rows,
        columns=columns,
        frames=1,
        intensity=intensity,
        inverted=False,
        raw_min=raw_min,
        raw_max=raw_max,
        bits_allocated=bits,
    )
    return pixels, info


def _reduced_bands(image: Image.Image, target_size: int) -> np.ndarray:
    """Each band as a float plane, block-averaged in Pillow the way ``resize_to_square`` starts: the
    full-size float array is never made (exact: averaging is linear, the intensity mapping comes after)."""
    bands = [np.asarray(box_reduce(band.convert("F"), target_size))
             for band in (image.split() if len(image.getbands()) > 1 else (image,))]
    return bands[0] if len(bands) == 1 else np.stack(bands, axis=2)


def _extrema(image: Image.Image) -> tuple[float, float]:
    extrema = image.getextrema()
    if isinstance(extrema[0], tuple):
        return float(min(low for low, _ in extrema)), float(max(high for _, high in extrema))
    return float(extrema[0]), float(extrema[1])


def draft_at_least(image: Image.Image, target_size: int) -> None:
    """Ask Pillow's JPEG decoder (a no-op for other formats) for the strongest DCT scaling whose result still
    covers what ``resize_to_square(..., target_size)`` keeps of ``image``: the longer side scaled to
    ``target_size``, rounded up, so the resize after it only ever shrinks."""
    width, height = image.size
    scale = target_size / max(width, height)
    if scale < 1:
        image.draft(image.mode, (max(1, math.ceil(width * scale)), max(1, math.ceil(height * scale))))
