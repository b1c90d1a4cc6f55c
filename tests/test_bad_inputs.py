"""The bad-input matrix: one hospital export holding every kind of bad row and file fedauc knows, run through
scan and shard writing in worker processes. Each row must end kept or quarantined with its own reason,
``input rows = kept + quarantined`` must hold, and the run must finish within a bound."""

from __future__ import annotations

import os
import shutil
import socket
import time

import numpy as np
import pandas as pd
import pytest
import yaml
from hostile_files import (
    SLOW_PNG_PIXELS,
    SLOW_PNG_SIDE,
    big_png,
    big_rle_dicom,
    dicom,
    j2k_dicom_declaring,
    slow_png,
    structured_report,
    video_dicom,
)
from PIL import Image

from preprocessing.qc import build_report
from preprocessing.scan import scan_site
from preprocessing.shards import QUARANTINE_FILE, shard_site
from preprocessing.sites import load_site

RAMP = np.add.outer(np.arange(64), np.arange(64))


def _png(path, offset=0):
    # Each offset its own picture: the ramp at another brightness alone is the same picture, a near-duplicate.
    texture = np.random.default_rng(offset).integers(0, 60, RAMP.shape)
    Image.fromarray(np.clip(RAMP + offset + texture, 0, 255).astype(np.uint8)).save(path)


@pytest.fixture
def hostile_site(tmp_path):
    """(site YAML, {image path: expected reason or "kept"}); one CSV row per entry, plus scan-stage rows."""
    root = tmp_path / "export"
    img = root / "img"
    img.mkdir(parents=True)
    outside = tmp_path / "outside"
    outside.mkdir()
    _png(outside / "secret.png", 99)
    expected: dict[str, str] = {}
    rows = []

    def row(path, reason, patient=None, cardio="1", view="PA", split=""):
        rows.append({"path": path, "patient": patient if patient is not None else f"P{len(rows)}",
                     "cardio": cardio, "view": view, "split": split})
        if reason is not None:
            expected[path] = reason

    for k in range(6):
        _png(img / f"ok{k}.png", k)
        row(f"img/ok{k}.png", "kept", split="train" if k in (0, 3, 4) else "")
    # today's cases
    row("img/missing.png", "missing_file")
    (img / "junk.dcm").write_bytes(b"\x00" * 300)
    row("img/junk.dcm", "unreadable_file")
    Image.fromarray(RAMP[:8, :8].astype(np.uint8)).save(img / "tiny.png")
    row("img/tiny.png", "image_too_small")
    dicom(img / "ct.dcm", RAMP * 16, Modality="CT")
    row("img/ct.dcm", "wrong_modality")
    structured_report(img / "sr.dcm")
    row("img/sr.dcm", "not_an_image")
    video_dicom(img / "video.dcm")
    row("img/video.dcm", "unsupported_transfer_syntax")
    row("img/ok1.png", None, patient="")  # missing_field: no patient (the path is another row's)
    row("img/ok2.png", None, patient="P2")  # duplicate_row: the same record id again
    _png(img / "label.png", 40)
    row("img/label.png", "unparsable_label", cardio="maybe")
    _png(img / "lateral.png", 41)
    row("img/lateral.png", "excluded_view", view="LATERAL")
    _png(img / "leak_a.png", 42)
    _png(img / "leak_b.png", 43)
    row("img/leak_a.png", "patient_in_two_splits", patient="P-two", split="train")
    row("img/leak_b.png", "patient_in_two_splits", patient="P-two", split="test")
    # paths
    row("../outside/secret.png", "outside_root")
    row(str(outside / "secret.png"), "outside_root")  # absolute
    os.symlink(outside / "secret.png", img / "link.png")
    row("img/link.png", "outside_root")
    os.symlink("/dev/zero", img / "zero.dcm")
    row("img/zero.dcm", "outside_root")
    os.mkfifo(img / "fifo.png")
    row("img/fifo.png", "not_a_regular_file")
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(img / "sock.png"))
    row("img/sock.png", "not_a_regular_file")
    (img / "folder.png").mkdir()
    row("img/folder.png", "not_a_regular_file")
    # sizes, before decoding
    big_png(img / "huge.png", SLOW_PNG_SIDE + 1000, SLOW_PNG_SIDE + 1000)
    row("img/huge.png", "too_large")
    big_rle_dicom(img / "huge_rle.dcm")
    row("img/huge_rle.dcm", "too_large")
    j2k_dicom_declaring(img / "huge_j2k.dcm", 20000, 20000)
    row("img/huge_j2k.dcm", "too_large")
    _, decode_timeout_s = slow_png(img / "slow.png", target_size=16)  # allowed by the limits, slower than their timeout
    row("img/slow.png", "decode_timeout")
    # numbers that make no image
    dicom(img / "nan.dcm", RAMP * 16, RescaleSlope="NaN", RescaleIntercept="0")
    row("img/nan.dcm", "nonfinite_values")
    Image.fromarray(np.full((64, 64), 90, dtype=np.uint8)).save(img / "flat.png")
    row("img/flat.png", "constant_image")
    dicom(img / "window.dcm", RAMP * 16, WindowCenter="100000", WindowWidth="10")
    row("img/window.dcm", "blank_after_window")
    # leaks: ok0's bytes again under another patient, in the official test split
    shutil.copy(img / "ok0.png", img / "copy_of_ok0.png")
    row("img/copy_of_ok0.png", "duplicate_content", split="test")
    row("./img/ok3.png", "duplicate_content", split="test")  # the same file spelled another way
    os.symlink("ok4.png", img / "alias_of_ok4.png")
    row("img/alias_of_ok4.png", "duplicate_content", split="test")

    pd.DataFrame(rows).to_csv(root / "labels.csv", index=False)
    site = {
        "name": "hostile",
        "format": "generic-csv",
        "root": "export",
        "task": "chest-xray",
        "split": {"seed": 0, "valid": 0.0, "test": 0.2},
        "image_size": 16,
        "min_image_size": 16,
        "decode_limits": {"max_pixels": SLOW_PNG_PIXELS, "timeout_s": decode_timeout_s},
        "options": {"labels_csv": "labels.csv", "path_column": "path", "patient_column": "patient",
                    "label_columns": {"Cardiomegaly": "cardio"}, "view_column": "view", "split_column": "split"},
    }
    path = tmp_path / "hostile.yaml"
    path.write_text(yaml.safe_dump(site))
    yield path, expected, len(rows)
    sock.close()


def test_every_bad_input_ends_with_its_reason(hostile_site, tmp_path):
    site_yaml, expected, csv_rows = hostile_site
    started = time.monotonic()
    config = load_site(site_yaml)
    scan = scan_site(config)
    summary = shard_site(config, scan, tmp_path / "shards", workers=2, progress=False)
    elapsed = time.monotonic() - started

    assert summary.input_rows == csv_rows
    assert summary.input_rows == summary.kept + summary.quarantined
    quarantine = pd.read_parquet(summary.site_dir / QUARANTINE_FILE)
    kept = pd.concat(pd.read_parquet(summary.site_dir / split / "manifest.parquet")
                     for split, count in summary.counts.items() if count)
    assert len(kept) == summary.kept and len(quarantine) == summary.quarantined

    by_path = quarantine.groupby("image_path")["reason"].apply(sorted).to_dict()
    for path, reason in expected.items():
        if reason == "kept":
            assert path in set(kept["image_path"]), path
        else:
            assert by_path.get(path, [None])[-1] == reason, (path, by_path.get(path))
    # scan-stage rows share a path with a kept row: the reason is on the row, not the file
    assert sorted(by_path["img/ok1.png"]) == ["missing_field"]
    assert sorted(by_path["img/ok2.png"]) == ["duplicate_row"]
    assert set(quarantine["reason"]) == set(expected.values()) - {"kept"} | {"missing_field", "duplicate_row"}
    duplicate = quarantine.set_index("image_path").loc["img/copy_of_ok0.png"]
    assert duplicate["stage"] == "dedup" and "byte-identical to img/ok0.png" in duplicate["detail"]

    report = build_report(summary.site_dir)
    assert report["accounting"]["holds"]
    counts = {(r["stage"], r["reason"]): r["count"] for r in report["quarantine"]["by_stage_and_reason"]}
    assert counts[("dedup", "duplicate_content")] == 3 and counts[("decode", "too_large")] == 3
    assert elapsed < 120, f"the bad-input run took {elapsed:.0f} s"
