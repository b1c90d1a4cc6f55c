"""The PACS job against a real Orthanc holding a real chest radiograph (pydicom-data's RG1, a CR PA) in every
transfer syntax (pydicom-data's uncompressed, JPEG 2000 lossless and lossy; dcmtk's JPEG lossless, 12-bit
JPEG, JPEG-LS, RLE): each scored exactly as ``fedauc predict`` scores the same file, one SR valid under
dciodvfy; an archive study and a CT-only study in the same PACS never asked for; a second run stores
nothing. The job talks to Orthanc through the adversary proxy (tests/pacs_files.py), here only logging."""

from __future__ import annotations

import csv
import datetime as dt
from pathlib import Path

import pytest
import yaml
from pacs_files import Adversary, chest_in_every_syntax, dciodvfy_errors, reports_in, restudy
from pacs_helpers import register_chest_model, upload
from pydicom.data import get_testdata_file
from pydicom.uid import generate_uid
from typer.testing import CliRunner

from pipelines.cli import app
from pipelines.hospital import dicom_sr, pacs
from pipelines.model_package.loading import choose_points, load_registered
from testbed.orthanc import PASSWORD, USER, orthanc_server

pytestmark = pytest.mark.slow
MODEL = "models:/fedauc-chest-xray/1"


@pytest.fixture(scope="module")
def chest_model(tmp_path_factory):
    return register_chest_model(tmp_path_factory.mktemp("store"))


def test_every_transfer_syntax_is_scored_as_predict_scores_the_file(chest_model, tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", chest_model)
    study, archive, ct_only = generate_uid(), generate_uid(), generate_uid()
    files = chest_in_every_syntax(tmp_path / "incoming", study)
    old = restudy(Path(get_testdata_file("RG1_UNCR.dcm")), tmp_path / "archive.dcm", archive, "P2", 1,
                  date="20040826")
    ct = restudy(Path(get_testdata_file("CT_small.dcm")), tmp_path / "ct.dcm", ct_only, "P3", 1)
    with orthanc_server(tmp_path / "orthanc") as base:
        for path in [*files, old, ct]:
            upload(base, path)
        adversary = Adversary(base)
        try:
            web = pacs.Pacs(f"{adversary.url}/dicom-web", (USER, PASSWORD))
            scorer = load_registered(MODEL, None, tmp_path / "model")
            chosen = choose_points(scorer, "youden", None)
            state = tmp_path / "state.json"
            first = pacs.score_pacs(web, scorer, "youden", chosen.thresholds, chosen.source, state, stable_minutes=0)
            assert (first.studies_found, first.studies_reported, first.failed) == (1, 1, {})
            # Neither the archive (dated 2004, before the first run's lookback) nor the CT-only study was asked for.
            assert adversary.requested(archive) == [] and adversary.requested(ct_only) == []
            retrievals = [line for line in adversary.requested(study) if line.startswith("GET") and "/series/" in line
                          and "/instances" not in line and "?" not in line]
            assert len(retrievals) == len(files)  # one WADO-RS per accepted series

            direct = pacs.Pacs(f"{base}/dicom-web", (USER, PASSWORD))
            (sr,) = reports_in(direct, study, tmp_path / "read-back")
            assert dciodvfy_errors(sr, tmp_path / "sr.dcm") == []
            content = dicom_sr.read_report(sr)
            expected = _predict(tmp_path / "incoming", tmp_path / "predict.csv")
            scored = {uid: row for uid, row in expected.items() if row["status"] == "scored"}
            assert len(scored) == len(files) and set(content["images"]) == set(scored)
            for uid, scores in content["images"].items():
                for disease in scorer.contract.diseases:
                    assert scores[disease] == pytest.approx(float(scored[uid][f"p_{disease}"]), abs=1e-6)

            stores = sum(line.startswith("POST") for line in adversary.log)
            second = pacs.score_pacs(web, scorer, "youden", chosen.thresholds, chosen.source, state, stable_minutes=0,
                                     now=dt.datetime.now(dt.timezone.utc) + dt.timedelta(hours=1))
            assert (second.studies_found, second.studies_skipped, second.studies_reported) == (1, 1, 0)
            assert sum(line.startswith("POST") for line in adversary.log) == stores == 1
            assert len(reports_in(direct, study, tmp_path / "again")) == 1

            # Asked to, `fedauc pacs --since` reaches back to the archive (its own state: the 2004 study is new).
            site = tmp_path / "hospital.yaml"
            site.write_text(yaml.safe_dump({
                "name": "hanoi", "format": "vindr-cxr", "root": str(tmp_path), "task": "chest-xray", "image_size": 32,
                "min_image_size": 16, "pacs": {"url": f"{base}/dicom-web", "username": USER, "stable_minutes": 0,
                                               "password_env": "TEST_PACS_PASSWORD"}}))
            monkeypatch.setenv("TEST_PACS_PASSWORD", PASSWORD)
            back = CliRunner().invoke(app, ["pacs", str(site), "--model", MODEL, "--since", "2004-08-01",
                                            "--shards", str(tmp_path / "shards")])
            assert back.exit_code == 0 and "2 studies found, 0 waiting to be stable, 1 already scored, 1 reported," \
                in back.output, back.output
            assert len(reports_in(direct, archive, tmp_path / "archive")) == 1
        finally:
            adversary.close()


def _predict(folder: Path, out: Path) -> dict[str, dict]:
    """``fedauc predict`` on the files the PACS was given, by SOP Instance UID."""
    result = CliRunner().invoke(app, ["predict", str(folder), "--out", str(out), "--model", MODEL, "--workers", "0"])
    assert result.exit_code == 0, result.output
    with out.open() as table:
        rows = list(csv.DictReader(table))
    return {row["sop_uid"]: row for row in rows}
