"""Near-duplicate detection (``preprocessing.near_duplicates``): false matches between distinct pictures, and the
recall on re-exports, at the threshold preprocessing uses. Prints every figure of docs/quarantine.md
"Near-duplicates" in one run.

* False matches, target 0: every pair of distinct pictures among the demo phantoms (``fedauc synth``: every
  demo format, ``--phantoms`` of each) and among pydicom-data's images (one picture per group of files that
  store the same pixels in other encodings: RG1_UNCR, RG1_J2KI... are one; so are the files that show one
  picture under two names, found by their content: US1 and examples_jpeg2k/examples_rgb_color, mlut_18 and
  vlut_04, the two SC JPEG files). Printed: the pairs compared, the hash's candidates among them and their
  structure correlations (``MIN_SAME_PICTURE`` decides), the false matches left.
* Recall, target all: re-exports made with Pillow at 8 bits (PNG; JPEG at qualities 95, 75, 50 and 30;
  windowed to the 5th-95th and 20th-80th percentiles; gamma 0.6 and 1.6; resized to 1/2 and 1/4 and saved as
  JPEG 75), and a DICOM copy with new UIDs, of pydicom-data's radiographs and CT/MR slices and of phantoms.
  Printed: each kind's largest distance to its original, smallest structure correlation, and how many match.

Every image goes through what preprocessing does: decoded by ``decode_image`` at the tile size, tiled by
``resize_to_square``, hashed on the tile's image. Both tile sizes in use are measured (64: the demo; 224).

Run: ``.venv/bin/python -m benchmarks.studies.near_duplicates [--phantoms 300]``.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import tempfile
from pathlib import Path

import numpy as np
import pydicom
from PIL import Image
from pydicom.data import get_testdata_file
from pydicom.uid import generate_uid

from preprocessing.decode import DecodeError, decode_image
from preprocessing.near_duplicates import (
    MAX_DISTANCE,
    MIN_SAME_PICTURE,
    MIN_SITE_IMAGES,
    candidate_pairs,
    matching_pairs,
    signature_bits,
)
from preprocessing.perceptual_hash import dct_signature, same_picture_score, structure
from preprocessing.resize import quantize, resize_to_square
from preprocessing.synth import generate_site

# pydicom-data's images with a picture of 64 pixels or more a side, by the picture they show.
PYDICOM_PICTURES = {
    "RG1 chest CR": ["RG1_UNCR.dcm", "RG1_UNCI.dcm", "RG1_J2KR.dcm", "RG1_J2KI.dcm"],
    "RG3 leg CR": ["RG3_UNCR.dcm", "RG3_UNCI.dcm", "RG3_J2KR.dcm", "RG3_J2KI.dcm"],
    "693 CT": ["693_UNCR.dcm", "693_UNCI.dcm", "693_J2KR.dcm", "693_J2KI.dcm"],
    "MR2": ["MR2_UNCR.dcm", "MR2_UNCI.dcm", "MR2_J2KR.dcm", "MR2_J2KI.dcm"],
    "US1 colour": ["US1_UNCR.dcm", "US1_UNCI.dcm", "US1_J2KR.dcm", "US1_J2KI.dcm", "examples_jpeg2k.dcm",
                   "examples_rgb_color.dcm"],
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
    "OT deflate": ["image_dfl.dcm"],
    "OT LUT": ["mlut_18.dcm", "vlut_04.dcm"],
    "SC rgb 100": ["SC_rgb.dcm", "SC_rgb_expb.dcm", "SC_rgb_rle.dcm", "SC_rgb_16bit.dcm"],
    "SC rgb jpeg 256": ["SC_rgb_jpeg_dcmd.dcm", "SC_jpeg_no_color_transform.dcm"],
}
RE_EXPORTED = ["RG1_UNCR.dcm", "RG3_UNCR.dcm", "693_UNCR.dcm", "MR2_UNCR.dcm", "examples_overlay.dcm",
               "MR-SIEMENS-DICOM-WithOverlays.dcm"]


def tile_content(path: Path | bytes, size: int) -> np.ndarray:
    """The tile preprocessing makes of the file (or PNG/JPEG bytes) at tile ``size``, without its padding."""
    if isinstance(path, bytes):
        with tempfile.NamedTemporaryFile(suffix=".img") as handle:
            handle.write(path)
            handle.flush()
            return tile_content(Path(handle.name), size)
    decoded = decode_image(path, channels=1, target_size=size)
    tile = resize_to_square(decoded.pixels, size)
    top, left, height, width = tile.content
    return tile.pixels[top:top + height, left:left + width]


def correlation(first: np.ndarray, second: np.ndarray) -> float | None:
    a, b = structure(first), structure(second)
    return None if a is None or b is None else same_picture_score(a, b)


def distinct_pairs(contents: list[np.ndarray], groups: list[str]) -> tuple[int, list[float], int]:
    """(pairs of distinct pictures, the structure correlations of those the hash made candidates, false matches)."""
    known = [(c, g, h) for c, g in zip(contents, groups) if (h := dct_signature(c)) is not None]
    bits = signature_bits([h for *_, h in known])
    labels = np.array([g for _, g, _ in known])
    pairs = int((labels[:, None] != labels[None, :]).sum() // 2)
    if len(known) >= MIN_SITE_IMAGES:
        distances = (bits[:, None, :] != bits[None, :, :]).sum(axis=2)
        found = {(int(i), int(j)) for i, j, _ in matching_pairs(bits)}
        assert found == set(zip(*np.nonzero(np.triu(distances <= MAX_DISTANCE, 1)))), "the bands missed a match"
    scores = [correlation(known[i][0], known[j][0]) for i, j, _ in candidate_pairs(bits) if labels[i] != labels[j]]
    scores = [score for score in scores if score is not None]
    return pairs, scores, sum(score >= MIN_SAME_PICTURE for score in scores)


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


def recall(sources: list[Path], size: int, work: Path, site: list[str]) -> dict[str, list[tuple[int, float]]]:
    """(bits apart, structure correlation) of each kind of re-export and its original, over ``sources``, with the
    bits cut at the medians of a site made of ``site``'s signatures and the originals and copies."""
    found: dict[str, list[tuple[int, int, float]]] = {}
    signatures = list(site)
    for source in sources:
        original = tile_content(source, size)
        decoded = decode_image(source, channels=1).pixels
        copies = {kind: tile_content(data, size) for kind, data in exports(decoded).items()}
        if source.suffix == ".dcm":
            copies["DICOM, new UIDs, other patient"] = tile_content(new_uids(source, work / "copy.dcm"), size)
        for kind, copy in copies.items():
            found.setdefault(kind, []).append((len(signatures), len(signatures) + 1, correlation(original, copy)))
            signatures += [dct_signature(original), dct_signature(copy)]
    bits = signature_bits(signatures)
    return {kind: [(int((bits[i] != bits[j]).sum()), score) for i, j, score in pairs] for kind, pairs in found.items()}


def matched(distance: int, score: float) -> bool:
    return distance <= MAX_DISTANCE and score >= MIN_SAME_PICTURE


def histogram(scores: list[float]) -> str:
    edges = sorted({-1.0, 0.5, 0.8, 0.9, 0.93, 0.95, 0.96, MIN_SAME_PICTURE, 0.98, 0.99, 1.01})
    counts = np.histogram(scores, bins=edges)[0]
    return ", ".join(f"[{low:.2f}, {high:.2f}): {n}" for low, high, n in zip(edges, edges[1:], counts) if n)


def phantom_files(work: Path, n: int) -> dict[str, list[Path]]:
    files = {}
    for fmt in ("chexpert", "vindr-cxr", "nih-cxr14", "padchest", "siim-isic-2020"):
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
        print(f"candidates: at most {MAX_DISTANCE} of 143 bits apart (every pair below {MIN_SITE_IMAGES} images); "
              f"the same picture: structure correlation >= {MIN_SAME_PICTURE}")
        for size in (64, 224):
            print(f"\n== tile size {size}")
            site_signatures: list[str] = []
            distinct_scores: list[float] = []
            for fmt, paths in phantoms.items():
                decoded = []
                for path in paths:
                    with contextlib.suppress(DecodeError):
                        decoded.append((tile_content(path, size), str(path)))
                contents = [content for content, _ in decoded]
                pairs, scores, false = distinct_pairs(contents, [name for _, name in decoded])
                distinct_scores += scores
                if fmt == "vindr-cxr":
                    site_signatures = [h for c in contents if (h := dct_signature(c))]
                print(f"phantoms {fmt}: {len(contents)} of {len(paths)} decoded, {pairs:,} pairs, {len(scores)} "
                      f"hash candidates (largest correlation {max(scores, default=float('nan')):.3f}), "
                      f"{false} false matches")
            files = [(group, Path(get_testdata_file(name))) for group, names in PYDICOM_PICTURES.items() for name in names]
            pairs, scores, false = distinct_pairs([tile_content(path, size) for _, path in files],
                                                  [group for group, _ in files])
            print(f"pydicom-data: {len(PYDICOM_PICTURES)} pictures in {len(files)} files, {pairs:,} pairs of distinct "
                  f"pictures, all compared (under {MIN_SITE_IMAGES} images); largest correlation "
                  f"{max(scores):.3f}, {false} false matches")
            print(f"distinct phantoms paired by the hash, correlations: {histogram(distinct_scores)}")
            sources = [Path(get_testdata_file(name)) for name in RE_EXPORTED]
            sources += phantoms["vindr-cxr"][:5] + phantoms["chexpert"][:5] + phantoms["nih-cxr14"][:3]
            sources += phantoms["padchest"][:3]
            found = recall(sources, size, work, site_signatures)
            total = sum(len(v) for v in found.values())
            hits = sum(matched(*pair) for v in found.values() for pair in v)
            print(f"recall on re-exports of {len(sources)} images: {hits} of {total}")
            print(f"re-exports, correlations: {histogram([score for v in found.values() for _, score in v])}")
            for kind, pairs in found.items():
                print(f"  {kind:>32}: largest distance {max(d for d, _ in pairs):2d}, smallest correlation "
                      f"{min(c for _, c in pairs):.3f}, {sum(matched(*pair) for pair in pairs)} of {len(pairs)} matched")


if __name__ == "__main__":
    main()
