"""Turn image files into shard tiles: the part of shard writing that runs in the decoding workers.

``preprocessing.shards`` (the parent) plans chunks and writes what ``process_chunk`` returns; a failure
to decode is an outcome carrying its quarantine reason, never an exception that would stop the run. Only
a failure to decode: an error of fedauc's own code is raised (``preprocessing.pool`` raises it in the
parent), not written down as the file's fault.
"""

from __future__ import annotations

import hashlib
import zlib
from dataclasses import dataclass, field

import numpy as np
from pydicom.errors import InvalidDicomError

from preprocessing.body_parts import ANATOMIC_REGIONS, BODY_PARTS
from preprocessing.decode import (
    ALLOWED_MODALITIES,
    DECODER_VERSION,
    DEFAULT_LIMITS,
    DecodeError,
    DecodeLimits,
    decode_image,
)
from preprocessing.perceptual_hash import dct_signature
from preprocessing.quarantine import Reason
from preprocessing.records import TASK_CHANNELS, label_columns
from preprocessing.resize import INTERPOLATION, RESIZE_MODE, resize_to_square

# What the decoding libraries raise for a file they cannot read, where a decoder has not already turned it
# into a DecodeError: the file system's and Pillow's (OSError, which UnidentifiedImageError is; SyntaxError
# for a broken header), pydicom's parser and its lazy value conversion (InvalidDicomError, EOFError,
# ValueError; zlib.error for a deflated DICOM). Anything else (a KeyError, an AttributeError...) is a bug.
DECODING_ERRORS: tuple[type[Exception], ...] = (OSError, SyntaxError, ValueError, EOFError, InvalidDicomError,
                                                zlib.error)

# Per-image facts kept for the QC report (qc/image_stats.parquet, row order = manifest order per split).
STAT_COLUMNS: tuple[str, ...] = (
    "format",
    "modality",
    "manufacturer",
    "photometric",
    "bits_stored",
    "transfer_syntax",
    "intensity",
    "inverted",
    "rows",
    "columns",
    "mean",
    "std",
)


@dataclass(frozen=True)
class TransformSettings:
    """Everything that changes pixels for the same file; part of the content hash."""

    task: str
    image_size: int = 224
    min_image_size: int = 64
    resize_mode: str = RESIZE_MODE
    interpolation: str = INTERPOLATION
    decoder_version: str = DECODER_VERSION
    limits: DecodeLimits = DEFAULT_LIMITS

    def __post_init__(self) -> None:
        label_columns(self.task)  # rejects an unknown task with the list of known ones
        if self.image_size < 1 or self.min_image_size < 0:
            raise ValueError(
                f"image_size must be >= 1 and min_image_size >= 0, got {self.image_size}, {self.min_image_size}"
            )

    @property
    def channels(self) -> int:
        return TASK_CHANNELS[self.task]

    @property
    def tile_shape(self) -> tuple[int, ...]:
        size = self.image_size
        return (size, size) if self.channels == 1 else (size, size, 3)


@dataclass(frozen=True)
class Chunk:
    split: str
    start: int  # first record index within the split; the chunk covers start .. start + len(paths) - 1
    paths: tuple[str, ...]
    root: str  # the site's data root: a path resolving outside it is never read


@dataclass
class ChunkResult:
    split: str
    start: int
    tiles: np.ndarray  # uint8 (len(paths), *tile_shape); zeros where decoding failed
    outcomes: list[dict] = field(default_factory=list)


def process_chunk(chunk: Chunk, transform: TransformSettings) -> ChunkResult:
    """Decode and resize one chunk in this process. A failure is an outcome, never an exception."""
    tiles = np.zeros((len(chunk.paths),) + transform.tile_shape, dtype=np.uint8)
    outcomes = []
    for offset in range(len(chunk.paths)):
        tile, outcome = process_file(chunk, offset, transform)
        if tile is not None:
            tiles[offset] = tile
        outcomes.append(outcome)
    return ChunkResult(chunk.split, chunk.start, tiles, outcomes)


def failed_outcome(index: int, reason: Reason, detail: str) -> dict:
    return {"i": index, "ok": False, "reason": reason.value, "detail": detail}


def process_file(chunk: Chunk, offset: int, transform: TransformSettings) -> tuple[np.ndarray | None, dict]:
    """The tile (None on failure) and the outcome of the chunk's file ``offset``."""
    index, path = chunk.start + offset, chunk.paths[offset]
    try:
        decoded = decode_image(
            path,
            channels=transform.channels,
            allowed_modalities=ALLOWED_MODALITIES[transform.task],
            min_size=transform.min_image_size,
            root=chunk.root,
            limits=transform.limits,
            target_size=transform.image_size,
            body_parts=(BODY_PARTS[transform.task], ANATOMIC_REGIONS[transform.task]),
        )
        digest = file_digest(path)
    except DecodeError as err:
        return None, failed_outcome(index, err.reason, err.detail)
    except DECODING_ERRORS as err:
        return None, failed_outcome(index, Reason.UNREADABLE_FILE, f"{path}: {type(err).__name__} while decoding: {err}")
    tile = resize_to_square(decoded.pixels, transform.image_size)
    top, left, height, width = tile.content
    content = tile.pixels[top : top + height, left : left + width]
    info = decoded.info
    return tile.pixels, {
        "i": index,
        "ok": True,
        "format": info.format,
        "modality": info.modality,
        "manufacturer": info.manufacturer,
        "photometric": info.photometric,
        "bits_stored": info.bits_stored,
        "transfer_syntax": info.transfer_syntax,
        "intensity": info.intensity,
        "inverted": info.inverted,
        "rows": info.rows,
        "columns": info.columns,
        "mean": float(content.mean()),
        "std": float(content.std()),
        "sha256": digest,
        # Site-local like the digest: the staging log holds it until the duplicate passes, nothing else does.
        "dct": dct_signature(content),
        # Where the picture sits in the tile, for the near-duplicate check to cut the padding off.
        "content": [int(top), int(left), int(height), int(width)],
    }


def file_digest(path: str) -> str:
    """SHA-256 of the file's bytes: byte-identical images under two patients or splits are a leak."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
