"""Hostile files (``docs/quarantine.md``): where a file may be and what it may declare before anything is
decoded -- a regular file inside the site's data root, header sizes within ``DecodeLimits``, a deflated
data set that inflates within them, a JPEG / JPEG 2000 codestream that declares no more pixels."""

from __future__ import annotations

import functools
import os
import stat
import zlib
from pathlib import Path

import pydantic
import pydicom
from pydicom.encaps import generate_fragmented_frames
from pydicom.errors import InvalidDicomError

from preprocessing.decoded import DecodeError
from preprocessing.quarantine import Reason


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


def check_declared(shown: Path, rows: int, columns: int, bits: int, frames: int, limits: DecodeLimits) -> None:
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


def check_inflated_size(path: Path, shown: Path, limits: DecodeLimits) -> None:
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


def check_dicom_header(header: pydicom.Dataset, shown: Path, limits: DecodeLimits) -> None:
    try:
        rows, columns = int(header.get("Rows", 0) or 0), int(header.get("Columns", 0) or 0)
        bits = int(header.get("BitsAllocated", 0) or 0)
        frames = int(header.get("NumberOfFrames", 1) or 1)
    except (TypeError, ValueError) as err:
        raise DecodeError(Reason.UNREADABLE_FILE, f"{shown}: unreadable image size in the header: {err}") from None
    check_declared(shown, rows, columns, bits, frames, limits)


def check_codestream(pixel_data: bytes, frames: int, shown: Path, limits: DecodeLimits) -> None:
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
