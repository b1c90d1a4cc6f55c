"""Turn image files into shard tiles: the part of shard writing that runs in the decoding workers.

``preprocessing.shards`` (the parent) plans chunks and writes what ``process_chunk`` returns; a failure
to decode is an outcome carrying its quarantine reason, never an exception that would stop the run.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from preprocessing.decode import ALLOWED_MODALITIES, DECODER_VERSION, DecodeError, decode_image
from preprocessing.quarantine import Reason
from preprocessing.records import TASK_CHANNELS, label_columns
from preprocessing.resize import INTERPOLATION, RESIZE_MODE, resize_to_square

# Per-image facts kept for the QC report (qc/image_stats.parquet, row order = manifest order per split).
STAT_COLUMNS: tuple[str, ...] = (
    "format",
    "modality",
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


@dataclass
class ChunkResult:
    split: str
    start: int
    tiles: np.ndarray  # uint8 (len(paths), *tile_shape); zeros where decoding failed
    outcomes: list[dict] = field(default_factory=list)


def process_chunk(chunk: Chunk, transform: TransformSettings) -> ChunkResult:
    """Decode and resize one chunk; runs in a worker process. A failure is an outcome, never an exception."""
    tiles = np.zeros((len(chunk.paths),) + transform.tile_shape, dtype=np.uint8)
    outcomes = []
    allowed = ALLOWED_MODALITIES[transform.task]
    for offset, path in enumerate(chunk.paths):
        index = chunk.start + offset
        try:
            decoded = decode_image(
                path, channels=transform.channels, allowed_modalities=allowed, min_size=transform.min_image_size
            )
        except DecodeError as err:
            outcomes.append({"i": index, "ok": False, "reason": err.reason.value, "detail": err.detail})
            continue
        except Exception as err:
            detail = f"{path}: unexpected {type(err).__name__} while decoding: {err}"
            outcomes.append({"i": index, "ok": False, "reason": Reason.UNREADABLE_FILE.value, "detail": detail})
            continue
        tile = resize_to_square(decoded.pixels, transform.image_size)
        tiles[offset] = tile.pixels
        top, left, height, width = tile.content
        content = tile.pixels[top : top + height, left : left + width]
        info = decoded.info
        outcomes.append(
            {
                "i": index,
                "ok": True,
                "format": info.format,
                "modality": info.modality,
                "photometric": info.photometric,
                "bits_stored": info.bits_stored,
                "transfer_syntax": info.transfer_syntax,
                "intensity": info.intensity,
                "inverted": info.inverted,
                "rows": info.rows,
                "columns": info.columns,
                "mean": float(content.mean()),
                "std": float(content.std()),
            }
        )
    return ChunkResult(chunk.split, chunk.start, tiles, outcomes)
