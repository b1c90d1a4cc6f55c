"""Each adapter on a small tree in its dataset's exact layout (file names, columns, codes)."""

from __future__ import annotations

import gzip
import os
import shutil

import numpy as np
import pandas as pd
import pydicom
import pytest
from pydicom.dataset import FileMetaDataset
from pydicom.uid import ExplicitVRLittleEndian, generate_uid

from preprocessing.adapters import MetadataError
from preprocessing.records import RECORD_COLUMNS
from preprocessing.scan import scan_site
from preprocessing.sites import SiteConfig

CHEXPERT_HEADER = (
    "Path,Sex,Age,Frontal/Lateral,AP/PA,No Finding,Enlarged Cardiomediastinum,Cardiomegaly,Lung Opacity,"
    "Lung Lesion,Edema,Consolidation,Pneumonia,Atelectasis,Pneumothorax,Pleural Effusion,Pleural Other,"
    "Fracture,Support Devices"
)


def site(root, fmt, task="chest-xray", **fields) -> SiteConfig:
    return SiteConfig.model_validate({"name": "h", "format": fmt, "root": root, "task": task, **fields})


def by_id(result, record_id) -> dict:
    rows = result.records[result.records["record_id"] == record_id]
    assert len(rows) == 1, record_id
    return rows.iloc[0].to_dict()


def reasons(result) -> dict:
    return result.quarantine.set_index("record_id")["reason"].to_dict()


def assert_labels(record, expected: dict) -> None:
    for disease, value in expected.items():
        if np.isnan(value):
            assert np.isnan(record[disease]), disease
        else:
            assert record[disease] == value, disease


def test_chexpert_layout(tmp_path):
    p = "CheXpert-v1.0-small/train"
    (tmp_path / "train.csv").write_text(
        CHEXPERT_HEADER + "\n"
        f"{p}/patient00001/study1/view1_frontal.jpg,Female,68,Frontal,AP,1.0,,,,,,,,,0.0,,,,1.0\n"
        f"{p}/patient00002/study2/view1_frontal.jpg,Female,87,Frontal,AP,,,-1.0,1.0,,-1.0,-1.0,,-1.0,,-1.0,,1.0,\n"
        f"{p}/patient00002/study2/view2_lateral.jpg,Female,87,Lateral,,,,1.0,,,,,,,,,,,\n"
        f"{p}/patient00003/study1/view1_frontal.jpg,Male,40,Frontal,PA,,,yes,,,,,,,,,,,\n"
        f"{p}/patient00001/study1/view1_frontal.jpg,Female,68,Frontal,AP,1.0,,,,,,,,,0.0,,,,1.0\n"
    )
    (tmp_path / "valid.csv").write_text(
        CHEXPERT_HEADER + "\n"
        "CheXpert-v1.0-small/valid/patient64541/study1/view1_frontal.jpg,Male,73,Frontal,AP,0.0,1.0,1.0,1.0,0.0,"
        "0.0,0.0,0.0,0.0,0.0,0.0,0.0,0.0,0.0\n"
    )
    (tmp_path / "train").mkdir()
    result = scan_site(site(tmp_path, "chexpert", uncertain_policy={"Consolidation": "ignore"}))
    assert result.input_rows == 6 and len(result.records) == 3 and len(result.quarantine) == 3
    assert list(result.records.columns[: len(RECORD_COLUMNS)]) == list(RECORD_COLUMNS)
    second = by_id(result, "train/patient00002/study2/view1_frontal.jpg")
    assert second["patient_id"] == "patient00002" and second["study_id"] == "patient00002/study2"
    assert (second["sex"], second["age"], second["view"]) == ("F", 87.0, "AP")
    # -1: U-Zeros Cardiomegaly, U-Ones Edema/Atelectasis (defaults), U-Ignore Consolidation (site's choice)
    assert_labels(second, {"Cardiomegaly": 0.0, "Edema": 1.0, "Consolidation": np.nan, "Atelectasis": 1.0,
                           "Pleural Effusion": 0.0})
    first = by_id(result, "train/patient00001/study1/view1_frontal.jpg")
    assert_labels(first, dict.fromkeys(["Cardiomegaly", "Edema", "Consolidation", "Atelectasis", "Pleural Effusion"], 0.0))
    official_valid = by_id(result, "valid/patient64541/study1/view1_frontal.jpg")
    assert official_valid["split"] == "test" and official_valid["Cardiomegaly"] == 1.0
    assert reasons(result) == {
        "train/patient00002/study2/view2_lateral.jpg": "excluded_view",
        "train/patient00003/study1/view1_frontal.jpg": "unparsable_label",
        "train/patient00001/study1/view1_frontal.jpg": "duplicate_row",
    }
    detail = result.quarantine.set_index("reason")["detail"]
    assert detail["unparsable_label"] == "Cardiomegaly=yes is not one of 1, 0, -1 or blank"
    assert detail["duplicate_row"] == "same record as train.csv:row 1"
    assert result.quarantine.set_index("reason")["source_row"]["duplicate_row"] == "train.csv:row 5"


def test_chexpert_blank_can_mean_missing_and_bad_paths_are_quarantined(tmp_path):
    (tmp_path / "train.csv").write_text(
        CHEXPERT_HEADER + "\ntrain/patient00001/study1/view1_frontal.jpg,Female,68,Frontal,AP,1.0,,,,,,,,,0.0,,,,1.0\n"
        "CheXpert-v1.0/train/view1_frontal.jpg,Female,68,Frontal,AP,1.0,,,,,,,,,0.0,,,,1.0\n"
    )
    result = scan_site(site(tmp_path, "chexpert", options={"valid_csv": None, "blank": "ignore"}))
    assert reasons(result) == {"train/view1_frontal.jpg": "missing_field"}
    # only No Finding, Pneumothorax and Support Devices are filled in this row
    assert result.records[list(result.records.columns[len(RECORD_COLUMNS):])].isna().all(axis=None)


def test_mimic_cxr_jpg_layout(tmp_path):
    pd.DataFrame({
        "dicom_id": ["d1", "d2", "d3", "d4", "d5"],
        "subject_id": ["10000032", "10000032", "10000032", "11000001", "12000002"],
        "study_id": ["50414267", "50414267", "53189527", "56000001", "57000009"],
        "ViewPosition": ["PA", "LATERAL", "AP", "AP", "PA"],
        "Rows": [3056] * 5,
    }).to_csv(tmp_path / "mimic-cxr-2.0.0-metadata.csv.gz", index=False)
    labels = pd.DataFrame({"subject_id": ["10000032", "10000032", "11000001"],
                           "study_id": ["50414267", "53189527", "56000001"]})
    for disease, values in {"Cardiomegaly": [1.0, None, 0.0], "Edema": [-1.0, 1.0, None],
                            "Consolidation": [None, -1.0, None], "Atelectasis": [-1.0, None, None],
                            "Pleural Effusion": [0.0, 1.0, 1.0], "No Finding": [None, None, None]}.items():
        labels[disease] = values
    labels.to_csv(tmp_path / "mimic-cxr-2.0.0-chexpert.csv.gz", index=False)
    pd.DataFrame({"dicom_id": ["d1", "d2", "d3", "d4", "d5"], "study_id": ["50414267"] * 5,
                  "subject_id": ["10000032"] * 5, "split": ["train", "train", "test", "validate", "train"]}
                 ).to_csv(tmp_path / "mimic-cxr-2.0.0-split.csv.gz", index=False)
    (tmp_path / "files").mkdir()
    result = scan_site(site(tmp_path, "mimic-cxr-jpg"))
    assert result.input_rows == 5
    d4 = by_id(result, "d4")
    assert d4["image_path"] == "files/p11/p11000001/s56000001/d4.jpg" and d4["split"] == "valid"
    assert_labels(d4, {"Cardiomegaly": 0.0, "Edema": 0.0, "Pleural Effusion": 1.0})
    # subject 10000032 is in train (d1) and test (d3): a patient in two official splits
    assert reasons(result) == {"d1": "patient_in_two_splits", "d2": "excluded_view", "d3": "patient_in_two_splits",
                               "d5": "missing_field"}
    assert result.quarantine.set_index("record_id")["detail"]["d5"] == "study_id has no row in mimic-cxr-2.0.0-chexpert.csv.gz"


def test_nih_layout_with_official_lists(tmp_path):
    (tmp_path / "Data_Entry_2017_v2020.csv").write_text(
        "Image Index,Finding Labels,Follow-up #,Patient ID,Patient Age,Patient Gender,View Position,"
        "OriginalImage[Width,Height],OriginalImagePixelSpacing[x,y]\n"
        "00000001_000.png,Cardiomegaly,0,1,57,M,PA,2682,2749,0.143,0.143\n"
        "00000001_002.png,Cardiomegaly|Effusion,2,1,58,M,PA,2500,2048,0.168,0.168\n"
        "00000002_000.png,No Finding,0,2,81,F,AP,2500,2048,0.171,0.171\n"
        "00000003_000.png,Hernia|Edema,0,3,74,F,PA,2500,2048,0.168,0.168\n"
        "00000004_000.png,Cardiomegaly|Tumour,0,4,70,F,PA,2500,2048,0.168,0.168\n"
        "00000005_000.png,,0,5,70,F,PA,2500,2048,0.168,0.168\n"
    )
    (tmp_path / "train_val_list.txt").write_text("00000001_000.png\n00000001_002.png\n00000003_000.png\n")
    (tmp_path / "test_list.txt").write_text("00000002_000.png\n")
    (tmp_path / "images_002" / "images").mkdir(parents=True)
    (tmp_path / "images_002" / "images" / "00000001_002.png").write_bytes(b"")
    result = scan_site(site(tmp_path, "nih-cxr14", split={"valid": 0.0}))
    assert result.input_rows == 6 and len(result.records) == 4
    record = by_id(result, "00000001_002.png")
    assert record["image_path"] == "images_002/images/00000001_002.png"
    assert (record["patient_id"], record["study_id"], record["age"], record["sex"]) == ("1", "1/2", 58.0, "M")
    assert_labels(record, {"Cardiomegaly": 1.0, "Pleural Effusion": 1.0, "Edema": 0.0, "Atelectasis": 0.0,
                           "Consolidation": 0.0})
    assert by_id(result, "00000003_000.png")["Edema"] == 1.0
    assert by_id(result, "00000002_000.png")["split"] == "test"
    assert by_id(result, "00000001_000.png")["image_path"] == "images/00000001_000.png"
    assert set(result.records["split"]) == {"train", "test"}
    assert reasons(result) == {"00000004_000.png": "unparsable_label", "00000005_000.png": "unparsable_label"}
    assert [p.name for p in result.metadata_files] == ["Data_Entry_2017_v2020.csv", "train_val_list.txt", "test_list.txt"]


PADCHEST_COLUMNS = ["", "ImageID", "ImageDir", "StudyDate_DICOM", "StudyID", "PatientID", "PatientBirth",
                    "PatientSex_DICOM", "ViewPosition_DICOM", "Projection", "Report", "Labels"]


def test_padchest_layout(tmp_path):
    rows = [
        [0, "a_1.png", 0, "20140915", "s1", "p1", "1930.0", "F", "POSTEROANTERIOR", "PA", "line one\nline two",
         "['cardiomegaly', 'laminar atelectasis', 'loculated pleural effusion', ' pleural thickening']"],
        [1, "a_2.png", 0, "20140915", "s1", "p1", "1930.0", "F", "LATERAL", "L", "x", "['normal']"],
        [2, "b_1.png", 3, "20150101", "s2", "p2", "1950.0", "O", "AP", "AP_horizontal", "x", "[' pulmonary edema', 'consolidation']"],
        [3, "c_1.png", 3, "20150101", "s3", "p3", None, "M", "", "PA", "x", "nan"],
        [4, "d_1.png", 3, "20150101", "s4", "p4", "1950.0", "M", "", "PA", "x", "['unterminated"],
        [5, "e_1.png", 3, "20150101", "s5", "p5", "1950.0", "M", "", "PA", "x", "__import__('os')"],
        [6, "f_1.png", 5, "20150101", "s6", "p6", "1950.0", "M", "", "COSTAL", "x", "['normal']"],
    ]
    pd.DataFrame(rows, columns=PADCHEST_COLUMNS).to_csv(
        tmp_path / "PADCHEST_chest_x_ray_images_labels_160K_01.02.19.csv", index=False
    )
    result = scan_site(site(tmp_path, "padchest"))
    assert result.input_rows == 7 and len(result.records) == 2
    a1 = by_id(result, "0/a_1.png")
    assert (a1["age"], a1["sex"], a1["view"], a1["study_id"]) == (84.0, "F", "PA", "s1")
    assert_labels(a1, {"Cardiomegaly": 1.0, "Atelectasis": 1.0, "Pleural Effusion": 1.0, "Edema": 0.0, "Consolidation": 0.0})
    b1 = by_id(result, "3/b_1.png")
    assert (b1["view"], b1["sex"]) == ("AP", "unknown")
    assert_labels(b1, {"Edema": 1.0, "Consolidation": 1.0, "Cardiomegaly": 0.0})
    assert reasons(result) == {"0/a_2.png": "excluded_view", "3/c_1.png": "unparsable_label",
                               "3/d_1.png": "unparsable_label", "3/e_1.png": "unparsable_label",
                               "5/f_1.png": "excluded_view"}
    details = result.quarantine.set_index("record_id")["detail"]
    assert details["3/c_1.png"] == "Labels is blank"
    # rows, not lines: the Report of row 1 spans two lines
    assert result.quarantine.set_index("record_id")["source_row"]["3/c_1.png"].endswith(".csv:row 4")


def test_vindr_layout_any_radiologist_counts(tmp_path):
    (tmp_path / "train.csv").write_text(
        "image_id,class_name,class_id,rad_id,x_min,y_min,x_max,y_max\n"
        "img1,Cardiomegaly,3,R10,1,2,3,4\n"
        "img1,No finding,14,R9,,,,\n"
        "img2,No finding,14,R8,,,,\n"
        "img1,Pleural effusion,10,R8,1,2,3,4\n"
        "img2,No finding,14,R9,,,,\n"
        "img3,Pneumonia,99,R9,1,2,3,4\n"
        ",Cardiomegaly,3,R9,1,2,3,4\n"
    )
    (tmp_path / "train").mkdir()
    result = scan_site(site(tmp_path, "vindr-cxr"))
    assert result.input_rows == 4 and len(result.records) == 2
    img1 = by_id(result, "img1")
    assert img1["image_path"] == "train/img1.dicom" and img1["source_row"] == "train.csv:row 1 (+2 more)"
    assert_labels(img1, {"Cardiomegaly": 1.0, "Pleural Effusion": 1.0, "Atelectasis": 0.0, "Edema": np.nan})
    assert_labels(by_id(result, "img2"), {"Cardiomegaly": 0.0, "Edema": np.nan})
    q = result.quarantine.set_index("source_row")
    assert q.loc["train.csv:row 6 (+0 more)", "detail"] == "class_name outside the VinDr classes: Pneumonia"
    assert q.loc["train.csv:row 7", "reason"] == "missing_field"


@pytest.mark.parametrize("image_format,expected", [("dicom", "train/ISIC_1.dcm"), ("jpeg", "jpeg/train/ISIC_1.jpg")])
def test_siim_isic_layout(tmp_path, image_format, expected):
    (tmp_path / "train.csv").write_text(
        "image_name,patient_id,sex,age_approx,anatom_site_general_challenge,diagnosis,benign_malignant,target\n"
        "ISIC_1,IP_1,male,45.0,head/neck,unknown,benign,0\n"
        "ISIC_2,IP_1,male,45.0,torso,melanoma,malignant,1\n"
        "ISIC_3,IP_2,,,torso,melanoma,malignant,\n"
    )
    result = scan_site(site(tmp_path, "siim-isic-2020", task="melanoma", options={"image_format": image_format}))
    assert list(result.records.columns[len(RECORD_COLUMNS):]) == ["Melanoma"]
    assert by_id(result, "ISIC_1")["image_path"] == expected
    assert (by_id(result, "ISIC_2")["Melanoma"], by_id(result, "ISIC_2")["sex"]) == (1.0, "M")
    assert reasons(result) == {"ISIC_3": "unparsable_label"}
    assert result.quarantine["detail"].iloc[0] == "target=<blank> is not 0 or 1"


def test_generic_csv_layout(tmp_path):
    (tmp_path / "labels.csv").write_text(
        "file,mrn,cardio,fluid,projection,split\n"
        "a.png,M1,1,,PA,train\n"
        "b.png,M2,0,-1,AP,test\n"
        "c.png,,0,0,PA,train\n"
        "d.png,M3,2,0,PA,train\n"
    )
    options = {"labels_csv": "labels.csv", "path_column": "file", "patient_column": "mrn", "image_dir": "png",
               "view_column": "projection", "split_column": "split",
               "label_columns": {"Cardiomegaly": "cardio", "Pleural Effusion": "fluid"}}
    result = scan_site(site(tmp_path, "generic-csv", options=options))
    a = by_id(result, "a.png")
    assert a["image_path"] == "png/a.png" and a["split"] == "train"
    # blank is missing by default; Edema is never labeled here, so missing, not negative
    assert_labels(a, {"Cardiomegaly": 1.0, "Pleural Effusion": np.nan, "Edema": np.nan})
    assert_labels(by_id(result, "b.png"), {"Cardiomegaly": 0.0, "Pleural Effusion": 0.0})  # U-Zeros default
    assert reasons(result) == {"c.png": "missing_field", "d.png": "unparsable_label"}


def test_generic_csv_missing_column_names_file_and_column(tmp_path):
    (tmp_path / "labels.csv").write_text("file,mrn\na.png,M1\n")
    options = {"labels_csv": "labels.csv", "path_column": "file", "patient_column": "mrn",
               "label_columns": {"Edema": "edema"}}
    with pytest.raises(MetadataError, match=r"labels\.csv: missing column\(s\) \['edema'\]"):
        scan_site(site(tmp_path, "generic-csv", options=options))


def write_dicom(path, uid):
    meta = FileMetaDataset()
    meta.MediaStorageSOPClassUID = "1.2.840.10008.5.1.4.1.1.1.1"
    meta.MediaStorageSOPInstanceUID = uid
    meta.TransferSyntaxUID = ExplicitVRLittleEndian
    ds = pydicom.Dataset()
    ds.file_meta = meta
    ds.SOPClassUID, ds.SOPInstanceUID, ds.Modality = meta.MediaStorageSOPClassUID, uid, "DX"
    ds.Rows = ds.Columns = 2
    ds.BitsAllocated, ds.BitsStored, ds.HighBit, ds.PixelRepresentation = 16, 12, 11, 0
    ds.SamplesPerPixel, ds.PhotometricInterpretation = 1, "MONOCHROME2"
    ds.PixelData = np.arange(4, dtype=np.uint16).tobytes()
    path.parent.mkdir(parents=True, exist_ok=True)
    ds.save_as(path, enforce_file_format=True)


def test_generic_dicom_keyed_by_sop_instance_uid(tmp_path):
    uid1, uid2, uid3 = generate_uid(), generate_uid(), generate_uid()
    write_dicom(tmp_path / "dicom" / "2024" / "x1.dcm", uid1)
    write_dicom(tmp_path / "dicom" / "x2", uid2)
    (tmp_path / "dicom" / "notes.txt").write_text("not a DICOM")
    uid4 = generate_uid()
    write_dicom(tmp_path / "elsewhere" / "x4.dcm", uid4)
    os.symlink(tmp_path / "elsewhere" / "x4.dcm", tmp_path / "dicom" / "x4.dcm")  # out of the folder: never read
    os.mkfifo(tmp_path / "dicom" / "pipe.dcm")  # opening it would block the scan forever
    (tmp_path / "labels.csv").write_text(f"uid,patient,edema\n{uid1},P1,1\n{uid2},P2,0\n{uid3},P3,1\n{uid4},P4,1\n")
    options = {"labels_csv": "labels.csv", "key_column": "uid", "key": "sop_instance_uid", "patient_column": "patient",
               "label_columns": {"Edema": "edema"}, "default_view": "PA"}
    result = scan_site(site(tmp_path, "generic-dicom", options=options))
    assert by_id(result, uid1)["image_path"] == "dicom/2024/x1.dcm"
    assert by_id(result, uid2)["image_path"] == "dicom/x2" and by_id(result, uid2)["Edema"] == 0.0
    assert reasons(result) == {uid3: "missing_field", uid4: "missing_field"}


def test_generic_dicom_keyed_by_file_name(tmp_path):
    (tmp_path / "labels.csv").write_text("file,patient,mel\nISIC_1.dcm,P1,1\n")
    options = {"labels_csv": "labels.csv", "key_column": "file", "patient_column": "patient", "dicom_dir": "derm",
               "label_columns": {"Melanoma": "mel"}}
    result = scan_site(site(tmp_path, "generic-dicom", task="melanoma", options=options))
    assert by_id(result, "ISIC_1.dcm")["image_path"] == "derm/ISIC_1.dcm"


# Every metadata file of every adapter, emptied to its header while the site's other files keep their rows.
# None: a header-only copy is an error (no training image); a string: allowed, and the label report warns so.
HEADER_ONLY = [
    ("chexpert", "train_csv", None),
    ("chexpert", "valid_csv", "split test: no images"),  # the official test set, empty: the test split is empty
    ("mimic-cxr-jpg", "metadata_csv", None),
    ("mimic-cxr-jpg", "chexpert_csv", None),
    ("mimic-cxr-jpg", "split_csv", ""),  # no official split: every patient is drawn
    ("nih-cxr14", "data_entry_csv", None),
    ("padchest", "labels_csv", None),
    ("vindr-cxr", "train_csv", None),
    ("siim-isic-2020", "train_csv", None),
    ("generic-csv", "labels_csv", None),
    ("generic-dicom", "labels_csv", None),
]


@pytest.fixture(scope="module")
def layouts(tmp_path_factory):
    """format -> (data root, site fields): small sites in each format's real layout, written once."""
    from conftest import generic_csv_site_yaml, write_generic_csv_site

    from preprocessing.synth import generate_site

    base = tmp_path_factory.mktemp("layouts")
    layouts = {}
    for fmt in sorted({fmt for fmt, _, _ in HEADER_ONLY} - {"generic-csv", "generic-dicom"}):
        result = generate_site(fmt, base / fmt, n=40, seed=1, workers=0, progress=False)
        layouts[fmt] = (result.root, {"task": "melanoma" if fmt == "siim-isic-2020" else "chest-xray"})
    write_generic_csv_site(base / "generic-csv", patients=10)
    generic = generic_csv_site_yaml("h", base / "generic-csv")
    layouts["generic-csv"] = (base / "generic-csv", {"task": generic["task"], "options": generic["options"]})
    uid = generate_uid()
    write_dicom(base / "generic-dicom" / "dicom" / "x1.dcm", uid)
    (base / "generic-dicom" / "labels.csv").write_text(f"uid,patient,edema\n{uid},P1,1\n")
    layouts["generic-dicom"] = (base / "generic-dicom", {"task": "chest-xray", "options": {
        "labels_csv": "labels.csv", "key_column": "uid", "key": "sop_instance_uid", "patient_column": "patient",
        "label_columns": {"Edema": "edema"}, "default_view": "PA"}})
    return layouts


@pytest.mark.parametrize(("fmt", "option", "warning"), HEADER_ONLY, ids=[f"{f}-{o}" for f, o, _ in HEADER_ONLY])
def test_a_header_only_metadata_file(layouts, tmp_path, fmt, option, warning):
    """validate names the file, report and preprocess stop with the same one-line error (never a crash on
    the empty table); a file that may be empty leaves a usable site, with a warning where a split empties."""
    from common.errors import DataError
    from preprocessing.adapters import ADAPTERS
    from preprocessing.adapters.base import read_metadata_text, resolve_metadata
    from preprocessing.label_report import label_report, require_usable_rows
    from preprocessing.sites import validate_site

    source, fields = layouts[fmt]
    root = tmp_path / "data"
    shutil.copytree(source, root)
    config = site(root, fmt, **fields)
    assert option in [m.option for m in ADAPTERS[fmt].files(config.adapter_options)]
    path = resolve_metadata(root, getattr(config.adapter_options, option))
    header = read_metadata_text(path).partition("\n")[0] + "\n"
    path.write_bytes(gzip.compress(header.encode()) if path.suffix == ".gz" else header.encode())
    problems = validate_site(config)
    if warning is None:
        assert [(p.field, p.message) for p in problems] == [(f"options.{option}", f"{path}: no data rows, only a header")]
        with pytest.raises(DataError, match=r"no data rows, only a header|no usable image row"):
            require_usable_rows(label_report(scan_site(config)), config.name)
    else:
        assert problems == []
        report = label_report(scan_site(config))
        require_usable_rows(report, config.name)
        assert report["splits"]["train"]["images"] > 0
        assert warning in report["warnings"] if warning else not [w for w in report["warnings"] if "no images" in w]
