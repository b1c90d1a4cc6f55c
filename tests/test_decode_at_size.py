"""Decoding at the tile size against full decode then resize, on films of real export geometry.

Stated bounds (preprocessing/decode.py): PNG and other non-JPEG sources give the same tiles up to float32
rounding (the block averaging only moves before the intensity mapping: a grey level apart in under 0.1% of
the pixels). JPEG decoded with DCT scaling (at 1/8, each
8x8 block's mean) then resized differs from the full decode's 13x13 box then resize by 0.4-0.5 grey levels
(of 255) on average, by at most 8 in 99% of the tile's pixels and by at most 16 anywhere: the two
antialiasing filters differ only where the film has sharp edges (collimation border, burned-in marker, rib
and body outlines). Labels, quarantine decisions and the QC image facts do not change.
"""

from __future__ import annotations

import dataclasses
import io

import numpy as np
import pandas as pd
import pytest
from PIL import Image
from pydicom.dataset import Dataset, FileMetaDataset
from pydicom.encaps import encapsulate
from pydicom.uid import DigitalXRayImageStorageForPresentation, JPEGBaseline8Bit, generate_uid

from preprocessing.decode import decode_image
from preprocessing.records import CHEST_XRAY_DISEASES, RECORD_COLUMNS
from preprocessing.resize import resize_to_square
from preprocessing.shards import TransformSettings, write_site_shards
from preprocessing.synth.chest import ChestFindings, detector_film
from preprocessing.synth.files import write_image
from preprocessing.synth.profiles import chest_profile

# CheXpert / MIMIC-CXR-JPG export geometry, the Stanford X-ray chain at detector resolution.
FILM = dataclasses.replace(chest_profile("stanford").xray, height=3000, width=2500, blur_px=2.0, noise=0.02)
FINDINGS = [ChestFindings(severity={"Pleural Effusion": 0.8}), ChestFindings(severity={"Edema": 0.6})]


@pytest.fixture(scope="module")
def films() -> list[np.ndarray]:
    return [detector_film(f, FILM, np.random.default_rng([7, k])) for k, f in enumerate(FINDINGS)]


def tiles(path, size: int, channels: int = 1) -> tuple[np.ndarray, np.ndarray]:
    full = decode_image(path, channels=channels)
    reduced = decode_image(path, channels=channels, target_size=size)
    assert (reduced.info.rows, reduced.info.columns) == (full.info.rows, full.info.columns)
    return (resize_to_square(full.pixels, size).pixels.astype(np.int16),
            resize_to_square(reduced.pixels, size).pixels.astype(np.int16))


@pytest.mark.parametrize("size", [224, 512])
def test_jpeg_film_at_tile_size_is_within_the_stated_bound(films, tmp_path, size):
    for k, film in enumerate(films):
        path = tmp_path / f"{k}.jpg"
        Image.fromarray(np.rint(film * 255).astype(np.uint8)).save(path, quality=95)
        reduced = decode_image(path, channels=1, target_size=size)
        # DCT scaling happened, to the smallest scale still covering the tile: 1/8 for 224, 1/4 for 512.
        scale = 8 if size == 224 else 4
        assert reduced.pixels.shape == (3000 // scale, -(-2500 // scale))
        assert (reduced.info.rows, reduced.info.columns, reduced.info.format) == (3000, 2500, "jpeg")
        full, at_size = tiles(path, size)
        difference = np.abs(full - at_size)
        assert difference.mean() < 0.6, np.bincount(difference.ravel())
        assert np.percentile(difference, 99) <= 8
        assert difference.max() <= 16


def test_png_tiles_match_full_decode_then_resize(films, tmp_path):
    film = films[0]
    sources = {  # (file, stored array, channels, block-averaged shape when the decoder does it, or None)
        "nih.png": (np.rint(film[:2048:2, :2048:2] * 255).astype(np.uint8), 1, (256, 256)),
        "odd.png": (np.rint(film[:1000, :834] * 255).astype(np.uint8), 1, None),  # partial blocks: Pillow's
        # PadChest: 12 bits stored in 16, min-max scaled by the stored extremes, before and after averaging.
        "padchest.png": ((film[:1440, :1200] * 4000 + 30).astype(np.uint16), 1, (240, 200)),
        "rgb.png": (np.stack([np.rint(film[:1120, :1568] * 255).astype(np.uint8)] * 3, axis=2), 3, (160, 224, 3)),
    }
    for name, (stored, channels, averaged) in sources.items():
        Image.fromarray(stored).save(tmp_path / name)
        full, at_size = tiles(tmp_path / name, 224, channels)
        # Averaging before the intensity mapping rounds differently in float32: a level apart at a .5 boundary.
        assert np.abs(full - at_size).max() <= 1 and np.mean(full != at_size) < 1e-3, name
        reduced = decode_image(tmp_path / name, channels=channels, target_size=224)
        assert reduced.pixels.shape == (averaged or stored.shape[:2] + stored.shape[2:]), name
    assert decode_image(tmp_path / "rgb.png", channels=1, target_size=224).pixels.shape == (160, 224)
    assert decode_image(tmp_path / "padchest.png", target_size=224).info == decode_image(tmp_path / "padchest.png").info


def _jpeg_dicom(path, film: np.ndarray, photometric: str, window: bool = True) -> None:
    """An 8-bit JPEG Baseline DICOM: gray (MONOCHROME1/2) CR film; YBR colour comes from the synth writer."""
    buffer = io.BytesIO()
    stored = np.rint((1 - film if photometric == "MONOCHROME1" else film) * 255).astype(np.uint8)
    Image.fromarray(stored).save(buffer, format="JPEG", quality=95)
    ds = Dataset()
    ds.file_meta = FileMetaDataset()
    ds.file_meta.TransferSyntaxUID = JPEGBaseline8Bit
    ds.file_meta.MediaStorageSOPClassUID = ds.SOPClassUID = DigitalXRayImageStorageForPresentation
    ds.file_meta.MediaStorageSOPInstanceUID = ds.SOPInstanceUID = generate_uid()
    ds.Modality = "DX"
    ds.Rows, ds.Columns = stored.shape
    ds.SamplesPerPixel, ds.PhotometricInterpretation = 1, photometric
    ds.BitsAllocated, ds.BitsStored, ds.HighBit, ds.PixelRepresentation = 8, 8, 7, 0
    if window:
        ds.WindowCenter, ds.WindowWidth = 120, 200
    ds.PixelData = encapsulate([buffer.getvalue()])
    ds["PixelData"].VR = "OB"
    ds["PixelData"].is_undefined_length = True
    ds.save_as(path, enforce_file_format=True)


def test_jpeg_baseline_dicom_decodes_at_tile_size(films, tmp_path):
    film = films[1]
    for photometric in ("MONOCHROME2", "MONOCHROME1"):
        path = tmp_path / f"{photometric}.dcm"
        _jpeg_dicom(path, film, photometric)
        reduced = decode_image(path, target_size=224)
        assert reduced.pixels.shape == (375, 313) and reduced.info.inverted == (photometric == "MONOCHROME1")
        assert (reduced.info.rows, reduced.info.columns) == (3000, 2500)
        full, at_size = tiles(path, 224)
        assert np.abs(full - at_size).mean() < 0.6 and np.percentile(np.abs(full - at_size), 99) <= 8
    # Without a window, gray is min-max scaled by the stored extremes, which block means lose: full decode.
    _jpeg_dicom(tmp_path / "plain.dcm", film, "MONOCHROME2", window=False)
    assert decode_image(tmp_path / "plain.dcm", target_size=224).pixels.shape == (3000, 2500)
    # SIIM-ISIC dermoscopy: YBR_FULL_422 JPEG, converted to RGB like pydicom's own decode.
    lesion = np.stack([film[:2000] * c for c in (0.9, 0.6, 0.5)], axis=2)
    path = tmp_path / "lesion.dcm"
    write_image(path, "dicom-rgb", np.rint(lesion * 255).astype(np.uint8), jpeg_quality=92, uid_seed="t")
    assert decode_image(path, target_size=224).pixels.shape[2] == 3
    full, at_size = tiles(path, 224, channels=3)
    assert np.abs(full - at_size).mean() < 0.6 and np.percentile(np.abs(full - at_size), 99) <= 8


def test_shards_keep_labels_and_qc_facts(films, tmp_path):
    root = tmp_path / "data"
    root.mkdir()
    names = []
    for k, film in enumerate(films):
        names.append(f"{k}.jpg")
        Image.fromarray(np.rint(film * 255).astype(np.uint8)).save(root / names[-1], quality=95)
    # Stored 1600x80: kept (shorter side 80 >= 64), although DCT scaling decodes it at 400x20.
    names.append("strip.jpg")
    ramp = np.tile(np.linspace(0, 255, 1600).astype(np.uint8), (80, 1))
    Image.fromarray(ramp).save(root / "strip.jpg")
    names.append("small.jpg")  # 60 rows stored: quarantined by its stored size
    Image.fromarray(ramp[:60, :900]).save(root / "small.jpg")
    records = pd.DataFrame({
        "record_id": [f"r{k}" for k in range(len(names))], "source_row": [f"l.csv:{k + 2}" for k in range(len(names))],
        "patient_id": [f"p{k}" for k in range(len(names))], "study_id": [f"s{k}" for k in range(len(names))],
        "image_path": names, "view": "PA", "sex": "F", "age": 60.0, "split": "train"}, columns=list(RECORD_COLUMNS))
    for c, disease in enumerate(CHEST_XRAY_DISEASES):
        records[disease] = np.roll(np.array([1.0, 0.0, np.nan, 1.0], dtype=np.float32), c)
    transform = TransformSettings(task="chest-xray", image_size=224, min_image_size=64)
    summary = write_site_shards(records, None, site="s", data_root=root, out_dir=tmp_path / "out", transform=transform,
                                content_hash="h", input_rows=len(records), workers=0, progress=False)
    assert (summary.kept, summary.quarantined) == (3, 1)
    site = tmp_path / "out" / "s"
    manifest = pd.read_parquet(site / "train" / "manifest.parquet")
    expected = records[records["image_path"] != "small.jpg"].reset_index(drop=True)
    pd.testing.assert_frame_equal(manifest[list(CHEST_XRAY_DISEASES)], expected[list(CHEST_XRAY_DISEASES)])
    assert pd.read_parquet(site / "quarantine.parquet")["reason"].tolist() == ["image_too_small"]
    stats = pd.read_parquet(site / "qc" / "image_stats.parquet")
    assert stats[["rows", "columns"]].to_numpy().tolist() == [[3000, 2500], [3000, 2500], [80, 1600]]
    assert set(stats["format"]) == {"jpeg"} and set(stats["intensity"]) == {"fixed"}
    images = np.load(site / "train" / "images.npy")
    for k in range(2):
        full = resize_to_square(decode_image(root / names[k], channels=1).pixels, 224)
        assert np.abs(images[k].astype(np.int16) - full.pixels).mean() < 0.6
        top, left, height, width = full.content
        assert abs(stats["mean"][k] - full.pixels[top : top + height, left : left + width].mean()) < 0.5


def test_duplicate_films_are_quarantined_when_every_file_decodes(films, tmp_path):
    root = tmp_path / "data"
    root.mkdir()
    Image.fromarray(np.rint(films[0][:2048:2, :2048:2] * 255).astype(np.uint8)).save(root / "a.png")
    (root / "b.png").write_bytes((root / "a.png").read_bytes())  # the same film under another patient
    records = pd.DataFrame({
        "record_id": ["r0", "r1"], "source_row": ["l.csv:2", "l.csv:3"], "patient_id": ["p0", "p1"],
        "study_id": ["s0", "s1"], "image_path": ["a.png", "b.png"], "view": "PA", "sex": "F", "age": 60.0,
        "split": "train"}, columns=list(RECORD_COLUMNS))
    for disease in CHEST_XRAY_DISEASES:
        records[disease] = np.float32(1.0)
    transform = TransformSettings(task="chest-xray", image_size=224, min_image_size=64)
    summary = write_site_shards(records, None, site="s", data_root=root, out_dir=tmp_path / "out", transform=transform,
                                content_hash="h", input_rows=2, workers=0, progress=False)
    assert (summary.kept, summary.quarantined) == (1, 1)
    assert pd.read_parquet(tmp_path / "out" / "s" / "quarantine.parquet")["reason"].tolist() == ["duplicate_content"]
