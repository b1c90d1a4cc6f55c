"""A split's staging while its shards are written (``preprocessing.shards`` describes the whole): a slot per
record in ``.staging/<hash>/<split>.npy`` written with ``os.pwrite``, a JSON line per record done (the resume
log), and the finalization that compacts the kept slots, in order, into ``<split>/images.npy``."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pandas as pd

from common.notice import notice
from preprocessing.quarantine import DEDUP_REASONS, QUARANTINE_COLUMNS
from preprocessing.shard_format import IMAGE_DTYPE, IMAGES_FILE, MANIFEST_FILE
from preprocessing.tiles import STAT_COLUMNS, ChunkResult


class SplitStaging:
    """One split's staging array (a slot per record) and its progress log (a JSON line per record done).

    In memory only a bitmap of the records done: the outcomes stay in the log until finalization.
    """

    def __init__(self, staging: Path, split: str, size: int, tile_shape: tuple[int, ...]):
        self.images = staging / f"{split}.npy"
        self.log = staging / f"{split}.jsonl"
        self.size = size
        self.tile_shape = tile_shape
        self.row_bytes = int(np.prod(tile_shape))
        self.done = np.zeros(size, dtype=bool)
        try:
            self._open()
        except (ValueError, KeyError, IndexError, TypeError, OSError) as err:
            notice(f"{staging}: cannot resume split {split} of an interrupted run ({err}); decoding it again")
            self.images.unlink(missing_ok=True)
            self.log.unlink(missing_ok=True)
            self.done[:] = False
            self._open()

    def _open(self) -> None:
        self.finalized = not self.images.exists() and self.log.exists()
        if not self.images.exists() and not self.finalized:
            # open_memmap writes the .npy header and sizes the file (sparse); rows are then pwritten.
            np.lib.format.open_memmap(self.images, mode="w+", dtype=IMAGE_DTYPE, shape=(self.size,) + self.tile_shape)
            self.log.unlink(missing_ok=True)
        self.header_bytes = _npy_header_bytes(self.images) if self.images.exists() else 0
        for outcome in self._complete_lines():
            self.done[json.loads(outcome)["i"]] = True

    def tile(self, row: int) -> np.ndarray | None:
        """Record ``row``'s staged tile (read on demand), None once finalization has moved the staging array."""
        if not self.images.exists():
            return None
        return np.load(self.images, mmap_mode="r")[row]

    @property
    def done_count(self) -> int:
        return int(self.done.sum())

    def pending_ranges(self, chunk_size: int) -> Iterator[tuple[int, int]]:
        if self.finalized:
            return
        start = 0
        while start < self.size:
            while start < self.size and self.done[start]:
                start += 1
            stop = start
            while stop < self.size and not self.done[stop] and stop - start < chunk_size:
                stop += 1
            if stop > start:
                yield start, stop
            start = stop

    def record(self, result: ChunkResult) -> None:
        # Images first, then the log: a record is "done" only once its pixels are on disk.
        with self.images.open("r+b") as handle:
            os.pwrite(handle.fileno(), result.tiles.tobytes(), self.header_bytes + result.start * self.row_bytes)
        lines = "".join(json.dumps(outcome) + "\n" for outcome in result.outcomes)
        with self.log.open("a") as handle:
            handle.write(lines)
        for outcome in result.outcomes:
            self.done[outcome["i"]] = True

    def outcomes(self) -> pd.DataFrame:
        """One row per record of the split, in record order; raises if any record is missing."""
        frame = pd.read_json(self.log, lines=True, dtype=False, convert_dates=False)
        # A chunk redone after an interruption may log a record twice; the later line is the one whose image
        # is on disk.
        frame = frame.drop_duplicates("i", keep="last")
        frame = frame.reindex(columns=["i", "ok", "reason", "detail", "sha256", "dct", "content", *STAT_COLUMNS]).sort_values("i")
        # Text columns stay object even when every record decoded (all NaN): a duplicate found later writes
        # its reason into them.
        frame[["reason", "detail"]] = frame[["reason", "detail"]].astype(object)
        if not np.array_equal(frame["i"].to_numpy(), np.arange(self.size)):
            undone = np.setdiff1d(np.arange(self.size), frame["i"].to_numpy())
            raise RuntimeError(
                f"{self.log}: the log does not hold each of the {self.size} records exactly once "
                f"({len(frame)} lines, {len(undone)} records missing)"
            )
        return frame.reset_index(drop=True)

    def _complete_lines(self) -> list[str]:
        """The log's lines, after cutting a last line that a killed run left half-written (its chunk is redone)."""
        if not self.log.exists():
            return []
        data = self.log.read_bytes()
        complete = data[: data.rfind(b"\n") + 1]
        if len(complete) != len(data):
            with self.log.open("r+b") as handle:
                handle.truncate(len(complete))
        return complete.decode().splitlines()


def finalize_split(
    part: pd.DataFrame, outcomes: pd.DataFrame, stage: SplitStaging, split_dir: Path, chunk_size: int
) -> tuple[int, pd.DataFrame, pd.DataFrame]:
    ok = outcomes["ok"].to_numpy(dtype=bool)

    failed = part.loc[~ok]
    failures = pd.DataFrame(
        {
            "record_id": failed["record_id"].astype("object").to_numpy(),
            "source_row": failed["source_row"].astype("object").to_numpy(),
            "image_path": failed["image_path"].astype("object").to_numpy(),
            "stage": np.where(outcomes.loc[~ok, "reason"].isin(DEDUP_REASONS), "dedup", "decode"),
            "reason": outcomes.loc[~ok, "reason"].to_numpy(),
            "detail": outcomes.loc[~ok, "detail"].to_numpy(),
        },
        columns=list(QUARANTINE_COLUMNS),
    )
    stats = outcomes.loc[ok, list(STAT_COLUMNS)].reset_index(drop=True)
    stats.insert(0, "view", part.loc[ok, "view"].to_numpy())
    stats.insert(0, "split", split_dir.name)
    stats.insert(0, "record_id", part.loc[ok, "record_id"].to_numpy())

    split_dir.mkdir(parents=True, exist_ok=True)
    write_parquet(part.loc[ok].reset_index(drop=True), split_dir / MANIFEST_FILE)
    final = split_dir / IMAGES_FILE
    if not stage.finalized:
        if ok.all():
            os.replace(stage.images, final)
        else:
            _compact(stage, np.flatnonzero(ok), final, chunk_size)
    return int(ok.sum()), failures, stats


def _compact(stage: SplitStaging, kept: np.ndarray, final: Path, chunk_size: int) -> None:
    """Copy the kept staging rows, in order, into ``final``; reads and writes ``chunk_size`` rows at a time."""
    temporary = final.with_suffix(".npy.partial")
    np.lib.format.open_memmap(temporary, mode="w+", dtype=IMAGE_DTYPE, shape=(len(kept),) + stage.tile_shape)
    target_header = _npy_header_bytes(temporary)
    with stage.images.open("rb") as source, temporary.open("r+b") as target:
        for block_start in range(0, len(kept), chunk_size):
            rows = kept[block_start : block_start + chunk_size]
            data = b"".join(
                os.pread(source.fileno(), stage.row_bytes, stage.header_bytes + int(row) * stage.row_bytes)
                for row in rows
            )
            os.pwrite(target.fileno(), data, target_header + block_start * stage.row_bytes)
    os.replace(temporary, final)
    stage.images.unlink()


def _npy_header_bytes(path: Path) -> int:
    return int(np.load(path, mmap_mode="r").offset)


def write_parquet(frame: pd.DataFrame, path: Path) -> None:
    temporary = path.with_suffix(".parquet.partial")
    frame.to_parquet(temporary, index=False)
    os.replace(temporary, path)


def remove_other_staging(root: Path, keep: Path) -> None:
    if root.exists():
        for stale in root.iterdir():
            if stale != keep:
                notice(f"{stale}: removing the staging of an interrupted run over other inputs")
                shutil.rmtree(stale, ignore_errors=True)
