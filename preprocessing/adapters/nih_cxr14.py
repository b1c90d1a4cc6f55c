"""NIH ChestX-ray14: ``Data_Entry_2017_v2020.csv``, PNGs in ``images_001/images/`` ... ``images_012/images/``.

Input row: one CSV row = one image. "Finding Labels" is pipe-separated (or "No Finding"); NIH "Effusion"
is Pleural Effusion; there are no uncertain labels. A finding outside the 14 NIH classes means the row is
not what we think it is: quarantined as UNPARSABLE_LABEL. The official split lists (by patient) are used
when present; a listed image in neither list gets its split from its patient's other images, or by
patient like a site without an official split.
Reference: docs/datasets.md section 5.
"""

from __future__ import annotations

import os
from pathlib import Path

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
    normalize_views,
    read_metadata,
    resolve_metadata,
    source_rows,
    to_age,
)
from preprocessing.quarantine import Reason

COLUMNS = ("Image Index", "Finding Labels", "Follow-up #", "Patient ID", "Patient Age", "Patient Gender", "View Position")
NIH_TO_CANONICAL = {
    "Cardiomegaly": "Cardiomegaly",
    "Edema": "Edema",
    "Consolidation": "Consolidation",
    "Atelectasis": "Atelectasis",
    "Effusion": "Pleural Effusion",
}
NIH_FINDINGS = frozenset(NIH_TO_CANONICAL) | {
    "No Finding", "Infiltration", "Nodule", "Mass", "Pneumothorax", "Pleural_Thickening",
    "Emphysema", "Fibrosis", "Pneumonia", "Hernia",
}


class NihOptions(AdapterOptions):
    data_entry_csv: str = "Data_Entry_2017_v2020.csv"
    train_val_list: str = "train_val_list.txt"  # official split lists, used when present
    test_list: str = "test_list.txt"


def files(options: NihOptions) -> tuple[MetadataFile, ...]:
    return (MetadataFile("data_entry_csv", COLUMNS),)


def image_locations(root: Path) -> dict[str, str]:
    """Where each PNG lives: the release spreads them over ``images_0NN/images/``; a flat ``images/`` also works.

    Lists directories only (one scandir per folder), never opens an image.
    """
    folders = sorted(root.glob("images_*/images")) + [root / "images"]
    found: dict[str, str] = {}
    for folder in folders:
        if folder.is_dir():
            relative = folder.relative_to(root).as_posix()
            with os.scandir(folder) as entries:
                for entry in entries:
                    found.setdefault(entry.name, f"{relative}/{entry.name}")
    return found


def official_split(root: Path, options: NihOptions, names: pd.Series) -> tuple[np.ndarray, list[Path]]:
    split = pd.Series(None, index=names.index, dtype=object)
    used = []
    for name, value in ((options.train_val_list, "train"), (options.test_list, "test")):
        path = resolve_metadata(root, name)
        if path.is_file():
            listed = set(path.read_text().split())
            split[names.isin(listed)] = value
            used.append(path)
    return split.to_numpy(dtype=object), used


def read(config) -> AdapterOutput:
    options: NihOptions = config.adapter_options
    path = resolve_metadata(config.root, options.data_entry_csv)
    table = read_metadata(path, COLUMNS)
    names = table["Image Index"].str.strip()
    findings = table["Finding Labels"].fillna("").str.strip()
    present = findings.str.get_dummies(sep="|")
    present.columns = present.columns.str.strip()
    unknown_terms = sorted(set(present.columns) - NIH_FINDINGS - {""})
    unknown = present[unknown_terms].sum(axis=1).to_numpy() > 0 if unknown_terms else np.zeros(len(table), bool)
    labels = {
        canonical: (present[nih].to_numpy() > 0).astype(np.float32) if nih in present else np.zeros(len(table), np.float32)
        for nih, canonical in NIH_TO_CANONICAL.items()
    }
    locations = image_locations(config.root)
    split, split_files = official_split(config.root, options, names)
    patient = table["Patient ID"].str.strip()
    records = build_records(
        "chest-xray",
        {
            "record_id": names.to_numpy(dtype=object),
            "source_row": source_rows(path, len(table)),
            "patient_id": patient.to_numpy(dtype=object),
            "study_id": (patient + "/" + table["Follow-up #"].str.strip()).to_numpy(dtype=object),
            "image_path": names.map(lambda n: locations.get(n, f"images/{n}")).to_numpy(dtype=object),
            "view": normalize_views(table["View Position"], {"PA": "PA", "AP": "AP"}).to_numpy(dtype=object),
            "sex": normalize_sex(table["Patient Gender"], ("F",), ("M",)).to_numpy(dtype=object),
            "age": to_age(table["Patient Age"]).to_numpy(),
            "split": split,
        },
        labels,
        len(table),
    )
    problems = [
        ((findings == "").to_numpy(), Reason.UNPARSABLE_LABEL, "Finding Labels is blank"),
        (unknown, Reason.UNPARSABLE_LABEL, "Finding Labels has a term outside the 14 NIH findings: " + findings),
    ]
    return finish(records, problems, len(table), [path, *split_files], age_notes(table["Patient Age"]))


ADAPTER = Adapter(name="nih-cxr14", tasks=("chest-xray",), options=NihOptions, files=files, read=read)
