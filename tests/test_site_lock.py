"""One writer per site, and recovery from a killed run: the lock names its holder, a killed holder's lock and
an unreadable staging log are taken over with a one-line notice."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pandas as pd
import pytest
import yaml
from PIL import Image
from typer.testing import CliRunner

from pipelines.cli import app
from preprocessing.locks import LOCK_FILE, SiteBusyError
from preprocessing.records import CHEST_XRAY_DISEASES
from preprocessing.shards import STAGING_DIR, TransformSettings, write_site_shards

TRANSFORM = TransformSettings(task="chest-xray", image_size=16, min_image_size=8)


@pytest.fixture
def records(tmp_path):
    root = tmp_path / "data"
    root.mkdir()
    for k in range(7):
        # Each its own picture: the ramp at another brightness alone would be the same one (a near_duplicate).
        texture = np.random.default_rng(k).integers(0, 60, (32, 32))
        Image.fromarray((np.add.outer(np.arange(32), np.arange(32)) + 10 * k + texture).astype(np.uint8)).save(root / f"{k}.png")
    frame = pd.DataFrame({
        "record_id": [str(k) for k in range(7)], "source_row": [f"l.csv:row {k + 1}" for k in range(7)],
        "patient_id": [f"p{k}" for k in range(7)], "study_id": [str(k) for k in range(7)],
        "image_path": [f"{k}.png" for k in range(7)], "view": "PA", "sex": "F", "age": 40.0, "split": "train",
    })
    for disease in CHEST_XRAY_DISEASES:
        frame[disease] = np.float32(np.nan)
    return root, frame


def _write(records, out, digest="h1"):
    root, frame = records
    return write_site_shards(frame, None, site="s", data_root=root, out_dir=out, transform=TRANSFORM,
                             content_hash=digest, input_rows=len(frame), workers=0, chunk_size=3, progress=False)


_HOLD = """
import sys, time
from preprocessing.locks import site_lock
with site_lock(sys.argv[1]):
    print("held", flush=True)
    time.sleep(120)
"""


def _hold_lock(site_dir):
    holder = subprocess.Popen([sys.executable, "-c", _HOLD, str(site_dir)], stdout=subprocess.PIPE, text=True,
                              env=os.environ | {"PYTHONPATH": os.getcwd()})
    assert holder.stdout.readline().strip() == "held"
    return holder


def test_a_second_run_is_refused_with_the_holder_and_a_killed_holder_is_taken_over(records, tmp_path, capfd):
    out = tmp_path / "out"
    holder = _hold_lock(out / "s")
    try:
        with pytest.raises(SiteBusyError) as busy:
            _write(records, out)
        message = str(busy.value)
        assert f"pid {holder.pid} on {socket.gethostname()}, since 20" in message
        assert "fix: wait for it to finish or stop it" in message
        assert not (out / "s" / "shard.json").exists()
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    summary = _write(records, out)  # kill -9 released the flock; the file still names the dead holder
    assert summary.kept == 7
    (notice,) = capfd.readouterr().err.strip().splitlines()
    assert notice.startswith(f"{out / 's'}: taking over the lock of an interrupted run (pid {holder.pid} on "
                             f"{socket.gethostname()}, since 20")
    assert (out / "s" / LOCK_FILE).read_text() == ""  # released cleanly: nothing to recover next time
    _write(records, out, digest="h2")
    assert capfd.readouterr().err == ""


def test_preprocess_command_refuses_a_locked_site_without_a_traceback(tmp_path):
    root = tmp_path / "data"
    root.mkdir()
    Image.fromarray(np.add.outer(np.arange(32), np.arange(32)).astype(np.uint8)).save(root / "a.png")
    (root / "labels.csv").write_text("path,patient,edema\na.png,P1,1\n")
    site = tmp_path / "site.yaml"
    site.write_text(yaml.safe_dump({"name": "locked", "format": "generic-csv", "root": "data", "task": "chest-xray",
                                    "options": {"labels_csv": "labels.csv", "path_column": "path",
                                                "patient_column": "patient", "label_columns": {"Edema": "edema"}}}))
    holder = _hold_lock(tmp_path / "out" / "locked")
    try:
        result = CliRunner().invoke(app, ["preprocess", str(site), "--out", str(tmp_path / "out")])
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    assert result.exit_code == 1
    assert f"another preprocess of this site is running (pid {holder.pid} on" in result.output
    assert "Traceback" not in result.output


def test_an_unreadable_staging_log_is_recovered_with_a_notice(records, tmp_path, capfd):
    _write(records, tmp_path / "fresh")
    out = tmp_path / "out"
    staging = out / "s" / STAGING_DIR / "h1"
    staging.mkdir(parents=True)
    # What two unlocked runs writing one log at once left behind: interleaved, torn JSON lines.
    (staging / "train.jsonl").write_text('{"i": 0, "ok": true}\n{"i": 1, "o{"i": 3, "ok": tr\n{"i": 2}\n')
    np.lib.format.open_memmap(staging / "train.npy", mode="w+", dtype=np.uint8, shape=(7, 16, 16))
    (out / "s" / STAGING_DIR / "0123456789abcdef").mkdir()  # a staging of other inputs
    started = time.monotonic()
    summary = _write(records, out)
    assert summary.kept == 7 and time.monotonic() - started < 30
    notices = capfd.readouterr().err.strip().splitlines()
    assert len(notices) == 2
    assert "0123456789abcdef: removing the staging of an interrupted run over other inputs" in notices[0]
    assert "cannot resume split train of an interrupted run" in notices[1] and "decoding it again" in notices[1]
    for relative in ("train/images.npy", "train/manifest.parquet"):
        assert (out / "s" / relative).read_bytes() == (tmp_path / "fresh" / "s" / relative).read_bytes()
    assert not (out / "s" / STAGING_DIR).exists()
