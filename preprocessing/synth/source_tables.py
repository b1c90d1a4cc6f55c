"""What every synthetic format's sampler builds on (``preprocessing.synth.sources`` describes the whole):
the real public tables read as text, whole-patient sampling, and the CheXpert coding with its fallback model."""

from __future__ import annotations

import csv
import gzip
from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.csv as pacsv
from scipy.stats import norm

from preprocessing.public_metadata import (
    CHEXPERT_TRAIN,
    PublicMetadataUnavailable,
    public_metadata_dir,
)
from preprocessing.records import CHEST_XRAY_DISEASES

CHEXPERT_LABELS = (
    "No Finding", "Enlarged Cardiomediastinum", "Cardiomegaly", "Lung Opacity", "Lung Lesion", "Edema",
    "Consolidation", "Pneumonia", "Atelectasis", "Pneumothorax", "Pleural Effusion", "Pleural Other",
    "Fracture", "Support Devices",
)
CONFOUNDERS = ("opacity", "nodule", "devices", "lateral")
IMAGE_COLUMNS = ("path", "file_type", *CHEST_XRAY_DISEASES, *CONFOUNDERS)

# CheXpert training-set mention rates (Irvin et al., 2019, table 1), used only by the fallback.
FALLBACK_PREVALENCE = {
    "Enlarged Cardiomediastinum": 0.10, "Cardiomegaly": 0.15, "Lung Opacity": 0.50, "Lung Lesion": 0.05,
    "Edema": 0.29, "Consolidation": 0.19, "Pneumonia": 0.11, "Atelectasis": 0.30, "Pneumothorax": 0.10,
    "Pleural Effusion": 0.45, "Pleural Other": 0.02, "Fracture": 0.04, "Support Devices": 0.52,
}
FALLBACK_LOADING = 0.6  # correlation of each finding with the shared latent factor


@dataclass
class SiteSample:
    tables: dict[str, pd.DataFrame]  # relative path -> CSV content (written without index)
    images: pd.DataFrame  # IMAGE_COLUMNS (+ format extras such as bits, monochrome1)
    texts: dict[str, str] = field(default_factory=dict)  # relative path -> plain text (split lists)
    real_metadata: bool = True


@lru_cache(maxsize=4)
def _read_source(name: str) -> pd.DataFrame:
    # pyarrow parses the 17 MB PadChest table three times faster than pandas' C parser; every column stays
    # text and blanks stay "" so that rows are written back exactly as read (PadChest's first header is "").
    path = public_metadata_dir() / name
    with gzip.open(path, "rt") as handle:
        header = next(csv.reader(handle))
    table = pacsv.read_csv(
        path,
        parse_options=pacsv.ParseOptions(newlines_in_values=True),  # PadChest reports span lines
        convert_options=pacsv.ConvertOptions(column_types={column: pa.string() for column in header},
                                             strings_can_be_null=False, quoted_strings_can_be_null=False),
    )
    return table.to_pandas()


def real_table(name: str, use_real: bool = True) -> pd.DataFrame | None:
    """A real metadata table as strings (blank stays ""), or None when the wheel cannot be had or
    ``use_real`` is False (the fallback asked for explicitly, e.g. to test it)."""
    if not use_real:
        return None
    try:
        return _read_source(name)
    except PublicMetadataUnavailable:
        return None


def take_patients(patient_of_row: pd.Series, n: int, rng: np.random.Generator) -> np.ndarray:
    """Row positions of whole random patients until ``n`` rows; the last patient is cut to hit ``n``."""
    codes, patients = pd.factorize(patient_of_row, sort=True)
    order = rng.permutation(len(patients))
    rank = np.empty(len(patients), dtype=np.int64)
    rank[order] = np.arange(len(patients))
    row_rank = rank[codes]
    positions = np.lexsort((np.arange(len(codes)), row_rank))
    if n > len(positions):
        raise ValueError(f"asked for {n} images but the source has only {len(positions)}")
    return np.sort(positions[:n])


def unique_ints(rng: np.random.Generator, count: int, low: int, high: int) -> np.ndarray:
    return rng.choice(high - low, size=count, replace=False) + low


# --------------------------------------------------------------------------- CheXpert coding


def chexpert_evidence(rows: pd.DataFrame) -> pd.DataFrame:
    """Evidence and confounders from CheXpert-coded rows (1.0 / -1.0 / 0.0 / blank)."""

    def code(column: str) -> np.ndarray:
        return pd.to_numeric(rows[column], errors="coerce").fillna(0.0).to_numpy()

    evidence = pd.DataFrame(index=rows.index)
    for disease in CHEST_XRAY_DISEASES:
        values = code(disease)
        evidence[disease] = np.where(values == 1.0, 1.0, np.where(values == -1.0, 0.5, 0.0))
    evidence["opacity"] = (code("Lung Opacity") != 0) | (code("Pneumonia") != 0)
    evidence["nodule"] = code("Lung Lesion") != 0
    evidence["devices"] = code("Support Devices") == 1.0
    evidence["lateral"] = rows["Frontal/Lateral"].str.strip().str.lower() == "lateral"
    return evidence


def fallback_chexpert_table(n_patients: int, rng: np.random.Generator) -> pd.DataFrame:
    """A CheXpert ``train.csv`` drawn from the documented latent model (see the module docstring)."""
    studies = 1 + rng.geometric(0.45, size=n_patients) - 1
    rows = []
    for patient, n_studies in enumerate(studies, start=1):
        sex = rng.choice(["Male", "Female"], p=[0.59, 0.41])
        age = int(np.clip(rng.normal(61, 17), 18, 90))
        for study in range(1, n_studies + 1):
            sick = rng.standard_normal()
            labels = {}
            for name, prevalence in FALLBACK_PREVALENCE.items():
                latent = FALLBACK_LOADING * sick + np.sqrt(1 - FALLBACK_LOADING**2) * rng.standard_normal()
                mentioned = latent > norm.ppf(1 - prevalence)
                labels[name] = ("-1.0" if rng.random() < 0.12 else "1.0") if mentioned else ("0.0" if rng.random() < 0.1 else "")
            labels["No Finding"] = "" if any(v == "1.0" for v in labels.values()) else "1.0"
            views = ["frontal"] + (["lateral"] if rng.random() < 0.3 else [])
            ap_pa = rng.choice(["AP", "PA"], p=[0.85, 0.15])
            for number, view in enumerate(views, start=1):
                rows.append({
                    "Path": f"CheXpert-v1.0-small/train/patient{patient:05d}/study{study}/view{number}_{view}.jpg",
                    "Sex": sex, "Age": str(age + study - 1),
                    "Frontal/Lateral": view.capitalize(), "AP/PA": ap_pa if view == "frontal" else "",
                    **{name: labels[name] for name in CHEXPERT_LABELS},
                })
    return pd.DataFrame(rows, columns=["Path", "Sex", "Age", "Frontal/Lateral", "AP/PA", *CHEXPERT_LABELS])


def chexpert_source(n: int, rng: np.random.Generator, use_real: bool) -> tuple[pd.DataFrame, bool]:
    table = real_table(CHEXPERT_TRAIN, use_real)
    if table is not None:
        return table, True
    return fallback_chexpert_table(max(8, n // 2), rng), False


def patient_of_chexpert_path(paths: pd.Series) -> pd.Series:
    return paths.str.extract(r"(patient\d+)/", expand=False)
