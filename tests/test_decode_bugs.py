"""A file the decoders cannot read is a quarantine row; an error of fedauc's own code while decoding is not
(preprocessing/tiles.py catches decoding errors only, preprocessing/pool.py raises a worker's bug in the
parent): it stops the run, so a bug never passes for thousands of "unreadable" images."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from preprocessing.pool import DecodeWorkerBug, decode_chunks
from preprocessing.tiles import Chunk, TransformSettings, process_chunk

TRANSFORM = TransformSettings(task="chest-xray", image_size=16, min_image_size=8)


@pytest.fixture
def root(tmp_path):
    for name in ("a.png", "b.png"):
        Image.fromarray(np.add.outer(np.arange(32), np.arange(32)).astype(np.uint8)).save(tmp_path / name)
    return tmp_path


def _chunk(root, names) -> Chunk:
    return Chunk("train", 0, tuple(None if n is None else str(root / n) for n in names), str(root))


def test_a_bug_while_decoding_in_process_is_raised_not_quarantined(root, monkeypatch):
    def broken(pixels, info, path):
        raise KeyError("window_center")  # fedauc's own code, not the file

    monkeypatch.setattr("preprocessing.decode.check_values", broken)
    with pytest.raises(KeyError, match="window_center"):
        process_chunk(_chunk(root, ["a.png"]), TRANSFORM)


def test_a_bug_in_a_decode_worker_stops_the_run_in_the_parent(root):
    # A path the planner would never hand over: decode_image raises a TypeError on it in the worker.
    with pytest.raises(DecodeWorkerBug, match=r"(?s)failed on None with an error in fedauc's code.*TypeError"):
        list(decode_chunks(iter([_chunk(root, ["a.png", None, "b.png"])]), TRANSFORM, workers=1))


def test_an_os_error_reading_the_file_is_still_a_quarantine_row(root, monkeypatch):
    def unreadable(path):
        raise PermissionError(13, "Permission denied", path)

    monkeypatch.setattr("preprocessing.tiles.file_digest", unreadable)
    outcomes = process_chunk(_chunk(root, ["a.png", "b.png"]), TRANSFORM).outcomes
    assert [o["reason"] for o in outcomes] == ["unreadable_file"] * 2
    assert "PermissionError while decoding" in outcomes[0]["detail"] and "a.png" in outcomes[0]["detail"]
