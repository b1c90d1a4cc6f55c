"""Preprocessing throughput: decode+resize+write against decode-only, and the speed-up from 1 to 2 workers.

Writes N synthetic 1024x1024 8-bit PNG chest films (NIH ChestX-ray14 geometry: smooth anatomy-like shading
plus noise, so PNG compression is realistic), then measures on the same files:

* decode-only: ``decode_image`` in a loop in this process (the floor any pipeline pays);
* the pipeline: ``write_site_shards`` with 1 and with 2 worker processes (decode, resize, write, compact,
  manifest), worker start-up included.

Targets: images/s per decoding process of the pipeline >= 0.8 x decode-only, and 2 workers faster than 1.
Peak resident memory is sampled (this process + its workers, summed) every 20 ms during each pipeline run;
``--memory-check`` repeats the 2-worker run on 4x the images to show that it does not grow with the site.

Run: ``.venv/bin/python benchmarks/preprocess.py [--images 400] [--memory-check]``.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import pandas as pd
import psutil
from PIL import Image

from preprocessing.decode import ALLOWED_MODALITIES, decode_image
from preprocessing.records import CHEST_XRAY_DISEASES, RECORD_COLUMNS
from preprocessing.shards import TransformSettings, write_site_shards

TRANSFORM = TransformSettings(task="chest-xray", image_size=224, min_image_size=64)
TARGET_RATIO = 0.8


def make_films(root: Path, count: int, size: int = 1024) -> pd.DataFrame:
    root.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    y, x = np.mgrid[0:size, 0:size] / size
    body = 120 + 80 * np.exp(-((x - 0.5) ** 2 / 0.08 + (y - 0.55) ** 2 / 0.2))
    noise = rng.normal(0, 6, (size, size))  # rolled per film: distinct files without a fresh draw each
    for k in range(count):
        film = body + 25 * np.sin(6 * np.pi * x + k) * (y > 0.3) + np.roll(noise, 37 * k, axis=(0, 1))
        Image.fromarray(np.clip(film, 0, 255).astype(np.uint8)).save(root / f"{k:06d}.png", compress_level=6)
    records = pd.DataFrame(
        {
            "record_id": [f"{k:06d}" for k in range(count)],
            "source_row": [f"bench.csv:{k + 2}" for k in range(count)],
            "patient_id": [f"P{k}" for k in range(count)],
            "study_id": [f"S{k}" for k in range(count)],
            "image_path": [f"{k:06d}.png" for k in range(count)],
            "view": "PA",
            "sex": "unknown",
            "age": np.nan,
            "split": "train",
        },
        columns=list(RECORD_COLUMNS),
    )
    for disease in CHEST_XRAY_DISEASES:
        records[disease] = np.float32(np.nan)
    return records


class PeakMemory:
    """Samples the summed RSS of this process and its children in a background thread."""

    def __init__(self, interval: float = 0.02):
        self.interval, self.peak, self._stop = interval, 0, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        me = psutil.Process()
        while not self._stop.is_set():
            total = me.memory_info().rss
            for child in me.children(recursive=True):
                try:
                    total += child.memory_info().rss
                except psutil.NoSuchProcess:
                    pass
            self.peak = max(self.peak, total)
            time.sleep(self.interval)

    def __enter__(self) -> PeakMemory:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


def decode_only(root: Path, records: pd.DataFrame) -> float:
    start = time.perf_counter()
    for path in records["image_path"]:
        decode_image(root / path, channels=1, allowed_modalities=ALLOWED_MODALITIES["chest-xray"], min_size=64)
    return len(records) / (time.perf_counter() - start)


def pipeline(root: Path, records: pd.DataFrame, out: Path, workers: int) -> tuple[float, int]:
    with PeakMemory() as memory:
        start = time.perf_counter()
        summary = write_site_shards(
            records,
            None,
            site=f"bench-w{workers}",
            data_root=root,
            out_dir=out,
            transform=TRANSFORM,
            content_hash=f"bench-{workers}-{len(records)}",
            input_rows=len(records),
            workers=workers,
            progress=False,
        )
        elapsed = time.perf_counter() - start
    if summary.kept != len(records):
        raise RuntimeError(f"benchmark films failed to decode: {summary.quarantined} quarantined")
    return len(records) / elapsed, memory.peak


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=400)
    parser.add_argument("--memory-check", action="store_true")
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="fedauc-bench-") as tmp:
        tmp = Path(tmp)
        count = args.images * (4 if args.memory_check else 1)
        records = make_films(tmp / "films", count)
        small = records.iloc[: args.images].reset_index(drop=True)
        decode_only(tmp / "films", small.iloc[:20])  # warm the page cache and imports

        decode_rate = decode_only(tmp / "films", small)
        rate_1, peak_1 = pipeline(tmp / "films", small, tmp / "out", workers=1)
        rate_2, peak_2 = pipeline(tmp / "films", small, tmp / "out", workers=2)
        ratio, speedup = rate_1 / decode_rate, rate_2 / rate_1
        mib = 1 / 2**20
        print(f"{args.images} PNG films 1024x1024 -> 224x224 uint8 shards, {psutil.cpu_count()} CPUs")
        print(f"  decode-only, 1 process           {decode_rate:8.1f} images/s")
        print(f"  decode+resize+write, 1 worker    {rate_1:8.1f} images/s   peak RSS {peak_1 * mib:6.0f} MiB")
        print(f"  decode+resize+write, 2 workers   {rate_2:8.1f} images/s   peak RSS {peak_2 * mib:6.0f} MiB")
        print(f"  pipeline / decode-only (1 process each): {ratio:.2f}  (target >= {TARGET_RATIO})")
        print(f"  speed-up 1 -> 2 workers:                 {speedup:.2f}x")
        ok = ratio >= TARGET_RATIO and speedup > 1.0
        if args.memory_check:
            rate_big, peak_big = pipeline(tmp / "films", records, tmp / "out", workers=2)
            print(
                f"  {count} images, 2 workers:  {rate_big:8.1f} images/s   peak RSS {peak_big * mib:6.0f} MiB "
                f"(x{peak_big / peak_2:.2f} the RSS for x4 the images)"
            )
            ok = ok and peak_big < 1.25 * peak_2
    print("PASS" if ok else "FAIL: below target")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
