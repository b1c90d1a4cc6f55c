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
JPEG / JPEG 2000 DICOMs the codestream's own size); NaN or infinite rescale or window values, constant
images and images a window turns into one value are rejected after decoding. The per-file time limit is
enforced by the worker pool (``preprocessing.pool``), which can kill a stuck decoder.

Every failure is a ``DecodeError`` carrying the quarantine ``Reason`` and a detail naming the file.
"""

from __future__ import annotations

import dataclasses
import functools
import io
import math
import os
import stat
import warnings
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pydantic
import pydicom
from PIL import Image, UnidentifiedImageError
from pydicom.encaps import generate_fragmented_frames, generate_frames
from pydicom.errors import InvalidDicomError
from pydicom.pixels import apply_modality_lut, apply_voi, apply_windowing, get_decoder
from pydicom.uid import JPEGBaseline8Bit

from preprocessing.quarantine import Reason
from preprocessing.resize import box_reduce

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
# Pillow modes whose bands convert to float planes exactly (8-bit gray and colour, 16-bit gray).
_REDUCIBLE_MODES = ("L", "RGB", "I;16", "I;16B", "I;16L")
# ITU-R BT.601 luma, the weights Pillow's RGB -> L conversion uses, so a colour file fed to a grayscale
# task looks the same whichever library converted it.
_LUMA = np.array([0.299, 0.587, 0.114], dtype=np.float32)


class DecodeError(Exception):
    """A file that cannot become a training image; ``reason`` is its quarantine reason."""

    def __init__(self, reason: Reason, detail: str):
        super().__init__(f"{reason.value}: {detail}")
        self.reason = reason
        self.detail = detail


@pydantic.dataclasses.dataclass(frozen=True, config=pydantic.ConfigDict(extra="forbid"))
class DecodeLimits:
    """What a file may declare before anything is decoded (``decode_limits:`` in a site YAML).

    The defaults fit the largest real inputs with room to spare (4320 x 4320 16-bit flat-panel radiographs,
    6000 x 4000 RGB dermoscopy photographs) and bound a decode worker's memory: see docs/quarantine.md.
    """

    max_pixels: int = pydantic.Field(36_000_000, ge=1)  # rows x columns of the decoded frame (6000 x 6000)
    max_bits: int = pydantic.Field(16, ge=1)  # bits per sample (DICOM BitsAllocated, Pillow mode)
    max_frames: int = pydantic.Field(1024, ge=1)  # frames in the file; only the first is decoded
    max_file_bytes: int = pydantic.Field(256 * 2**20, ge=1)  # the file, and a deflated DICOM once inflated
    timeout_s: float = pydantic.Field(60.0, gt=0)  # per file; enforced by the worker pool


DEFAULT_LIMITS = DecodeLimits()


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
    root: str | Path | None = None,
    limits: DecodeLimits = DEFAULT_LIMITS,
    target_size: int | None = None,
) -> DecodedImage:
    """Decode ``path`` to float32 in [0, 1].

    ``channels`` (1 or 3) converts colour to luma or replicates gray; None keeps what the file holds.
    ``allowed_modalities`` rejects a DICOM whose Modality is present and not listed (WRONG_MODALITY).
    ``min_size`` rejects images whose shorter side is below it (IMAGE_TOO_SMALL).
    ``root``: the site's data root; a file resolving outside it is never opened (OUTSIDE_ROOT).
    ``limits``: what the header may declare (TOO_LARGE); ``timeout_s`` is the caller's to enforce.
    ``target_size``: the longer side the caller resizes to; the pixels may then come back smaller than
    stored but never below it (see the module docstring); None decodes at full size.
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
        pixels, info = _decode_dicom(resolved, path, allowed_modalities, limits, target_size)
    elif head.startswith((_PNG_MAGIC, _JPEG_MAGIC, *_TIFF_MAGICS)):
        pixels, info = _decode_pillow(resolved, path, limits, target_size)
    elif path.suffix.lower() in _DICOM_SUFFIXES:
        pixels, info = _decode_dicom(resolved, path, allowed_modalities, limits, target_size)
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


def check_file(path: Path, root: str | Path | None) -> tuple[Path, int]:
    """The real path of ``path`` and its size, when it is a regular file inside ``root`` (if given).

    Decided by ``realpath`` and ``stat`` alone, before any open: opening a FIFO blocks forever and a
    device such as /dev/zero never ends. ``..`` in a label file, an absolute path and a symlink out of the
    root all resolve outside it.
    """
    resolved = Path(os.path.realpath(path))
    if root is not None:
        real_root = _real_root(str(root))
        if not resolved.is_relative_to(real_root):
            raise DecodeError(
                Reason.OUTSIDE_ROOT, f"{path}: resolves to {resolved}, outside the site's data root {real_root}"
            )
    try:
        status = os.stat(resolved)
    except FileNotFoundError:
        raise DecodeError(Reason.MISSING_FILE, f"{path}: file not found") from None
    except OSError as err:
        raise DecodeError(Reason.UNREADABLE_FILE, f"{path}: {err}") from None
    if not stat.S_ISREG(status.st_mode):
        raise DecodeError(Reason.NOT_A_REGULAR_FILE, f"{path}: {_file_kind(status.st_mode)}, not a regular file")
    return resolved, status.st_size


@functools.lru_cache(maxsize=16)
def _real_root(root: str) -> Path:
    """A site root's real path, resolved once per process rather than once per file."""
    return Path(os.path.realpath(root))


def _file_kind(mode: int) -> str:
    kinds = ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
             (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))
    return next((name for test, name in kinds if test(mode)), f"file type {stat.S_IFMT(mode):o}")


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


# Bits per sample of each Pillow mode; modes not listed (P, 1, RGB...) hold at most 8.
_PILLOW_MODE_BITS = {"I": 32, "F": 32, "I;16": 16, "I;16B": 16, "I;16L": 16, "I;16N": 16, "I;16S": 16}


def _check_pillow_header(image: Image.Image, shown: Path, limits: DecodeLimits) -> None:
    """TOO_LARGE from what ``Image.open`` parsed (size, mode, frames), before ``load`` allocates anything."""
    columns, rows = image.size
    bits = _PILLOW_MODE_BITS.get(image.mode, 8)
    frames = int(getattr(image, "n_frames", 1))
    _check_declared(shown, rows, columns, bits, frames, limits)


def _check_declared(shown: Path, rows: int, columns: int, bits: int, frames: int, limits: DecodeLimits) -> None:
    problems = []
    if rows * columns > limits.max_pixels:
        problems.append(f"{rows}x{columns} pixels, more than max_pixels={limits.max_pixels:,}")
    if bits > limits.max_bits:
        problems.append(f"{bits} bits per sample, more than max_bits={limits.max_bits}")
    if frames > limits.max_frames:
        problems.append(f"{frames} frames, more than max_frames={limits.max_frames}")
    if problems:
        raise DecodeError(
            Reason.TOO_LARGE, f"{shown}: the header declares {'; '.join(problems)} (decode_limits in the site YAML)"
        )


def _decode_pillow(
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
        pixels, intensity, bits = _scale(stored.astype(np.float32), raw_min, raw_max), "minmax", 16
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


def _decode_dicom_jpeg_at_size(ds: pydicom.Dataset, target_size: int) -> np.ndarray | None:
    """The single frame of an 8-bit JPEG Baseline DICOM decoded with DCT scaling, as ``pixel_array`` would
    return it (uint8, YBR converted to RGB); None where this path does not apply and ``pixel_array`` must."""
    photometric = str(ds.get("PhotometricInterpretation", "")).strip().upper()
    samples = int(ds.get("SamplesPerPixel", 1) or 1)
    applies = (
        int(ds.get("NumberOfFrames", 1) or 1) == 1
        and int(ds.get("BitsAllocated", 0) or 0) == 8
        and int(ds.get("PixelRepresentation", 0) or 0) == 0
        # Gray: only under a window or VOI LUT; without one the intensities are min-max scaled by the
        # stored extremes, which block means do not keep. Colour: Pillow converts 3-component JPEG from YCbCr
        # to RGB, what pydicom does for YBR_FULL(_422); RGB stored as RGB keeps pydicom's full decode.
        and ((samples == 1 and photometric in ("MONOCHROME1", "MONOCHROME2")
              and (("WindowCenter" in ds and "WindowWidth" in ds) or bool(ds.get("VOILUTSequence"))))
             or (samples == 3 and photometric in ("YBR_FULL", "YBR_FULL_422")))
    )
    if not applies:
        return None
    frame = next(generate_frames(ds.PixelData, number_of_frames=1))
    with Image.open(io.BytesIO(frame), formats=("JPEG",)) as image:
        if image.size != (int(ds.Columns), int(ds.Rows)) or "adobe_transform" in image.info:
            return None  # inconsistent with the header, or colour Pillow would interpret differently
        draft_at_least(image, target_size)
        image.load()
        return np.asarray(image)


def _decode_dicom(
    path: Path,
    shown: Path,
    allowed_modalities: frozenset[str] | None,
    limits: DecodeLimits,
    target_size: int | None,
) -> tuple[np.ndarray, ImageInfo]:
    try:
        _check_inflated_size(path, shown, limits)
        # The header first (up to the pixel data): its declared sizes decide whether the rest is read.
        # force: some archives store DICOM without the 128-byte preamble; the check below catches garbage.
        _check_dicom_header(pydicom.dcmread(path, force=True, stop_before_pixels=True), shown, limits)
        ds = pydicom.dcmread(path, force=True)
        identified = "SOPClassUID" in ds or "PixelData" in ds
    except (InvalidDicomError, OSError, ValueError, EOFError, KeyError, TypeError, zlib.error) as err:
        raise DecodeError(Reason.UNREADABLE_FILE, f"{shown}: pydicom cannot parse it: {err}") from None
    path = shown  # from here on messages name the file as the label file does
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
    if transfer_syntax.is_encapsulated:
        _check_codestream(ds.PixelData, frames, path, limits)
    try:
        stored = None
        if target_size and transfer_syntax == JPEGBaseline8Bit:
            stored = _decode_dicom_jpeg_at_size(ds, target_size)
        if stored is None:
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
        rows=int(ds.get("Rows") or stored.shape[0]),
        columns=int(ds.get("Columns") or stored.shape[1]),
        frames=frames,
        intensity=intensity,
        inverted=inverted,
        raw_min=raw_min,
        raw_max=raw_max,
    )
    return np.clip(pixels, 0.0, 1.0, out=pixels), info


def _check_inflated_size(path: Path, shown: Path, limits: DecodeLimits) -> None:
    """A deflated DICOM is inflated whole by pydicom: inflate it here first, stopping at max_file_bytes.

    The data set starts after the preamble, "DICM" and the file meta group (its length is element
    (0002,0000), 12 bytes in Explicit VR Little Endian: PS3.10 7.1).
    """
    try:
        meta = pydicom.filereader.read_file_meta_info(path)
    except InvalidDicomError:
        return  # no file meta, so no deflated transfer syntax; dcmread's force decides the rest
    if meta.get("TransferSyntaxUID") != pydicom.uid.DeflatedExplicitVRLittleEndian:
        return
    if "FileMetaInformationGroupLength" not in meta:
        raise DecodeError(Reason.UNREADABLE_FILE, f"{shown}: deflated DICOM without (0002,0000) group length")
    inflater = zlib.decompressobj(-zlib.MAX_WBITS)
    inflated = 0
    with path.open("rb") as handle:
        handle.seek(132 + 12 + int(meta.FileMetaInformationGroupLength))
        for block in iter(lambda: handle.read(1 << 20), b""):
            inflated += len(inflater.decompress(block, limits.max_file_bytes + 1 - inflated))
            if inflated > limits.max_file_bytes or inflater.unconsumed_tail:
                raise DecodeError(
                    Reason.TOO_LARGE,
                    f"{shown}: the deflated data set inflates to more than max_file_bytes={limits.max_file_bytes:,}",
                )


def _check_dicom_header(header: pydicom.Dataset, shown: Path, limits: DecodeLimits) -> None:
    try:
        rows, columns = int(header.get("Rows", 0) or 0), int(header.get("Columns", 0) or 0)
        bits = int(header.get("BitsAllocated", 0) or 0)
        frames = int(header.get("NumberOfFrames", 1) or 1)
    except (TypeError, ValueError) as err:
        raise DecodeError(Reason.UNREADABLE_FILE, f"{shown}: unreadable image size in the header: {err}") from None
    _check_declared(shown, rows, columns, bits, frames, limits)


def _check_codestream(pixel_data: bytes, frames: int, shown: Path, limits: DecodeLimits) -> None:
    """TOO_LARGE when the first frame's JPEG or JPEG 2000 codestream declares more pixels than allowed.

    Those decoders size their output from the codestream, not from the DICOM Rows and Columns, so a file
    whose header is small can still ask for gigabytes.
    """
    try:
        first = next(generate_fragmented_frames(pixel_data, number_of_frames=frames))[0]
    except (StopIteration, ValueError, IndexError, TypeError):
        return  # the decoder reports broken encapsulation as unreadable
    size = codestream_size(first)
    if size is not None and size[0] * size[1] > limits.max_pixels:
        raise DecodeError(
            Reason.TOO_LARGE,
            f"{shown}: the compressed frame declares {size[0]}x{size[1]} pixels, "
            f"more than max_pixels={limits.max_pixels:,} (decode_limits in the site YAML)",
        )


# JPEG start-of-frame markers (ITU-T T.81 Table B.1: SOF0-3, 5-7, 9-11, 13-15) and JPEG-LS SOF55 (T.87).
_SOF_MARKERS = frozenset({0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF, 0xF7})
_JP2_SIGNATURE = b"\x00\x00\x00\x0cjP  "


def codestream_size(data: bytes) -> tuple[int, int] | None:
    """(rows, columns) a JPEG / JPEG-LS (T.81 B.2.2 frame header) or JPEG 2000 (15444-1 A.5.1 SIZ, raw or
    in a JP2 file's ``jp2c`` box) codestream declares; None when ``data`` is neither or is cut short."""
    if data.startswith(_JP2_SIGNATURE):
        offset = 0
        while offset + 8 <= len(data):
            length = int.from_bytes(data[offset : offset + 4], "big")
            header = 8
            if length == 1:
                length, header = int.from_bytes(data[offset + 8 : offset + 16], "big"), 16
            if data[offset + 4 : offset + 8] == b"jp2c":
                return codestream_size(data[offset + header :])
            if length < header:
                return None
            offset += length
        return None
    if data[:4] == b"\xff\x4f\xff\x51" and len(data) >= 28:
        xsiz, ysiz, xosiz, yosiz = (int.from_bytes(data[k : k + 4], "big") for k in (8, 12, 16, 20))
        return ysiz - yosiz, xsiz - xosiz
    if data[:2] != b"\xff\xd8":
        return None
    offset = 2
    while offset + 4 <= len(data):
        if data[offset] != 0xFF:
            return None
        marker = data[offset + 1]
        if marker == 0xFF:  # fill byte before a marker
            offset += 1
            continue
        if marker in _SOF_MARKERS:
            if offset + 9 > len(data):
                return None
            return int.from_bytes(data[offset + 5 : offset + 7], "big"), int.from_bytes(data[offset + 7 : offset + 9], "big")
        offset += 2 + int.from_bytes(data[offset + 2 : offset + 4], "big")
    return None


def _check_rescale_and_window(ds: pydicom.Dataset, path: Path) -> None:
    for keyword in ("RescaleSlope", "RescaleIntercept", "WindowCenter", "WindowWidth"):
        value = ds.get(keyword)
        if value is None or value == "":
            continue
        values = value if isinstance(value, pydicom.multival.MultiValue) else [value]
        try:
            finite = all(np.isfinite(float(v)) for v in values)
        except (TypeError, ValueError):
            raise DecodeError(Reason.UNREADABLE_FILE, f"{path}: {keyword} {value!r} is not a number") from None
        if not finite:
            raise DecodeError(Reason.NONFINITE_VALUES, f"{path}: {keyword} is {value}, not a finite number")


def _grayscale_intensity(stored: np.ndarray, ds: pydicom.Dataset, path: Path) -> tuple[np.ndarray, str]:
    """Modality LUT then VOI, scaled to [0, 1] over the VOI output range (DICOM PS3.3 C.11)."""
    _check_rescale_and_window(ds, path)
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
