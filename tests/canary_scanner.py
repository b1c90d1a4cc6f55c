"""The privacy canary's scanner (tests/test_privacy_canary.py): finds the planted markers (plain, UTF-16, base64;
inside zip and gzip members too) and planted pixels (runs of the planted gray levels as uint8, float32 or float64
values, numbers in text, rendered PNGs) and image files in bytes."""

from __future__ import annotations

import base64
import gzip
import io
import re
import zipfile
from pathlib import Path

import numpy as np

MARK = "zqxcanary"
# The only pixel values of the planted images: no printable ASCII, no 0 or 255 (common padding bytes).
LEVELS = np.array([3, 17, 141, 151, 167, 181, 197, 233], dtype=np.uint8)
RUN = 16  # consecutive planted values that count as image content


def _needles() -> list[bytes]:
    mark = MARK.encode()
    needles = [mark, MARK.encode("utf-16-le")]
    for shift in range(3):  # base64 of the marker at each alignment, without the groups it shares
        encoded = base64.b64encode(b"\0" * shift + mark)
        needles.append(encoded[4 if shift else 0: -4])
    return needles


NEEDLES = _needles()
_NUMBER = re.compile(rb"-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?")


def _planted_run(values: np.ndarray, levels: np.ndarray, tolerance: float = 0.0, length: int = RUN) -> bool:
    """``length`` consecutive values that are all planted levels, at least three different ones (a run of one
    repeated byte is padding, not a picture)."""
    if tolerance:
        mask = np.zeros(len(values), dtype=bool)
        with np.errstate(invalid="ignore", over="ignore"):  # reinterpreted bytes hold NaN and inf
            for level in levels:
                mask |= np.abs(values - level) <= tolerance
    else:
        mask = np.isin(values, levels)
    edges = np.flatnonzero(np.diff(np.concatenate(([0], mask.astype(np.int8), [0]))))
    for start, end in zip(edges[::2], edges[1::2]):
        if end - start >= length:
            segment = values[start:end].astype(np.float64)
            nearest = np.abs(segment[:, None] - levels.astype(np.float64)[None, :]).argmin(axis=1)
            if len(np.unique(nearest)) >= 3:
                return True
    return False


def _pixel_runs(data: bytes) -> list[str]:
    """Planted pixels in ``data`` as uint8, float32, float64 (values / 255) or as numbers in text."""
    found = []
    if _planted_run(np.frombuffer(data, dtype=np.uint8), LEVELS):
        found.append("uint8 pixels")
    for dtype in (np.float32, np.float64):
        width = np.dtype(dtype).itemsize
        for offset in range(width):
            usable = (len(data) - offset) // width * width
            view = np.frombuffer(data[offset: offset + usable], dtype=dtype)
            # float64 copies of float32 pixels differ from v / 255 in float64 by ~1e-9
            if len(view) >= RUN and _planted_run(view, LEVELS / 255.0, tolerance=1e-7):
                found.append(f"{np.dtype(dtype).name} pixels")
                break
    numbers = np.array([float(m) for m in _NUMBER.findall(data) if len(m) < 32])
    if len(numbers) >= RUN and (_planted_run(numbers, LEVELS / 255.0, tolerance=1e-6)
                                or _planted_run(numbers, LEVELS.astype(float))):
        found.append("pixel values as text")
    return found


def _rendered_pixels(data: bytes) -> bool:
    """A picture showing planted images: rows of planted gray levels (r = g = b, +-1)."""
    from PIL import Image

    try:
        pixels = np.asarray(Image.open(io.BytesIO(data)).convert("RGB")).astype(np.int16)
    except Exception:  # not a picture Pillow reads
        return False
    gray = (np.abs(pixels[..., 0] - pixels[..., 1]) <= 1) & (np.abs(pixels[..., 1] - pixels[..., 2]) <= 1)
    return any(_planted_run(np.where(row_gray, row, -99), LEVELS, tolerance=1, length=24)
               for row_gray, row in zip(gray, pixels[..., 0]))


def scan_bytes(data: bytes, where: str, source_chunks: list[bytes]) -> list[str]:
    leaks = [f"{where}: marker {needle!r}" for needle in NEEDLES if needle in data]
    leaks += [f"{where}: {kind}" for kind in _pixel_runs(data)]
    if data[:8] == b"\x89PNG\r\n\x1a\n" and _rendered_pixels(data):
        leaks.append(f"{where}: a rendered picture of planted images")
    if data[:3] == b"\xff\xd8\xff" or data[128:132] == b"DICM":
        leaks.append(f"{where}: a JPEG or DICOM file")
    if any(chunk in data for chunk in source_chunks):
        leaks.append(f"{where}: bytes of a source image file")
    if data[:4] == b"PK\x03\x04":
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            for member in archive.namelist():
                leaks += scan_bytes(archive.read(member), f"{where}!{member}", source_chunks)
    elif data[:2] == b"\x1f\x8b":
        leaks += scan_bytes(gzip.decompress(data), f"{where}!gunzip", source_chunks)
    return leaks


def scan(paths: list[Path], source_chunks: list[bytes]) -> list[str]:
    leaks = []
    for path in paths:
        files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
        for file in files:
            leaks += scan_bytes(file.read_bytes(), str(file), source_chunks)
    return leaks
