"""A chest X-ray model registered with its contract, phantom radiographs and their upload to the tests' Orthanc
(testbed/orthanc.py): what tests/test_hospital_pacs.py and tests/test_deploy_schedule.py share."""

from __future__ import annotations

import datetime as dt
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
from testbed.orthanc import PASSWORD, USER


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
    return dx_dicom(path, (rng.random((96, 80)) * 4000).astype(np.uint16), 12, study, patient, view, seed)


def dx_dicom(path: Path, pixels: np.ndarray, bits: int, study: str, patient: str, view: str,
             instance: int) -> Path:
    """A DX DICOM of ``pixels`` (MONOCHROME2, ``bits`` stored) in ``study``, as a hospital's PACS holds a film."""
    meta = pydicom.dataset.FileMetaDataset()
    meta.MediaStorageSOPClassUID = pydicom.uid.DigitalXRayImageStorageForPresentation
    meta.MediaStorageSOPInstanceUID = generate_uid()
    meta.TransferSyntaxUID = pydicom.uid.ExplicitVRLittleEndian
    ds = pydicom.Dataset()
    ds.file_meta = meta
    ds.SOPClassUID, ds.SOPInstanceUID = meta.MediaStorageSOPClassUID, meta.MediaStorageSOPInstanceUID
    ds.update(study_tags(study, patient))
    ds.SeriesInstanceUID, ds.SeriesNumber, ds.InstanceNumber = generate_uid(), 1, instance
    ds.Modality, ds.ViewPosition, ds.Manufacturer = "DX", view, "phantom"
    ds.set_pixel_data(pixels, "MONOCHROME2", bits)
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
