"""The chest formats' samplers: CheXpert, MIMIC-CXR-JPG (CheXpert rows re-keyed), NIH ChestX-ray14, PadChest
and VinDr-CXR, each from its real public table by whole patient or from the CheXpert fallback model."""

from __future__ import annotations

import ast

import numpy as np
import pandas as pd

from preprocessing.public_metadata import (
    NIH_DATA_ENTRY,
    PADCHEST_LABELS,
    VINDR_TRAIN,
)
from preprocessing.synth.source_tables import (
    CHEXPERT_LABELS,
    SiteSample,
    chexpert_evidence,
    chexpert_source,
    fallback_chexpert_table,
    patient_of_chexpert_path,
    real_table,
    take_patients,
    unique_ints,
)

# --------------------------------------------------------------------------- CheXpert


def sample_chexpert(n: int, rng: np.random.Generator, use_real: bool = True, valid_fraction: float = 0.08) -> SiteSample:
    """``train.csv`` + ``valid.csv`` under ``CheXpert-v1.0-small/``; images as 8-bit JPEG.

    The real valid set is 200 held-out patients read by a radiologist panel: no uncertain and no blank
    labels. Here a ``valid_fraction`` of the sampled patients plays that part, renumbered from
    patient64541 (where the real valid ids start), with uncertain mentions resolved by a coin toss and
    blanks read as negative; their images follow the resolved labels.
    """
    source, real = chexpert_source(n, rng, use_real)
    rows = source.iloc[take_patients(patient_of_chexpert_path(source["Path"]), n, rng)].reset_index(drop=True)
    patients = patient_of_chexpert_path(rows["Path"])
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
    images = chexpert_evidence(listed)
    images.insert(0, "path", listed["Path"].str.replace(r"^CheXpert-v1\.0-small/", "", regex=True))
    images.insert(1, "file_type", "jpeg")
    return SiteSample({"train.csv": train, "valid.csv": valid}, images, real_metadata=real)


# --------------------------------------------------------------------------- MIMIC-CXR-JPG

MIMIC_LABEL_ORDER = tuple(sorted(CHEXPERT_LABELS))
MIMIC_VIEW_MEANING = {"PA": "postero-anterior", "AP": "antero-posterior", "LATERAL": "lateral"}


def sample_mimic(n: int, rng: np.random.Generator, use_real: bool = True, split_fractions=(0.85, 0.05, 0.10)) -> SiteSample:
    """MIMIC's three CSVs and ``files/pXX/pNNNNNNNN/sNNNNNNNN/<dicom_id>.jpg`` from CheXpert-coded rows.

    Labels are per study (the first image's row of each CheXpert study). ``split_fractions`` (train,
    validate, test) by subject: larger held-out parts than the real release (0.8 % / 1.5 %) so that a
    demo-sized hospital still has a test set.
    """
    source, real = chexpert_source(n, rng, use_real)
    rows = source.iloc[take_patients(patient_of_chexpert_path(source["Path"]), n, rng)].reset_index(drop=True)
    parts = rows["Path"].str.extract(r"(?P<patient>patient\d+)/(?P<study>study\d+)/")
    study_key = parts["patient"] + "/" + parts["study"]
    patient_codes, patients = pd.factorize(parts["patient"])
    study_codes, studies = pd.factorize(study_key)
    subject_ids = unique_ints(rng, len(patients), 10_000_000, 20_000_000)[patient_codes].astype(str)
    study_ids = unique_ints(rng, len(studies), 50_000_000, 60_000_000)[study_codes].astype(str)
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
    images = chexpert_evidence(image_labels)
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
    patient = patient_of_chexpert_path(chexpert["Path"]).str.slice(7).astype(int)
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
    patient = patient_of_chexpert_path(chexpert["Path"])
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
                 window: float = 0.6, manufacturers: tuple[tuple[str, float], ...] = (("GE Healthcare", 1.0),)
                 ) -> SiteSample:
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
    # Drawn last, so that adding the tag left every earlier draw, hence every image, as it was.
    names, shares = zip(*manufacturers)
    images["manufacturer"] = rng.choice(names, size=n, p=np.asarray(shares) / sum(shares))
    return SiteSample({"train.csv": rows}, images, real_metadata=real)
