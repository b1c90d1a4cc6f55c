"""Image files in the types the real releases use: 8-bit JPEG/PNG, 16-bit PNG, grayscale and RGB DICOM.

Files are byte-for-byte deterministic: no timestamps, and DICOM UIDs derived from the file's path and
the generation seed (``pydicom.uid.generate_uid`` with fixed entropy sources).
"""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
from PIL import Image
from pydicom.dataset import Dataset, FileMetaDataset
from pydicom.encaps import encapsulate
from pydicom.uid import (
    DigitalXRayImageStorageForPresentation,
    ExplicitVRLittleEndian,
    JPEGBaseline8Bit,
    VLPhotographicImageStorage,
    generate_uid,
)

FILE_TYPES = ("jpeg", "png8", "png16", "dicom", "dicom-rgb", "jpeg-rgb")


def to_uint8(image: np.ndarray) -> np.ndarray:
    return (np.clip(image, 0.0, 1.0) * 255.0 + 0.5).astype(np.uint8)


def write_image(path: Path, file_type: str, image: np.ndarray, *, jpeg_quality: int = 90, bits: int = 12,
                monochrome1: bool = False, window: bool = False, manufacturer: str | None = None,
                uid_seed: str = "") -> None:
    """Write ``image`` (float [0, 1] grayscale, or uint8 RGB for the ``-rgb`` types) as ``file_type``.

    ``manufacturer``: a grayscale DICOM's Manufacturer tag (none written when None).
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    # PNGs at zlib level 1: noisy 16-bit data costs 35 ms per image at the default level, 5 ms here.
    if file_type == "jpeg":
        Image.fromarray(to_uint8(image), mode="L").save(path, format="JPEG", quality=jpeg_quality)
    elif file_type == "png8":
        Image.fromarray(to_uint8(image), mode="L").save(path, format="PNG", compress_level=1)
    elif file_type == "png16":
        # PadChest: 10 or 12 significant bits in a 16-bit PNG, the stored depth not recorded in the file.
        stored = np.round(np.clip(image, 0.0, 1.0) * (2**bits - 1)).astype(np.uint16)
        Image.fromarray(stored).save(path, format="PNG", compress_level=1)
    elif file_type == "jpeg-rgb":
        Image.fromarray(image, mode="RGB").save(path, format="JPEG", quality=jpeg_quality)
    elif file_type == "dicom":
        _write_gray_dicom(path, image, bits=bits, monochrome1=monochrome1, window=window, manufacturer=manufacturer,
                          uid_seed=uid_seed)
    elif file_type == "dicom-rgb":
        _write_rgb_dicom(path, image, jpeg_quality=jpeg_quality, uid_seed=uid_seed)
    else:
        raise ValueError(f"unknown file type {file_type!r}; expected one of {FILE_TYPES}")


def _base_dataset(sop_class: str, uid_seed: str, modality: str) -> Dataset:
    sop_instance = generate_uid(entropy_srcs=[uid_seed, "sop"])
    meta = FileMetaDataset()
    meta.MediaStorageSOPClassUID = sop_class
    meta.MediaStorageSOPInstanceUID = sop_instance
    meta.TransferSyntaxUID = ExplicitVRLittleEndian
    ds = Dataset()
    ds.file_meta = meta
    ds.SOPClassUID = sop_class
    ds.SOPInstanceUID = sop_instance
    ds.StudyInstanceUID = generate_uid(entropy_srcs=[uid_seed, "study"])
    ds.SeriesInstanceUID = generate_uid(entropy_srcs=[uid_seed, "series"])
    ds.Modality = modality
    ds.PatientID = ""  # the releases are de-identified
    ds.PatientName = ""
    return ds


def _write_gray_dicom(path: Path, image: np.ndarray, *, bits: int, monochrome1: bool, window: bool,
                      manufacturer: str | None, uid_seed: str) -> None:
    """A DX image as VinDr ships them: ``bits`` stored in 16, MONOCHROME1 stored inverted."""
    top = 2**bits - 1
    stored = np.round(np.clip(image, 0.0, 1.0) * top).astype(np.uint16)
    if monochrome1:
        stored = (top - stored).astype(np.uint16)
    ds = _base_dataset(DigitalXRayImageStorageForPresentation, uid_seed, "DX")
    ds.PresentationIntentType = "FOR PRESENTATION"
    if manufacturer is not None:
        ds.Manufacturer = manufacturer
    ds.Rows, ds.Columns = stored.shape
    ds.SamplesPerPixel = 1
    ds.PhotometricInterpretation = "MONOCHROME1" if monochrome1 else "MONOCHROME2"
    ds.BitsAllocated, ds.BitsStored, ds.HighBit, ds.PixelRepresentation = 16, bits, bits - 1, 0
    ds.RescaleIntercept, ds.RescaleSlope, ds.RescaleType = "0", "1", "US"
    if window:
        # A window spanning the stored range, as many DR consoles write: the decoder applies it.
        ds.WindowCenter = f"{(top + 1) / 2:.1f}"
        ds.WindowWidth = f"{top + 1:.1f}"
    ds.PixelData = stored.tobytes()
    ds.save_as(path, enforce_file_format=True)


def _write_rgb_dicom(path: Path, image: np.ndarray, *, jpeg_quality: int, uid_seed: str) -> None:
    """An RGB dermoscopy image with embedded baseline JPEG (YBR_FULL_422), as in SIIM-ISIC 2020."""
    buffer = io.BytesIO()
    # 4:2:2 chroma subsampling is what YBR_FULL_422 declares.
    Image.fromarray(image, mode="RGB").save(buffer, format="JPEG", quality=jpeg_quality, subsampling=1)
    ds = _base_dataset(VLPhotographicImageStorage, uid_seed, "XC")
    ds.file_meta.TransferSyntaxUID = JPEGBaseline8Bit
    ds.Rows, ds.Columns = image.shape[:2]
    ds.SamplesPerPixel = 3
    ds.PhotometricInterpretation = "YBR_FULL_422"
    ds.PlanarConfiguration = 0
    ds.BitsAllocated, ds.BitsStored, ds.HighBit, ds.PixelRepresentation = 8, 8, 7, 0
    ds.PixelData = encapsulate([buffer.getvalue()])
    ds["PixelData"].VR = "OB"
    ds["PixelData"].is_undefined_length = True
    ds.save_as(path, enforce_file_format=True)
