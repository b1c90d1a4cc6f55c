"""Near-duplicate detection (``preprocessing.near_duplicates``): false matches between distinct pictures, and the
recall on re-exports, at the threshold preprocessing uses. Prints every figure of docs/quarantine.md
"Near-duplicates" in one run.

* False matches, target 0: every pair of distinct pictures among the demo phantoms (``fedauc synth``: CheXpert
  JPEG, VinDr DICOM and SIIM-ISIC colour DICOM, ``--phantoms`` of each) and among pydicom-data's images (one
  picture per group of files that store the same pixels in other encodings: RG1_UNCR, RG1_J2KI... are one).
  Printed: the pairs compared, how many fall within the threshold, the smallest distance.
* Recall, target all: re-exports made with Pillow at 8 bits (PNG; JPEG at qualities 95, 75, 50 and 30;
  windowed to the 5th-95th and 20th-80th percentiles; gamma 0.6 and 1.6; resized to 1/2 and 1/4 and saved as
  JPEG 75), and a DICOM copy with new UIDs, of pydicom-data's radiographs and CT/MR slices and of phantoms.
  Printed: each kind's largest distance to its original and whether it is within the threshold.

Every image goes through what preprocessing does: decoded by ``decode_image`` at the tile size, tiled by
``resize_to_square``, hashed on the tile's image. Both tile sizes in use are measured (64: the demo; 224).

Run: ``.venv/bin/python benchmarks/near_duplicates.py [--phantoms 300]``.
"""

from __future__ import annotations

import argparse
import io
import tempfile
from pathlib import Path

import numpy as np
import pydicom
from PIL import Image
from pydicom.data import get_testdata_file
from pydicom.uid import generate_uid

from preprocessing.decode import DecodeError, decode_image
from preprocessing.near_duplicates import MAX_DISTANCE, matching_pairs, signature_bits
from preprocessing.perceptual_hash import dct_signature
from preprocessing.resize import quantize, resize_to_square
from preprocessing.synth import generate_site

# pydicom-data's images with a picture of 64 pixels or more a side, by the picture they show.
PYDICOM_PICTURES = {
    "RG1 chest CR": ["RG1_UNCR.dcm", "RG1_UNCI.dcm", "RG1_J2KR.dcm", "RG1_J2KI.dcm"],
    "RG3 leg CR": ["RG3_UNCR.dcm", "RG3_UNCI.dcm", "RG3_J2KR.dcm", "RG3_J2KI.dcm"],
    "693 CT": ["693_UNCR.dcm", "693_UNCI.dcm", "693_J2KR.dcm", "693_J2KI.dcm"],
    "MR2": ["MR2_UNCR.dcm", "MR2_UNCI.dcm", "MR2_J2KR.dcm", "MR2_J2KI.dcm"],
    "US1 colour": ["US1_UNCR.dcm", "US1_UNCI.dcm", "US1_J2KR.dcm", "US1_J2KI.dcm"],
    "NM whole body": ["JPEG2000_UNC.dcm", "JPEG2000.dcm", "JPEG-LL.dcm"],
    "MR small": ["MR_small.dcm", "MR_small_RLE.dcm", "MR_small_bigendian.dcm", "MR_small_expb.dcm",
                 "MR_small_implicit.dcm", "MR_small_jp2klossless.dcm", "MR_small_jpeg_ls_lossless.dcm"],
    "emri small": ["emri_small.dcm", "emri_small_RLE.dcm", "emri_small_big_endian.dcm"],
    "CT small": ["CT_small.dcm"],
    "MR overlays": ["MR-SIEMENS-DICOM-WithOverlays.dcm"],
    "MR examples": ["examples_overlay.dcm"],
    "CT bad sequence": ["bad_sequence.dcm"],
    "CT pancreas": ["explicit_VR-UN.dcm"],
    "CT J2K head": ["J2K_pixelrep_mismatch.dcm"],
    "US 8-bit": ["JPGLosslessP14SV1_1s_1f_8b.dcm"],
    "US palette": ["OBXXXX1A.dcm", "OBXXXX1A_expb.dcm", "OBXXXX1A_rle.dcm"],
    "US ALOKA": ["gdcm-US-ALOKA-16.dcm", "gdcm-US-ALOKA-16_big.dcm"],
    "US palette example": ["examples_palette.dcm"],
    "US rgb example": ["examples_rgb_color.dcm"],
    "US jpeg2k example": ["examples_jpeg2k.dcm"],
    "OT deflate": ["image_dfl.dcm"],
    "OT modality LUT": ["mlut_18.dcm"],
    "OT VOI LUT": ["vlut_04.dcm"],
    "SC rgb 100": ["SC_rgb.dcm", "SC_rgb_expb.dcm", "SC_rgb_rle.dcm", "SC_rgb_16bit.dcm"],
    "SC rgb jpeg 256": ["SC_rgb_jpeg_dcmd.dcm"],
    "SC jpeg no colour transform": ["SC_jpeg_no_color_transform.dcm"],
}
RE_EXPORTED = ["RG1_UNCR.dcm", "RG3_UNCR.dcm", "693_UNCR.dcm", "MR2_UNCR.dcm", "examples_overlay.dcm",
               "MR-SIEMENS-DICOM-WithOverlays.dcm"]


def tile_hash(path: Path | bytes, size: int) -> str | None:
    """The signature preprocessing gives the file (or PNG/JPEG bytes) at tile ``size``."""
    if isinstance(path, bytes):
        with tempfile.NamedTemporaryFile(suffix=".img") as handle:
            handle.write(path)
            handle.flush()
            return tile_hash(Path(handle.name), size)
    decoded = decode_image(path, channels=1, target_size=size)
    tile = resize_to_square(decoded.pixels, size)
    top, left, height, width = tile.content
    return dct_signature(tile.pixels[top:top + height, left:left + width])


def distinct_pairs(hashes: list[str | None], groups: list[str]) -> tuple[int, int, int, np.ndarray]:
    """(pairs of distinct pictures compared, how many match, the smallest distance among them, the distances)."""
    known = [(h, g) for h, g in zip(hashes, groups) if h is not None]
    bits = signature_bits([h for h, _ in known])
    labels = np.array([g for _, g in known])
    distances = (bits[:, None, :] != bits[None, :, :]).sum(axis=2)
    other = labels[:, None] != labels[None, :]
    upper = np.triu(np.ones_like(other), 1) & other
    pairs = int(upper.sum())
    found = {(int(i), int(j)) for i, j, _ in matching_pairs(bits)}
    assert found == set(zip(*np.nonzero(np.triu(distances <= MAX_DISTANCE, 1)))), "the bands missed a match"
    false = sum(1 for i, j in found if labels[i] != labels[j])
    lateral = sum(1 for i, j in found if labels[i] != labels[j] and "lateral" in labels[i] + labels[j])
    if false:
        print(f"  false matches: {false}, {lateral} of them with a lateral phantom")
    return pairs, false, int(distances[upper].min()), distances


def exports(decoded: np.ndarray) -> dict[str, bytes]:
    """8-bit re-exports of a displayed image (float in [0, 1]) as a viewer or a script would save them."""
    gray = decoded if decoded.ndim == 2 else decoded.mean(axis=2)
    image = Image.fromarray(quantize(gray))
    low5, high95, low20, high80 = np.percentile(gray, [5, 95, 20, 80])

    def save(picture: Image.Image, fmt: str, **options) -> bytes:
        buffer = io.BytesIO()
        picture.save(buffer, fmt, **options)
        return buffer.getvalue()

    def windowed(low: float, high: float) -> Image.Image:
        return Image.fromarray(quantize((gray - low) / max(high - low, 1e-6)))

    out = {"png": save(image, "PNG")}
    out.update({f"jpeg q{q}": save(image, "JPEG", quality=q) for q in (95, 75, 50, 30)})
    out["window 5-95 %"] = save(windowed(low5, high95), "PNG")
    out["window 20-80 %"] = save(windowed(low20, high80), "JPEG", quality=90)
    out.update({f"gamma {g}": save(Image.fromarray(quantize(gray ** g)), "PNG") for g in (0.6, 1.6)})
    for factor in (2, 4):
        smaller = image.resize((max(1, image.width // factor), max(1, image.height // factor)), Image.Resampling.LANCZOS)
        out[f"resized 1/{factor} jpeg q75"] = save(smaller, "JPEG", quality=75)
    return out


def new_uids(path: Path, out: Path) -> Path:
    ds = pydicom.dcmread(path)
    ds.PatientID, ds.PatientName = "OTHER", "Other^Patient"
    ds.StudyInstanceUID, ds.SeriesInstanceUID = generate_uid(), generate_uid()
    ds.SOPInstanceUID = ds.file_meta.MediaStorageSOPInstanceUID = generate_uid()
    ds.save_as(out)
    return out


def recall(sources: list[Path], size: int, work: Path, site: list[str]) -> dict[str, list[int]]:
    """Distance of each kind of re-export to its original, over ``sources``, with the bits cut at the medians of
    a site made of ``site``'s signatures and the originals and copies."""
    found: dict[str, list[tuple[int, int]]] = {}
    signatures = list(site)
    for source in sources:
        original = tile_hash(source, size)
        decoded = decode_image(source, channels=1).pixels
        copies = {kind: tile_hash(data, size) for kind, data in exports(decoded).items()}
        if source.suffix == ".dcm":
            copies["DICOM, new UIDs, other patient"] = tile_hash(new_uids(source, work / "copy.dcm"), size)
        for kind, copy in copies.items():
            found.setdefault(kind, []).append((len(signatures), len(signatures) + 1))
            signatures += [original, copy]
    bits = signature_bits(signatures)
    return {kind: [int((bits[i] != bits[j]).sum()) for i, j in pairs] for kind, pairs in found.items()}


def phantom_files(work: Path, n: int) -> dict[str, list[Path]]:
    files = {}
    for fmt in ("chexpert", "vindr-cxr", "siim-isic-2020"):
        result = generate_site(fmt, work / fmt, n=n, seed=7, progress=False, workers=1)
        files[fmt] = sorted(p for p in result.root.rglob("*") if p.suffix.lower() in (".jpg", ".png", ".dcm", ".dicom"))
    return files


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--phantoms", type=int, default=300, help="images per phantom format")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        work = Path(scratch)
        phantoms = phantom_files(work, args.phantoms)
        print(f"threshold: at most {MAX_DISTANCE} of 143 bits apart")
        for size in (64, 224):
            print(f"\n== tile size {size}")
            site_signatures: list[str] = []
            for fmt, paths in phantoms.items():
                hashes = []
                for path in paths:
                    try:
                        hashes.append(tile_hash(path, size))
                    except DecodeError:
                        hashes.append(None)
                pairs, false, closest, _ = distinct_pairs(hashes, [str(p) for p in paths])
                site_signatures = site_signatures if fmt != "vindr-cxr" else [h for h in hashes if h]
                print(f"phantoms {fmt}: {sum(h is not None for h in hashes)} of {len(paths)} hashed, {pairs:,} pairs, "
                      f"{false} false matches, closest distinct pair {closest} bits")
            files = [(group, Path(get_testdata_file(name))) for group, names in PYDICOM_PICTURES.items() for name in names]
            hashes = [tile_hash(path, size) for _, path in files]
            pairs, false, closest, distances = distinct_pairs(hashes, [group for group, _ in files])
            groups = [group for (group, _), h in zip(files, hashes) if h is not None]
            same = [int(distances[i, j]) for i in range(len(groups)) for j in range(i + 1, len(groups))
                    if groups[i] == groups[j]]
            print(f"pydicom-data: {len(PYDICOM_PICTURES)} pictures in {len(files)} files, {pairs:,} pairs of distinct "
                  f"pictures, {false} false matches, closest {closest} bits; same picture in other encodings: at most "
                  f"{max(same)} bits apart ({sum(d <= MAX_DISTANCE for d in same)} of {len(same)} pairs match)")
            sources = [Path(get_testdata_file(name)) for name in RE_EXPORTED]
            sources += phantoms["vindr-cxr"][:5] + phantoms["chexpert"][:5]
            found = recall(sources, size, work, site_signatures)
            total = sum(len(v) for v in found.values())
            matched = sum(d <= MAX_DISTANCE for v in found.values() for d in v)
            print(f"recall on re-exports of {len(sources)} images: {matched} of {total}")
            for kind, distances in found.items():
                print(f"  {kind:>32}: largest distance {max(distances):2d}, "
                      f"{sum(d <= MAX_DISTANCE for d in distances)} of {len(distances)} matched")


if __name__ == "__main__":
    main()
