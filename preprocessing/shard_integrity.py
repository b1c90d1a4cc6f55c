"""Shards damaged after preprocessing are named before training opens them (docs/shards.md, its Integrity part).

The writer records every split file's size and SHA-256 in ``shard.json`` (``files``). Every training opens
a site's shards through :func:`check_shard_files` first (in-process, under torchrun and at an NVIDIA FLARE
site alike): each ``images.npy`` header must give the shape ``shard.json`` promises (its split's count,
``image_size``, ``channels``) and the file exactly the bytes that header needs, and every recorded file its
recorded size: cheap (a header and a ``stat`` per file). ``full=True`` (``fedauc consortium start-site``)
also hashes every file against its recorded digest, which finds a changed byte of the same size. A
damaged file is a ``DataError`` naming the site, the file and the fix, instead of numpy's
``mmap length is greater than file size`` in the middle of a job.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np

from common.errors import DataError
from preprocessing.records import SPLITS
from preprocessing.shard_format import IMAGE_DTYPE, IMAGES_FILE, MANIFEST_FILE

_CHUNK = 1 << 20


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(_CHUNK):
            digest.update(block)
    return digest.hexdigest()


def split_files(site_dir: str | Path) -> list[Path]:
    """Every split file of a site's shards (images and manifest of each split on disk)."""
    site_dir = Path(site_dir)
    return [site_dir / split / name for split in SPLITS for name in (IMAGES_FILE, MANIFEST_FILE)
            if (site_dir / split / name).is_file()]


def file_digests(site_dir: str | Path) -> dict[str, dict]:
    """``shard.json``'s ``files``: relative path -> ``{"bytes", "sha256"}`` of every split file."""
    site_dir = Path(site_dir)
    return {path.relative_to(site_dir).as_posix(): {"bytes": path.stat().st_size, "sha256": _sha256(path)}
            for path in split_files(site_dir)}


def _npy_layout(path: Path) -> tuple[tuple[int, ...], np.dtype, int]:
    """(shape, dtype, header bytes) of a .npy file, from its header alone."""
    with open(path, "rb") as f:
        version = np.lib.format.read_magic(f)
        read = {(1, 0): np.lib.format.read_array_header_1_0, (2, 0): np.lib.format.read_array_header_2_0}.get(version)
        if read is None:
            raise ValueError(f"npy format version {version}")
        shape, _, dtype = read(f)
        return tuple(shape), np.dtype(dtype), f.tell()


def check_shard_files(site_dir: str | Path, info: dict, full: bool = False) -> None:
    """Raise a ``DataError`` naming the site and the first damaged file of ``site_dir`` (``info``: its
    ``shard.json``); ``full`` also compares every recorded file's content hash."""
    site_dir = Path(site_dir)
    site = info.get("site", site_dir.name)
    fix = f"re-run `fedauc preprocess <{site}'s site YAML> --out {site_dir.parent}` to write the site's shards again"
    counts, size, channels = info.get("counts", {}), info.get("image_size"), info.get("channels", 1)

    def named(path: Path) -> str:
        # The file inside the shard folder first: over NVIDIA FLARE the site's folder is redacted from what the
        # centre reads (federated/flare/site/failure.py), the file's name in the shard layout is not.
        return f"{path.relative_to(site_dir).as_posix()} (in {site_dir})"
    for split in SPLITS:
        path = site_dir / split / IMAGES_FILE
        if not path.is_file():
            continue
        try:
            shape, dtype, offset = _npy_layout(path)
        except (ValueError, OSError) as err:
            raise DataError(f"site {site!r}: {named(path)} is damaged: its header cannot be read ({err})", fix=fix) from None
        expected = (counts.get(split, shape[0]), size, size, *(() if channels == 1 else (channels,)))
        if dtype != IMAGE_DTYPE or (size is not None and shape != expected):
            raise DataError(f"site {site!r}: {named(path)} holds {dtype} {shape}, shard.json promises {IMAGE_DTYPE} "
                            f"{expected}: the file was changed after preprocessing", fix=fix)
        needed = offset + int(np.prod(shape)) * dtype.itemsize
        actual = path.stat().st_size
        if actual != needed:
            what = "truncated" if actual < needed else "changed (longer than its header says)"
            raise DataError(f"site {site!r}: {named(path)} is {what}: {actual} bytes, its {shape} images need {needed}",
                            fix=fix)
    for name, recorded in info.get("files", {}).items():
        path = site_dir / name
        if not path.is_file():
            if any(other.is_file() for other in path.parent.glob("*")):
                continue  # its split's partner file is there: read_split names the missing one
            raise DataError(f"site {site!r}: split {path.parent.name!r} is missing ({path}; shard.json records it)",
                            fix=fix)
        actual = path.stat().st_size
        if actual != recorded["bytes"]:
            raise DataError(f"site {site!r}: {named(path)} was {'truncated' if actual < recorded['bytes'] else 'changed'} "
                            f"after preprocessing: {actual} bytes, shard.json records {recorded['bytes']}", fix=fix)
        if full and _sha256(path) != recorded["sha256"]:
            raise DataError(f"site {site!r}: {named(path)} was changed after preprocessing: its content no longer "
                            "matches the SHA-256 in shard.json", fix=fix)
