"""Labels per study (issue 53 item 5): generic-dicom keyed by AccessionNumber or StudyInstanceUID, on real CR
radiographs (pydicom-data's RG1 chest PA, copied with new identifiers)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pydicom
import pytest
from pydicom.data import get_testdata_file
from pydicom.uid import generate_uid

from preprocessing.quarantine import Reason
from preprocessing.scan import scan_site
from preprocessing.shards import shard_site
from preprocessing.sites import SiteConfig


def radiograph(target: Path, source: str, accession: str, study_uid: str, view: str | None, picture: int) -> Path:
    """pydicom-data's ``source`` as a new instance of the study, its ``picture``-th window (a quarter of each side
    cut off at another corner, flipped on odd ``picture``): each file its own picture, or the near-duplicate
    search would rightly quarantine the copies of one radiograph under several studies."""
    ds = pydicom.dcmread(get_testdata_file(source))
    pixels = ds.pixel_array
    rows, columns = pixels.shape[0] * 3 // 4, pixels.shape[1] * 3 // 4
    top, left = (picture // 2 % 2) * (pixels.shape[0] - rows), (picture % 2) * (pixels.shape[1] - columns)
    window = pixels[top:top + rows, left:left + columns]
    window = np.ascontiguousarray(window[:, ::-1] if picture % 2 else window)
    ds.Rows, ds.Columns, ds.PixelData = rows, columns, window.astype(pixels.dtype).tobytes()
    ds.AccessionNumber, ds.StudyInstanceUID = accession, study_uid
    ds.SeriesInstanceUID, ds.SOPInstanceUID = generate_uid(), generate_uid()
    ds.file_meta.MediaStorageSOPInstanceUID = ds.SOPInstanceUID
    if view is None:
        del ds.ViewPosition
    else:
        ds.ViewPosition = view
    target.parent.mkdir(parents=True, exist_ok=True)
    ds.save_as(target, enforce_file_format=True)
    return target


@pytest.fixture(scope="module")
def export(tmp_path_factory) -> tuple[Path, dict[str, str]]:
    """A PACS export in nested folders whose file names repeat: study ACC1 (a PA, a lateral, a frontal without
    ViewPosition), study ACC2 (a PA), study ACC3 (a PA no labels row names)."""
    root = tmp_path_factory.mktemp("pacs-export")
    uids = {accession: generate_uid() for accession in ("ACC1", "ACC2", "ACC3", "ACC9")}
    for picture, (accession, source, view, series) in enumerate([
            ("ACC1", "RG1_UNCR.dcm", "PA", "SE1"), ("ACC1", "RG1_UNCI.dcm", "LL", "SE2"),
            ("ACC1", "RG1_UNCR.dcm", None, "SE3"), ("ACC2", "RG1_UNCI.dcm", "PA", "SE1"),
            ("ACC3", "RG1_UNCR.dcm", "PA", "SE1")]):
        radiograph(root / "dicom" / accession / series / "IM00001.dcm", source, accession, uids[accession], view,
                   picture)
    (root / "dicom" / "ACC1" / "notes.txt").write_text("not a DICOM")
    return root, uids


def labels(root: Path, key: str, uids: dict[str, str]) -> None:
    """The RIS's findings, one row per study (ACC9's study was never exported)."""
    value = (lambda accession: accession) if key == "accession_number" else uids.__getitem__
    rows = [("ACC1", "P1", "1", "0"), ("ACC2", "P2", "0", ""), ("ACC9", "P9", "1", "1")]
    (root / "findings.csv").write_text("study,mrn,edema,effusion\r\n" + "".join(
        f"{value(accession)},{mrn},{edema},{effusion}\r\n" for accession, mrn, edema, effusion in rows), encoding="utf-8-sig")


def study_site(root: Path, key: str, **fields) -> SiteConfig:
    options = {"labels_csv": "findings.csv", "key_column": "study", "key": key, "patient_column": "mrn",
               "label_columns": {"Edema": "edema", "Pleural Effusion": "effusion"}, "default_view": "PA"}
    return SiteConfig.model_validate({"name": "ris", "format": "generic-dicom", "root": root, "task": "chest-xray",
                                      "views": ["PA", "AP"], "options": options, **fields})


@pytest.mark.parametrize("key", ["accession_number", "study_instance_uid"])
def test_a_study_row_labels_each_frontal_image_and_every_file_is_accounted(export, key):
    root, uids = export
    labels(root, key, uids)
    result = scan_site(study_site(root, key))
    kept = result.records.set_index("image_path")
    assert sorted(kept.index) == ["dicom/ACC1/SE1/IM00001.dcm", "dicom/ACC1/SE3/IM00001.dcm",
                                  "dicom/ACC2/SE1/IM00001.dcm"]
    study = (lambda accession: accession) if key == "accession_number" else uids.__getitem__
    assert kept.loc["dicom/ACC1/SE1/IM00001.dcm", "study_id"] == study("ACC1")
    assert list(kept.loc["dicom/ACC1/SE3/IM00001.dcm", ["Edema", "Pleural Effusion"]]) == [1.0, 0.0]
    assert kept.loc["dicom/ACC2/SE1/IM00001.dcm", "Edema"] == 0.0
    assert np.isnan(kept.loc["dicom/ACC2/SE1/IM00001.dcm", "Pleural Effusion"])
    assert set(kept["source_row"]) == {"findings.csv:row 1", "findings.csv:row 2"}
    quarantine = result.quarantine.set_index("image_path")
    assert quarantine.loc["dicom/ACC1/SE2/IM00001.dcm", "reason"] == Reason.EXCLUDED_VIEW.value  # its own LL
    assert quarantine.loc["dicom/ACC3/SE1/IM00001.dcm", "reason"] == Reason.NO_LABELS_ROW.value
    assert quarantine.loc["dicom/ACC3/SE1/IM00001.dcm", "detail"].endswith(f"no row in findings.csv: {study('ACC3')}")
    orphan_row = result.quarantine[result.quarantine["source_row"] == "findings.csv:row 3"]
    assert list(orphan_row["reason"]) == [Reason.MISSING_FIELD.value] and list(orphan_row["record_id"]) == [study("ACC9")]
    assert result.input_rows == 6 == len(result.records) + len(result.quarantine)


def test_a_study_row_with_a_bad_label_quarantines_each_of_its_images(export):
    root, uids = export
    labels(root, "accession_number", uids)
    text = (root / "findings.csv").read_text(encoding="utf-8-sig").replace("ACC1,P1,1,", "ACC1,P1,Y,")
    (root / "findings.csv").write_text(text, encoding="utf-8-sig")
    result = scan_site(study_site(root, "accession_number"))
    bad = result.quarantine[result.quarantine["reason"] == Reason.UNPARSABLE_LABEL.value]
    assert sorted(bad["image_path"]) == [f"dicom/ACC1/SE{n}/IM00001.dcm" for n in (1, 2, 3)]
    assert set(bad["detail"]) == {"edema=Y is not one of 1, 0, -1 or blank"}
    assert result.input_rows == 6 == len(result.records) + len(result.quarantine)


def test_study_labels_reach_the_shards(export, tmp_path):
    root, uids = export
    labels(root, "accession_number", uids)
    config = study_site(root, "accession_number", image_size=32,
                        split={"valid": 0.0, "test": 0.0})
    summary = shard_site(config, scan_site(config), tmp_path / "shards", workers=1, progress=False)
    assert summary.kept == 3 and summary.quarantined == 3
