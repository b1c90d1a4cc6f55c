"""DICOM through pydicom (docs/datasets.md section 10; the steps are listed in ``preprocessing.decode``):
header limits first, then pixel data, Modality LUT, VOI LUT or window, MONOCHROME1 inverted; single-frame
8-bit JPEG Baseline decoded with DCT scaling at the tile size."""

from __future__ import annotations

import io
import zlib
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pydicom
from PIL import Image
from pydicom.encaps import generate_frames
from pydicom.errors import InvalidDicomError
from pydicom.pixels import apply_modality_lut, apply_voi, apply_windowing, get_decoder
from pydicom.uid import JPEGBaseline8Bit

from preprocessing.body_parts import body_parts_named, outside_body_parts
from preprocessing.decode_limits import DecodeLimits, check_codestream, check_dicom_header, check_inflated_size
from preprocessing.decode_pillow import draft_at_least
from preprocessing.decoded import DecodeError, ImageInfo, minmax, scale_to_unit
from preprocessing.quarantine import Reason


def _decode_dicom_jpeg_at_size(ds: pydicom.Dataset, target_size: int) -> np.ndarray | None:
    """The single frame of an 8-bit JPEG Baseline DICOM decoded with DCT scaling, as ``pixel_array`` would
    return it (uint8, YBR converted to RGB); None where this path does not apply and ``pixel_array`` must."""
    photometric = _photometric(ds)
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


def decode_dicom(
    path: Path,
    shown: Path,
    allowed_modalities: frozenset[str] | None,
    limits: DecodeLimits,
    target_size: int | None,
    body_parts: tuple[Sequence[str], Sequence[str]] | None = None,
) -> tuple[np.ndarray, ImageInfo]:
    """The DICOM file at ``path`` (``shown``: its name in messages, as the label file has it) as float32 pixels in
    [0, 1] and what was read from it; anything else a DecodeError whose reason says why it is quarantined. At
    ``target_size`` an 8-bit JPEG Baseline frame is decoded at the smallest DCT scale that keeps that size.
    ``body_parts``: the BodyPartExamined values and Anatomic Region codes accepted (``preprocessing.body_parts``);
    a file naming another is WRONG_BODY_PART before its pixels are decoded."""
    ds = _read_dataset(path, shown, limits)
    modality = _image_modality(ds, shown, allowed_modalities)
    if body_parts is not None and (outside := outside_body_parts(ds, *body_parts)):
        accepted = ", ".join(body_parts[0]) or "any"
        raise DecodeError(
            Reason.WRONG_BODY_PART,
            f"{shown}: {', '.join(outside)}; the task reads {accepted} (BodyPartExamined) only",
        )
    transfer_syntax = _decodable_transfer_syntax(ds, shown)
    frames = int(ds.get("NumberOfFrames", 1) or 1)
    stored = _stored_pixels(ds, transfer_syntax, frames, shown, limits, target_size)
    raw_min, raw_max = float(stored.min()), float(stored.max())
    pixels, intensity, inverted = _displayed(stored, ds, shown)
    info = ImageInfo(
        path=str(shown),
        format="dicom",
        modality=modality,
        photometric=_photometric(ds),
        bits_stored=int(ds.get("BitsStored", 0) or 0),
        transfer_syntax=str(transfer_syntax.name),
        rows=int(ds.get("Rows") or stored.shape[0]),
        columns=int(ds.get("Columns") or stored.shape[1]),
        frames=frames,
        intensity=intensity,
        inverted=inverted,
        raw_min=raw_min,
        raw_max=raw_max,
        manufacturer=str(ds.get("Manufacturer", "") or "").strip() or None,
        bits_allocated=int(ds.get("BitsAllocated", 0) or 0),
        body_part="; ".join(part for named in body_parts_named(ds) for part in named) or None,
        view_position=str(ds.get("ViewPosition", "") or "").strip().upper() or None,
    )
    return np.clip(pixels, 0.0, 1.0, out=pixels), info


def _read_dataset(path: Path, shown: Path, limits: DecodeLimits) -> pydicom.Dataset:
    """The file read as DICOM once its inflated size and its header's declared sizes are within ``limits``."""
    try:
        check_inflated_size(path, shown, limits)
        # The header first (up to the pixel data): its declared sizes decide whether the rest is read.
        # force: some archives store DICOM without the 128-byte preamble; the check below catches garbage.
        check_dicom_header(pydicom.dcmread(path, force=True, stop_before_pixels=True), shown, limits)
        ds = pydicom.dcmread(path, force=True)
        identified = "SOPClassUID" in ds or "PixelData" in ds
    except (InvalidDicomError, OSError, ValueError, EOFError, KeyError, TypeError, zlib.error) as err:
        raise DecodeError(Reason.UNREADABLE_FILE, f"{shown}: pydicom cannot parse it: {err}") from None
    if not identified:
        raise DecodeError(Reason.UNREADABLE_FILE, f"{shown}: not a DICOM file (no SOP Class UID, no pixel data)")
    return ds


def _image_modality(ds: pydicom.Dataset, path: Path, allowed_modalities: frozenset[str] | None) -> str | None:
    """The object's Modality, once it is an image of an allowed one."""
    # Without pixel data first: a report or a presentation state is no image whatever its Modality (SR, PR).
    if not any(tag in ds for tag in ("PixelData", "FloatPixelData", "DoubleFloatPixelData")):
        sop_class = ds.get("SOPClassUID")
        kind = sop_class.name if sop_class is not None else "unknown SOP class"
        raise DecodeError(Reason.NOT_AN_IMAGE, f"{path}: DICOM object without pixel data ({kind})")
    modality = str(ds.get("Modality", "") or "").strip().upper() or None
    if allowed_modalities is not None and modality is not None and modality not in allowed_modalities:
        raise DecodeError(
            Reason.WRONG_MODALITY,
            f"{path}: Modality {modality!r}, expected one of {sorted(allowed_modalities)}",
        )
    return modality


def _decodable_transfer_syntax(ds: pydicom.Dataset, path: Path) -> pydicom.uid.UID:
    """The file meta's transfer syntax, once a decoder for it is installed."""
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
    return transfer_syntax


def _stored_pixels(ds: pydicom.Dataset, transfer_syntax: pydicom.uid.UID, frames: int, path: Path,
                   limits: DecodeLimits, target_size: int | None) -> np.ndarray:
    """The first frame's stored values (rows x columns, or x 3 for colour), its compressed stream checked first."""
    if transfer_syntax.is_encapsulated:
        check_codestream(ds.PixelData, frames, path, limits)
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
    if stored.ndim not in (2, 3) or (stored.ndim == 3 and stored.shape[2] != 3):
        raise DecodeError(Reason.NOT_AN_IMAGE, f"{path}: pixel array of shape {stored.shape} is not one 2-D image")
    return stored


def _photometric(ds: pydicom.Dataset) -> str:
    return str(ds.get("PhotometricInterpretation", "")).strip().upper()


def _displayed(stored: np.ndarray, ds: pydicom.Dataset, path: Path) -> tuple[np.ndarray, str, bool]:
    """The stored values as displayed, in [0, 1]: gray through the Modality LUT and the VOI LUT or window,
    MONOCHROME1 inverted; colour scaled by its bit depth. With how the intensity was set and whether it was
    inverted."""
    if stored.ndim == 3:
        # Colour: pydicom already returns RGB for YBR_* data; no LUT or window applies to colour.
        depth = int(ds.get("BitsStored", 8))
        return stored.astype(np.float32) / np.float32(2**depth - 1), "fixed", False
    pixels, intensity = _grayscale_intensity(stored, ds, path)
    inverted = _photometric(ds) == "MONOCHROME1"
    return (1.0 - pixels if inverted else pixels), intensity, inverted


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
            return scale_to_unit(windowed, float(table.min()), float(table.max())), "voi_lut"
        if "WindowCenter" in ds and "WindowWidth" in ds:
            windowed = apply_windowing(values, ds)
            # A window maps everything below it to its output minimum and above it to its maximum.
            low, high = apply_windowing(np.array([-np.inf, np.inf]), ds)
            return scale_to_unit(windowed, float(low), float(high)), "window"
    except (ValueError, NotImplementedError, AttributeError, IndexError) as err:
        raise DecodeError(Reason.UNREADABLE_FILE, f"{path}: invalid VOI LUT or window: {err}") from None
    return minmax(values.astype(np.float32)), "minmax"
