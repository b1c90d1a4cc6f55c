"""Preprocessing throughput: decode+resize+write against decode-only, and the speed-up from 1 to 2 workers.

Writes N synthetic 1024x1024 8-bit PNG chest films (NIH ChestX-ray14 geometry: smooth anatomy-like shading
plus noise, so PNG compression is realistic), then measures on the same files:

* decode-only: ``decode_image`` in a loop in this process (the floor any pipeline pays);
* the pipeline: ``write_site_shards`` with 1 and with 2 worker processes (decode, resize, write, compact,
  manifest).

"Per process" is measured in CPU time (this process plus its workers, from ``getrusage``), which other
load on a shared machine does not distort the way it distorts wall time: images per CPU-second of the
pipeline against images per CPU-second of decode-only. A spawned worker spends about 0.7 CPU-seconds
importing numpy, pandas and pydicom, once per run; that start-up is measured with an empty pool and
reported apart, as a site of 200,000 images pays it once. The 1 -> 2 worker speed-up is in wall time,
start-up included, best of ``--rounds`` interleaved rounds. Targets: pipeline >= 0.8 x decode-only per
CPU-second, and 2 workers faster than 1.

Run: ``.venv/bin/python benchmarks/preprocess.py [--images 400] [--memory-check]``.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import contextlib
import multiprocessing
import resource
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

    def __init__(self, interval: float = 0.1):
        self.interval, self.peak, self._stop = interval, 0, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        me = psutil.Process()
        while not self._stop.is_set():
            total = me.memory_info().rss
            for child in me.children(recursive=True):
                with contextlib.suppress(psutil.NoSuchProcess):
                    total += child.memory_info().rss
            self.peak = max(self.peak, total)
            time.sleep(self.interval)

    def __enter__(self) -> PeakMemory:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


def cpu_seconds() -> float:
    """CPU time of this process and of its children that have exited (the pool's workers, after shutdown)."""
    mine, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return mine.ru_utime + mine.ru_stime + children.ru_utime + children.ru_stime


def decode_only(root: Path, records: pd.DataFrame) -> float:
    """CPU seconds to decode every record in this process."""
    start = cpu_seconds()
    for path in records["image_path"]:
        decode_image(root / path, channels=1, allowed_modalities=ALLOWED_MODALITIES["chest-xray"], min_size=64)
    return cpu_seconds() - start


def _worker_ready(_: int) -> int:
    return 0


def worker_startup(workers: int) -> float:
    """CPU seconds to start and stop a spawned pool like the shard writer's, with the same imports."""
    start = cpu_seconds()
    with cf.ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        list(pool.map(_worker_ready, range(workers)))
    return cpu_seconds() - start


def pipeline(root: Path, records: pd.DataFrame, out: Path, workers: int) -> tuple[float, float, int]:
    """Wall seconds, CPU seconds (all processes) and peak resident memory (bytes) of one shard run."""
    with PeakMemory() as memory:
        start, start_cpu = time.perf_counter(), cpu_seconds()
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
        elapsed, cpu = time.perf_counter() - start, cpu_seconds() - start_cpu
    if summary.kept != len(records):
        raise RuntimeError(f"benchmark films failed to decode: {summary.quarantined} quarantined")
    return elapsed, cpu, memory.peak


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=400)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--memory-check", action="store_true")
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="fedauc-bench-") as tmp:
        tmp = Path(tmp)
        count = args.images * (4 if args.memory_check else 1)
        records = make_films(tmp / "films", count)
        small = records.iloc[: args.images].reset_index(drop=True)
        decode_only(tmp / "films", small)  # warm the page cache and imports

        n, mib = len(small), 1 / 2**20
        decode_cpu, startup_cpu, walls, cpus, peaks = [], {}, {1: [], 2: []}, {1: [], 2: []}, {1: 0, 2: 0}
        for round_ in range(args.rounds):
            decode_cpu.append(decode_only(tmp / "films", small))
            for workers in (1, 2):
                startup_cpu[workers] = worker_startup(workers)
                elapsed, cpu, peak = pipeline(tmp / "films", small, tmp / f"out{round_}", workers)
                walls[workers].append(elapsed)
                cpus[workers].append(cpu - startup_cpu[workers])
                peaks[workers] = max(peaks[workers], peak)
        decode_rate = n / min(decode_cpu)
        rate = {workers: n / min(cpus[workers]) for workers in (1, 2)}
        print(f"{n} PNG films 1024x1024 -> 224x224 uint8 shards, {psutil.cpu_count()} CPUs, best of {args.rounds} rounds")
        print(f"  decode-only, 1 process         {decode_rate:7.1f} images per CPU-second")
        for workers in (1, 2):
            print(
                f"  decode+resize+write, {workers} worker{'s' if workers > 1 else ' '} {rate[workers]:7.1f} images per CPU-second, "
                f"{n / min(walls[workers]):7.1f} images/s wall, worker start-up {startup_cpu[workers]:.1f} CPU-s, "
                f"peak RSS {peaks[workers] * mib:5.0f} MiB"
            )
        ratio, speedup = rate[1] / decode_rate, min(walls[1]) / min(walls[2])
        print(f"  pipeline / decode-only, per CPU-second: {ratio:.2f}  (target >= {TARGET_RATIO})")
        print(f"  speed-up 1 -> 2 workers, wall time:     {speedup:.2f}x")
        ok = ratio >= TARGET_RATIO and speedup > 1.0
        if args.memory_check:
            elapsed, _, peak_big = pipeline(tmp / "films", records, tmp / "out", workers=2)
            print(
                f"  {count} images, 2 workers: {count / elapsed:7.1f} images/s total, peak RSS {peak_big * mib:5.0f} MiB "
                f"(x{peak_big / peaks[2]:.2f} the RSS of {n} images)"
            )
            ok = ok and peak_big < 1.25 * peaks[2]
    print("PASS" if ok else "FAIL: below target")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
