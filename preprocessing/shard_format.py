"""The site shard format (docs/shards.md): file names, dtypes, the format version, and the checked reads.

Every writer and reader of shards takes names and dtypes from here: the shard writer
(``preprocessing.shards``), the QC report, the training loader (``federated.data``) and the pipelines.
Readers go through :func:`read_shard_info` and :func:`read_split`, which refuse what they cannot read
with a :class:`~common.errors.DataError` that names the file and says how to rewrite the shards.

``FORMAT_VERSION`` changes whenever a reader of the previous version would misread a new shard (a file,
column, dtype or pixel convention changes); the content hash covers it, so a re-run of
``fedauc preprocess`` rewrites shards of another version instead of reusing them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TypedDict

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from common.errors import DataError
from preprocessing.records import SPLITS  # the split directories a shard may hold

FORMAT_VERSION = 1

SHARD_FILE = "shard.json"  # written last: a site directory without it is an unfinished run
# shard.json's field naming the data the shards were written from (federated/privacy/binding.py): it picks the
# site's privacy ledger. Not in the content hash: moving the same files re-binds their shards without decoding them.
BINDING_FIELD = "ledger_binding"
IMAGES_FILE = "images.npy"  # per split
MANIFEST_FILE = "manifest.parquet"  # per split; row i describes images.npy[i]
QUARANTINE_FILE = "quarantine.parquet"
QC_DIR = "qc"
IMAGE_STATS_FILE = f"{QC_DIR}/image_stats.parquet"
STAGING_DIR = ".staging"
LOCK_FILE = ".lock"  # flock-ed by the run writing the site (preprocessing.locks); empty after a clean exit

IMAGE_DTYPE = np.dtype(np.uint8)  # (N, H, W) for 1-channel tasks, (N, H, W, 3) for RGB
LABEL_DTYPE = np.dtype(np.float32)  # 1.0 positive, 0.0 negative, NaN missing


class ShardInfo(TypedDict):
    """The fields of ``shard.json`` (docs/shards.md)."""

    format_version: int
    site: str
    task: str
    diseases: list[str]  # the label columns, in order
    image_size: int
    channels: int
    content_hash: str
    counts: dict[str, int]  # kept images per split, 0 for a split absent from disk
    input_rows: int
    kept: int
    quarantined: int
    transform: dict
    privacy: dict | None  # the site's declared budget {epsilon, delta} (docs/privacy.md section 2; absent before it)
    ledger_binding: str | None  # the binding id of the data they came from (absent before it)
    files: dict[str, dict]  # split file -> {"bytes", "sha256"} (preprocessing/shard_integrity.py; absent before it)


def images_path(site_dir: str | Path, split: str) -> Path:
    return Path(site_dir) / split / IMAGES_FILE


def manifest_path(site_dir: str | Path, split: str) -> Path:
    return Path(site_dir) / split / MANIFEST_FILE


def is_finished(site_dir: str | Path) -> bool:
    """True when the writer finished this site directory (its ``shard.json`` exists)."""
    return (Path(site_dir) / SHARD_FILE).is_file()


def rewrite_fix(site_dir: Path) -> str:
    return f"re-run `fedauc preprocess <the site's yaml> --out {site_dir.parent}` to write the site's shards again"


def read_shard_info(site_dir: str | Path) -> ShardInfo:
    """``shard.json`` of a finished shard of this format version; a DataError with the fix otherwise."""
    site_dir = Path(site_dir)
    path = site_dir / SHARD_FILE
    if not path.is_file():
        raise DataError(f"{site_dir}: not a finished site shard (no {SHARD_FILE}; an interrupted run leaves none)",
                        fix=rewrite_fix(site_dir))
    try:
        info = json.loads(path.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise DataError(f"{path}: not valid JSON ({err})", fix=rewrite_fix(site_dir)) from None
    if not isinstance(info, dict):
        raise DataError(f"{path}: expected a JSON object, got {type(info).__name__}", fix=rewrite_fix(site_dir))
    version = info.get("format_version")
    if version != FORMAT_VERSION:
        written = "no format version" if version is None else f"format v{version}"
        fix = rewrite_fix(site_dir)
        if isinstance(version, int) and version > FORMAT_VERSION:
            fix = f"install the fedauc that wrote them on this machine, or {fix}"
        raise DataError(f"shards at {site_dir} were written by {written}, this fedauc reads v{FORMAT_VERSION}",
                        fix=fix)
    diseases = info.get("diseases")
    if not isinstance(diseases, list) or not diseases or not all(isinstance(d, str) for d in diseases):
        raise DataError(f"{path}: field 'diseases' must be a non-empty list of label column names, got {diseases!r}",
                        fix=rewrite_fix(site_dir))
    return info  # type: ignore[return-value]


def load_shard_info(site_dir: str | Path) -> dict | None:
    """The parsed ``shard.json`` as it is on disk, or None when there is none (the writer's reuse check:
    a shard of another version has another content hash, so it is rewritten, never reused)."""
    path = Path(site_dir) / SHARD_FILE
    if not path.exists():
        return None
    return json.loads(path.read_text())


def shard_content_hash(site_dir: str | Path) -> str:
    """The content hash of a finished shard: what identifies its data in caches and MLflow runs."""
    info = read_shard_info(site_dir)
    if not isinstance(info.get("content_hash"), str):
        raise DataError(f"{Path(site_dir) / SHARD_FILE}: field 'content_hash' is missing",
                        fix=rewrite_fix(Path(site_dir)))
    return info["content_hash"]


def read_columns(path: Path, columns: list[str] | tuple[str, ...], fix: str, what: str = "columns") -> pa.Table:
    """``columns`` of the Parquet file ``path``; a missing column is a DataError naming the file, with ``fix``.

    Read, and converted (``float_columns``, ``to_pylist``), without pandas: a hospital's training process reads
    its manifests and has no other use for it (about 33 MB of a process's own memory, in every simulated site),
    and pyarrow's ``read_table``, ``to_numpy`` and ``group_by`` import pandas wherever it is installed."""
    with pq.ParquetFile(path) as file:
        if missing := [c for c in columns if c not in file.schema_arrow.names]:
            raise DataError(f"{path}: {what} {missing} missing", fix=fix)
        return file.read(columns=list(columns))


def float_columns(path: Path, columns: list[str] | tuple[str, ...], fix: str, what: str = "columns") -> np.ndarray:
    """``columns`` of the Parquet file ``path`` as one float32 array (rows, columns), nulls as NaN (pandas writes
    a float column's NaN as a null); a column that is not numeric is a DataError naming the file and column."""
    table = read_columns(path, columns, fix, what)
    out = np.empty((table.num_rows, len(columns)), LABEL_DTYPE)
    for k, name in enumerate(columns):
        try:
            array = pc.cast(table.column(name), pa.float32()).combine_chunks()
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as err:
            raise DataError(f"{path}: column {name!r} is not numeric ({err})", fix=fix) from None
        if table.num_rows:
            # A primitive array's values buffer (Arrow's columnar format); a null's slot holds any value.
            out[:, k] = np.frombuffer(array.buffers()[1], LABEL_DTYPE, table.num_rows, 4 * array.offset)
            out[np.from_dlpack(pc.cast(pc.is_null(array), pa.uint8())).astype(bool), k] = np.nan
    return out


def read_split(site_dir: str | Path, split: str, diseases: list[str] | tuple[str, ...]
               ) -> tuple[np.ndarray, np.ndarray] | None:
    """``(images, labels)`` of one split, images memory-mapped; None when the split is absent from disk.

    ``labels`` is float32 (N, C) in ``diseases`` order with values 1, 0 or NaN. A file missing beside its
    partner, a wrong dtype, a missing label column, a label outside {0, 1, NaN} or a row-count mismatch
    is a DataError naming the file (and row and column).
    """
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    site_dir = Path(site_dir)
    images_file, manifest_file = images_path(site_dir, split), manifest_path(site_dir, split)
    if not images_file.exists() and not manifest_file.exists():
        return None
    for p in (images_file, manifest_file):
        if not p.is_file():
            raise DataError(f"{p}: missing while the other file of split {split!r} exists", fix=rewrite_fix(site_dir))
    images = np.load(images_file, mmap_mode="r")
    if images.dtype != IMAGE_DTYPE:
        raise DataError(f"{images_file}: expected {IMAGE_DTYPE} images, got {images.dtype}", fix=rewrite_fix(site_dir))
    labels = float_columns(manifest_file, diseases, rewrite_fix(site_dir),
                           what=f"label columns (the diseases of {site_dir / SHARD_FILE})")
    bad = ~(np.isnan(labels) | (labels == 0.0) | (labels == 1.0))
    if bad.any():
        row, col = map(int, np.argwhere(bad)[0])
        raise DataError(f"{manifest_file}: row {row}, column {diseases[col]!r}: label {float(labels[row, col])!r} "
                        "is not 0, 1 or NaN", fix=rewrite_fix(site_dir))
    if len(images) != len(labels):
        raise DataError(f"{images_file}: {len(images)} images but {manifest_file} has {len(labels)} rows",
                        fix=rewrite_fix(site_dir))
    return images, labels

