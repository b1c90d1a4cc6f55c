"""CheXpert (Stanford): ``train.csv`` + ``valid.csv`` under the dataset folder (``CheXpert-v1.0[-small]/``).

Input row: one CSV row = one image. The official valid set (radiologist consensus) becomes the test split.
Patient and study come from the path (``train/patient00001/study1/view1_frontal.jpg``). Blank labels
("not mentioned") are negative by default (the DAM convention, docs/datasets.md section 3), -1 is resolved later by the
site's uncertain policy.
Reference: docs/datasets.md section 3.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
import pandas as pd

from preprocessing.adapters.base import (
    Adapter,
    AdapterOptions,
    AdapterOutput,
    MetadataError,
    MetadataFile,
    build_records,
    concat_outputs,
    finish,
    normalize_sex,
    read_metadata,
    resolve_metadata,
    source_rows,
    to_age,
)
from preprocessing.labels import parse_label_codes
from preprocessing.quarantine import Reason
from preprocessing.records import CHEST_XRAY_DISEASES

DATASET_PREFIX = r"^CheXpert-v1\.0(?:-small)?/"
PATH_PATTERN = r"(?:train|valid)/patient\d+/study\d+/[^/]+"
BASE_COLUMNS = ("Path", "Sex", "Age", "Frontal/Lateral", "AP/PA")


class ChexpertOptions(AdapterOptions):
    train_csv: str = "train.csv"
    valid_csv: str | None = "valid.csv"  # None: a copy without the official valid set (no official test)
    blank: Literal["zeros", "ignore"] = "zeros"  # "not mentioned" = negative (DAM) or missing


def files(options: ChexpertOptions) -> tuple[MetadataFile, ...]:
    columns = BASE_COLUMNS + CHEST_XRAY_DISEASES
    listed = [MetadataFile("train_csv", columns)]
    if options.valid_csv is not None:
        listed.append(MetadataFile("valid_csv", columns, needs_rows=False))
    return tuple(listed)


def read_table(path, split: str, options: ChexpertOptions) -> tuple[pd.DataFrame, list]:
    table = read_metadata(path, BASE_COLUMNS + CHEST_XRAY_DISEASES)
    # split() rather than a regex extract: on 223k rows the extract runs in Python, split does not
    path_text = table["Path"].fillna("").str.strip().str.replace(DATASET_PREFIX, "", regex=True)
    bad_path = ~path_text.str.fullmatch(PATH_PATTERN).to_numpy(dtype=bool)
    # object: the columns reindex adds (all of them for a header-only file) would be float and refuse the "/"
    parts = path_text.str.split("/", n=3, expand=True).reindex(columns=range(4)).astype(object)
    patient, study = parts[1], parts[1] + "/" + parts[2]
    frontal = table["Frontal/Lateral"].str.strip().str.lower() == "frontal"
    projection = table["AP/PA"].str.strip().str.upper()
    # LL/RL in "AP/PA" on a handful of "Frontal" rows are decubitus films: neither PA nor AP.
    view = np.where(~frontal, "LATERAL", np.where(projection.isin(["PA", "AP"]), projection, "unknown"))
    view = np.where(table["Frontal/Lateral"].isna(), "unknown", view)
    labels, bad_labels, label_detail = parse_label_codes(
        table, {d: d for d in CHEST_XRAY_DISEASES}, blank=0.0 if options.blank == "zeros" else np.nan
    )
    records = build_records(
        "chest-xray",
        {
            "record_id": path_text.to_numpy(dtype=object),
            "source_row": source_rows(path, len(table)),
            "patient_id": patient.to_numpy(dtype=object),
            "study_id": study.to_numpy(dtype=object),
            "image_path": path_text.to_numpy(dtype=object),
            "view": view,
            "sex": normalize_sex(table["Sex"], ("Female",), ("Male",)).to_numpy(dtype=object),
            "age": to_age(table["Age"]).to_numpy(),
            "split": split,
        },
        labels,
        len(table),
    )
    problems = [
        (bad_path, Reason.MISSING_FIELD, "Path is not <train|valid>/patientN/studyN/<file> (patient and study come from it)"),
        (bad_labels, Reason.UNPARSABLE_LABEL, label_detail),
    ]
    return records, problems


def read(config) -> AdapterOutput:
    options: ChexpertOptions = config.adapter_options
    outputs = []
    for option, split in (("train_csv", "train"), ("valid_csv", "test")):
        name = getattr(options, option)
        if name is None:
            continue
        path = resolve_metadata(config.root, name)
        records, problems = read_table(path, split, options)
        # No training image (validate names the file too); a header-only valid.csv only empties the test split.
        if split == "train" and records.empty:
            raise MetadataError(f"{path}: no data rows, only a header",
                                fix="export the labels again with one row per image")
        outputs.append(finish(records, problems, len(records), [path]))
    return concat_outputs(outputs)


ADAPTER = Adapter(
    name="chexpert",
    tasks=("chest-xray",),
    options=ChexpertOptions,
    files=files,
    read=read,
    image_dirs=lambda options: ("train",),
)
