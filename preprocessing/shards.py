"""Write a site's shards (``docs/shards.md``): decode and resize in worker processes, the parent writes.

Memory stays bounded whatever the site size: images go from workers to disk one chunk at a time
(``chunk_size`` images, at most two chunks per worker in flight), written with ``os.pwrite`` into a
preallocated ``.npy`` rather than through a memory map, so written pages are page cache, not resident
memory of this process.

Keeping ``manifest row i == images.npy[i]`` when some files fail to decode: every record of a split first
gets a slot in a staging array ``.staging/<hash>/<split>.npy`` (N slots). Once all are done, the kept
slots are compacted in order into ``<split>/images.npy`` block by block; when nothing failed the staging
file is simply renamed. Failed records go to ``quarantine.parquet`` with their decode reason.

Resume: each finished chunk appends one line per record to ``.staging/<hash>/<split>.jsonl`` after its
images are written, so an interrupted run (Ctrl-C, a killed worker, a crash) redoes only the chunks whose
lines are missing. ``shard.json`` is written last; when it holds the same content hash, a re-run does no work.
The resume survives a process interruption; a log it cannot read (a power loss) restarts that split.

One writer per site: the run holds ``<site>/.lock`` (``preprocessing.locks``); a second run of the same
site is refused with the holder's pid, host and start time. Decoding runs in ``preprocessing.pool``
workers with a per-file time limit. Byte-identical files kept under two patients or in two splits would
leak a test image into training: all but the first (train before valid before test, then record order)
are quarantined DUPLICATE_CONTENT (stage "dedup", ``preprocessing.duplicates``); the same picture in other
bytes (an 8-bit export, a re-UIDed or rescaled copy) is NEAR_DUPLICATE (``preprocessing.near_duplicates``).

The staging arrays, their resume logs and the finalization are ``preprocessing.shard_staging``.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import pandas as pd
from tqdm import tqdm

from common.notice import notice
from preprocessing.duplicates import quarantine_duplicate_content
from preprocessing.locks import site_lock
from preprocessing.near_duplicates import quarantine_near_duplicates
from preprocessing.pool import decode_chunks
from preprocessing.quarantine import QUARANTINE_COLUMNS, SELECTION_RULES, Reason, empty_quarantine
from preprocessing.records import RECORD_COLUMNS, SPLITS, label_columns
from preprocessing.shard_format import (
    BINDING_FIELD,
    FORMAT_VERSION,
    IMAGE_STATS_FILE,
    QC_DIR,
    QUARANTINE_FILE,
    SHARD_FILE,
    STAGING_DIR,
    ShardInfo,
    load_shard_info,
)
from preprocessing.shard_integrity import file_digests
from preprocessing.shard_staging import SplitStaging, finalize_split, remove_other_staging, write_parquet
from preprocessing.tiles import STAT_COLUMNS, Chunk, TransformSettings


@dataclass(frozen=True)
class ShardSummary:
    site: str
    site_dir: Path
    content_hash: str
    counts: dict[str, int]  # kept images per split, 0 for an absent split
    input_rows: int
    kept: int
    quarantined: int
    reused: bool  # True when the shards on disk already had this content hash: no work was done


def content_hash(
    records: pd.DataFrame,
    metadata_files: Sequence[Path],
    data_root: Path,
    label_contract: Mapping,
    transform: TransformSettings,
) -> str:
    """SHA-256 over the inputs, the label contract and the transform settings (``docs/shards.md``).

    Inputs: each metadata file's bytes, the records themselves (so an adapter change that alters them
    counts), and each image file's identity (relative path, size, mtime): statting 200,000 files takes
    seconds where hashing their bytes would take hours.
    """
    digest = hashlib.sha256()
    digest.update(json.dumps({"format": FORMAT_VERSION, "selection": SELECTION_RULES, "transform": asdict(transform)},
                             sort_keys=True).encode())
    digest.update(json.dumps(label_contract, sort_keys=True, default=str).encode())
    for path in sorted(Path(p) for p in metadata_files):
        digest.update(f"\0metadata:{path.name}\0".encode())
        with path.open("rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
    digest.update(pd.util.hash_pandas_object(records, index=False).to_numpy().tobytes())
    for image_path in records["image_path"]:
        try:
            stat = (data_root / image_path).stat()
            identity = f"{image_path}\0{stat.st_size}\0{stat.st_mtime_ns}\n"
        except OSError:
            identity = f"{image_path}\0missing\n"
        digest.update(identity.encode())
    return digest.hexdigest()


def write_site_shards(
    records: pd.DataFrame,
    scan_quarantine: pd.DataFrame,
    *,
    site: str,
    data_root: Path,
    out_dir: Path,
    transform: TransformSettings,
    content_hash: str,
    input_rows: int,
    workers: int = 1,
    chunk_size: int = 32,
    progress: bool = True,
    privacy: dict | None = None,
    ledger_binding: str | None = None,
) -> ShardSummary:
    """Decode, resize and write every record of ``records`` into ``out_dir/<site>/`` (``docs/shards.md``).

    ``records``: canonical records (``RECORD_COLUMNS`` + the task's label columns) with ``split`` set.
    ``scan_quarantine``: rows already quarantined by the scan; written to ``quarantine.parquet`` together
    with this stage's decode failures. ``workers``: decoding processes; 0 decodes in this process.
    """
    _validate_records(records, transform.task)
    if workers < 0 or chunk_size < 1:
        raise ValueError(f"workers must be >= 0 and chunk_size >= 1, got {workers}, {chunk_size}")
    site_dir = Path(out_dir) / site
    with site_lock(site_dir):
        info = load_shard_info(site_dir)
        if info is not None and info.get("content_hash") == content_hash:
            if info.get(BINDING_FIELD) != ledger_binding:  # the same files at another root: re-bound, not decoded
                _write_atomic(site_dir / SHARD_FILE, json.dumps({**info, BINDING_FIELD: ledger_binding}, indent=2) + "\n")
            return _summary_from_info(site, site_dir, info, reused=True)
        return _write_locked(
            records, scan_quarantine, site, data_root, site_dir, transform, content_hash, input_rows,
            workers, chunk_size, progress, privacy, ledger_binding,
        )


def _write_locked(
    records: pd.DataFrame,
    scan_quarantine: pd.DataFrame,
    site: str,
    data_root: Path,
    site_dir: Path,
    transform: TransformSettings,
    content_hash: str,
    input_rows: int,
    workers: int,
    chunk_size: int,
    progress: bool,
    privacy: dict | None,
    ledger_binding: str | None,
) -> ShardSummary:
    # From here the shards on disk are stale: without shard.json they cannot be mistaken for a finished run.
    (site_dir / SHARD_FILE).unlink(missing_ok=True)
    staging = site_dir / STAGING_DIR / content_hash[:16]
    remove_other_staging(site_dir / STAGING_DIR, keep=staging)
    staging.mkdir(parents=True, exist_ok=True)

    splits = {name: part.reset_index(drop=True) for name in SPLITS if len(part := records[records["split"] == name])}
    stages = {name: SplitStaging(staging, name, len(part), transform.tile_shape) for name, part in splits.items()}
    resumed = sum(stage.done_count for stage in stages.values())
    if resumed:
        notice(f"{site_dir}: resuming an interrupted run, {resumed} of {len(records)} images already done")
    _decode_pending(splits, stages, data_root, transform, workers, chunk_size, progress, site)

    outcomes = {name: stages[name].outcomes() for name in splits}
    quarantine_duplicate_content(splits, outcomes)
    quarantine_near_duplicates(splits, outcomes, lambda split, row: stages[split].tile(row))
    decode_failures, stats, counts = [], [], dict.fromkeys(SPLITS, 0)
    for name, part in splits.items():
        kept, failures, split_stats = finalize_split(part, outcomes[name], stages[name], site_dir / name, chunk_size)
        counts[name] = kept
        decode_failures.append(failures)
        stats.append(split_stats)
    for name in SPLITS:
        if name not in splits:
            shutil.rmtree(site_dir / name, ignore_errors=True)

    quarantine = pd.concat([_as_quarantine(scan_quarantine), *decode_failures], ignore_index=True)
    write_parquet(quarantine, site_dir / QUARANTINE_FILE)
    image_stats = pd.concat(stats, ignore_index=True) if stats else _empty_stats()
    (site_dir / QC_DIR).mkdir(exist_ok=True)
    write_parquet(image_stats, site_dir / IMAGE_STATS_FILE)

    info: ShardInfo = {
        "format_version": FORMAT_VERSION,
        "site": site,
        "task": transform.task,
        "diseases": list(label_columns(transform.task)),
        "image_size": transform.image_size,
        "channels": transform.channels,
        "content_hash": content_hash,
        "counts": counts,
        "input_rows": int(input_rows),
        "kept": int(sum(counts.values())),
        "quarantined": int(len(quarantine)),
        "transform": asdict(transform),
        # The site's declared privacy budget travels with its shards (hashed: it is in the label contract), so a
        # site whose ledger is lost refuses every job (federated/privacy/budget.py).
        "privacy": privacy,
        BINDING_FIELD: ledger_binding,  # which of the site's privacy ledgers guards these records
        "files": file_digests(site_dir),
    }
    _write_atomic(site_dir / SHARD_FILE, json.dumps(info, indent=2) + "\n")
    shutil.rmtree(site_dir / STAGING_DIR, ignore_errors=True)
    return _summary_from_info(site, site_dir, info, reused=False)


# --------------------------------------------------------------------------- decoding


def _decode_pending(
    splits: dict[str, pd.DataFrame],
    stages: dict[str, SplitStaging],
    data_root: Path,
    transform: TransformSettings,
    workers: int,
    chunk_size: int,
    progress: bool,
    site: str,
) -> None:
    total = sum(len(part) for part in splits.values())
    done = sum(stage.done_count for stage in stages.values())
    chunks = (
        Chunk(name, start, tuple(str(data_root / p) for p in splits[name]["image_path"].iloc[start:stop]), str(data_root))
        for name, stage in stages.items()
        for start, stop in stage.pending_ranges(chunk_size)
    )
    with tqdm(total=total, initial=done, desc=f"{site}: images", unit="img", disable=not progress) as bar:
        for result in decode_chunks(chunks, transform, workers):
            stages[result.split].record(result)
            bar.update(len(result.outcomes))


# --------------------------------------------------------------------------- small helpers


def _validate_records(records: pd.DataFrame, task: str) -> None:
    expected = list(RECORD_COLUMNS) + list(label_columns(task))
    missing = [column for column in expected if column not in records.columns]
    if missing:
        raise ValueError(f"records lack columns {missing}; expected {expected}")
    bad_split = ~records["split"].isin(SPLITS)
    if bad_split.any():
        row = records.loc[bad_split].iloc[0]
        raise ValueError(
            f"{int(bad_split.sum())} records have no split in {SPLITS} "
            f"(first: record_id={row['record_id']!r}, source_row={row['source_row']!r}, split={row['split']!r})"
        )
    duplicated = records["record_id"].duplicated()
    if duplicated.any():
        raise ValueError(f"record_id is not unique: {records.loc[duplicated, 'record_id'].iloc[0]!r} repeats")
    uncertain = records[list(label_columns(task))].eq(-1.0).any(axis=1)
    if uncertain.any():
        row = records.loc[uncertain].iloc[0]
        raise ValueError(
            f"records still hold uncertain (-1) labels; harmonize them first "
            f"(first: record_id={row['record_id']!r}, source_row={row['source_row']!r})"
        )


def _as_quarantine(rows: pd.DataFrame) -> pd.DataFrame:
    if rows is None or rows.empty:
        return empty_quarantine()
    missing = [column for column in QUARANTINE_COLUMNS if column not in rows.columns]
    if missing:
        raise ValueError(f"scan quarantine lacks columns {missing}; expected {list(QUARANTINE_COLUMNS)}")
    unknown = set(rows["reason"]) - {reason.value for reason in Reason}
    if unknown:
        raise ValueError(f"scan quarantine has unknown reasons {sorted(unknown)}")
    return rows[list(QUARANTINE_COLUMNS)].astype("object")


def _empty_stats() -> pd.DataFrame:
    return pd.DataFrame(columns=["record_id", "split", "view", *STAT_COLUMNS])


def _write_atomic(path: Path, text: str) -> None:
    temporary = path.with_suffix(path.suffix + ".partial")
    temporary.write_text(text)
    os.replace(temporary, path)


def _summary_from_info(site: str, site_dir: Path, info: dict, reused: bool) -> ShardSummary:
    return ShardSummary(
        site=site,
        site_dir=site_dir,
        content_hash=info["content_hash"],
        counts=dict(info["counts"]),
        input_rows=int(info["input_rows"]),
        kept=int(info["kept"]),
        quarantined=int(info["quarantined"]),
        reused=reused,
    )


def shard_site(config, scan, out_dir: Path, workers: int = 1, progress: bool = True,
               ledger_binding: str | None = None) -> ShardSummary:
    """Write the shards of a scanned site: ``config`` is a ``SiteConfig``, ``scan`` its ``ScanResult``.

    The label contract in the content hash is the whole site declaration except its name and data root
    (those move the output and the files, whose identities are hashed on their own) and the fedauc versions
    it accepts jobs from, its PACS, whether its images are synthetic and the quarantine share it tolerates (they
    change no shard).
    """
    transform = TransformSettings(
        task=config.task, image_size=config.image_size, min_image_size=config.min_image_size,
        limits=config.decode_limits,
    )
    contract = config.model_dump(mode="json", exclude={"name", "root", "allowed_code_versions", "pacs",
                                                                 "synthetic", "max_quarantine_share"})
    digest = content_hash(scan.records, scan.metadata_files, config.root, contract, transform)
    return write_site_shards(
        scan.records,
        scan.quarantine,
        site=config.name,
        data_root=config.root,
        out_dir=Path(out_dir),
        transform=transform,
        content_hash=digest,
        input_rows=scan.input_rows,
        workers=workers,
        progress=progress,
        privacy=None if config.privacy is None else config.privacy.model_dump(),
        ledger_binding=ledger_binding,
    )
