"""A real Orthanc PACS (Debian's orthanc with orthanc-dicomweb) on 127.0.0.1 for the tests, a chest X-ray model
registered with its contract, and phantom radiographs: what tests/test_hospital_pacs.py and
tests/test_deploy_schedule.py share."""

from __future__ import annotations

import datetime as dt
import json
import shutil
import socket
import subprocess
import time
from contextlib import contextmanager
from pathlib import Path

import mlflow
import numpy as np
import pydicom
import pytest
import requests
from pydicom.uid import generate_uid

from federated.network import build_named
from pipelines import registry
from pipelines.champion import synthetic_input_example
from pipelines.model_package import thresholds
from pipelines.model_package.contract import ModelContract, Provenance

PLUGIN = Path("/usr/share/orthanc/plugins/libOrthancDicomWeb.so")
USER, PASSWORD = "hospital", "s3cret-pacs"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def orthanc_server(here: Path):
    """Orthanc with DICOMweb and a password, its storage in ``here``; skips where it is not installed."""
    if shutil.which("Orthanc") is None or not PLUGIN.is_file() or shutil.which("dciodvfy") is None:
        pytest.skip("Orthanc, its DICOMweb plugin or dciodvfy is not installed "
                    "(apt-get install orthanc orthanc-dicomweb dicom3tools; `make setup` does it as root)")
    here.mkdir(parents=True, exist_ok=True)
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
    try:
        yield base
    finally:
        process.terminate()
        process.wait(timeout=30)


def register_chest_model(store: Path, synthetic_sites: tuple[str, ...] = ()) -> str:
    """A chest X-ray network registered with its contract in a store of its own (untrained: the round trip
    is under test, not the model's accuracy; its provenance names ``synthetic_sites``); the store's URI."""
    uri = f"sqlite:///{store / 'mlruns.db'}"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("MLFLOW_TRACKING_URI", uri)
        mlflow.set_tracking_uri(uri)
        diseases = ["Cardiomegaly", "Edema", "Consolidation", "Atelectasis", "Pleural Effusion"]
        counts = np.random.default_rng(0).integers(0, 20, (len(diseases), 2, 1000)).astype(float)
        model = build_named("small_resnet", {}, (1, 32, 32), len(diseases))
        mlflow.set_experiment("chest-xray")
        with mlflow.start_run() as run:
            contract = ModelContract(
                task="chest-xray", diseases=diseases, network="small_resnet", input_shape=(1, 32, 32), image_size=32,
                min_image_size=16, channels=1, allowed_modalities=["CR", "DX", "DR"], views=["AP", "PA"],
                code_version="test", operating_points=thresholds.from_histograms(counts, diseases, "made up"),
                provenance=Provenance(federation="pacs-test", sites=2, training_run=run.info.run_id,
                                      synthetic_sites=list(synthetic_sites)))
            registry.register_model(model, "chest-xray", synthetic_input_example((1, 32, 32)), 0.5, contract=contract)
    return uri


def radiograph(path: Path, study: str, patient: str, view: str, seed: int) -> Path:
    rng = np.random.default_rng(seed)
    pixels = (rng.random((96, 80)) * 4000).astype(np.uint16)
    meta = pydicom.dataset.FileMetaDataset()
    meta.MediaStorageSOPClassUID = pydicom.uid.DigitalXRayImageStorageForPresentation
    meta.MediaStorageSOPInstanceUID = generate_uid()
    meta.TransferSyntaxUID = pydicom.uid.ExplicitVRLittleEndian
    ds = pydicom.Dataset()
    ds.file_meta = meta
    ds.SOPClassUID, ds.SOPInstanceUID = meta.MediaStorageSOPClassUID, meta.MediaStorageSOPInstanceUID
    ds.update(study_tags(study, patient))
    ds.SeriesInstanceUID, ds.SeriesNumber, ds.InstanceNumber = generate_uid(), 1, seed
    ds.Modality, ds.ViewPosition, ds.Manufacturer = "DX", view, "phantom"
    ds.set_pixel_data(pixels, "MONOCHROME2", 12)
    ds.save_as(path, enforce_file_format=True)
    return path


def study_tags(study: str, patient: str) -> pydicom.Dataset:
    ds = pydicom.Dataset()
    ds.StudyInstanceUID, ds.PatientID, ds.PatientName = study, patient, f"Phantom^{patient}"
    ds.PatientBirthDate, ds.PatientSex, ds.AccessionNumber, ds.StudyID = "19700101", "O", "A1", "1"
    ds.StudyDate, ds.StudyTime, ds.ReferringPhysicianName = dt.date.today().strftime("%Y%m%d"), "120000", ""
    return ds


def upload(base: str, path: Path) -> None:
    response = requests.post(f"{base}/instances", data=path.read_bytes(), auth=(USER, PASSWORD), timeout=30)
    response.raise_for_status()
