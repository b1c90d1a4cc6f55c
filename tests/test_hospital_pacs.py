"""The PACS round trip against a real Orthanc with its DICOMweb plugin (Debian's orthanc, orthanc-dicomweb;
dciodvfy from dicom3tools): studies in, one SR per study back through STOW-RS, read back and validated, a
second run scores nothing new, a run that stops mid-study leaves nothing half-written. One Orthanc for the
module, on 127.0.0.1, with its own storage and a password."""

from __future__ import annotations

import subprocess
from pathlib import Path

import mlflow
import pydicom
import pytest
import yaml
from pacs_helpers import PASSWORD, USER, orthanc_server, radiograph, register_chest_model, upload
from pydicom.data import get_testdata_file
from pydicom.uid import generate_uid
from typer.testing import CliRunner

from pipelines.cli import app
from pipelines.hospital import pacs, report
from pipelines.hospital.batch import choose_points, load_registered
from pipelines.hospital.predict import Item, score_items

pytestmark = pytest.mark.slow
runner = CliRunner()


@pytest.fixture(scope="module")
def orthanc(tmp_path_factory):
    with orthanc_server(tmp_path_factory.mktemp("orthanc")) as base:
        yield base


@pytest.fixture(scope="module")
def chest_model(tmp_path_factory):
    return register_chest_model(tmp_path_factory.mktemp("store"))


def test_pacs_round_trip(orthanc, chest_model, tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", chest_model)
    incoming = tmp_path / "incoming"
    incoming.mkdir()
    generated = generate_uid()
    files = [radiograph(incoming / "pa.dcm", generated, "P1", "PA", 1),
             radiograph(incoming / "lat.dcm", generated, "P1", "LL", 2),  # a view the model was not trained on
             radiograph(incoming / "ap.dcm", generated, "P1", "AP", 3)]
    # A real CR (pydicom-data) of a lower leg (BodyPartExamined EXTREMITY, AP): refused wrong_body_part, no SR.
    real_cr = Path(get_testdata_file("RG3_UNCR.dcm"))
    ct = Path(get_testdata_file("CT_small.dcm"))  # another study: a CT, which the model refuses
    for path in [*files, real_cr, ct]:
        upload(orthanc, path)
    real_study = str(pydicom.dcmread(real_cr, stop_before_pixels=True).StudyInstanceUID)

    scorer = load_registered("models:/fedauc-chest-xray/1", None, tmp_path / "model")
    chosen = choose_points(scorer, "youden", None)
    monkeypatch.setenv("TEST_PACS_PASSWORD", PASSWORD)
    settings, auth = pacs.settings_from(pacs.PacsSettings(url=f"{orthanc}/dicom-web", username=USER,
                                                          password_env="TEST_PACS_PASSWORD"))
    web = pacs.DicomWeb(settings.url, auth)
    state = tmp_path / "state.json"

    def stop_in(study: str):
        def hook(current: str) -> None:
            if current == study:
                raise KeyboardInterrupt("stopped mid-study")
        return hook

    # A run that stops while one study's SR is about to be stored leaves no SR in that study.
    with pytest.raises(KeyboardInterrupt):
        pacs.score_pacs(web, scorer, "youden", chosen.thresholds, chosen.source, state, before_store=stop_in(generated))
    description = report.series_description(scorer.name, scorer.version)
    assert not web.has_series(generated, description)

    # This run does the rest: the leg's study and the CT's hold no image the model takes.
    first = pacs.score_pacs(web, scorer, "youden", chosen.thresholds, chosen.source, state)
    assert (first.studies_found, first.studies_without_image) == (3, 2)
    assert (first.studies_reported, first.studies_skipped) == (1, 0)
    assert web.has_series(generated, description) and not web.has_series(real_study, description)
    (leg,) = [row for row in first.rows if row["study_uid"] == real_study]
    assert (leg["status"], leg["reason"]) == ("refused", "wrong_body_part")

    # Read back: the SR of the generated study references the two accepted radiographs, not the lateral.
    parts = [pydicom.dcmread(pydicom.filebase.DicomBytesIO(p)) for p in web.retrieve_study(generated)]
    (sr,) = [ds for ds in parts if ds.Modality == "SR"]
    content = report.read_report(sr)
    assert content["Algorithm Name"] == "fedauc-chest-xray" and content["Algorithm Version"] == "1"
    assert "Not a diagnosis" in content["Comment"]
    expected = {r["sop_uid"]: r for r in score_items(scorer, [Item(str(p), str(incoming)) for p in files], workers=0)
                if r["status"] == "scored"}
    lateral = pydicom.dcmread(files[1], stop_before_pixels=True).SOPInstanceUID
    (refused,) = [row for row in first.rows if row["sop_uid"] == lateral]
    assert refused["reason"] == "excluded_view" and "ViewPosition LL (view LATERAL)" in refused["detail"]
    assert set(content["images"]) == set(expected) and lateral not in content["images"]
    for uid, scores in content["images"].items():
        for disease in scorer.contract.diseases:
            assert scores[disease] == pytest.approx(expected[uid][f"p_{disease}"], abs=1e-6)
            assert scores[f"{disease} decision"] in ("positive", "negative")
    sr_file = tmp_path / "sr.dcm"
    sr.save_as(sr_file, enforce_file_format=True)
    checked = subprocess.run(["dciodvfy", str(sr_file)], capture_output=True, text=True)
    errors = [line for line in (checked.stdout + checked.stderr).splitlines() if line.startswith("Error")]
    assert errors == [], "\n".join(errors)

    # The scheduled job (`fedauc pacs`): PACS and user from the site YAML, the password from the environment;
    # it finds the same studies and scores none of them again; a run that scores nothing sends nothing to the
    # centre (a day's aggregates leave once, the next day: tests/test_hospital_contract.py).
    site = tmp_path / "hospital.yaml"
    site.write_text(yaml.safe_dump({"name": "hanoi", "format": "vindr-cxr", "root": str(tmp_path), "task": "chest-xray",
                                    "image_size": 32, "min_image_size": 16, "sharing": {"min_count": 1},
                                    "pacs": {"url": f"{orthanc}/dicom-web", "username": USER,
                                             "password_env": "TEST_PACS_PASSWORD"}}))
    result = runner.invoke(app, ["pacs", str(site), "--model", "models:/fedauc-chest-xray/1",
                                 "--shards", str(tmp_path / "shards")])
    assert result.exit_code == 0, result.output
    assert "0 reported" in result.output and PASSWORD not in result.output
    assert mlflow.search_runs(experiment_names=["chest-xray"], output_format="list",
                              filter_string="tags.fedauc_role = 'hospital-scoring'") == []
    assert len([ds for ds in (pydicom.dcmread(pydicom.filebase.DicomBytesIO(p)) for p in web.retrieve_study(generated))
                if ds.Modality == "SR"]) == 1
