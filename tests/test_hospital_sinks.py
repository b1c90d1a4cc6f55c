"""Result sinks against a real Orthanc: every registered sink keeps the contract (``pipelines/hospital/sinks.py``),
the site YAML's ``pacs.sinks`` chooses them (a wrong name or option is one line naming the field), and a PACS
that fails to store the SR after another sink delivered the result gets, on the retry, the SR and nothing
twice."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pydicom
import pytest
import yaml
from pacs_files import Adversary, reports_in, restudy
from pacs_helpers import radiograph, register_chest_model, upload
from pydicom.data import get_testdata_file
from pydicom.uid import generate_uid
from typer.testing import CliRunner

from common.errors import ConfigError
from pipelines.cli import app
from pipelines.hospital import job, pacs, sink_registry
from pipelines.hospital.result import StudyResult
from testbed.orthanc import PASSWORD, USER, orthanc_server

pytestmark = pytest.mark.slow
MODEL = "models:/fedauc-chest-xray/1"


def _options(name: str, here: Path) -> dict:
    """What a test gives each sink that needs options; a new sink with required options adds its own here."""
    return {"json-outbox": {"folder": str(here / "outbox")}}.get(name, {})


@pytest.fixture(scope="module")
def orthanc(tmp_path_factory):
    with orthanc_server(tmp_path_factory.mktemp("orthanc")) as base:
        yield base


@pytest.mark.parametrize("name", sorted(sink_registry.registered()))
def test_every_registered_sink_keeps_the_contract(name, orthanc, tmp_path):
    sink_class = sink_registry.resolve_sink(name)
    assert sink_class.name == name
    with pytest.raises(ValueError):  # a misspelt option is refused, not ignored
        sink_class.Options.model_validate({**_options(name, tmp_path), "no_such_option": 1})
    study = generate_uid()
    files = [radiograph(tmp_path / f"{view}.dcm", study, "P1", view, seed) for seed, view in enumerate(["PA", "AP"])]
    for path in files:
        upload(orthanc, path)
    images = [pydicom.dcmread(path, stop_before_pixels=True) for path in files]
    rows = [{"p_Edema": 0.25 * (i + 1), "Edema": bool(i)} for i in range(len(images))]

    def result(scored: list[pydicom.Dataset], supersedes: list[dict] = ()) -> StudyResult:
        return StudyResult(study, scored, rows[:len(scored)], ["Edema"], "fedauc-chest-xray", "7", "youden", "test",
                           supersedes=list(supersedes))

    sink = sink_class(pacs.Pacs(f"{orthanc}/dicom-web", (USER, PASSWORD)),
                      sink_class.Options.model_validate(_options(name, tmp_path)))
    first = result(images[:1])
    assert not sink.written(first)
    sink.write(first)
    # The same study, model version and images, built again as a retry builds it: the same result, delivered.
    again = result(images[:1])
    assert again.result_id == first.result_id and sink.written(again)
    # An image more, or the same images superseding a result, is another result, not yet delivered.
    grown = result(images, supersedes=[first.reference()])
    assert grown.result_id != first.result_id and not sink.written(grown)
    assert result(images[:1], supersedes=[grown.reference()]).result_id != first.result_id
    sink.write(grown)
    assert sink.written(grown) and sink.written(first)


def test_the_site_yaml_chooses_the_sinks_and_a_wrong_one_is_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv("TEST_PACS_PASSWORD", PASSWORD)
    web = pacs.Pacs("http://127.0.0.1:9/dicom-web")  # no request is made to build the sinks
    assert [s.name for s in sink_registry.build_sinks(["dicom-sr"], web)] == ["dicom-sr"]
    built = sink_registry.build_sinks([{"json-outbox": {"folder": str(tmp_path)}}, "dicom-sr"], web)
    assert [s.name for s in built] == ["json-outbox", "dicom-sr"]
    for sinks, message in (
            (["fhir", "dicom-sr"], "pacs.sinks[0]: no result sink is named 'fhir'"),
            ([{"json-outbox": {}}, "dicom-sr"], "pacs.sinks[0].json-outbox.folder: required field is missing"),
            ([{"json-outbox": {"folder": "x", "format": "csv"}}, "dicom-sr"],
             "pacs.sinks[0].json-outbox.format: unknown field"),
            (["dicom-sr", {"json-outbox": {"folder": "x"}}], "does not end with dicom-sr"),
            ([{"json-outbox": {"folder": "x"}, "dicom-sr": {}}], "pacs.sinks[0]: one sink per entry")):
        with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
            sink_registry.build_sinks(sinks, web)
    # Through the command: one line naming the YAML field, before any model is loaded or the PACS asked.
    site = _site_yaml(tmp_path, "http://127.0.0.1:9/dicom-web", ["dicom-sr", "fhir"])
    result = CliRunner().invoke(app, ["pacs", str(site), "--model", MODEL, "--shards", str(tmp_path / "shards")])
    assert result.exit_code == 1 and "Traceback" not in result.output
    (line,) = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert "pacs.sinks[1]: no result sink is named 'fhir'" in line
    validated = CliRunner().invoke(app, ["sites", "validate", str(site)])
    assert validated.exit_code == 1 and "pacs.sinks[1]: no result sink is named 'fhir'" in validated.output
    _site_yaml(tmp_path, "http://127.0.0.1:9/dicom-web", [{"json-outbox": {"folder": "out"}}, "dicom-sr"])
    assert CliRunner().invoke(app, ["sites", "validate", str(site)]).exit_code == 0


def test_a_retry_after_the_sr_failed_writes_nothing_twice(tmp_path, monkeypatch):
    """The SR store fails after the outbox delivered the result: the study is failed, without an SR; the retry
    stores the SR, and the outbox file is the one written the first time, naming the SR's UID. A PACS of its
    own: the job scores every study of the day."""
    monkeypatch.setenv("MLFLOW_TRACKING_URI", register_chest_model(tmp_path / "store"))
    monkeypatch.setenv("TEST_PACS_PASSWORD", PASSWORD)
    study = generate_uid()
    outbox = tmp_path / "outbox"
    now = dt.datetime.now().astimezone()
    with orthanc_server(tmp_path / "orthanc") as orthanc:
        upload(orthanc, restudy(Path(get_testdata_file("RG1_UNCR.dcm")), tmp_path / "rg1.dcm", study, "P1", 1))
        adversary = Adversary(orthanc)
        site = _site_yaml(tmp_path, f"{adversary.url}/dicom-web",
                          [{"json-outbox": {"folder": str(outbox)}}, "dicom-sr"])

        def run(at: dt.datetime) -> dict:
            return job.run(site, tmp_path / "shards", MODEL, echo=lambda _: None, local=lambda _: None, now=at,
                           report_to_centre=False)

        direct = pacs.Pacs(f"{orthanc}/dicom-web", (USER, PASSWORD))
        try:
            adversary.refuse_stores = True
            with pytest.raises(job.StudiesNotRetrieved, match="storing its report answered HTTP 500"):
                run(now)
            assert reports_in(direct, study, tmp_path / "none") == []
            (delivered,) = outbox.glob("*.json")
            before = delivered.stat()
            assert before.st_mode & 0o777 == 0o600
            adversary.refuse_stores = False
            assert run(now + dt.timedelta(minutes=16))["studies_reported"] == 1  # after the first backoff
            assert run(now + dt.timedelta(minutes=17))["studies_reported"] == 0
        finally:
            adversary.close()
        (sr,) = reports_in(direct, study, tmp_path / "read-back")
    assert list(outbox.glob("*.json")) == [delivered]
    after = delivered.stat()
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
    written = json.loads(delivered.read_text())
    assert written["result"] == sr.SOPInstanceUID == delivered.stem and written["study"] == study
    stows = [line for line in adversary.log if line.startswith("POST")]
    assert len(stows) == 2  # the refused one and the retry's; the third run found the study done


def _site_yaml(tmp_path: Path, url: str, sinks: list) -> Path:
    site = tmp_path / "hospital.yaml"
    site.write_text(yaml.safe_dump({"name": "hanoi", "task": "chest-xray", "sharing": {"min_count": 1},
                                    "pacs": {"url": url, "username": USER, "password_env": "TEST_PACS_PASSWORD",
                                             "stable_minutes": 0, "timeout_s": 5, "sinks": sinks}}))
    return site
