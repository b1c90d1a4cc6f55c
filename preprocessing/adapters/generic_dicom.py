"""A hospital's DICOM export: a folder of DICOM files and a labels CSV keyed by file name or SOPInstanceUID.

Input row: one CSV row = one image. Keyed by ``file_name``, the key is the file's path under
``dicom_dir``. Keyed by ``sop_instance_uid``, the folder is indexed by reading each file's header up to
SOPInstanceUID (never its pixel data); a row whose UID matches no file is quarantined (MISSING_FIELD),
and so is a row whose UID two files share. Labels, patient and the optional columns are read as in
``generic-csv``.
Reference: docs/datasets.md section 9.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Literal

import numpy as np
import pydicom
from pydicom.errors import InvalidDicomError

from preprocessing.adapters.base import Adapter, AdapterOutput, MetadataFile, finish
from preprocessing.adapters.generic_csv import LabelTableOptions, label_table_ages, read_label_table, table_columns
from preprocessing.quarantine import Reason


class GenericDicomOptions(LabelTableOptions):
    key_column: str
    key: Literal["file_name", "sop_instance_uid"] = "file_name"
    dicom_dir: str = "dicom"


def files(options: GenericDicomOptions) -> tuple[MetadataFile, ...]:
    return (MetadataFile("labels_csv", table_columns(options, options.key_column)),)


def index_by_uid(folder: Path) -> tuple[dict[str, str], set[str]]:
    """SOPInstanceUID -> path relative to ``folder``, and the UIDs held by more than one file.

    Files that are not DICOM are skipped here: the decoder never sees them since no row points to them.
    So is every file that resolves outside ``folder`` (a symlink out) or is no regular file: never opened.
    """
    found: dict[str, str] = {}
    counts: Counter[str] = Counter()
    real_folder = folder.resolve()
    for file in sorted(p for p in folder.rglob("*") if p.is_file() and p.resolve().is_relative_to(real_folder)):
        try:
            header = pydicom.dcmread(file, stop_before_pixels=True, specific_tags=["SOPInstanceUID"])
        except (InvalidDicomError, OSError, EOFError):
            continue
        uid = str(header.get("SOPInstanceUID", "")).strip()
        if uid:
            found.setdefault(uid, file.relative_to(folder).as_posix())
            counts[uid] += 1
    return found, {uid for uid, n in counts.items() if n > 1}


def read(config) -> AdapterOutput:
    options: GenericDicomOptions = config.adapter_options
    table, records, problems, path = read_label_table(config, options, options.key_column)
    prefix = options.dicom_dir.rstrip("/") + "/" if options.dicom_dir else ""
    if options.key == "sop_instance_uid":
        by_uid, shared = index_by_uid(config.root / options.dicom_dir)
        keys = records["record_id"].astype(str)
        relative = keys.map(by_uid)
        problems += [
            (relative.isna().to_numpy(), Reason.MISSING_FIELD, f"no DICOM file under {options.dicom_dir}/ has this SOPInstanceUID"),
            (keys.isin(shared).to_numpy(), Reason.DUPLICATE_ROW, "several DICOM files share this SOPInstanceUID"),
        ]
        records["image_path"] = np.where(relative.isna(), "", prefix + relative.fillna("").astype(str))
    else:
        records["image_path"] = prefix + records["image_path"].astype(str)
    return finish(records, problems, len(records), [path], label_table_ages(table, options))


ADAPTER = Adapter(
    name="generic-dicom",
    tasks=("chest-xray", "melanoma"),
    options=GenericDicomOptions,
    files=files,
    read=read,
    image_dirs=lambda options: (options.dicom_dir,),
)
