"""The NIH, PadChest, VinDr and CheXpert adapters on the real public metadata (torchxrayvision wheel).

Expected counts and records were checked by hand against the gz CSVs (zcat | grep): e.g. NIH
``00000001_002.png,Cardiomegaly|Effusion,2,1,58,M,PA``; PadChest data row 73338 (index column 73337)
``..._01-020-113.png`` with Labels ['cardiomegaly', 'laminar atelectasis', 'loculated pleural effusion',
' pleural effusion', ' pleural thickening'], born 1930, study 20110628; VinDr image
``0007d316f756b3fa0baea2ff514ce945`` with 11 finding rows, Cardiomegaly by R10 only.
"""

from __future__ import annotations

import numpy as np
import pytest

from preprocessing.public_metadata import CHEXPERT_TRAIN, NIH_DATA_ENTRY, PADCHEST_LABELS, VINDR_TRAIN
from preprocessing.scan import scan_site
from preprocessing.sites import SiteConfig

DISEASES = ("Cardiomegaly", "Edema", "Consolidation", "Atelectasis", "Pleural Effusion")


def scan(root, fmt, options):
    return scan_site(SiteConfig.model_validate(
        {"name": fmt, "format": fmt, "root": root, "task": "chest-xray", "options": options}
    ))


def record(result, record_id) -> dict:
    rows = result.records[result.records["record_id"] == record_id]
    assert len(rows) == 1
    return rows.iloc[0].to_dict()


def positives(result) -> dict:
    return {d: int((result.records[d] == 1.0).sum()) for d in DISEASES}


@pytest.fixture(scope="module")
def nih(public_metadata):
    return scan(public_metadata, "nih-cxr14", {"data_entry_csv": NIH_DATA_ENTRY})


@pytest.fixture(scope="module")
def padchest(public_metadata):
    return scan(public_metadata, "padchest", {"labels_csv": PADCHEST_LABELS})


def test_nih_real_metadata(nih):
    assert nih.input_rows == 112_120 and len(nih.records) == 112_120 and len(nih.quarantine) == 0
    assert nih.records["patient_id"].nunique() == 30_805
    # every image is PA or AP; "Effusion" is Pleural Effusion; counts of the Finding Labels terms
    assert positives(nih) == {"Cardiomegaly": 2776, "Edema": 2303, "Consolidation": 4667, "Atelectasis": 11559,
                              "Pleural Effusion": 13317}
    r = record(nih, "00000001_002.png")
    assert (r["patient_id"], r["study_id"], r["age"], r["sex"], r["view"]) == ("1", "1/2", 58.0, "M", "PA")
    assert [r[d] for d in DISEASES] == [1.0, 0.0, 0.0, 0.0, 1.0]
    assert record(nih, "00030805_000.png")["source_row"] == "Data_Entry_2017_v2020.csv.gz:row 112120"


def test_padchest_real_metadata(padchest):
    assert padchest.input_rows == 160_861
    reasons = padchest.quarantine["reason"].value_counts().to_dict()
    # 103 rows whose Labels is "nan"; laterals (49,579 L) + COSTAL 630 + EXCLUDE 11 + UNK 8 - blank-label
    # rows among them (quarantined first, for their labels)
    assert reasons["unparsable_label"] == 103
    assert reasons == {"unparsable_label": 103, "excluded_view": 50_204}
    assert len(padchest.records) == 160_861 - 103 - 50_204
    assert set(padchest.records["view"]) == {"PA", "AP"}
    r = record(padchest, "22/216840111366964013076187734852011178141332421_01-020-113.png")
    assert (r["age"], r["sex"], r["view"], r["source_row"]) == (81.0, "F", "PA", f"{PADCHEST_LABELS}:row 73338")
    assert [r[d] for d in DISEASES] == [1.0, 0.0, 0.0, 1.0, 1.0]
    # a patient's images all land in one split
    assert (padchest.records.groupby("patient_id")["split"].nunique() == 1).all()


def test_vindr_real_metadata(public_metadata):
    result = scan(public_metadata, "vindr-cxr", {"train_csv": VINDR_TRAIN})
    assert result.input_rows == 15_000 and len(result.records) == 15_000  # 67,914 finding rows, 15,000 images
    assert result.records["Edema"].isna().all()
    r = record(result, "0007d316f756b3fa0baea2ff514ce945")
    assert r["source_row"] == f"{VINDR_TRAIN}:row 1447 (+10 more)"
    assert r["Cardiomegaly"] == 1.0 and r["Pleural Effusion"] == 0.0 and np.isnan(r["Edema"])
    # images where at least one radiologist marked the class (checked with zcat | awk | sort -u)
    assert positives(result)["Cardiomegaly"] == 2300


def test_chexpert_real_metadata(public_metadata):
    result = scan(public_metadata, "chexpert", {"train_csv": CHEXPERT_TRAIN, "valid_csv": None})
    assert result.input_rows == 223_414
    # 32,387 laterals + 17 frontal rows marked LL/RL (decubitus, neither PA nor AP)
    assert result.quarantine["reason"].value_counts().to_dict() == {"excluded_view": 32_404}
    r = record(result, "train/patient00002/study2/view1_frontal.jpg")
    assert (r["sex"], r["age"], r["view"], r["source_row"]) == ("F", 87.0, "AP", f"{CHEXPERT_TRAIN}:row 2")
    # all five are -1: U-Ones for Edema and Atelectasis, U-Zeros for the others
    assert [r[d] for d in DISEASES] == [0.0, 1.0, 0.0, 1.0, 0.0]
    assert not (result.records[list(DISEASES)] == -1.0).any(axis=None)
