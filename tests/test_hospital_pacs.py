"""The PACS round trip against a real Orthanc with its DICOMweb plugin (Debian's orthanc, orthanc-dicomweb;
dciodvfy from dicom3tools): studies in, one SR per study back through STOW-RS, read back and validated, a
second run scores nothing new, a run that stops mid-study leaves nothing half-written. One Orthanc for the
module, on 127.0.0.1, with its own storage and a password."""

from __future__ import annotations

import datetime as dt
import json
import shutil
import socket
import subprocess
import time
from pathlib import Path

import mlflow
import numpy as np
import pydicom
import pytest
import requests
import yaml
from pydicom.data import get_testdata_file
from pydicom.uid import generate_uid
from typer.testing import CliRunner

from federated.network import build_named
from pipelines import registry
from pipelines.champion import synthetic_input_example
from pipelines.cli import app
from pipelines.hospital import pacs, report, thresholds
from pipelines.hospital.batch import choose_points, load_registered
from pipelines.hospital.contract import ModelContract
from pipelines.hospital.predict import Item, score_items

pytestmark = pytest.mark.slow
runner = CliRunner()
PLUGIN = Path("/usr/share/orthanc/plugins/libOrthancDicomWeb.so")
USER, PASSWORD = "hospital", "s3cret-pacs"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def orthanc(tmp_path_factory):
    if shutil.which("Orthanc") is None or not PLUGIN.is_file() or shutil.which("dciodvfy") is None:
        pytest.skip("Orthanc, its DICOMweb plugin or dciodvfy is not installed "
                    "(apt-get install orthanc orthanc-dicomweb dicom3tools; `make setup` does it as root)")
    here = tmp_path_factory.mktemp("orthanc")
    port = _free_port()
    config = {"Name": "fedauc-test", "StorageDirectory": str(here / "db"), "IndexDirectory": str(here / "db"),
              "HttpPort": port, "DicomServerEnabled": False, "RemoteAccessAllowed": False,
              "AuthenticationEnabled": True, "RegisteredUsers": {USER: PASSWORD}, "Plugins": [str(PLUGIN)],
              "DicomWeb": {"Enable": True, "Root": "/dicom-web/"}}
    (here / "orthanc.json").write_text(json.dumps(config))
    log = (here / "orthanc.log").open("w")
    process = subprocess.Popen(["Orthanc", str(here / "orthanc.json")], stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            if requests.get(f"{base}/system", auth=(USER, PASSWORD), timeout=2).ok:
                break
        except requests.ConnectionError:
            pass
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            pytest.fail(f"Orthanc did not start: {(here / 'orthanc.log').read_text()[-2000:]}")
        time.sleep(0.2)
    yield base
    process.terminate()
    process.wait(timeout=30)


@pytest.fixture(scope="module")
def chest_model(tmp_path_factory):
    """A chest X-ray network registered with its contract in a store of its own (untrained: the round trip
    is under test, not the model's accuracy)."""
    store = tmp_path_factory.mktemp("store")
    uri = f"sqlite:///{store / 'mlruns.db'}"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("MLFLOW_TRACKING_URI", uri)
        mlflow.set_tracking_uri(uri)
        diseases = ["Cardiomegaly", "Edema", "Consolidation", "Atelectasis", "Pleural Effusion"]
        counts = np.random.default_rng(0).integers(0, 20, (len(diseases), 2, 1000)).astype(float)
        contract = ModelContract(task="chest-xray", diseases=diseases, network="small_resnet", input_shape=(1, 32, 32),
                                 image_size=32, min_image_size=16, channels=1, allowed_modalities=["CR", "DX", "DR"],
                                 views=["AP", "PA"], code_version="test",
                                 operating_points=thresholds.from_histograms(counts, diseases, "made up"))
        model = build_named("small_resnet", {}, (1, 32, 32), len(diseases))
        mlflow.set_experiment("chest-xray")
        with mlflow.start_run():
            registry.register_model(model, "chest-xray", synthetic_input_example((1, 32, 32)), 0.5, contract=contract)
    return uri


def _radiograph(path: Path, study: str, patient: str, view: str, seed: int) -> Path:
    rng = np.random.default_rng(seed)
    pixels = (rng.random((96, 80)) * 4000).astype(np.uint16)
    meta = pydicom.dataset.FileMetaDataset()
    meta.MediaStorageSOPClassUID = pydicom.uid.DigitalXRayImageStorageForPresentation
    meta.MediaStorageSOPInstanceUID = generate_uid()
    meta.TransferSyntaxUID = pydicom.uid.ExplicitVRLittleEndian
    ds = pydicom.Dataset()
    ds.file_meta = meta
    ds.SOPClassUID, ds.SOPInstanceUID = meta.MediaStorageSOPClassUID, meta.MediaStorageSOPInstanceUID
    ds.update(_study_tags(study, patient))
    ds.SeriesInstanceUID, ds.SeriesNumber, ds.InstanceNumber = generate_uid(), 1, seed
    ds.Modality, ds.ViewPosition, ds.Manufacturer = "DX", view, "phantom"
    ds.set_pixel_data(pixels, "MONOCHROME2", 12)
    ds.save_as(path, enforce_file_format=True)
    return path


def _study_tags(study: str, patient: str) -> pydicom.Dataset:
    ds = pydicom.Dataset()
    ds.StudyInstanceUID, ds.PatientID, ds.PatientName = study, patient, f"Phantom^{patient}"
    ds.PatientBirthDate, ds.PatientSex, ds.AccessionNumber, ds.StudyID = "19700101", "O", "A1", "1"
    ds.StudyDate, ds.StudyTime, ds.ReferringPhysicianName = dt.date.today().strftime("%Y%m%d"), "120000", ""
    return ds


def _upload(base: str, path: Path) -> None:
    response = requests.post(f"{base}/instances", data=path.read_bytes(), auth=(USER, PASSWORD), timeout=30)
    response.raise_for_status()


def test_pacs_round_trip(orthanc, chest_model, tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", chest_model)
    incoming = tmp_path / "incoming"
    incoming.mkdir()
    generated = generate_uid()
    files = [_radiograph(incoming / "pa.dcm", generated, "P1", "PA", 1),
             _radiograph(incoming / "lat.dcm", generated, "P1", "LL", 2),  # a view the model was not trained on
             _radiograph(incoming / "ap.dcm", generated, "P1", "AP", 3)]
    real_cr = Path(get_testdata_file("RG3_UNCR.dcm"))  # a real CR (pydicom-data), MONOCHROME1, 1760 x 1760
    ct = Path(get_testdata_file("CT_small.dcm"))  # another study: a CT, which the model refuses
    for path in [*files, real_cr, ct]:
        _upload(orthanc, path)
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

    # Whichever study came before the stop was stored whole; this run does the rest.
    done_before = int(web.has_series(real_study, description))
    first = pacs.score_pacs(web, scorer, "youden", chosen.thresholds, chosen.source, state)
    assert (first.studies_found, first.studies_without_image) == (3, 1)
    assert (first.studies_reported, first.studies_skipped) == (2 - done_before, done_before)
    assert web.has_series(generated, description) and web.has_series(real_study, description)

    # Read back: the SR of the generated study references the two accepted radiographs, not the lateral.
    parts = [pydicom.dcmread(pydicom.filebase.DicomBytesIO(p)) for p in web.retrieve_study(generated)]
    (sr,) = [ds for ds in parts if ds.Modality == "SR"]
    content = report.read_report(sr)
    assert content["Algorithm Name"] == "fedauc-chest-xray" and content["Algorithm Version"] == "1"
    assert "Not a diagnosis" in content["Comment"]
    expected = {r["sop_uid"]: r for r in score_items(scorer, [Item(str(p), str(incoming)) for p in files], workers=0)
                if r["status"] == "scored"}
    lateral = pydicom.dcmread(files[1], stop_before_pixels=True).SOPInstanceUID
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
    # it finds the same studies and scores none of them again, and only aggregates go to the centre.
    site = tmp_path / "hospital.yaml"
    site.write_text(yaml.safe_dump({"name": "hanoi", "format": "vindr-cxr", "root": str(tmp_path), "task": "chest-xray",
                                    "image_size": 32, "min_image_size": 16, "sharing": {"min_count": 1},
                                    "pacs": {"url": f"{orthanc}/dicom-web", "username": USER,
                                             "password_env": "TEST_PACS_PASSWORD"}}))
    result = runner.invoke(app, ["pacs", str(site), "--model", "models:/fedauc-chest-xray/1",
                                 "--shards", str(tmp_path / "shards")])
    assert result.exit_code == 0, result.output
    assert "0 reported" in result.output and PASSWORD not in result.output
    (run,) = mlflow.search_runs(experiment_names=["chest-xray"], output_format="list",
                                filter_string="tags.fedauc_role = 'hospital-scoring'")
    sent = json.dumps(mlflow.artifacts.load_dict(f"runs:/{run.info.run_id}/scoring_aggregates.json"))
    assert generated not in sent and "incoming" not in sent and PASSWORD not in sent and USER not in sent
    assert len([ds for ds in (pydicom.dcmread(pydicom.filebase.DicomBytesIO(p)) for p in web.retrieve_study(generated))
                if ds.Modality == "SR"]) == 1
