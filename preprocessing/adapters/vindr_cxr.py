"""VinDr-CXR, Kaggle VinBigData release: ``train.csv`` (one row per radiologist finding), DICOMs in ``train/``.

Input row: one image_id (its rows, three radiologists' findings, are aggregated). A disease is positive
when at least one radiologist marked it, negative otherwise; VinDr never labels Edema, so Edema is
missing. A class name outside the 14 VinDr classes and "No finding" quarantines the image
(UNPARSABLE_LABEL). The CSV has no patient id: each image is its own patient (the release is one image
per study), and every image is a PA film (VinDr-CXR paper), declared by the ``view`` option.
Reference: docs/datasets.md section 7.
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
    read_metadata,
    resolve_metadata,
)
from preprocessing.quarantine import Reason

COLUMNS = ("image_id", "class_name", "rad_id")
VINDR_TO_CANONICAL = {
    "Cardiomegaly": "Cardiomegaly",
    "Consolidation": "Consolidation",
    "Atelectasis": "Atelectasis",
    "Pleural effusion": "Pleural Effusion",
}
VINDR_CLASSES = frozenset(VINDR_TO_CANONICAL) | {
    "No finding", "Aortic enlargement", "Calcification", "ILD", "Infiltration", "Lung Opacity",
    "Nodule/Mass", "Other lesion", "Pleural thickening", "Pneumothorax", "Pulmonary fibrosis",
}


class VindrOptions(AdapterOptions):
    train_csv: str = "train.csv"
    image_dir: str = "train"
    image_extension: str = ".dicom"
    view: Literal["PA", "AP", "unknown"] = "PA"


def files(options: VindrOptions) -> tuple[MetadataFile, ...]:
    return (MetadataFile("train_csv", COLUMNS),)


def read(config) -> AdapterOutput:
    options: VindrOptions = config.adapter_options
    path = resolve_metadata(config.root, options.train_csv)
    table = read_metadata(path, COLUMNS)
    table["image_id"] = table["image_id"].str.strip()
    table["class_name"] = table["class_name"].fillna("").str.strip()
    table["row"] = np.arange(1, len(table) + 1)
    # A finding row without an image id belongs to no image: it is its own input row, quarantined.
    orphan = table[table["image_id"].isna() | (table["image_id"] == "")]
    table = table.drop(orphan.index)
    images = table.groupby("image_id", sort=False).agg(first_row=("row", "min"), rows=("row", "size"))
    marked = pd.crosstab(table["image_id"], table["class_name"]).reindex(images.index, fill_value=0)
    unknown_classes = sorted(set(marked.columns) - VINDR_CLASSES)
    unknown = marked[unknown_classes].sum(axis=1).to_numpy() > 0 if unknown_classes else np.zeros(len(images), bool)
    labels = {
        canonical: (marked[vindr].to_numpy() > 0).astype(np.float32) if vindr in marked else np.zeros(len(images), np.float32)
        for vindr, canonical in VINDR_TO_CANONICAL.items()
    }
    ids = images.index.to_series().to_numpy(dtype=object)
    image_path = options.image_dir.rstrip("/") + "/" + images.index.to_series() + options.image_extension
    records = build_records(
        "chest-xray",
        {
            "record_id": ids,
            "source_row": (f"{path.name}:row " + images["first_row"].astype(str) + " (+" + (images["rows"] - 1).astype(str) + " more)").to_numpy(dtype=object),
            "patient_id": ids,
            "study_id": ids,
            "image_path": image_path.to_numpy(dtype=object),
            "view": options.view,
            "sex": "unknown",
            "age": np.nan,
            "split": None,
        },
        labels,
        len(images),
    )
    orphans = build_records(
        "chest-xray",
        {"record_id": "", "source_row": (f"{path.name}:row " + orphan["row"].astype(str)).to_numpy(dtype=object),
         "image_path": "", "sex": "unknown", "view": "unknown"},
        {},
        len(orphan),
    )
    all_records = pd.concat([records, orphans], ignore_index=True)
    is_orphan = np.arange(len(all_records)) >= len(records)
    named = marked[unknown_classes].gt(0).apply(lambda row: ", ".join(row.index[row]), axis=1) if unknown_classes else ""
    unknown_detail = pd.Series(
        np.pad(np.asarray("class_name outside the VinDr classes: " + named, dtype=object), (0, len(orphan)), constant_values=""),
        dtype=object,
    ) if unknown_classes else ""
    problems = [
        (is_orphan, Reason.MISSING_FIELD, "image_id is blank"),
        (np.pad(unknown, (0, len(orphan))), Reason.UNPARSABLE_LABEL, unknown_detail),
    ]
    return finish(all_records, problems, len(all_records), [path])


ADAPTER = Adapter(
    name="vindr-cxr",
    tasks=("chest-xray",),
    options=VindrOptions,
    files=files,
    read=read,
    image_dirs=lambda options: (options.image_dir,),
)
