"""No silent loss: a quarantine reason that takes more than the site's share of its rows is a failure.

A site's quarantine is expected to be a few damaged files; when one reason takes more than
``max_quarantine_share`` of the input rows (5 % by default, per site in its YAML), something systematic is
wrong (a label encoding nothing maps, a wrong image folder), and `fedauc sites validate`, `sites report` and
`preprocess` exit non-zero with one line per such reason: its count, what lies behind it (the column and value,
the detail or the file pattern) and the fix. The rows still end in the quarantine and the QC report. The
site's own view filter (``excluded_view``) is a choice, not a loss, and never counts. These lines name values
and file patterns of the site's data: they are printed at the site, never sent (docs/quarantine.md, "No silent
loss").
"""

from __future__ import annotations

from collections import Counter
from pathlib import PurePosixPath

import pandas as pd

from preprocessing.quarantine import Reason

EXEMPT = (Reason.EXCLUDED_VIEW.value,)
# `fedauc preprocess` wrote the shards but lost rows: told apart from 1, a run that wrote nothing.
LOSS_EXIT_CODE = 3
_SHOWN = 3  # the most frequent details or file patterns a line names

_SCAN_FIXES = {
    Reason.UNPARSABLE_LABEL: "map the column's values in the site YAML's options.label_values (`fedauc sites "
                             "validate` prints the YAML to add)",
    Reason.MISSING_FIELD: "fill the patient and image columns, or name the right ones in the site YAML's options",
    Reason.DUPLICATE_ROW: "export one row per image: the key column repeats",
    Reason.NO_LABELS_ROW: "add the studies' rows to the labels table, or take their files out of dicom_dir",
    Reason.PATIENT_IN_TWO_SPLITS: "check the official split column: it puts one patient in two splits",
    Reason.MISSING_FILE: "check root and the image folder and path column in the site YAML: the files they name "
                         "do not exist",
    Reason.DUPLICATE_CONTENT: "remove the copies from the export: the same file is filed under two patients or splits",
}
_DECODE_FIX = "`fedauc inspect FILE` shows why one of them fails (docs/quarantine.md lists the reasons)"


def excess_reasons(quarantine: pd.DataFrame, input_rows: int, max_share: float) -> list[tuple[str, int]]:
    """(reason, rows) of each quarantine reason over ``max_share`` of ``input_rows``, the largest first."""
    counts = Counter(quarantine["reason"].astype(str))
    return [(reason, count) for reason, count in counts.most_common()
            if reason not in EXEMPT and input_rows and count > max_share * input_rows]


def excess_losses(quarantine: pd.DataFrame, input_rows: int, max_share: float) -> list[str]:
    """One line per quarantine reason over ``max_share`` of ``input_rows``, the largest first."""
    lines = []
    for reason, count in excess_reasons(quarantine, input_rows, max_share):
        rows = quarantine[quarantine["reason"].astype(str) == reason]
        fix = _SCAN_FIXES.get(_reason(reason), _DECODE_FIX)
        lines.append(
            f"{count} of {input_rows} rows ({100 * count / input_rows:.1f} %) quarantined as {reason}, over the "
            f"site's max_quarantine_share of {100 * max_share:g} %: {_behind(rows)}; fix: {fix}, or raise "
            "max_quarantine_share in the site YAML if this loss is expected"
        )
    return lines


def _reason(value: str) -> Reason | None:
    try:
        return Reason(value)
    except ValueError:
        return None


def _behind(rows: pd.DataFrame) -> str:
    """The most frequent details (a label's column=value) and, for files, their folder and extension patterns."""
    parts = [_most_common(rows["detail"].astype(str), "")]
    paths = rows["image_path"].dropna().astype(str)
    paths = paths[paths != ""]
    if rows["stage"].astype(str).ne("scan").any() and len(paths):
        parts.append("files " + _most_common(paths.map(file_pattern), ""))
    return "; ".join(part for part in parts if part)


def _most_common(values: pd.Series, empty: str) -> str:
    counts = Counter(value for value in values if value)
    if not counts:
        return empty
    shown = ", ".join(f"{value} ({n})" for value, n in counts.most_common(_SHOWN))
    more = len(counts) - _SHOWN
    return shown + (f" and {more} more" if more > 0 else "")


def file_pattern(path: str) -> str:
    """A path's folder pattern: its first folder, ``**`` for the levels below it, ``*`` and the extension
    (``dicom/**/*.dcm``): what files of one export share, without naming a patient's folder."""
    parts = PurePosixPath(path).parts
    suffix = PurePosixPath(path).suffix.lower()
    if len(parts) <= 1:
        return f"*{suffix}"
    middle = "/**" if len(parts) > 2 else ""
    return f"{parts[0]}{middle}/*{suffix}"
