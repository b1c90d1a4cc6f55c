"""PadChest (Hospital San Juan): ``PADCHEST_chest_x_ray_images_labels_160K_01.02.19.csv``, PNGs in ``<ImageDir>/``.

Input row: one CSV row = one image. ``Labels`` is a Python-list string of lower-case findings, parsed as
a literal (never evaluated); blank or unparsable -> UNPARSABLE_LABEL (the real file has 103 rows whose Labels is "nan").
A finding counts for a disease when it contains the disease term, torchxrayvision's convention
(docs/datasets.md section 6): "lobar atelectasis" is Atelectasis, "loculated pleural effusion" is Pleural Effusion, and
so is every finding containing "effusion". PadChest has no uncertain labels and no official split.
Reference: docs/datasets.md section 6.
"""

from __future__ import annotations

import ast

import numpy as np
import pandas as pd

from preprocessing.adapters.base import (
    Adapter,
    AdapterOptions,
    AdapterOutput,
    MetadataFile,
    build_records,
    finish,
    normalize_sex,
    normalize_views,
    read_metadata,
    resolve_metadata,
    source_rows,
)
from preprocessing.quarantine import Reason

COLUMNS = ("ImageID", "ImageDir", "StudyID", "PatientID", "PatientBirth", "StudyDate_DICOM",
           "PatientSex_DICOM", "Projection", "Labels")
DISEASE_TERMS = {
    "Cardiomegaly": "cardiomegaly",
    "Edema": "edema",
    "Consolidation": "consolidation",
    "Atelectasis": "atelectasis",
    "Pleural Effusion": "effusion",
}
# AP_horizontal is an AP film of a patient lying down: frontal. COSTAL, EXCLUDE, UNK stay "unknown".
PROJECTIONS = {"PA": "PA", "AP": "AP", "AP_horizontal": "AP", "L": "LATERAL"}


class PadchestOptions(AdapterOptions):
    labels_csv: str = "PADCHEST_chest_x_ray_images_labels_160K_01.02.19.csv"


def files(options: PadchestOptions) -> tuple[MetadataFile, ...]:
    return (MetadataFile("labels_csv", COLUMNS),)


def parse_findings(text: str) -> tuple[str, ...] | None:
    """The findings of one Labels cell, or None when it is not a list of strings."""
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return None
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        return None
    return tuple(item.strip() for item in value)


def read(config) -> AdapterOutput:
    options: PadchestOptions = config.adapter_options
    path = resolve_metadata(config.root, options.labels_csv)
    table = read_metadata(path, COLUMNS)
    text = table["Labels"].fillna("").str.strip()
    # ~29k distinct label strings for 160k rows: parse each once.
    parsed = {value: parse_findings(value) for value in text.unique()}
    unparsable = text.map(lambda value: parsed[value] is None).to_numpy(dtype=bool)
    labels = {}
    for disease, term in DISEASE_TERMS.items():
        hit = {v: float(any(term in f for f in items)) for v, items in parsed.items() if items is not None}
        labels[disease] = text.map(hit).to_numpy(dtype=np.float32)
    year = pd.to_numeric(table["StudyDate_DICOM"].str.slice(0, 4), errors="coerce")
    birth = pd.to_numeric(table["PatientBirth"], errors="coerce")
    image_path = table["ImageDir"].str.strip() + "/" + table["ImageID"].str.strip()
    records = build_records(
        "chest-xray",
        {
            "record_id": image_path.to_numpy(dtype=object),
            "source_row": source_rows(path, len(table)),
            "patient_id": table["PatientID"].str.strip().to_numpy(dtype=object),
            "study_id": table["StudyID"].str.strip().to_numpy(dtype=object),
            "image_path": image_path.to_numpy(dtype=object),
            "view": normalize_views(table["Projection"], PROJECTIONS).to_numpy(dtype=object),
            "sex": normalize_sex(table["PatientSex_DICOM"], ("F",), ("M",)).to_numpy(dtype=object),
            "age": (year - birth).to_numpy(dtype=np.float64),
            "split": None,
        },
        labels,
        len(table),
    )
    # the release writes a missing list as "nan"
    detail = np.where(text.isin(["", "nan"]), "Labels is blank", "Labels is not a list of strings: " + text.str.slice(0, 80))
    return finish(records, [(unparsable, Reason.UNPARSABLE_LABEL, pd.Series(detail))], len(table), [path])


ADAPTER = Adapter(name="padchest", tasks=("chest-xray",), options=PadchestOptions, files=files, read=read)
