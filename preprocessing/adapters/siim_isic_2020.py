"""SIIM-ISIC 2020 melanoma: ``train.csv`` and DICOMs in ``train/`` (or JPEGs in ``jpeg/train/``).

Input row: one CSV row = one image. ``target`` 1 = melanoma, 0 = not; anything else is UNPARSABLE_LABEL.
No official labeled test split: patients are split by the site's policy. Views do not apply.
Reference: docs/datasets.md section 8.
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
    age_notes,
    build_records,
    finish,
    normalize_sex,
    read_metadata,
    resolve_metadata,
    source_rows,
    to_age,
)
from preprocessing.quarantine import Reason

COLUMNS = ("image_name", "patient_id", "sex", "age_approx", "target")
LAYOUTS = {"dicom": ("train", ".dcm"), "jpeg": ("jpeg/train", ".jpg")}


class SiimIsicOptions(AdapterOptions):
    train_csv: str = "train.csv"
    image_format: Literal["dicom", "jpeg"] = "dicom"


def files(options: SiimIsicOptions) -> tuple[MetadataFile, ...]:
    return (MetadataFile("train_csv", COLUMNS),)


def read(config) -> AdapterOutput:
    options: SiimIsicOptions = config.adapter_options
    path = resolve_metadata(config.root, options.train_csv)
    table = read_metadata(path, COLUMNS)
    names = table["image_name"].str.strip()
    folder, extension = LAYOUTS[options.image_format]
    target = table["target"].str.strip().map({"1": 1.0, "0": 0.0, "1.0": 1.0, "0.0": 0.0})
    records = build_records(
        "melanoma",
        {
            "record_id": names.to_numpy(dtype=object),
            "source_row": source_rows(path, len(table)),
            "patient_id": table["patient_id"].str.strip().to_numpy(dtype=object),
            "study_id": names.to_numpy(dtype=object),
            "image_path": (f"{folder}/" + names + extension).to_numpy(dtype=object),
            "view": "unknown",
            "sex": normalize_sex(table["sex"], ("female",), ("male",)).to_numpy(dtype=object),
            "age": to_age(table["age_approx"]).to_numpy(),
            "split": None,
        },
        {"Melanoma": target.to_numpy(dtype=np.float32)},
        len(table),
    )
    detail = "target=" + table["target"].fillna("<blank>").astype(str) + " is not 0 or 1"
    return finish(records, [(target.isna().to_numpy(), Reason.UNPARSABLE_LABEL, pd.Series(detail))], len(table), [path],
                  age_notes(table["age_approx"]))


ADAPTER = Adapter(
    name="siim-isic-2020",
    tasks=("melanoma",),
    options=SiimIsicOptions,
    files=files,
    read=read,
    image_dirs=lambda options: (LAYOUTS[options.image_format][0],),
)
