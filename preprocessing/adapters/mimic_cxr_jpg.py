"""MIMIC-CXR-JPG (Beth Israel Deaconess): metadata, CheXpert-labeler labels and official split CSVs.

Input row: one row of ``mimic-cxr-2.0.0-metadata.csv`` = one image, joined to its study's labels (labels
are per study). An image whose study has no label row, or several conflicting ones, is quarantined.
Image path: ``files/p10/p10000032/s50414267/<dicom_id>.jpg``. The release ships the CSVs gzipped; both
names are accepted. Sex and age are not in these files (they live in MIMIC-IV): unknown.
Reference: docs/datasets.md section 4.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
import pandas as pd

from preprocessing.adapters.base import (
    Adapter,
    AdapterOptions,
    AdapterOutput,
    MetadataFile,
    build_records,
    finish,
    normalize_views,
    read_metadata,
    resolve_metadata,
    source_rows,
)
from preprocessing.labels import parse_label_codes
from preprocessing.quarantine import Reason
from preprocessing.records import CHEST_XRAY_DISEASES

METADATA_COLUMNS = ("dicom_id", "subject_id", "study_id", "ViewPosition")
LABEL_COLUMNS = ("subject_id", "study_id", *CHEST_XRAY_DISEASES)
SPLIT_COLUMNS = ("dicom_id", "split")
SPLITS = {"train": "train", "validate": "valid", "test": "test"}
VIEW_POSITIONS = {"PA": "PA", "AP": "AP", "LATERAL": "LATERAL", "LL": "LATERAL", "RL": "LATERAL"}


class MimicOptions(AdapterOptions):
    metadata_csv: str = "mimic-cxr-2.0.0-metadata.csv"
    chexpert_csv: str = "mimic-cxr-2.0.0-chexpert.csv"
    split_csv: str | None = "mimic-cxr-2.0.0-split.csv"
    blank: Literal["zeros", "ignore"] = "zeros"


def files(options: MimicOptions) -> tuple[MetadataFile, ...]:
    listed = [MetadataFile("metadata_csv", METADATA_COLUMNS), MetadataFile("chexpert_csv", LABEL_COLUMNS)]
    if options.split_csv is not None:
        listed.append(MetadataFile("split_csv", SPLIT_COLUMNS, needs_rows=False))
    return tuple(listed)


def read(config) -> AdapterOutput:
    options: MimicOptions = config.adapter_options
    meta_path = resolve_metadata(config.root, options.metadata_csv)
    label_path = resolve_metadata(config.root, options.chexpert_csv)
    meta = read_metadata(meta_path, METADATA_COLUMNS).apply(lambda c: c.str.strip())
    labels_table = read_metadata(label_path, LABEL_COLUMNS)
    labels_table["study_id"] = labels_table["study_id"].str.strip()
    label_rows = labels_table.groupby("study_id").size()
    conflicting = label_rows.index[label_rows > 1]
    duplicated_study = labels_table["study_id"].isin(conflicting)
    identical = labels_table[duplicated_study].drop_duplicates().groupby("study_id").size()
    # identical repeats of a study's label row are harmless; different ones leave the labels unknown
    conflicting = identical.index[identical > 1]
    per_study = labels_table.drop_duplicates("study_id").set_index("study_id")
    joined = per_study.reindex(meta["study_id"]).reset_index(drop=True)
    values, bad_labels, label_detail = parse_label_codes(
        joined, {d: d for d in CHEST_XRAY_DISEASES}, blank=0.0 if options.blank == "zeros" else np.nan
    )
    files_read = [meta_path, label_path]
    split = pd.Series(None, index=meta.index, dtype=object)
    if options.split_csv is not None:
        split_path = resolve_metadata(config.root, options.split_csv)
        split_table = read_metadata(split_path, SPLIT_COLUMNS).apply(lambda c: c.str.strip())
        split = meta["dicom_id"].map(split_table.drop_duplicates("dicom_id").set_index("dicom_id")["split"].map(SPLITS))
        files_read.append(split_path)
    subject = meta["subject_id"]
    image_path = "files/p" + subject.str.slice(0, 2) + "/p" + subject + "/s" + meta["study_id"] + "/" + meta["dicom_id"] + ".jpg"
    records = build_records(
        "chest-xray",
        {
            "record_id": meta["dicom_id"].to_numpy(dtype=object),
            "source_row": source_rows(meta_path, len(meta)),
            "patient_id": subject.to_numpy(dtype=object),
            "study_id": meta["study_id"].to_numpy(dtype=object),
            "image_path": image_path.to_numpy(dtype=object),
            "view": normalize_views(meta["ViewPosition"], VIEW_POSITIONS).to_numpy(dtype=object),
            "sex": "unknown",
            "age": np.nan,
            "split": split.to_numpy(dtype=object),
        },
        values,
        len(meta),
    )
    no_labels = ~meta["study_id"].isin(per_study.index).to_numpy()
    problems = [
        (no_labels, Reason.MISSING_FIELD, f"study_id has no row in {label_path.name}"),
        (meta["study_id"].isin(conflicting).to_numpy(), Reason.DUPLICATE_ROW,
         f"study_id has conflicting label rows in {label_path.name}"),
        (bad_labels, Reason.UNPARSABLE_LABEL, label_detail),
    ]
    return finish(records, problems, len(meta), files_read)


ADAPTER = Adapter(
    name="mimic-cxr-jpg",
    tasks=("chest-xray",),
    options=MimicOptions,
    files=files,
    read=read,
    image_dirs=lambda options: ("files",),
)
