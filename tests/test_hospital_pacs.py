"""The PACS round trip against a real Orthanc with its DICOMweb plugin (Debian's orthanc, orthanc-dicomweb;
dciodvfy from dicom3tools): studies in, one SR per study back through STOW-RS, read back and validated, a
second run scores nothing new, a run that stops mid-study leaves nothing half-written. One Orthanc for the
module, on 127.0.0.1, with its own storage and a password. Every transfer syntax, studies in transfer, a PACS
that errs or says no: tests/test_hospital_pacs_*.py."""

from __future__ import annotations

from pathlib import Path

import mlflow
import pydicom
import pytest
import yaml
from pacs_files import Adversary, dciodvfy_errors, reports_in, restudy
from pacs_helpers import radiograph, register_chest_model, upload
from pydicom.data import get_testdata_file
from pydicom.uid import generate_uid
from typer.testing import CliRunner

from pipelines.cli import app
from pipelines.hospital import dicom_sr, pacs
from pipelines.hospital.sinks import DicomSrSink
from pipelines.model_package.loading import choose_points, load_registered
from pipelines.model_package.predict import Item, score_items
from testbed.orthanc import PASSWORD, USER, orthanc_server

pytestmark = pytest.mark.slow
runner = CliRunner()


@pytest.fixture(scope="module")
def orthanc(tmp_path_factory):
    with orthanc_server(tmp_path_factory.mktemp("orthanc")) as base:
        yield base


@pytest.fixture
def proxy(orthanc):
    """The job's way to Orthanc, logging each request's path (what it retrieved)."""
    adversary = Adversary(orthanc)
    yield adversary
    adversary.close()


@pytest.fixture(scope="module")
def chest_model(tmp_path_factory):
    return register_chest_model(tmp_path_factory.mktemp("store"))


def test_pacs_round_trip(orthanc, proxy, chest_model, tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", chest_model)
    incoming = tmp_path / "incoming"
    incoming.mkdir()
    generated = generate_uid()
    files = [radiograph(incoming / "pa.dcm", generated, "P1", "PA", 1),
             radiograph(incoming / "lat.dcm", generated, "P1", "LL", 2),  # a view the model was not trained on
             radiograph(incoming / "ap.dcm", generated, "P1", "AP", 3)]
    # A real CR chest PA (pydicom-data's RG1, MONOCHROME1, 1955 x 1841), dated today.
    real_study = generate_uid()
    real_cr = restudy(Path(get_testdata_file("RG1_UNCR.dcm")), tmp_path / "rg1.dcm", real_study, "P2", 1)
    ct = restudy(Path(get_testdata_file("CT_small.dcm")), tmp_path / "ct.dcm", generate_uid(), "P3", 1)
    for path in [*files, real_cr, ct]:
        upload(orthanc, path)

    scorer = load_registered("models:/fedauc-chest-xray/1", None, tmp_path / "model")
    chosen = choose_points(scorer, "youden", None)
    monkeypatch.setenv("TEST_PACS_PASSWORD", PASSWORD)
    settings, auth = pacs.settings_from(pacs.PacsSettings(url=f"{proxy.url}/dicom-web", username=USER,
                                                          password_env="TEST_PACS_PASSWORD"))
    web = pacs.connect(settings, auth)
    state = tmp_path / "state.json"
    sr = DicomSrSink(web)

    class StopBefore:
        """An output before the SR that stops the run at one study (the operator's ^C)."""

        def __init__(self, study: str):
            self.study = study

        def written(self, result):
            return False

        def write(self, result):
            if result.study == self.study:
                raise KeyboardInterrupt("stopped mid-study")

    def run(**kwargs):
        return pacs.score_pacs(web, scorer, "youden", chosen.thresholds, chosen.source, state, stable_minutes=0,
                               **kwargs)

    # A run that stops while one study's SR is about to be stored leaves no SR in that study.
    with pytest.raises(KeyboardInterrupt):
        run(sinks=[StopBefore(generated), sr])
    assert sr.latest(generated, scorer.name, scorer.version) is None

    # A real CR of a lower leg (pydicom-data's RG3: BodyPartExamined EXTREMITY, ViewPosition AP) arrives: a
    # body part the chest model does not read. Its series says so: never retrieved, no SR in its study
    # (predict's own wrong_body_part refusal of the file: tests/test_hospital_contract.py).
    leg_study, leg_series, leg_file = generate_uid(), generate_uid(), tmp_path / "rg3.dcm"
    upload(orthanc, restudy(Path(get_testdata_file("RG3_UNCR.dcm")), leg_file, leg_study, "P4", 1, series=leg_series))
    assert pydicom.dcmread(leg_file, stop_before_pixels=True).BodyPartExamined == "EXTREMITY"

    # Whichever study came before the stop was stored whole; this run does the rest. The CT-only study is
    # not a study the model could take: the search leaves it out.
    done_before = int(sr.latest(real_study, scorer.name, scorer.version) is not None)
    first = run()
    assert (first.studies_found, first.studies_without_image, first.failed) == (3, 1, {})
    assert (first.studies_reported, first.studies_skipped) == (2 - done_before, done_before)
    assert sr.latest(generated, scorer.name, scorer.version) and sr.latest(real_study, scorer.name, scorer.version)
    assert sr.latest(leg_study, scorer.name, scorer.version) is None
    assert any(leg_study in line for line in proxy.log) and proxy.requested(leg_series) == []
    (refusal,) = [row for row in first.rows if row["status"] == "refused"]  # the DX lateral, retrieved, refused
    assert refusal["reason"] == "excluded_view"

    # Read back: the SR of the generated study references the two accepted radiographs, not the lateral.
    (report_read,) = reports_in(web, generated, tmp_path / "read-back")
    content = dicom_sr.read_report(report_read)
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
            # The calibrated probability predict states, where the contract has a map for the disease (none stated
            # without one: this store's model is registered without calibration).
            calibrated = expected[uid][f"calibrated_{disease}"]
            mapped = scorer.contract.calibration.diseases if scorer.contract.calibration else {}
            assert (f"{disease} calibrated" in scores) == (disease in mapped)
            if f"{disease} calibrated" in scores:
                assert scores[f"{disease} calibrated"] == pytest.approx(calibrated, abs=1e-6)
    assert dciodvfy_errors(report_read, tmp_path / "sr.dcm") == []
    # Given to predict, the SR is no image (docs/deploy.md), not a wrong modality.
    (sr_row,) = score_items(scorer, [Item(str(tmp_path / "sr.dcm"), str(tmp_path))], workers=0)
    assert sr_row["reason"] == "not_an_image"

    # The scheduled job (`fedauc pacs`): PACS and user from the site YAML, the password from the environment;
    # its state is elsewhere, yet it finds the studies' SRs and scores none of them again; a run that scores
    # nothing sends nothing to the centre (a day's aggregates leave once, the next day:
    # tests/test_hospital_contract.py).
    site = tmp_path / "hospital.yaml"
    site.write_text(yaml.safe_dump({"name": "hanoi", "format": "vindr-cxr", "root": str(tmp_path), "task": "chest-xray",
                                    "image_size": 32, "min_image_size": 16, "sharing": {"min_count": 1},
                                    "pacs": {"url": f"{orthanc}/dicom-web", "username": USER, "stable_minutes": 0,
                                             "password_env": "TEST_PACS_PASSWORD"}}))
    result = runner.invoke(app, ["pacs", str(site), "--model", "models:/fedauc-chest-xray/1",
                                 "--shards", str(tmp_path / "shards")])
    assert result.exit_code == 0, result.output
    assert "2 already scored, 0 reported," in result.output and PASSWORD not in result.output
    assert mlflow.search_runs(experiment_names=["chest-xray"], output_format="list",
                              filter_string="tags.fedauc_role = 'hospital-scoring'") == []
    assert len(reports_in(web, generated, tmp_path / "again")) == 1
