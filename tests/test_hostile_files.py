"""Hostile image files, one decoder call each: paths out of the root, non-regular files, declared sizes over
the limits (before any pixel buffer), numbers that make no image; the decode pool's timeout and crash
recovery; the memory bound on a crafted oversized file."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
from hostile_files import (
    SLOW_PNG_PIXELS,
    big_png,
    big_rle_dicom,
    deflated_dicom,
    dicom,
    j2k_dicom_declaring,
    jpeg_declaring,
    slow_png,
    tiff_declaring,
)
from PIL import Image

from preprocessing.decode import DecodeError, DecodeLimits, decode_image
from preprocessing.decode_limits import codestream_size
from preprocessing.pool import decode_chunks
from preprocessing.quarantine import Reason
from preprocessing.tiles import Chunk, TransformSettings


def _reason(path, **kwargs) -> str:
    with pytest.raises(DecodeError) as caught:
        decode_image(path, **kwargs)
    return caught.value.reason.value


def _ramp_png(path, rows=64, columns=64):
    Image.fromarray(np.add.outer(np.arange(rows), np.arange(columns)).astype(np.uint8)).save(path)
    return path


@pytest.fixture
def root(tmp_path):
    data = tmp_path / "site"
    data.mkdir()
    return data


def test_paths_resolving_outside_the_root_are_never_read(tmp_path, root):
    outside = _ramp_png(tmp_path / "secret.png")
    (root / "img").mkdir()
    os.symlink(outside, root / "img" / "link.png")
    inside = _ramp_png(root / "img" / "ok.png")
    os.symlink(inside, root / "img" / "inside_link.png")

    assert _reason(root / "img" / ".." / ".." / "secret.png", root=root) == "outside_root"
    assert _reason(outside, root=root) == "outside_root"  # an absolute path in the label file
    assert _reason(root / "img" / "link.png", root=root) == "outside_root"
    assert decode_image(root / "img" / "inside_link.png", root=root).info.rows == 64  # a link within the root is fine
    # without a root (``fedauc inspect``) the same file decodes
    assert decode_image(root / "img" / "link.png").info.rows == 64


def test_fifos_devices_sockets_and_folders_are_never_opened(root):
    os.mkfifo(root / "pipe.png")
    os.symlink("/dev/zero", root / "zero.dcm")
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(root / "sock.png"))
    (root / "folder.png").mkdir()
    os.symlink("/dev/zero", root / "zero_link.png")
    started = time.monotonic()
    for name, kind in [("pipe.png", "FIFO"), ("sock.png", "socket"), ("folder.png", "folder")]:
        with pytest.raises(DecodeError, match=kind) as caught:
            decode_image(root / name, root=root)
        assert caught.value.reason == Reason.NOT_A_REGULAR_FILE
    # /dev/zero is outside any site root; without a root it is still no regular file
    assert _reason(root / "zero.dcm", root=root) == "outside_root"
    with pytest.raises(DecodeError, match="character device") as caught:
        decode_image(root / "zero_link.png")
    assert caught.value.reason == Reason.NOT_A_REGULAR_FILE
    assert time.monotonic() - started < 5  # nothing blocked on the FIFO
    server.close()


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda p: big_png(p / "huge.png", 12000, 12000), "12000x12000 pixels"),
        (lambda p: jpeg_declaring(p / "huge.jpg", 12000, 12000), "12000x12000 pixels"),
        (lambda p: tiff_declaring(p / "huge.tif", 12000, 12000), "12000x12000 pixels"),
        (lambda p: jpeg_declaring(p / "bomb.jpg", 20000, 20000), "400000000 pixels"),  # Pillow's own bomb check
        (lambda p: big_rle_dicom(p / "huge_rle.dcm"), "20000x20000 pixels"),
        (lambda p: j2k_dicom_declaring(p / "huge_j2k.dcm", 20000, 20000), "compressed frame declares 20000x20000"),
    ],
    ids=["png", "jpeg", "tiff", "jpeg-over-pillow-limit", "dicom-rle", "dicom-jpeg2000-codestream"],
)
def test_oversized_headers_are_rejected_before_decoding(tmp_path, make, message):
    path = make(tmp_path)
    started = time.monotonic()
    with pytest.raises(DecodeError, match=message) as caught:
        decode_image(path)
    assert caught.value.reason == Reason.TOO_LARGE
    assert time.monotonic() - started < 2  # the header alone: decoding any of these takes far longer


def test_bits_frames_file_and_inflated_size_limits(tmp_path):
    ramp = np.add.outer(np.arange(64), np.arange(64)) * 16
    assert _reason(dicom(tmp_path / "frames.dcm", ramp, NumberOfFrames=5000)) == "too_large"
    assert _reason(_ramp_png(tmp_path / "a.png"), limits=DecodeLimits(max_file_bytes=100)) == "too_large"
    bomb = deflated_dicom(tmp_path / "deflated.dcm")
    assert bomb.stat().st_size < 100_000  # 8 MB inflated
    with pytest.raises(DecodeError, match="inflates to more than") as caught:
        decode_image(bomb, limits=DecodeLimits(max_file_bytes=1_000_000))
    assert caught.value.reason == Reason.TOO_LARGE
    assert decode_image(bomb).info.rows == 2000  # within the default limits the same file decodes
    sixteen = np.add.outer(np.arange(64), np.arange(64)).astype(np.uint16) * 16
    Image.fromarray(sixteen).save(tmp_path / "sixteen.png")
    assert _reason(tmp_path / "sixteen.png", limits=DecodeLimits(max_bits=8)) == "too_large"


def test_codestream_size_reads_jpeg_and_jpeg2000_headers(tmp_path):
    jpeg = jpeg_declaring(tmp_path / "x.jpg", 300, 200).read_bytes()
    assert codestream_size(jpeg) == (300, 200)
    j2k = j2k_dicom_declaring(tmp_path / "x.dcm", 123, 456).read_bytes()
    assert codestream_size(j2k[j2k.index(b"\xff\x4f\xff\x51") :]) == (123, 456)
    assert codestream_size(b"\x00" * 40) is None


def test_numbers_that_make_no_image(tmp_path):
    ramp = np.add.outer(np.arange(64), np.arange(64)) * 16
    assert _reason(dicom(tmp_path / "nan.dcm", ramp, RescaleSlope="NaN", RescaleIntercept="0")) == "nonfinite_values"
    assert _reason(dicom(tmp_path / "inf.dcm", ramp, RescaleSlope="1", RescaleIntercept="inf")) == "nonfinite_values"
    assert _reason(dicom(tmp_path / "nanw.dcm", ramp, WindowCenter="NaN", WindowWidth="400")) == "nonfinite_values"
    assert _reason(dicom(tmp_path / "flat.dcm", np.full((64, 64), 900))) == "constant_image"
    Image.fromarray(np.full((64, 64), 77, dtype=np.uint8)).save(tmp_path / "flat.png")
    assert _reason(tmp_path / "flat.png") == "constant_image"
    Image.fromarray(np.full((64, 64, 3), (10, 200, 30), dtype=np.uint8)).save(tmp_path / "flat_rgb.png")
    assert _reason(tmp_path / "flat_rgb.png") == "constant_image"
    # The data is 0..2016, the window 100000 +- 5: everything maps to the window's lower bound.
    windowed = dicom(tmp_path / "blank.dcm", ramp, WindowCenter="100000", WindowWidth="10")
    with pytest.raises(DecodeError, match="all become 0") as caught:
        decode_image(windowed)
    assert caught.value.reason == Reason.BLANK_AFTER_WINDOW
    assert decode_image(dicom(tmp_path / "ok.dcm", ramp, WindowCenter="1000", WindowWidth="2000")).info.intensity == "window"


_RSS_PROBE = """
import json, resource, sys
from preprocessing.decode import DecodeError, decode_image
decode_image(sys.argv[1])  # a small file first: imports and decoder setup are the baseline
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
reasons = []
for path in sys.argv[2:]:
    try:
        decode_image(path)
        reasons.append("kept")
    except DecodeError as err:
        reasons.append(err.reason.value)
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"reasons": reasons, "growth_mb": (after - before) / 1024}))
"""


def test_oversized_files_do_not_raise_peak_memory(tmp_path):
    """The bound (docs/quarantine.md): a rejected file adds nothing measurable to a worker's peak RSS.

    Decoded, the RLE DICOM alone would take 800 MB (11.9 GB in the old decoder) and the PNG 144 MB.
    """
    files = [big_rle_dicom(tmp_path / "rle.dcm"), big_png(tmp_path / "big.png", 12000, 12000),
             j2k_dicom_declaring(tmp_path / "j2k.dcm", 20000, 20000)]
    small = _ramp_png(tmp_path / "small.png")
    probe = subprocess.run(
        [sys.executable, "-c", _RSS_PROBE, str(small), *map(str, files)],
        capture_output=True, text=True, check=True, env=os.environ | {"PYTHONPATH": os.getcwd()},
    )
    result = json.loads(probe.stdout.splitlines()[-1])
    assert result["reasons"] == ["too_large"] * 3
    assert result["growth_mb"] < 40, result  # the RLE file is 12.6 MB and is read once, header first


def _chunk(root, names):
    return Chunk("train", 0, tuple(str(root / name) for name in names), str(root))


def test_a_decode_past_the_timeout_replaces_its_worker_and_the_run_goes_on(root):
    for name in ("a.png", "b.png", "c.png"):
        _ramp_png(root / name)
    _, timeout_s = slow_png(root / "slow.png", target_size=16)
    transform = TransformSettings(task="chest-xray", image_size=16, min_image_size=8,
                                  limits=DecodeLimits(max_pixels=SLOW_PNG_PIXELS, timeout_s=timeout_s))
    started = time.monotonic()
    results = list(decode_chunks(iter([_chunk(root, ["a.png", "slow.png", "b.png"]), _chunk(root, ["c.png"])]),
                                 transform, workers=1))
    outcomes = [outcome for result in results for outcome in result.outcomes]
    assert [(o["ok"], o.get("reason")) for o in outcomes] == [
        (True, None), (False, "decode_timeout"), (True, None), (True, None)
    ]
    assert "slow.png" in outcomes[1]["detail"] and f"timeout_s={timeout_s:g}" in outcomes[1]["detail"]
    assert results[0].tiles[2].max() > 0  # the file after the stuck one was decoded by the replacement
    assert time.monotonic() - started < 60


def test_a_worker_killed_mid_file_is_replaced_and_that_file_quarantined(root):
    for name in ("a.png", "b.png"):
        _ramp_png(root / name)
    slow, _ = slow_png(root / "slow.png", target_size=16)
    transform = TransformSettings(task="chest-xray", image_size=16, min_image_size=8,
                                  limits=DecodeLimits(max_pixels=SLOW_PNG_PIXELS))

    def kill_the_worker_on_the_slow_file():
        # As the OOM killer would, mid-decode: SIGKILL to the decoding child while it holds slow.png open.
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            for pid in _decode_workers(os.getpid()):
                if str(slow) in _open_files(pid):
                    os.kill(pid, signal.SIGKILL)
                    return
            time.sleep(0.01)

    killer = threading.Thread(target=kill_the_worker_on_the_slow_file)
    chunks = iter([_chunk(root, ["a.png", "slow.png", "b.png"])])
    results = decode_chunks(chunks, transform, workers=1)
    killer.start()
    outcomes = next(results).outcomes
    killer.join()
    assert [o.get("reason") for o in outcomes] == [None, "decoder_crashed", None]
    assert "killed by SIGKILL" in outcomes[1]["detail"]


def _decode_workers(parent: int) -> list[int]:
    """The spawned children of ``parent`` that run multiprocessing's spawn entry point."""
    found = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/stat") as handle:
                parent_of_entry = int(handle.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{entry}/cmdline", "rb") as handle:
                command = handle.read()
        except OSError:
            continue
        if parent_of_entry == parent and b"spawn_main" in command:
            found.append(int(entry))
    return found


def _open_files(pid: int) -> set[str]:
    opened = set()
    try:
        descriptors = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return opened
    for descriptor in descriptors:
        try:
            opened.add(os.readlink(f"/proc/{pid}/fd/{descriptor}"))
        except OSError:
            continue
    return opened
