"""`fedauc preprocess` end to end: a generic-csv site on disk, a real Prefect run, shards, QC report, re-run."""

from __future__ import annotations

import json
import time

import numpy as np
import pandas as pd
import pytest
import yaml
from PIL import Image
from pydicom.dataset import Dataset, FileMetaDataset
from pydicom.uid import DigitalXRayImageStorageForPresentation, ExplicitVRLittleEndian, RLELossless, generate_uid
from typer.testing import CliRunner

from pipelines.prefect_env import configure_prefect_env, prefect_env_defaults


def _monochrome1_rle(path, rows=96, columns=80):
    ds = Dataset()
    ds.file_meta = FileMetaDataset()
    ds.file_meta.TransferSyntaxUID = ExplicitVRLittleEndian
    ds.file_meta.MediaStorageSOPClassUID = DigitalXRayImageStorageForPresentation
    ds.file_meta.MediaStorageSOPInstanceUID = generate_uid()
    ds.SOPClassUID = DigitalXRayImageStorageForPresentation
    ds.SOPInstanceUID = ds.file_meta.MediaStorageSOPInstanceUID
    ds.Modality = "DX"
    stored = np.zeros((rows, columns), dtype=np.uint16)
    stored[:, columns // 2 :] = 4095  # right half at the maximum: dark in MONOCHROME1
    ds.set_pixel_data(stored, "MONOCHROME1", 12)
    ds.compress(RLELossless)
    ds.save_as(path, enforce_file_format=True)


@pytest.fixture
def site_yaml(tmp_path):
    root = tmp_path / "hospital"
    (root / "img").mkdir(parents=True)
    rows = []
    for k in range(24):
        name = f"img/{k:03d}.png"
        pixels = np.full((100 + k, 90), 5 * k, dtype=np.uint8)
        pixels[-1, -1] = 255  # one pixel off: a constant image is quarantined
        Image.fromarray(pixels).save(root / name)
        rows.append({"path": name, "patient": f"P{k // 2}", "cardio": k % 2, "edema": "" if k % 3 else "-1"})
    _monochrome1_rle(root / "img" / "m1.dcm")
    (root / "img" / "broken.dcm").write_bytes(b"\x00" * 400)
    rows += [
        {"path": "img/m1.dcm", "patient": "P100", "cardio": 1, "edema": 0},
        {"path": "img/broken.dcm", "patient": "P101", "cardio": 0, "edema": 1},
        {"path": "img/not_there.png", "patient": "P102", "cardio": 0, "edema": 0},
        {"path": "img/000.png", "patient": "P0", "cardio": 1, "edema": 1},  # duplicate row
        {"path": "img/003.png", "patient": "", "cardio": 0, "edema": 0},  # no patient id
    ]
    pd.DataFrame(rows).to_csv(root / "labels.csv", index=False)
    site = {
        "name": "riverside",
        "format": "generic-csv",
        "root": "hospital",
        "task": "chest-xray",
        "views": ["PA", "AP", "unknown"],
        "split": {"seed": 1, "valid": 0.2, "test": 0.2},
        "image_size": 32,
        "min_image_size": 16,
        "options": {
            "labels_csv": "labels.csv",
            "path_column": "path",
            "patient_column": "patient",
            "label_columns": {"Cardiomegaly": "cardio", "Edema": "edema"},
        },
    }
    path = tmp_path / "riverside.yaml"
    path.write_text(yaml.safe_dump(site))
    return path


def test_prefect_env_defaults_do_not_override(monkeypatch):
    monkeypatch.setenv("PREFECT_LOGGING_LEVEL", "DEBUG")
    for name in prefect_env_defaults():
        if name != "PREFECT_LOGGING_LEVEL":
            monkeypatch.delenv(name, raising=False)
    applied = configure_prefect_env()
    assert "PREFECT_LOGGING_LEVEL" not in applied
    assert applied["PREFECT_SERVER_ANALYTICS_ENABLED"] == "false"
    assert applied["PREFECT_HOME"].endswith(".prefect")


@pytest.mark.slow
def test_preprocess_command_runs_the_prefect_flow(site_yaml, tmp_path):
    out = tmp_path / "shards"
    runner = CliRunner()
    result = runner.invoke(app_for_test(), ["preprocess", str(site_yaml), "--out", str(out), "--workers", "1"])
    assert result.exit_code == 0, result.output
    assert "input rows 29 = kept 25 + quarantined 4" in result.output

    site_dir = out / "riverside"
    info = json.loads((site_dir / "shard.json").read_text())
    assert sum(info["counts"].values()) == 25 and info["diseases"][0] == "Cardiomegaly"
    manifests = [pd.read_parquet(site_dir / s / "manifest.parquet") for s in info["counts"] if info["counts"][s]]
    patients = [set(m["patient_id"]) for m in manifests]
    assert all(a.isdisjoint(b) for i, a in enumerate(patients) for b in patients[i + 1 :])  # split by patient
    merged = pd.concat(manifests)
    assert merged["Atelectasis"].isna().all()  # not in this dataset's labels: missing, not negative
    m1_split = merged.loc[merged["image_path"] == "img/m1.dcm", "split"].item()
    m1_manifest = pd.read_parquet(site_dir / m1_split / "manifest.parquet")
    m1 = np.load(site_dir / m1_split / "images.npy", mmap_mode="r")[m1_manifest.index[m1_manifest["image_path"] == "img/m1.dcm"][0]]
    assert m1[16, 5] == 255 and m1[16, 25] == 0  # inverted: the stored maximum is black

    quarantine = pd.read_parquet(site_dir / "quarantine.parquet").set_index("image_path")
    assert quarantine.loc["img/broken.dcm", "reason"] == "unreadable_file"
    assert quarantine.loc["img/not_there.png", "reason"] == "missing_file"
    assert set(quarantine["reason"]) == {"unreadable_file", "missing_file", "duplicate_row", "missing_field"}

    report = json.loads((site_dir / "qc" / "report.json").read_text())
    assert report["accounting"] == {"input_rows": 29, "kept": 25, "quarantined": 4, "holds": True}
    assert report["images"]["inverted"] == 1
    assert "| valid | Cardiomegaly |" in (site_dir / "qc" / "report.md").read_text()

    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        artifact = client.read_latest_artifacts()
    # Prefect gets the counts-only QC summary (small counts suppressed); the file names stay in the site's report.
    shared = next(a.data for a in artifact if a.key == "qc-riverside")
    assert "input rows = kept + quarantined: holds" in shared and "| decode | missing_file | <10 |" in shared
    assert "not_there.png" in (site_dir / "qc" / "report.md").read_text() and "not_there" not in shared
    # Runs named by what they did where, the site's folder in none of them; the result in the flow run's log.
    with get_client(sync_client=True) as client:
        (flow_run,) = [run for run in client.read_flow_runs() if run.name == "preprocess riverside"]
        steps = {run.name for run in client.read_task_runs() if run.flow_run_id == flow_run.id}
        assert steps == {"scan riverside", "write-shards riverside", "qc-report riverside"}
        deadline = time.monotonic() + 30
        while not any(log.message.startswith("site riverside: shards written") for log in client.read_logs()):
            assert time.monotonic() < deadline, "the flow run's result never reached Prefect's log"
            time.sleep(1)

    # A re-run with nothing changed does no work; the shards are left untouched.
    images = site_dir / m1_split / "images.npy"
    before = images.stat().st_mtime_ns
    result = runner.invoke(app_for_test(), ["preprocess", str(site_yaml), "--out", str(out), "--workers", "1"])
    assert result.exit_code == 0, result.output
    assert "unchanged, nothing to do" in result.output
    assert images.stat().st_mtime_ns == before


def app_for_test():
    from pipelines.cli import app

    return app
