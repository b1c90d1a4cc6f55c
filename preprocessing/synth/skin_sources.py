"""The SIIM-ISIC 2020 sampler: a ``train.csv`` drawn from the release's published marginals."""

from __future__ import annotations

import numpy as np
import pandas as pd

from preprocessing.synth.source_tables import SiteSample, unique_ints

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
    patient_ids = [f"IP_{v:07d}" for v in unique_ints(rng, n_patients, 0, 10_000_000)]
    patient_of_image = np.sort(rng.integers(0, n_patients, size=n))
    sex = rng.choice(["male", "female"], size=n_patients, p=[0.52, 0.48])
    age = np.clip(np.round(rng.normal(49, 14, size=n_patients) / 5) * 5, 0, 90)
    # Risk rises with age (log-odds +0.04 per year); the intercept is solved so the mean hits the prevalence.
    slope = 0.04 * (age[patient_of_image] - 49)
    intercept = _solve_intercept(slope, prevalence)
    risk = 1 / (1 + np.exp(-(intercept + slope)))
    target = rng.random(n) < risk
    diagnosis = np.where(target, "melanoma", rng.choice(list(SIIM_BENIGN), size=n, p=_normalised(SIIM_BENIGN)))
    names = [f"ISIC_{v:07d}" for v in unique_ints(rng, n, 0, 10_000_000)]
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
