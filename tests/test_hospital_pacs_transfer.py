"""Studies as a real PACS holds them while the job runs every few minutes: sent in several parts (a lateral
first, the PA later, an AP after the SR), and studies the PACS cannot send whole (a body cut short, a
series missing an instance, a 500 mid-study) through the adversary proxy (tests/pacs_files.py) in front
of a real Orthanc. The clock is the job's ``now``: a run at t0 + 6 minutes is one."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pydicom
import pytest
from pacs_files import Adversary, dciodvfy_errors, reports_in, restudy
from pacs_helpers import radiograph, register_chest_model, upload
from pydicom.data import get_testdata_file
from pydicom.uid import generate_uid

from pipelines.hospital import dicom_sr, pacs, pacs_state
from pipelines.model_package.loading import choose_points, load_registered
from testbed.orthanc import PASSWORD, USER, orthanc_server

pytestmark = pytest.mark.slow
RG1 = Path(get_testdata_file("RG1_UNCR.dcm"))  # a real chest PA (CR)
T0 = dt.datetime(2026, 3, 2, 8, 0, tzinfo=dt.timezone.utc)


@pytest.fixture(scope="module")
def chest_model(tmp_path_factory):
    return register_chest_model(tmp_path_factory.mktemp("store"))


@pytest.fixture
def job(chest_model, tmp_path, monkeypatch):
    """Orthanc behind the adversary, the registered model and a ``run(minutes)`` of the job at T0 + minutes."""
    monkeypatch.setenv("MLFLOW_TRACKING_URI", chest_model)
    scorer = load_registered("models:/fedauc-chest-xray/1", None, tmp_path / "model")
    chosen = choose_points(scorer, "youden", None)
    with orthanc_server(tmp_path / "orthanc") as base:
        adversary = Adversary(base)
        web = WatchedFolders(f"{adversary.url}/dicom-web", (USER, PASSWORD))

        def run(minutes: float, since: dt.date = dt.date.today()) -> pacs.RunSummary:
            # Studies are dated today; the job's clock is moved within today's window.
            summary = pacs.score_pacs(web, scorer, "youden", chosen.thresholds, chosen.source,
                                      tmp_path / "state.json", stable_minutes=5,
                                      now=T0 + dt.timedelta(minutes=minutes), since=since)
            assert set(web.modes) <= {0o700} and (tmp_path / "state.json").stat().st_mode & 0o777 == 0o600
            return summary

        yield run, base, adversary, pacs.Pacs(f"{base}/dicom-web", (USER, PASSWORD))
        adversary.close()


class WatchedFolders(pacs.Pacs):
    """The PACS client, noting the mode of each folder it retrieves a series into."""

    def __init__(self, *args):
        super().__init__(*args)
        self.modes: list[int] = []

    def retrieve_series(self, study, series, folder):
        self.modes.append(folder.stat().st_mode & 0o777)
        return super().retrieve_series(study, series, folder)


def test_a_study_sent_in_parts_is_scored_once_stable_and_again_when_it_gains_an_image(job, tmp_path):
    run, base, _, direct = job
    study = generate_uid()
    upload(base, restudy(RG1, tmp_path / "lateral.dcm", study, "P1", 1, view="LL"))
    assert run(0).studies_waiting == 1  # just arrived
    assert run(6).studies_without_image == 1  # stable: a CR lateral only, not even retrieved
    upload(base, restudy(RG1, tmp_path / "pa.dcm", study, "P1", 2, view="PA"))
    assert run(7).studies_waiting == 1  # the PA arrived: the study changed, its clock starts again
    first = run(13)
    assert first.studies_reported == 1 and first.failed == {}
    (sr,) = reports_in(direct, study, tmp_path / "first")
    pa = pydicom.dcmread(tmp_path / "pa.dcm", stop_before_pixels=True).SOPInstanceUID
    assert set(dicom_sr.read_report(sr)["images"]) == {pa}

    # A DX lateral after the SR: retrieved (DX names views per image), refused, so no new SR.
    upload(base, radiograph(tmp_path / "lateral-dx.dcm", study, "P1", "LL", 3))
    assert run(14).studies_waiting == 1
    late = run(20)
    assert (late.studies_skipped, late.studies_reported, late.studies_superseded) == (1, 0, 0)
    assert [row["reason"] for row in late.rows] == ["excluded_view"]  # drift counts the new image only
    assert len(reports_in(direct, study, tmp_path / "still-one")) == 1

    # An AP after the SR: a new SR covering both, naming the first in its Predecessor Documents Sequence.
    upload(base, restudy(RG1, tmp_path / "ap.dcm", study, "P1", 4, view="AP"))
    assert run(21).studies_waiting == 1
    again = run(27)
    assert again.studies_superseded == 1 and [row["status"] for row in again.rows] == ["scored"]
    reports = {ds.SOPInstanceUID: ds for ds in reports_in(direct, study, tmp_path / "second")}
    assert len(reports) == 2
    (newer,) = [ds for ds in reports.values() if "PredecessorDocumentsSequence" in ds]
    (older,) = [uid for uid in reports if uid != newer.SOPInstanceUID]
    predecessor = newer.PredecessorDocumentsSequence[0].ReferencedSeriesSequence[0].ReferencedSOPSequence[0]
    assert predecessor.ReferencedSOPInstanceUID == older and newer.InstanceNumber == 2
    ap = pydicom.dcmread(tmp_path / "ap.dcm", stop_before_pixels=True).SOPInstanceUID
    assert set(dicom_sr.read_report(newer)["images"]) == {pa, ap}
    assert dciodvfy_errors(newer, tmp_path / "newer.dcm") == []
    assert run(40).studies_skipped == 1 and len(reports_in(direct, study, tmp_path / "third")) == 2
    # A study dated before the window leaves the state: it holds the window's studies, not the PACS's history.
    run(41, since=dt.date.today() + dt.timedelta(days=1))
    assert pacs_state.read(tmp_path / "state.json")["fedauc-chest-xray/1"]["studies"] == {}


def test_a_study_the_pacs_cannot_send_whole_fails_alone_and_is_retried_with_backoff(job, tmp_path):
    run, base, adversary, direct = job
    broken, good = generate_uid(), generate_uid()
    upload(base, restudy(RG1, tmp_path / "good.dcm", good, "P1", 1))
    upload(base, restudy(RG1, tmp_path / "broken-pa.dcm", broken, "P2", 1))
    ap_series = generate_uid()
    for i in range(2):  # one series of two APs
        upload(base, restudy(radiograph(tmp_path / f"ap{i}.dcm", broken, "P2", "AP", 10 + i), tmp_path / f"b{i}.dcm",
                             broken, "P2", 2 + i, series=ap_series))
    state = tmp_path / "state.json"

    def tried() -> int:
        return len([line for line in adversary.requested(ap_series) if line.startswith("GET")])

    adversary.cut.add(ap_series)  # the APs' body stops halfway, without its closing boundary
    assert run(0).studies_waiting == 2
    first = run(6)
    assert first.studies_reported == 1 and set(first.failed) == {broken}
    assert "closing boundary" in first.failed[broken] or "unreadable instance" in first.failed[broken]
    assert broken not in first.failed[broken]  # the reason names no study
    assert reports_in(direct, broken, tmp_path / "none") == []  # nothing half-stored
    entry = pacs_state.read(state)["fedauc-chest-xray/1"]["studies"][broken]
    assert entry["failures"] == 1 and "done" not in entry

    adversary.cut.clear()
    adversary.short.add(ap_series)  # a well-formed body with one of the series' two instances
    before = tried()
    waiting = run(7)  # within the backoff: not asked again, still named
    assert tried() == before and set(waiting.failed) == {broken} and waiting.studies_skipped == 1
    second = run(22)
    assert tried() == before + 1 and second.failed == {broken: "a series arrived with 1 of its 2 instances"}

    adversary.short.clear()
    adversary.fail.add(ap_series)  # the PACS errs mid-study
    assert run(52).failed == {broken: "a series retrieval answered HTTP 500"}  # 30 minutes after the second try
    assert pacs_state.read(state)["fedauc-chest-xray/1"]["studies"][broken]["failures"] == 3

    adversary.fail.clear()
    assert run(52 + 59).failed == {broken: "a series retrieval answered HTTP 500"}  # the third waits an hour
    healed = run(52 + 61)
    assert healed.failed == {} and healed.studies_reported == 1 and healed.studies_skipped == 1
    (sr,) = reports_in(direct, broken, tmp_path / "healed")
    assert len(dicom_sr.read_report(sr)["images"]) == 3
