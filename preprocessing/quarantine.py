"""The quarantine list: every input record that does not reach a shard, with its reason.

Nothing is dropped silently. Each stage (scan, split, decode) appends rows here, and the QC report
proves ``input rows = kept + quarantined``.
"""

from __future__ import annotations

from enum import Enum
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # imported where used: decode workers import Reason and would pay pandas' import for nothing
    import pandas as pd


class Reason(str, Enum):
    # scan stage: the metadata row itself
    MISSING_FIELD = "missing_field"  # no patient id, no image path...
    UNPARSABLE_LABEL = "unparsable_label"
    DUPLICATE_ROW = "duplicate_row"
    EXCLUDED_VIEW = "excluded_view"  # the site's view filter (e.g. laterals), accounted, not an error
    PATIENT_IN_TWO_SPLITS = "patient_in_two_splits"
    NO_LABELS_ROW = "no_labels_row"  # an image of a folder labelled per study whose study no labels row names
    # decode stage: the image file
    MISSING_FILE = "missing_file"
    OUTSIDE_ROOT = "outside_root"  # resolves (after symlinks) outside the site's data root: never read
    NOT_A_REGULAR_FILE = "not_a_regular_file"  # a FIFO, device, socket or folder: never opened
    TOO_LARGE = "too_large"  # the header declares more than the decode limits allow: never decoded
    DECODE_TIMEOUT = "decode_timeout"  # decoding ran past the per-file limit; the worker was replaced
    DECODER_CRASHED = "decoder_crashed"  # the worker decoding it died (a decoder segfault, the OOM killer)
    UNREADABLE_FILE = "unreadable_file"  # truncated, corrupt, not a DICOM/PNG/JPEG
    NOT_AN_IMAGE = "not_an_image"  # a DICOM object without pixel data (SR, presentation state...)
    UNSUPPORTED_TRANSFER_SYNTAX = "unsupported_transfer_syntax"
    WRONG_MODALITY = "wrong_modality"
    # a DICOM naming another body part than the task's (preprocessing.body_parts); scoring refuses it alike
    WRONG_BODY_PART = "wrong_body_part"
    IMAGE_TOO_SMALL = "image_too_small"
    NONFINITE_VALUES = "nonfinite_values"  # NaN or infinite rescale slope/intercept, window or pixel value
    CONSTANT_IMAGE = "constant_image"  # every stored pixel has the same value
    BLANK_AFTER_WINDOW = "blank_after_window"  # stored values vary, the VOI LUT or window maps them to one
    # shard stage: across records
    DUPLICATE_CONTENT = "duplicate_content"  # byte-identical to a kept image of another patient or split
    NEAR_DUPLICATE = "near_duplicate"  # the same picture as another kept image (preprocessing.near_duplicates)
    # scoring only: features further from the training images' than the model's threshold (federated/ood.py)
    OUT_OF_DISTRIBUTION = "out_of_distribution"


STAGES = ("scan", "split", "decode", "dedup")
# Part of the shard content hash: bump it whenever the same inputs can keep other records (a new gate or
# duplicate rule), so that shards written under the old rules are not reused. 2: wrong_body_part, near_duplicate.
SELECTION_RULES = "2"
DEDUP_REASONS = frozenset({Reason.DUPLICATE_CONTENT.value, Reason.NEAR_DUPLICATE.value})

QUARANTINE_COLUMNS: tuple[str, ...] = ("record_id", "source_row", "image_path", "stage", "reason", "detail")


def empty_quarantine() -> pd.DataFrame:
    import pandas as pd

    return pd.DataFrame({column: pd.Series(dtype="object") for column in QUARANTINE_COLUMNS})


def quarantine_rows(records: pd.DataFrame, stage: str, reason: Reason, detail: str | pd.Series) -> pd.DataFrame:
    """Quarantine rows for ``records`` (canonical records, or raw rows carrying the same id columns)."""
    import pandas as pd

    if stage not in STAGES:
        raise ValueError(f"unknown quarantine stage {stage!r}; expected one of {STAGES}")
    rows = pd.DataFrame(
        {
            "record_id": records["record_id"].astype("object").to_numpy(),
            "source_row": records["source_row"].astype("object").to_numpy(),
            "image_path": records["image_path"].astype("object").to_numpy(),
        }
    )
    rows["stage"] = stage
    rows["reason"] = reason.value
    rows["detail"] = detail.to_numpy() if isinstance(detail, pd.Series) else detail
    return rows[list(QUARANTINE_COLUMNS)]
