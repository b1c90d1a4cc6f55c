"""A PACS that says no, through the real ``fedauc pacs`` command: a wrong password and a PACS that is not there
each end in one line and exit 1; a study the PACS fails to send makes the command exit 1 after scoring the
others, naming that study on the hospital's console only. TLS, a timeout, a name that does not resolve and
a server error each give one line from the DICOMweb client too."""

from __future__ import annotations

import datetime as dt
import json
import socket
from pathlib import Path

import mlflow
import pytest
import yaml
from pacs_files import Adversary, restudy
from pacs_helpers import register_chest_model, upload
from pydicom.data import get_testdata_file
from pydicom.uid import generate_uid
from typer.testing import CliRunner

from pipelines.cli import app
from pipelines.hospital import dicomweb, job, pacs
from testbed.orthanc import PASSWORD, USER, orthanc_server

pytestmark = pytest.mark.slow
RG1 = Path(get_testdata_file("RG1_UNCR.dcm"))


@pytest.fixture(scope="module")
def chest_model(tmp_path_factory):
    return register_chest_model(tmp_path_factory.mktemp("store"))


@pytest.fixture(scope="module")
def orthanc(tmp_path_factory):
    with orthanc_server(tmp_path_factory.mktemp("orthanc")) as base:
        yield base


def _fedauc_pacs(tmp_path: Path, url: str, monkeypatch, password: str = PASSWORD):
    site = _site_yaml(tmp_path, url, monkeypatch, password)
    return CliRunner().invoke(app, ["pacs", str(site), "--model", "models:/fedauc-chest-xray/1",
                                    "--shards", str(tmp_path / "shards")])


def _site_yaml(tmp_path: Path, url: str, monkeypatch, password: str) -> Path:
    monkeypatch.setenv("TEST_PACS_PASSWORD", password)
    site = tmp_path / "hospital.yaml"
    site.write_text(yaml.safe_dump({"name": "hanoi", "format": "vindr-cxr", "root": str(tmp_path), "task": "chest-xray",
                                    "image_size": 32, "min_image_size": 16, "sharing": {"min_count": 1},
                                    "pacs": {"url": url, "username": USER, "password_env": "TEST_PACS_PASSWORD",
                                             "stable_minutes": 0, "timeout_s": 5}}))
    return site


def _one_error_line(result) -> str:
    assert result.exit_code == 1 and "Traceback" not in result.output, result.output
    (line,) = [line for line in result.output.splitlines() if line.startswith("error:")]
    return line


def test_a_wrong_password_and_a_pacs_that_is_not_there_end_in_one_line(orthanc, chest_model, tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", chest_model)
    line = _one_error_line(_fedauc_pacs(tmp_path, f"{orthanc}/dicom-web", monkeypatch, password="wrong"))
    assert f"the PACS at {orthanc}/dicom-web refused user 'hospital' (HTTP 401)" in line
    assert "pacs.username" in line and "$TEST_PACS_PASSWORD" in line and "wrong" not in line.split("refused")[0]
    with socket.socket() as closed:  # a port nothing listens on
        closed.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{closed.getsockname()[1]}/dicom-web"
    line = _one_error_line(_fedauc_pacs(tmp_path, dead, monkeypatch))
    assert f"the PACS at {dead} cannot be reached" in line and "refused" in line.lower()


def test_the_prefect_flow_run_of_a_pacs_that_says_no_names_neither_its_address_nor_its_user(orthanc, chest_model,
                                                                                             tmp_path, monkeypatch):
    """The flow run's failure goes to the Prefect server, which may be the consortium's: the address and user stay
    in the worker's own log."""
    from pipelines.hospital_flow import score_pacs

    monkeypatch.setenv("MLFLOW_TRACKING_URI", chest_model)
    site = _site_yaml(tmp_path, f"{orthanc}/dicom-web", monkeypatch, "wrong")
    state = score_pacs(str(site), str(tmp_path / "shards"), "models:/fedauc-chest-xray/1", return_state=True)
    assert state.is_failed()
    assert "the PACS at <pacs.url> refused the user in pacs.username (HTTP 401)" in state.message
    assert orthanc not in state.message and "127.0.0.1" not in state.message and repr(USER) not in state.message


def test_tls_a_timeout_a_missing_name_and_a_server_error_are_one_line_each(orthanc, tmp_path):
    since = pacs.dt.date.today()
    port = int(orthanc.rsplit(":", 1)[1])
    with pytest.raises(dicomweb.PacsUnavailable, match=r"^TLS with the PACS at https://127\.0\.0\.1:\d+/dicom-web fail"):
        dicomweb.Pacs(f"https://127.0.0.1:{port}/dicom-web", (USER, PASSWORD), 5).studies(since, ["CR"])
    with socket.socket() as silent:  # accepts, never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        url = f"http://127.0.0.1:{silent.getsockname()[1]}/dicom-web"
        with pytest.raises(dicomweb.PacsUnavailable, match=r"did not answer a study search within 0\.5 s \(3 tries\)"):
            dicomweb.Pacs(url, None, 0.5).studies(since, ["CR"])
    with pytest.raises(dicomweb.PacsUnavailable, match=r"^the PACS host of http://pacs\.invalid/dicom-web does not resolve"):
        dicomweb.Pacs("http://pacs.invalid/dicom-web", None, 5).studies(since, ["CR"])
    adversary = Adversary(orthanc)
    adversary.fail.add("/studies")
    try:
        with pytest.raises(dicomweb.PacsUnavailable, match=r"answered HTTP 500 to a study search"):
            dicomweb.Pacs(f"{adversary.url}/dicom-web", (USER, PASSWORD), 5).studies(since, ["CR"])
    finally:
        adversary.close()


def test_a_study_the_pacs_fails_to_send_is_named_here_only_and_the_command_exits_1(orthanc, chest_model, tmp_path,
                                                                                  monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", chest_model)
    good, broken = generate_uid(), generate_uid()
    upload(orthanc, restudy(RG1, tmp_path / "good.dcm", good, "P1", 1))
    upload(orthanc, restudy(RG1, tmp_path / "broken.dcm", broken, "P2", 1))
    adversary = Adversary(orthanc)
    adversary.fail.add(f"/studies/{broken}/series/")  # its series search answers, its retrieval does not
    try:
        result = _fedauc_pacs(tmp_path, f"{adversary.url}/dicom-web", monkeypatch)
        line = _one_error_line(result)
        assert "1 study not retrieved whole (1: a series retrieval answered HTTP 500)" in line and broken not in line
        assert f"study {broken} not retrieved whole: a series retrieval answered HTTP 500" in result.output
        assert "1 reported," in result.output  # the other study was scored in the same run
        assert scoring_runs() == []  # the day's counts stay here until a run of a later day
        # The next day the study still fails; that run fails too, yet the closed day leaves, once.
        with pytest.raises(job.StudiesNotRetrieved):
            job.run(tmp_path / "hospital.yaml", tmp_path / "shards", "models:/fedauc-chest-xray/1", echo=lambda _: None,
                    local=lambda _: None, now=dt.datetime.now().astimezone() + dt.timedelta(days=1))
    finally:
        adversary.close()
    (run,) = scoring_runs()
    assert run.data.metrics["scored"] == 1
    sent = json.dumps(mlflow.artifacts.load_dict(f"runs:/{run.info.run_id}/scoring_aggregates.json"))
    assert broken not in sent and good not in sent and str(tmp_path) not in sent


def scoring_runs() -> list:
    return mlflow.search_runs(experiment_names=["chest-xray"], output_format="list",
                              filter_string="tags.fedauc_role = 'hospital-scoring'")
