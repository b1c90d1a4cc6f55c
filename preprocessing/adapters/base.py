"""What every adapter shares: the adapter description, metadata reading with clear errors, record assembly.

An adapter turns one dataset layout into canonical records (``preprocessing/records.py``): one row per
image, labels in {1, 0, -1, NaN} (-1 = uncertain, resolved later by the site's policy). It reads metadata
only and never opens an image. Rows it cannot turn into a record go to its quarantine list, so that
``input_rows == len(records) + len(quarantine)`` holds for every adapter.
"""

from __future__ import annotations

import csv
import gzip
import io
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
from pydantic import BaseModel, ConfigDict

from common.errors import DataError
from preprocessing.quarantine import Reason, empty_quarantine, quarantine_rows
from preprocessing.records import RECORD_COLUMNS, VIEWS, label_columns


class AdapterOptions(BaseModel):
    """Base of every adapter's ``options:`` block in a site YAML; unknown keys are errors."""

    model_config = ConfigDict(extra="forbid")


class MetadataError(DataError):
    """A metadata file is missing, not UTF-8, not comma-separated or lacks a column; names file, line, column."""


@dataclass
class AdapterOutput:
    records: pd.DataFrame  # RECORD_COLUMNS + task label columns, labels may still hold -1
    quarantine: pd.DataFrame  # QUARANTINE_COLUMNS, stage "scan"
    input_rows: int
    metadata_files: list[Path]
    ages: dict[str, int] = field(default_factory=dict)  # age_notes of the age column, when the layout has one


@dataclass(frozen=True)
class MetadataFile:
    """One metadata file an adapter reads: the option naming it and the columns it must have."""

    option: str  # the field of the adapter's options that holds the file name
    columns: tuple[str, ...]
    required: bool = True  # an optional file (an official split list) is used only when present
    # False for a file whose rows may all be absent: an official split list, CheXpert's official test set (the
    # site's test split is then empty, which the label report warns of). A header-only copy of any other file
    # leaves the site without a training image: an error.
    needs_rows: bool = True


@dataclass(frozen=True)
class Adapter:
    name: str
    tasks: tuple[str, ...]
    options: type[AdapterOptions]
    files: Callable[[AdapterOptions], tuple[MetadataFile, ...]]
    read: Callable[..., AdapterOutput]  # read(config) -> AdapterOutput
    # folders under the root that must exist for images to be found (spot-checked by validate_site)
    image_dirs: Callable[[AdapterOptions], tuple[str, ...]] = field(default=lambda options: ())


def resolve_metadata(root: Path, name: str) -> Path:
    """The path of a metadata file under ``root``; public releases ship some as ``.gz``, accept both."""
    path = root / name
    if not path.exists() and not name.endswith(".gz") and (root / f"{name}.gz").exists():
        return root / f"{name}.gz"
    return path


def read_metadata(path: Path, columns: tuple[str, ...] | list[str]) -> pd.DataFrame:
    """Read the given columns of a CSV (or .csv.gz) as strings: the one reader of ``validate`` and ``preprocess``.

    Fails with a ``MetadataError`` naming the file and, for each problem, where it is and what to do: a
    byte that is not UTF-8 (line and byte), a header that is one column on "," (the delimiter it probably
    uses), the missing columns with the ones found, a row the CSV parser rejects.
    """
    text = read_metadata_text(path)
    header_line = text.partition("\n")[0]
    header = next(csv.reader([header_line]), [])
    missing = [column for column in columns if column not in header]
    if missing:
        hint = delimiter_hint(header, header_line)
        raise MetadataError(
            f"{path}: missing column(s) {missing}; found {header}" + (f"; {hint}" if hint else ""),
            fix=f"re-export {path.name} comma-separated" if hint
            else "check that the site YAML's options name the right file (and, for a generic layout, its columns)",
        )
    try:
        # Everything as text: ids such as PadChest's StudyID mix digits and letters and must not become floats.
        return pd.read_csv(io.StringIO(text), usecols=list(columns), dtype=str, keep_default_na=False, na_values=[""])
    except (pd.errors.ParserError, pd.errors.EmptyDataError, ValueError) as err:
        raise MetadataError(f"{path}: cannot read as CSV: {err}") from None


def read_metadata_text(path: Path) -> str:
    """The file's text (gunzipped for .gz; a UTF-8 byte-order mark dropped); a byte that is not UTF-8 is an
    error naming its line, its byte within the line and its value, since pandas would only say "codec"."""
    try:
        data = path.read_bytes()
        if path.suffix == ".gz":
            data = gzip.decompress(data)
    except FileNotFoundError:
        raise MetadataError(f"{path}: metadata file not found") from None
    except (OSError, EOFError, gzip.BadGzipFile) as err:
        raise MetadataError(f"{path}: cannot read: {err}") from None
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        line = data.count(b"\n", 0, err.start) + 1
        byte = err.start - (data.rfind(b"\n", 0, err.start) + 1) + 1
        raise MetadataError(
            f"{path}: line {line}, byte {byte}: 0x{data[err.start]:02x} is not UTF-8 (the file is probably "
            "Latin-1 or Windows-1252, as spreadsheet programs export by default)",
            fix=f"re-save it as UTF-8, e.g. iconv -f WINDOWS-1252 -t UTF-8 {path.name} > utf8-{path.name}",
        ) from None


_OTHER_DELIMITERS = {";": "semicolon", "\t": "tab", "|": "pipe"}


def delimiter_hint(header: list[str], header_line: str) -> str | None:
    """When the header is one column split on ",", which other delimiter splits it, and into how many."""
    if len(header) != 1:
        return None
    counts = {delimiter: header_line.count(delimiter) for delimiter in _OTHER_DELIMITERS}
    delimiter, count = max(counts.items(), key=lambda item: item[1])
    if not count:
        return None
    return (
        f"the header is one column when split on ',' but {count + 1} columns on {_OTHER_DELIMITERS[delimiter]} "
        f"({delimiter!r}): the file is probably {_OTHER_DELIMITERS[delimiter]}-separated"
    )


def source_rows(path: Path, count: int) -> np.ndarray:
    """``"<file>:row <n>"`` for each data row, n counted from 1 after the header.

    Rows, not text lines: PadChest's Report column holds line breaks inside quotes, so lines drift.
    """
    return (f"{path.name}:row " + pd.Series(np.arange(1, count + 1)).astype(str)).to_numpy(dtype=object)


def normalize_views(values: pd.Series, mapping: dict[str, str]) -> pd.Series:
    """Map source view codes to canonical VIEWS; anything unmapped or blank is "unknown"."""
    assert set(mapping.values()) <= set(VIEWS), mapping
    return values.str.strip().str.upper().map({k.upper(): v for k, v in mapping.items()}).fillna("unknown")


def normalize_sex(values: pd.Series, female: tuple[str, ...], male: tuple[str, ...]) -> pd.Series:
    lowered = values.str.strip().str.lower()
    mapping = {v.lower(): "F" for v in female} | {v.lower(): "M" for v in male}
    return lowered.map(mapping).fillna("unknown")


# "90+", ">89", "89+", ">=90": ages above a bound written as the bound, as de-identification rules (HIPAA's
# "90 or older") make exports write them; read as that bound.
_TOP_CODE = r"^\s*(?:(?:>=?|\u2265)\s*\d+(?:\.\d+)?|\d+(?:\.\d+)?\s*\+)\s*$"


def to_age(values: pd.Series) -> pd.Series:
    """Ages as float years; a top-coded age (``90+``, ``>89``) is its bound; blank or unreadable is NaN
    (unknown), never an error: ``age_notes`` counts both for the QC report."""
    text = values.astype("string").str.strip()
    bound = text.where(text.str.match(_TOP_CODE, na=False)).str.extract(r"(\d+(?:\.\d+)?)", expand=False)
    return pd.to_numeric(bound.fillna(text), errors="coerce").astype("float64")


def age_notes(values: pd.Series) -> dict[str, int]:
    """How many ages were top-coded (read as their bound) and how many were written but unreadable."""
    text = values.astype("string").str.strip()
    written = text.notna() & (text != "")
    top_coded = text.str.match(_TOP_CODE, na=False)
    unreadable = written & to_age(values).isna()
    return {"top_coded": int(top_coded.sum()), "unreadable": int(unreadable.sum())}


def build_records(task: str, columns: dict[str, object], labels: dict[str, object], length: int) -> pd.DataFrame:
    """Assemble canonical records; a task disease absent from ``labels`` is missing (NaN), never negative."""
    frame = pd.DataFrame({column: columns.get(column) for column in RECORD_COLUMNS}, index=range(length))
    for column in RECORD_COLUMNS:
        if column != "age":
            frame[column] = frame[column].astype(object)
    frame["age"] = pd.to_numeric(frame["age"], errors="coerce").astype("float64")
    for disease in label_columns(task):
        values = labels.get(disease, np.nan)
        frame[disease] = np.asarray(values, dtype=np.float32) if not np.isscalar(values) else np.float32(values)
    return frame


def finish(
    records: pd.DataFrame,
    problems: list[tuple[np.ndarray, Reason, pd.Series | str]],
    input_rows: int,
    metadata_files: list[Path],
    ages: dict[str, int] | None = None,
) -> AdapterOutput:
    """Quarantine the rows flagged by ``problems`` (mask, reason, detail aligned with ``records``).

    A row flagged twice is quarantined once, for the first problem listed.
    """
    taken = np.zeros(len(records), dtype=bool)
    parts = [empty_quarantine()]
    for mask, reason, detail in problems:
        rows = np.asarray(mask, dtype=bool) & ~taken
        if rows.any():
            if isinstance(detail, pd.Series):
                detail = detail.reset_index(drop=True)[rows]
            parts.append(quarantine_rows(records[rows], "scan", reason, detail))
            taken |= rows
    quarantine = pd.concat(parts, ignore_index=True) if len(parts) > 1 else parts[0]
    return AdapterOutput(records[~taken].reset_index(drop=True), quarantine, input_rows, metadata_files, ages or {})


def concat_outputs(outputs: list[AdapterOutput]) -> AdapterOutput:
    """One output from several metadata files read the same way (CheXpert train + valid)."""
    return AdapterOutput(
        pd.concat([o.records for o in outputs], ignore_index=True),
        pd.concat([o.quarantine for o in outputs], ignore_index=True),
        sum(o.input_rows for o in outputs),
        [path for o in outputs for path in o.metadata_files],
        dict(sum((Counter(o.ages) for o in outputs), Counter())),
    )
