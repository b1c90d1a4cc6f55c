"""A hospital's DICOM export: a folder of DICOM files and a labels CSV keyed by file, instance or study.

``key`` says what the labels CSV's ``key_column`` holds:

- ``file_name``: one row per image, the file's path under ``dicom_dir``;
- ``sop_instance_uid``: one row per image, its SOPInstanceUID; a row whose UID matches no file is
  quarantined (MISSING_FIELD), and so is a row whose UID two files share (DUPLICATE_ROW);
- ``accession_number`` or ``study_instance_uid``: one row per study (as a RIS exports findings), its labels
  applied to every image of the study; each image's view is its own ViewPosition, so the site's view filter
  keeps the study's frontal images and quarantines its laterals. A row whose study has no file is quarantined
  (MISSING_FIELD); a file whose study has no row is quarantined too (NO_LABELS_ROW), so every image of the
  folder is accounted for.

The keyed folders are indexed by reading each file's header (SOPInstanceUID, AccessionNumber,
StudyInstanceUID, ViewPosition), never its pixel data. Labels, patient and the optional columns are read
as in ``generic-csv``.
Reference: docs/datasets.md section 9.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import numpy as np
import pandas as pd
import pydicom
from pydicom.errors import InvalidDicomError

from preprocessing.adapters.base import Adapter, AdapterOutput, MetadataFile, build_records, finish, normalize_views
from preprocessing.adapters.generic_csv import (
    VIEW_CODES,
    LabelTableOptions,
    label_table_ages,
    read_label_table,
    table_columns,
)
from preprocessing.quarantine import Reason, quarantine_rows

# The key's DICOM attribute; per-study keys expand a row to the study's images.
KEY_ATTRIBUTES = {"sop_instance_uid": "SOPInstanceUID", "accession_number": "AccessionNumber",
                  "study_instance_uid": "StudyInstanceUID"}
STUDY_KEYS = ("accession_number", "study_instance_uid")
HEADER_TAGS = ["SOPInstanceUID", "AccessionNumber", "StudyInstanceUID", "ViewPosition"]


class GenericDicomOptions(LabelTableOptions):
    key_column: str
    key: Literal["file_name", "sop_instance_uid", "accession_number", "study_instance_uid"] = "file_name"
    dicom_dir: str = "dicom"


def files(options: GenericDicomOptions) -> tuple[MetadataFile, ...]:
    return (MetadataFile("labels_csv", table_columns(options, options.key_column)),)


def index_headers(folder: Path) -> pd.DataFrame:
    """One row per DICOM file under ``folder``: its path relative to ``folder`` and the key attributes (blank
    when absent), in path order.

    Files that are not DICOM are skipped here: the decoder never sees them since no row points to them.
    So is every file that resolves outside ``folder`` (a symlink out) or is no regular file: never opened.
    """
    rows = []
    real_folder = folder.resolve()
    for file in sorted(p for p in folder.rglob("*") if p.is_file() and p.resolve().is_relative_to(real_folder)):
        try:
            header = pydicom.dcmread(file, stop_before_pixels=True, specific_tags=HEADER_TAGS)
        except (InvalidDicomError, OSError, EOFError):
            continue
        rows.append([file.relative_to(folder).as_posix(), *(str(header.get(tag, "") or "").strip() for tag in HEADER_TAGS)])
    return pd.DataFrame(rows, columns=["path", *HEADER_TAGS], dtype=object)


def read(config) -> AdapterOutput:
    options: GenericDicomOptions = config.adapter_options
    table, records, problems, path = read_label_table(config, options, options.key_column)
    output = keyed_records(config, options, records, problems, path)
    output.ages = label_table_ages(table, options)
    return output


def keyed_records(config, options: GenericDicomOptions, records: pd.DataFrame, problems: list,
                  path: Path) -> AdapterOutput:
    """The label table's records with their DICOM files, by the options' ``key``."""
    prefix = options.dicom_dir.rstrip("/") + "/" if options.dicom_dir else ""
    if options.key == "file_name":
        records["image_path"] = prefix + records["image_path"].astype(str)
        return finish(records, problems, len(records), [path])
    images = index_headers(config.root / options.dicom_dir)
    attribute = KEY_ATTRIBUTES[options.key]
    images = images[images[attribute] != ""]
    if options.key in STUDY_KEYS:
        return per_study(config.task, records, problems, images, attribute, options, path)
    shared = set(images.loc[images[attribute].duplicated(), attribute])
    relative = records["record_id"].astype(str).map(images.drop_duplicates(attribute).set_index(attribute)["path"])
    problems += [
        (relative.isna().to_numpy(), Reason.MISSING_FIELD, f"no DICOM file under {options.dicom_dir}/ has this {attribute}"),
        (records["record_id"].isin(shared).to_numpy(), Reason.DUPLICATE_ROW, f"several DICOM files share this {attribute}"),
    ]
    records["image_path"] = np.where(relative.isna(), "", prefix + relative.fillna("").astype(str))
    return finish(records, problems, len(records), [path])


def per_study(task: str, records: pd.DataFrame, problems: list, images: pd.DataFrame, attribute: str,
              options: GenericDicomOptions, path: Path) -> AdapterOutput:
    """Each labels row repeated for every image of its study (a row without one kept once, quarantined), then
    the images of no row's study, quarantined: input rows = the rows' images + rows without one + those images."""
    prefix = options.dicom_dir.rstrip("/") + "/" if options.dicom_dir else ""
    of_study = images.groupby(attribute, sort=False).indices
    row_of, image_of = [], []
    for row, key in enumerate(records["record_id"].astype(str)):
        found = of_study.get(key, [-1])
        row_of += [row] * len(found)
        image_of += list(found)
    row_of, image_of = np.asarray(row_of, dtype=int), np.asarray(image_of, dtype=int)
    matched = image_of >= 0
    expanded = records.iloc[row_of].reset_index(drop=True)
    hit = images.iloc[image_of[matched]]
    expanded["study_id"] = expanded["record_id"]
    expanded.loc[matched, "record_id"] = hit["path"].to_numpy()
    expanded.loc[matched, "image_path"] = (prefix + hit["path"]).to_numpy()
    expanded.loc[~matched, "image_path"] = ""
    # The image's own ViewPosition decides; a file without one keeps the row's view (its column or default_view).
    own_view = normalize_views(hit["ViewPosition"], VIEW_CODES).where(hit["ViewPosition"] != "").to_numpy()
    expanded.loc[matched, "view"] = np.where(pd.isna(own_view), expanded.loc[matched, "view"], own_view)
    problems = [(mask[row_of], reason, detail.iloc[row_of].reset_index(drop=True) if isinstance(detail, pd.Series) else detail)
                for mask, reason, detail in problems]
    problems.append((~matched, Reason.MISSING_FIELD, f"no DICOM file under {options.dicom_dir}/ has this {attribute}"))
    output = finish(expanded, problems, len(expanded), [path])
    unlabelled = images[~images[attribute].isin(set(records["record_id"].astype(str)))]
    if len(unlabelled):
        orphans = build_records(task, {"record_id": unlabelled["path"].to_numpy(dtype=object),
                                       "source_row": (prefix + unlabelled["path"]).to_numpy(dtype=object),
                                       "image_path": (prefix + unlabelled["path"]).to_numpy(dtype=object)},
                                {}, len(unlabelled))
        detail = f"its {attribute} has no row in {path.name}: " + unlabelled[attribute].reset_index(drop=True)
        output.quarantine = pd.concat([output.quarantine, quarantine_rows(orphans, "scan", Reason.NO_LABELS_ROW, detail)],
                                      ignore_index=True)
        output.input_rows += len(unlabelled)
    return output


ADAPTER = Adapter(
    name="generic-dicom",
    tasks=("chest-xray", "melanoma"),
    options=GenericDicomOptions,
    files=files,
    read=read,
    image_dirs=lambda options: (options.dicom_dir,),
)
