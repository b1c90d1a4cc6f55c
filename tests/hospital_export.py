"""A hospital's own export, as a data engineer receives it, built from pydicom-data's real CR radiographs.

Not a named dataset layout: DICOMs in nested ``dicom/<mrn>/<date>_<accession>/SE0001/IM00001.dcm`` folders (so
file names repeat), a second folder with a space in its name (``PACS exports/``) of PNG and JPEG exports, and a
labels CSV as Excel saves it (UTF-8 byte-order mark, CRLF line ends) with the hospital's column names and value
encodings: ``cardiomegaly_flag`` Y / N / blank, ``effusion`` 1 / 0 / -1 / blank, ``edema`` 1.0 / 0.0 / -1.0,
``atelectasis`` 1 / 0, no Consolidation column, ages with top codes (``90+``, ``>89``) and a few unreadable ones;
beside it the same labels per study, as a RIS exports them (``ris_labels.csv``, one row per accession).

Each image is a different crop of RG1 (a PA chest, MONOCHROME1), flipped or not, downscaled to about 100 px so
that the export builds and decodes in seconds. Planted problems, each row named in ``HospitalExport.planted``:

- ``leg``: RG3 (CR, BodyPartExamined EXTREMITY, a lower leg) filed and labelled as a PA chest study;
- ``png_reexport``: an 8-bit PNG export of one DICOM (``png_of``), in the same study;
- ``reuid_copy``: that DICOM's pixels with new UIDs under another patient;
- ``truncated``: a DICOM cut in half;
- ``lateral``: a study whose projection is LATERAL (and its DICOM's ViewPosition LL);
- ``jpeg``: a JPEG export that is an image of its own, not a copy.
"""

from __future__ import annotations

import copy
import io
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pydicom
import yaml
from PIL import Image
from pydicom.data import get_testdata_file
from pydicom.uid import generate_uid

COLUMNS = ("accession", "mrn", "study_date", "image_file", "projection", "patient_sex", "age_at_exam",
           "cardiomegaly_flag", "effusion", "edema", "atelectasis")
STUDY_COLUMNS = ("accession", "mrn", "study_date", "cardiomegaly_flag", "effusion", "edema", "atelectasis")
LABEL_COLUMNS = {"Cardiomegaly": "cardiomegaly_flag", "Pleural Effusion": "effusion", "Edema": "edema",
                 "Atelectasis": "atelectasis"}
EXPORTS = "PACS exports"  # the folder with a space in its name
TOP_CODED_AGES = ("90+", ">89", "89+")
UNREADABLE_AGES = ("n/a", "unknown")
_SCALE = 16  # RG1's 1955 x 1841 pixels, cropped, to about 100 px a side


@dataclass
class HospitalExport:
    root: Path
    rows: list[dict[str, str]]  # the labels CSV's rows, as written
    planted: dict[str, str] = field(default_factory=dict)  # problem -> its row's image_file
    png_of: str = ""  # image_file of the DICOM that png_reexport and reuid_copy copy

    @property
    def labels_csv(self) -> Path:
        return self.root / "labels.csv"

    @property
    def study_labels_csv(self) -> Path:
        """The same labels as the RIS exports them: one row per accession (the first image's row of each)."""
        return self.root / "ris_labels.csv"

    def row(self, problem: str) -> dict[str, str]:
        return next(row for row in self.rows if row["image_file"] == self.planted[problem])

    def count(self, column: str, value: str) -> int:
        return sum(row[column] == value for row in self.rows)

    def site_yaml(self, path: Path, name: str = "riverbank", options: dict | None = None, **fields) -> Path:
        """A generic-csv site YAML for this export at ``path``; ``options`` and ``fields`` add to or replace
        its options and top-level fields."""
        site = {
            "name": name, "format": "generic-csv", "root": str(self.root), "task": "chest-xray",
            "image_size": 32, "min_image_size": 32, "split": {"seed": 0, "valid": 0.2, "test": 0.2},
            "options": {"labels_csv": "labels.csv", "path_column": "image_file", "patient_column": "mrn",
                        "study_column": "accession", "view_column": "projection", "sex_column": "patient_sex",
                        "age_column": "age_at_exam", "label_columns": dict(LABEL_COLUMNS), **(options or {})},
            **fields,
        }
        path.write_text(yaml.safe_dump(site, sort_keys=False))
        return path


def build_hospital_export(root: Path, studies: int = 36, seed: int = 0) -> HospitalExport:
    """Write the export under ``root`` (``studies`` ordinary chest studies, one image each, plus the planted
    rows) and return what was written."""
    rng = np.random.default_rng(seed)
    chest, chest_pixels = _header_and_pixels("RG1_UNCI.dcm")
    leg, leg_pixels = _header_and_pixels("RG3_UNCI.dcm")
    export = HospitalExport(Path(root), [])
    export.root.mkdir(parents=True, exist_ok=True)
    (export.root / EXPORTS).mkdir(exist_ok=True)
    ages = [str(a) for a in rng.integers(25, 88, studies + 8)]
    for k, age in enumerate(TOP_CODED_AGES + UNREADABLE_AGES):
        ages[3 * k + 1] = age
    for k in range(studies):
        export.rows.append(_dicom_study(export, chest, _crop(chest_pixels, k, rng), k, f"MRN{k:04d}", ages[k], rng))
    source = export.rows[0]
    export.png_of = source["image_file"]
    pixels = pydicom.dcmread(export.root / source["image_file"]).pixel_array
    k = studies
    planted = {
        "leg": _dicom_study(export, leg, _downscale(leg_pixels, _SCALE), k, f"MRN{k:04d}", ages[k], rng, "PA"),
        "reuid_copy": _dicom_study(export, chest, pixels, k + 1, f"MRN{k + 1:04d}", ages[k + 1], rng),
        "truncated": _dicom_study(export, chest, _crop(chest_pixels, k + 2, rng), k + 2, f"MRN{k + 2:04d}", ages[k + 2], rng),
        "lateral": _dicom_study(export, chest, _crop(chest_pixels, k + 3, rng), k + 3, f"MRN{k + 3:04d}", ages[k + 3], rng,
                                "LATERAL"),
        "png_reexport": {**source, "image_file": f"{EXPORTS}/{source['accession']}.png"},
        "jpeg": {**_labels(rng), "accession": f"ACC{k + 4:05d}", "mrn": f"MRN{k + 4:04d}", "study_date": "20240301",
                 "image_file": f"{EXPORTS}/ACC{k + 4:05d}.jpg", "projection": "PA", "patient_sex": "M",
                 "age_at_exam": ages[k + 4]},
    }
    _write_8bit(pixels, export.root / planted["png_reexport"]["image_file"], "PNG")
    _write_8bit(_crop(chest_pixels, k + 4, rng), export.root / planted["jpeg"]["image_file"], "JPEG")
    truncated = export.root / planted["truncated"]["image_file"]
    truncated.write_bytes(truncated.read_bytes()[: truncated.stat().st_size // 2])
    for problem, row in planted.items():
        export.rows.append(row)
        export.planted[problem] = row["image_file"]
    _write_excel_csv(export.labels_csv, export.rows, COLUMNS)
    studies: dict[str, dict[str, str]] = {}
    for row in export.rows:
        studies.setdefault(row["accession"], row)
    _write_excel_csv(export.study_labels_csv, list(studies.values()), STUDY_COLUMNS)
    return export


def _header_and_pixels(name: str) -> tuple[pydicom.Dataset, np.ndarray]:
    dataset = pydicom.dcmread(get_testdata_file(name))
    pixels = dataset.pixel_array
    del dataset.PixelData
    return dataset, pixels


def _crop(pixels: np.ndarray, k: int, rng: np.random.Generator) -> np.ndarray:
    """The ``k``-th view of a radiograph: its own window (60-90 % of each side, anywhere), flipped on odd k."""
    rows, columns = pixels.shape
    size = rng.uniform(0.6, 0.9)
    height, width = int(rows * size), int(columns * size)
    top, left = rng.integers(0, rows - height + 1), rng.integers(0, columns - width + 1)
    window = pixels[top:top + height, left:left + width]
    return _downscale(window[:, ::-1] if k % 2 else window, _SCALE)


def _downscale(pixels: np.ndarray, factor: int) -> np.ndarray:
    rows, columns = (s // factor * factor for s in pixels.shape)
    blocks = pixels[:rows, :columns].reshape(rows // factor, factor, columns // factor, factor)
    return blocks.mean(axis=(1, 3)).astype(np.uint16)


def _labels(rng: np.random.Generator) -> dict[str, str]:
    return {
        "cardiomegaly_flag": str(rng.choice(["Y", "N", "N", ""])),
        "effusion": str(rng.choice(["1", "0", "0", "-1", ""])),
        "edema": str(rng.choice(["1.0", "0.0", "0.0", "-1.0"])),
        "atelectasis": str(rng.choice(["1", "0", "0"])),
    }


def _dicom_study(export: HospitalExport, template: pydicom.Dataset, pixels: np.ndarray, k: int, mrn: str, age: str,
                 rng: np.random.Generator, projection: str = "PA") -> dict[str, str]:
    """One single-image study under ``dicom/<mrn>/<date>_<accession>/SE0001/IM00001.dcm``; its CSV row."""
    accession, date = f"ACC{k:05d}", f"2024{1 + k % 12:02d}{1 + k % 28:02d}"
    relative = f"dicom/{mrn}/{date}_{accession}/SE0001/IM00001.dcm"
    dataset = copy.deepcopy(template)
    dataset.set_pixel_data(np.ascontiguousarray(pixels, dtype=np.uint16), template.PhotometricInterpretation,
                           template.BitsStored)
    dataset.PatientID, dataset.AccessionNumber, dataset.StudyDate = mrn, accession, date
    dataset.ViewPosition = "LL" if projection == "LATERAL" else "PA"
    dataset.StudyInstanceUID, dataset.SeriesInstanceUID = generate_uid(), generate_uid()
    dataset.SOPInstanceUID = dataset.file_meta.MediaStorageSOPInstanceUID = generate_uid()
    path = export.root / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    dataset.save_as(path, enforce_file_format=True)
    sex = str(rng.choice(["F", "M"]))
    return {"accession": accession, "mrn": mrn, "study_date": date, "image_file": relative, "projection": projection,
            "patient_sex": sex, "age_at_exam": age, **_labels(rng)}


def _write_8bit(pixels: np.ndarray, path: Path, kind: str) -> None:
    """What a PACS viewer's export writes: the MONOCHROME1 image inverted for display, stretched to 8 bits."""
    shown = pixels.max() - pixels.astype(np.float64)
    low, high = shown.min(), shown.max()
    Image.fromarray(np.round(255 * (shown - low) / max(high - low, 1)).astype(np.uint8)).save(path, kind)


def _write_excel_csv(path: Path, rows: list[dict[str, str]], columns: tuple[str, ...]) -> None:
    """As Excel's "CSV UTF-8" saves it: a byte-order mark, CRLF line ends."""
    text = io.StringIO()
    text.write(",".join(columns) + "\r\n")
    for row in rows:
        text.write(",".join(row[column] for column in columns) + "\r\n")
    path.write_bytes(b"\xef\xbb\xbf" + text.getvalue().encode("utf-8"))
