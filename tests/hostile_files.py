"""Crafted hostile files for the tests: declared sizes far beyond what they hold, NaN rescales, leaks.

Each writer builds a real file byte by byte (or with pydicom / Pillow) without ever holding the image it
declares: a 20000 x 20000 RLE DICOM is 12.6 MB on disk and would be 800 MB decoded.
"""

from __future__ import annotations

import struct
import time
import warnings
import zlib
from pathlib import Path

import numpy as np
from PIL import Image
from pydicom.dataset import Dataset, FileMetaDataset
from pydicom.encaps import encapsulate
from pydicom.uid import (
    MPEG2MPML,
    BasicTextSRStorage,
    DeflatedExplicitVRLittleEndian,
    DigitalXRayImageStorageForPresentation,
    ExplicitVRLittleEndian,
    JPEG2000Lossless,
    RLELossless,
    generate_uid,
)

from preprocessing.decode import DecodeLimits, decode_image


def _png_chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def big_png(path: Path, rows: int, columns: int) -> Path:
    """A valid 8-bit grayscale PNG of ``rows`` x ``columns`` zeros (one pixel at 7), compressed as it streams."""
    compressor = zlib.compressobj(1)
    row = b"\x00" * (columns + 1)  # filter byte "none", then the row
    body = [compressor.compress(b"\x00\x07" + b"\x00" * (columns - 1))]
    for start in range(1, rows, 256):
        body.append(compressor.compress(row * min(256, rows - start)))
    body.append(compressor.flush())
    header = struct.pack(">IIBBBBB", columns, rows, 8, 0, 0, 0, 0)
    path.write_bytes(
        b"\x89PNG\r\n\x1a\n" + _png_chunk(b"IHDR", header) + _png_chunk(b"IDAT", b"".join(body)) + _png_chunk(b"IEND", b"")
    )
    return path


SLOW_PNG_SIDE = 13000  # 169 M pixels: just under Pillow's own decompression-bomb error (179 M)
SLOW_PNG_PIXELS = SLOW_PNG_SIDE**2


def slow_png(path: Path, target_size: int) -> tuple[Path, float]:
    """A PNG that is allowed (``max_pixels >= SLOW_PNG_PIXELS``) but slow to inflate, and a timeout it exceeds.

    The timeout is a quarter of this machine's own decode time, measured here at ``target_size``: a fixed
    figure raced the decoder (0.29 s against a 0.3 s timeout on a quiet machine) and failed on a fast one.
    """
    big_png(path, SLOW_PNG_SIDE, SLOW_PNG_SIDE)
    started = time.monotonic()
    decode_image(path, limits=DecodeLimits(max_pixels=SLOW_PNG_PIXELS), target_size=target_size)
    return path, round((time.monotonic() - started) / 4, 3)


def jpeg_declaring(path: Path, rows: int, columns: int) -> Path:
    """A small real JPEG whose frame header (SOF0) is rewritten to declare ``rows`` x ``columns``."""
    ramp = np.add.outer(np.arange(32), np.arange(32)).astype(np.uint8)
    Image.fromarray(ramp).save(path, quality=90)
    data = bytearray(path.read_bytes())
    sof = data.index(b"\xff\xc0")
    data[sof + 5 : sof + 9] = struct.pack(">HH", rows, columns)
    path.write_bytes(bytes(data))
    return path


def tiff_declaring(path: Path, rows: int, columns: int) -> Path:
    """A small real little-endian TIFF whose ImageWidth / ImageLength tags are rewritten."""
    Image.fromarray(np.add.outer(np.arange(32), np.arange(32)).astype(np.uint8)).save(path, format="TIFF")
    data = bytearray(path.read_bytes())
    assert data[:4] == b"II*\x00"
    ifd = struct.unpack_from("<I", data, 4)[0]
    for entry in range(struct.unpack_from("<H", data, ifd)[0]):
        at = ifd + 2 + 12 * entry
        tag, kind = struct.unpack_from("<HH", data, at)
        if tag in (256, 257):
            value = columns if tag == 256 else rows
            struct.pack_into("<H" if kind == 3 else "<I", data, at + 8, value)
    path.write_bytes(bytes(data))
    return path


def _dataset(rows: int, columns: int, syntax=ExplicitVRLittleEndian, bits: int = 16) -> Dataset:
    ds = Dataset()
    ds.file_meta = FileMetaDataset()
    ds.file_meta.TransferSyntaxUID = syntax
    ds.file_meta.MediaStorageSOPClassUID = DigitalXRayImageStorageForPresentation
    ds.file_meta.MediaStorageSOPInstanceUID = generate_uid()
    ds.SOPClassUID = DigitalXRayImageStorageForPresentation
    ds.SOPInstanceUID = ds.file_meta.MediaStorageSOPInstanceUID
    ds.Modality = "DX"
    ds.Rows, ds.Columns = rows, columns
    ds.SamplesPerPixel = 1
    ds.PhotometricInterpretation = "MONOCHROME2"
    ds.BitsAllocated, ds.BitsStored, ds.HighBit = bits, min(bits, 12), min(bits, 12) - 1
    ds.PixelRepresentation = 0
    return ds


def big_rle_dicom(path: Path, rows: int = 20000, columns: int = 20000) -> Path:
    """A valid RLE Lossless (PS3.5 Annex G) 16-bit black image: two byte-plane segments of PackBits runs."""
    run = bytes([0x81, 0])  # PackBits: repeat the next byte 128 times
    tail = columns % 128
    row = run * (columns // 128) + (bytes([(257 - tail) & 0xFF, 0]) if tail else b"")
    segment = row * rows
    header = struct.pack("<16I", 2, 64, 64 + len(segment), *([0] * 13))
    ds = _dataset(rows, columns, RLELossless)
    ds.PixelData = encapsulate([header + segment + segment])
    ds["PixelData"].VR = "OB"
    ds.save_as(path, enforce_file_format=True)
    return path


def dicom(path: Path, pixels: np.ndarray, syntax=ExplicitVRLittleEndian, **tags) -> Path:
    """A 12-bit DX image holding ``pixels``, with extra ``tags`` (invalid values allowed, as in the wild)."""
    ds = _dataset(*pixels.shape)
    ds.set_pixel_data(pixels.astype(np.uint16), "MONOCHROME2", 12)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # pydicom warns about NaN in a DS: that is the point
        for keyword, value in tags.items():
            setattr(ds, keyword, value)
    if syntax == JPEG2000Lossless:
        ds.compress(JPEG2000Lossless)
    elif syntax != ExplicitVRLittleEndian:
        ds.file_meta.TransferSyntaxUID = syntax
    ds.save_as(path, enforce_file_format=True)
    return path


def j2k_dicom_declaring(path: Path, rows: int, columns: int) -> Path:
    """A JPEG 2000 DICOM whose header says 64 x 64 and whose codestream SIZ declares ``rows`` x ``columns``."""
    ramp = np.add.outer(np.arange(64), np.arange(64)).astype(np.uint16) * 16
    dicom(path, ramp, JPEG2000Lossless)
    data = bytearray(path.read_bytes())
    siz = data.index(b"\xff\x4f\xff\x51")
    struct.pack_into(">II", data, siz + 8, columns, rows)
    path.write_bytes(bytes(data))
    return path


def deflated_dicom(path: Path, rows: int = 2000, columns: int = 2000) -> Path:
    """A Deflated Explicit VR Little Endian DICOM: a few kB on disk, ``rows * columns * 2`` bytes inflated."""
    pixels = np.zeros((rows, columns), dtype=np.uint16)
    pixels[0, 0] = 7
    return dicom(path, pixels, DeflatedExplicitVRLittleEndian)


def structured_report(path: Path) -> Path:
    """A Basic Text SR: a DICOM object without pixel data, no Modality tag."""
    ds = Dataset()
    ds.file_meta = FileMetaDataset()
    ds.file_meta.TransferSyntaxUID = ExplicitVRLittleEndian
    ds.file_meta.MediaStorageSOPClassUID = BasicTextSRStorage
    ds.file_meta.MediaStorageSOPInstanceUID = generate_uid()
    ds.SOPClassUID = BasicTextSRStorage
    ds.SOPInstanceUID = ds.file_meta.MediaStorageSOPInstanceUID
    ds.save_as(path, enforce_file_format=True)
    return path


def video_dicom(path: Path) -> Path:
    """MPEG-2 encapsulated data: no pixel data decoder exists for it."""
    ds = _dataset(64, 64, MPEG2MPML, bits=8)
    ds.PixelData = encapsulate([b"\x00\x00\x01\xb3" + b"\x00" * 60])
    ds["PixelData"].VR = "OB"
    ds.save_as(path, enforce_file_format=True)
    return path
