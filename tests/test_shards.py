"""Shard writing, resume, the content hash and the QC report, on canonical records built here."""

from __future__ import annotations

import json
import os

import numpy as np
import pandas as pd
import pytest
from PIL import Image

import preprocessing.pool as pool
from preprocessing.qc import (
    AccountingError,
    build_report,
    check_accounting,
    render_central_markdown,
    render_markdown,
    write_central_summary,
    write_report,
)
from preprocessing.qc_counts import central_summary
from preprocessing.quarantine import Reason, quarantine_rows
from preprocessing.records import CHEST_XRAY_DISEASES, RECORD_COLUMNS
from preprocessing.shards import TransformSettings, content_hash, write_site_shards

TRANSFORM = TransformSettings(task="chest-xray", image_size=32, min_image_size=16)
# (file name, gray level or failure, rows, columns, split)
IMAGES = [
    ("a.png", 10, 80, 60, "train"),
    ("b.png", 20, 60, 80, "train"),
    ("missing.png", "missing", 0, 0, "train"),
    ("c.png", 30, 64, 64, "train"),
    ("junk.dcm", "junk", 0, 0, "train"),
    ("d.png", 40, 50, 100, "train"),
    ("tiny.png", 50, 8, 8, "train"),
    ("e.png", 60, 90, 45, "valid"),
    ("f.png", 70, 40, 40, "valid"),
] + [(f"g{k}.png", 80 + k, 48, 40, "train") for k in range(7)]
LABELS = {
    "Cardiomegaly": [1.0, 0.0, 1.0, np.nan, 0.0, 1.0, 0.0, 1.0, 0.0] + [0.0] * 7,
    "Edema": [np.nan] * 9 + [1.0] * 7,
}


@pytest.fixture
def site(tmp_path):
    root = tmp_path / "data"
    root.mkdir()
    for name, level, rows, columns, _ in IMAGES:
        if level == "junk":
            (root / name).write_bytes(b"\x00" * 300)
        elif level != "missing":
            pixels = np.full((rows, columns), level, dtype=np.uint8)
            pixels[-1, -1] = level + 1  # a constant image would be quarantined; one pixel off keeps each tile's level
            Image.fromarray(pixels).save(root / name)
    records = pd.DataFrame(
        {
            "record_id": [f"r{k}" for k in range(len(IMAGES))],
            "source_row": [f"labels.csv:{k + 2}" for k in range(len(IMAGES))],
            "patient_id": [f"p{k // 2}" for k in range(len(IMAGES))],
            "study_id": [f"s{k}" for k in range(len(IMAGES))],
            "image_path": [name for name, *_ in IMAGES],
            "view": ["PA", "AP"] * 8,
            "sex": "F",
            "age": 50.0,
            "split": [split for *_, split in IMAGES],
        }
    )
    for disease in CHEST_XRAY_DISEASES:
        records[disease] = np.asarray(LABELS.get(disease, [np.nan] * len(IMAGES)), dtype=np.float32)
    lateral = records.iloc[:1].assign(record_id="lat", image_path="lat.png", view="LATERAL")
    scan_quarantine = quarantine_rows(lateral, "scan", Reason.EXCLUDED_VIEW, "view LATERAL excluded by the site")
    metadata = tmp_path / "labels.csv"
    metadata.write_text("header\n")
    return {"root": root, "records": records, "scan_quarantine": scan_quarantine, "metadata": metadata}


def _write(site, out, workers=0, transform=TRANSFORM, **kwargs):
    digest = content_hash(site["records"], [site["metadata"]], site["root"], {"task": "chest-xray"}, transform)
    return write_site_shards(
        site["records"],
        site["scan_quarantine"],
        site="demo",
        data_root=site["root"],
        out_dir=out,
        transform=transform,
        content_hash=digest,
        input_rows=len(site["records"]) + 1,
        workers=workers,
        chunk_size=3,
        progress=False,
        **kwargs,
    )


def test_manifest_rows_match_images_after_decode_failures(site, tmp_path):
    summary = _write(site, tmp_path / "out")
    site_dir = tmp_path / "out" / "demo"
    assert summary.counts == {"train": 11, "valid": 2, "test": 0}
    assert (summary.input_rows, summary.kept, summary.quarantined, summary.reused) == (17, 13, 4, False)
    assert not (site_dir / "test").exists() and not (site_dir / ".staging").exists()

    levels = {name: level for name, level, *_ in IMAGES}
    for split in ("train", "valid"):
        images = np.load(site_dir / split / "images.npy", mmap_mode="r")
        manifest = pd.read_parquet(site_dir / split / "manifest.parquet")
        assert images.dtype == np.uint8 and images.shape == (len(manifest), 32, 32)
        assert list(manifest.columns) == list(RECORD_COLUMNS) + list(CHEST_XRAY_DISEASES)
        for i, path in enumerate(manifest["image_path"]):
            # Each file is a constant gray level: the tile centre names the file that filled slot i.
            assert images[i, 16, 16] == levels[path], (split, i, path)
    train = pd.read_parquet(site_dir / "train" / "manifest.parquet")
    assert train["Cardiomegaly"].dtype == np.float32
    assert np.isnan(train.loc[train["record_id"] == "r3", "Cardiomegaly"]).all()  # missing stays missing
    assert train["Edema"].isna().sum() == 4 and (train["Edema"] == 1.0).sum() == 7

    # d.png is 50x100: scaled to 16x32 and centred, black above and below.
    d = np.load(site_dir / "train" / "images.npy")[train.index[train["image_path"] == "d.png"][0]]
    assert (d[8:24] == 40).all() and (d[:8] == 0).all() and (d[24:] == 0).all()

    quarantine = pd.read_parquet(site_dir / "quarantine.parquet").set_index("image_path")
    assert quarantine["reason"].to_dict() == {
        "lat.png": Reason.EXCLUDED_VIEW.value,
        "missing.png": Reason.MISSING_FILE.value,
        "junk.dcm": Reason.UNREADABLE_FILE.value,
        "tiny.png": Reason.IMAGE_TOO_SMALL.value,
    }
    assert quarantine.loc["tiny.png", "source_row"] == "labels.csv:8"
    assert quarantine.loc["tiny.png", "stage"] == "decode" and "8x8" in quarantine.loc["tiny.png", "detail"]
    info = json.loads((site_dir / "shard.json").read_text())
    assert info["counts"] == summary.counts and info["channels"] == 1 and info["image_size"] == 32


def test_rerun_with_same_hash_does_no_work(site, tmp_path):
    _write(site, tmp_path / "out")
    images = tmp_path / "out" / "demo" / "train" / "images.npy"
    before = images.stat().st_mtime_ns
    again = _write(site, tmp_path / "out")
    assert again.reused and again.counts["train"] == 11
    assert images.stat().st_mtime_ns == before


def test_interrupted_run_resumes_and_matches_an_uninterrupted_one(site, tmp_path, monkeypatch):
    real = pool.process_chunk
    calls = []

    def interrupted_after_two_chunks(chunk, transform):
        if len(calls) == 2:
            raise KeyboardInterrupt
        calls.append(chunk.start)
        return real(chunk, transform)

    monkeypatch.setattr(pool, "process_chunk", interrupted_after_two_chunks)
    with pytest.raises(KeyboardInterrupt):
        _write(site, tmp_path / "resumed")
    assert not (tmp_path / "resumed" / "demo" / "shard.json").exists()
    log = next((tmp_path / "resumed" / "demo" / ".staging").iterdir()) / "train.jsonl"
    assert len(log.read_text().splitlines()) == 6  # two chunks of three records are on disk
    with log.open("a") as handle:
        handle.write('{"i": 6, "ok": tr')  # a kill in the middle of writing the third chunk's lines

    redone = []

    def counting(chunk, transform):
        redone.append(len(chunk.paths))
        return real(chunk, transform)

    monkeypatch.setattr(pool, "process_chunk", counting)
    summary = _write(site, tmp_path / "resumed")
    assert sum(redone) == len(IMAGES) - 6  # only what the interrupted run had not finished
    _write(site, tmp_path / "fresh")
    for relative in ("train/images.npy", "valid/images.npy", "train/manifest.parquet", "quarantine.parquet"):
        resumed = (tmp_path / "resumed" / "demo" / relative).read_bytes()
        assert resumed == (tmp_path / "fresh" / "demo" / relative).read_bytes(), relative
    assert summary.kept == 13


def test_worker_processes_write_the_same_bytes(site, tmp_path):
    _write(site, tmp_path / "inline", workers=0)
    _write(site, tmp_path / "pool", workers=2)
    for relative in ("train/images.npy", "valid/images.npy", "train/manifest.parquet", "qc/image_stats.parquet"):
        inline = (tmp_path / "inline" / "demo" / relative).read_bytes()
        assert inline == (tmp_path / "pool" / "demo" / relative).read_bytes(), relative


def test_content_hash_tracks_images_contract_and_transform(site):
    def digest(contract=None, transform=TRANSFORM):
        return content_hash(
            site["records"], [site["metadata"]], site["root"], contract or {"task": "chest-xray"}, transform
        )

    base = digest()
    assert digest() == base
    assert digest(contract={"task": "chest-xray", "uncertain_policy": "ones"}) != base
    assert digest(transform=TransformSettings(task="chest-xray", image_size=64, min_image_size=16)) != base
    stat = (site["root"] / "a.png").stat()
    os.utime(site["root"] / "a.png", ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    touched = digest()
    assert touched != base
    site["metadata"].write_text("header changed\n")
    assert digest() != touched


def test_records_without_split_name_the_record(site, tmp_path):
    site["records"].loc[4, "split"] = None
    with pytest.raises(ValueError, match=r"record_id='r4'.*labels.csv:6"):
        _write(site, tmp_path / "out")


def test_qc_report_counts_labels_and_proves_accounting(site, tmp_path):
    _write(site, tmp_path / "out")
    site_dir = tmp_path / "out" / "demo"
    report = build_report(site_dir)
    assert report["accounting"] == {"input_rows": 17, "kept": 13, "quarantined": 4, "holds": True}
    check_accounting(report)

    train = pd.read_parquet(site_dir / "train" / "manifest.parquet")
    row = next(r for r in report["labels"] if (r["split"], r["disease"]) == ("train", "Cardiomegaly"))
    labelled = train["Cardiomegaly"].dropna()
    assert (row["positives"], row["negatives"], row["missing"]) == (
        int((labelled == 1).sum()),
        int((labelled == 0).sum()),
        int(train["Cardiomegaly"].isna().sum()),
    )
    assert row["prevalence"] == pytest.approx(labelled.mean())
    assert next(r for r in report["labels"] if r["disease"] == "Atelectasis")["prevalence"] is None

    images = report["images"]
    assert images["count"] == 13 and images["inverted"] == 0
    assert images["size_before_resize"]["rows"]["max"] == 90
    # Constant images: per-image std 0, so the pooled std is the spread of the gray levels themselves.
    levels = np.array([10, 20, 30, 40, 60, 70] + [80 + k for k in range(7)], dtype=float)
    assert images["mean"] == pytest.approx(levels.mean(), abs=0.01)
    assert images["std"] == pytest.approx(levels.std(), abs=0.01)
    assert set(images["by_view"]) == {"PA", "AP"}
    assert {(r["stage"], r["reason"]): r["count"] for r in report["quarantine"]["by_stage_and_reason"]} == {
        ("scan", "excluded_view"): 1,
        ("decode", "missing_file"): 1,
        ("decode", "unreadable_file"): 1,
        ("decode", "image_too_small"): 1,
    }

    json_path, md_path = write_report(site_dir, report)
    assert json.loads(json_path.read_text()) == report
    markdown = md_path.read_text()
    assert "input rows 17 = kept 13 + quarantined 4**: holds" in markdown
    assert "| train | Cardiomegaly |" in markdown and "tiny.png" in markdown
    grid = site_dir / "qc" / "samples.png"
    assert "![sample images](samples.png)" in markdown
    with Image.open(grid) as png:
        assert png.size == (1280, 380)  # 8 x 2 tiles at 1.6 x 1.9 inches, 100 dpi
    first = grid.read_bytes()
    write_report(site_dir, report)
    assert grid.read_bytes() == first  # same shards, same picture

    report["accounting"].update(input_rows=18, holds=False)
    with pytest.raises(AccountingError, match="input rows 18 != kept 13 \\+ quarantined 4"):
        check_accounting(report)
    assert "DOES NOT HOLD" in render_markdown(report)


def test_central_qc_summary_is_counts_only_with_small_ones_suppressed(site, tmp_path):
    _write(site, tmp_path / "out")
    site_dir = tmp_path / "out" / "demo"
    report = build_report(site_dir)
    summary = central_summary(report, min_count=2)

    assert summary["accounting_holds"] is True and summary["qc_grid_shared"] is False
    assert summary["kept_per_split"] == {split: (n if n >= 2 else "<2") for split, n in report["counts"].items()}
    # Each quarantine reason has one row here: all below 2.
    assert {(r["stage"], r["reason"]): r["count"] for r in summary["quarantine_per_reason"]} == {
        ("scan", "excluded_view"): "<2", ("decode", "missing_file"): "<2",
        ("decode", "unreadable_file"): "<2", ("decode", "image_too_small"): "<2"}
    for full, shared in zip(report["labels"], summary["labels"]):
        small = {key: full[key] < 2 for key in ("positives", "negatives")}
        for key, partner in (("positives", "negatives"), ("negatives", "positives")):
            expected = "<2" if small[key] else "withheld" if small[partner] else full[key]
            assert shared[key] == expected, (full, shared)
    assert any(isinstance(row["positives"], int) for row in summary["labels"])
    text = json.dumps(summary) + render_central_markdown(summary)
    for private in ("tiny.png", "a.png", str(tmp_path), "record", "detail", "input_rows"):
        assert private not in text
    assert "| decode | missing_file | <2 |" in render_central_markdown(summary)
    assert all(row["count"] == "<10" for row in central_summary(report)["quarantine_per_reason"])

    path = write_central_summary(site_dir, summary)
    assert path == site_dir / "qc" / "central.json" and json.loads(path.read_text()) == summary


def test_melanoma_shards_are_rgb(tmp_path):
    root = tmp_path / "derm"
    root.mkdir()
    colours = [(200, 40, 10), (10, 90, 220)]
    for k, colour in enumerate(colours):
        pixels = np.full((48, 64, 3), colour, dtype=np.uint8)
        pixels[-8:, -8:] = 0  # one colour everywhere would be quarantined as a constant image
        Image.fromarray(pixels).save(root / f"{k}.jpg", quality=95)
    records = pd.DataFrame(
        {
            "record_id": ["0", "1"],
            "source_row": ["train.csv:2", "train.csv:3"],
            "patient_id": ["a", "b"],
            "study_id": ["0", "1"],
            "image_path": ["0.jpg", "1.jpg"],
            "view": "unknown",
            "sex": "M",
            "age": np.nan,
            "split": "train",
            "Melanoma": np.array([1.0, 0.0], dtype=np.float32),
        }
    )
    transform = TransformSettings(task="melanoma", image_size=16, min_image_size=8)
    summary = write_site_shards(
        records, None, site="derm", data_root=root, out_dir=tmp_path / "out", transform=transform,
        content_hash="h", input_rows=2, workers=0, progress=False,
    )
    images = np.load(tmp_path / "out" / "derm" / "train" / "images.npy")
    assert summary.kept == 2 and images.shape == (2, 16, 16, 3)
    for k, colour in enumerate(colours):
        assert np.abs(images[k, 8, 8].astype(int) - colour).max() <= 3  # JPEG chroma is lossy
        assert (images[k, :2] == 0).all()  # 48x64 -> 12x16: two black rows above
