"""What a registered model says about itself at a hospital: the body parts it reads (a real leg radiograph is
refused ``wrong_body_part`` by `fedauc predict`, the pyfunc and the PACS job's scoring path alike, a real chest
radiograph scored), what it was trained on (its provenance in the contract and the SR; `fedauc pacs` writes a
synthetic model's decisions into a PACS only when told), a hospital that only scores (a site YAML without a
dataset), and drift that leaves once per site and day."""

from __future__ import annotations

import base64
import datetime as dt
import json
import shutil
import stat
import subprocess
from pathlib import Path

import mlflow
import numpy as np
import pandas as pd
import pydicom
import pytest
import yaml
from pacs_files import reports_in
from pacs_helpers import radiograph, register_chest_model, upload
from pydicom.data import get_testdata_file
from pydicom.sr.codedict import codes
from pydicom.uid import generate_uid
from typer.testing import CliRunner

from common.errors import ConfigError
from pipelines.cli import app
from pipelines.hospital import dicom_sr, drift, job, pacs
from pipelines.hospital.result import StudyResult
from pipelines.hospital.sinks import DicomSrSink
from pipelines.model_package.contract import METADATA_KEY, ModelContract, contract_for
from pipelines.model_package.loading import load_registered
from pipelines.model_package.predict import Item, score_items
from preprocessing.federation import load_federation
from preprocessing.scan import scan_site
from preprocessing.sites import SharingPolicy, SiteConfigError, load_site, validate_site
from testbed.orthanc import PASSWORD, USER, orthanc_server

runner = CliRunner()
MODEL = "models:/fedauc-chest-xray/1"
REPO = Path(__file__).resolve().parents[1]
LEG = Path(get_testdata_file("RG3_UNCR.dcm"))  # a real CR of a lower leg: BodyPartExamined EXTREMITY, AP
CHEST = Path(get_testdata_file("RG1_UNCR.dcm"))  # a real chest CR: BodyPartExamined CHEST, PA


@pytest.fixture(scope="module")
def chest_store(tmp_path_factory):
    return register_chest_model(tmp_path_factory.mktemp("store"))


def _chest_variant(path: Path, part: str, regions: list = ()) -> Path:
    ds = pydicom.dcmread(CHEST)
    ds.BodyPartExamined = part
    if regions:
        ds.AnatomicRegionSequence = [_code_item(code) for code in regions]
    ds.save_as(path)
    return path


def _code_item(code) -> pydicom.Dataset:
    item = pydicom.Dataset()
    item.CodeValue, item.CodingSchemeDesignator, item.CodeMeaning = code.value, code.scheme_designator, code.meaning
    return item


@pytest.mark.slow
def test_a_leg_is_refused_wrong_body_part_by_predict_the_pyfunc_and_the_pacs_path(chest_store, tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", chest_store)
    mlflow.set_tracking_uri(chest_store)
    folder = tmp_path / "incoming"
    folder.mkdir()
    shutil.copy(LEG, folder / "leg.dcm")
    shutil.copy(CHEST, folder / "chest.dcm")
    _chest_variant(folder / "untagged.dcm", "")  # names no body part: scored, as one naming no view is
    _chest_variant(folder / "coded-chest.dcm", "CHEST", [codes.SCT.Chest])
    _chest_variant(folder / "coded-leg.dcm", "", [codes.SCT.LowerLeg])  # only the Anatomic Region names it
    expected = {"chest.dcm": "", "coded-chest.dcm": "", "coded-leg.dcm": "wrong_body_part", "leg.dcm": "wrong_body_part",
                "untagged.dcm": ""}

    result = runner.invoke(app, ["predict", str(folder), "--model", MODEL, "--out", str(tmp_path / "p.csv")])
    assert result.exit_code == 0, result.output
    table = pd.read_csv(tmp_path / "p.csv")  # a refused row's probabilities are NaN, its reason blank
    table["reason"] = table["reason"].fillna("")
    table["file"] = table["source"].map(lambda s: Path(s).name)
    assert dict(zip(table["file"], table["reason"])) == expected
    leg = table.set_index("file").loc["leg.dcm"]
    assert leg["status"] == "refused" and "BodyPartExamined EXTREMITY" in leg["detail"]
    assert "Anatomic Region SCT:30021000" in table.set_index("file").loc["coded-leg.dcm", "detail"]

    files = sorted(folder.iterdir())
    model = mlflow.pyfunc.load_model(MODEL)
    by_path = model.predict(pd.DataFrame({"path": [str(f) for f in files]}))
    by_bytes = model.predict(pd.DataFrame({"bytes": [base64.b64encode(f.read_bytes()).decode() for f in files]}))
    scorer = load_registered(MODEL, None, tmp_path / "model")
    job_rows = pd.DataFrame(score_items(scorer, [Item(str(f), str(folder)) for f in files], workers=1))
    for rows in (by_path, by_bytes, job_rows):
        assert list(rows["reason"]) == [expected[f.name] for f in files]
    scored = table.set_index("file").loc[[f.name for f in files], "p_Cardiomegaly"].to_numpy(dtype=float)
    for rows in (by_path, by_bytes, job_rows):
        np.testing.assert_allclose(rows["p_Cardiomegaly"].to_numpy(dtype=float), scored, atol=1e-6)
    assert np.isfinite(scored[[expected[f.name] == "" for f in files]]).all()



def test_a_model_registered_under_the_old_loader_name_still_serves(chest_store, tmp_path, monkeypatch):
    """Models registered before the package split name ``pipelines.hospital.flavor`` as their pyfunc loader."""
    monkeypatch.setenv("MLFLOW_TRACKING_URI", chest_store)
    mlflow.set_tracking_uri(chest_store)
    folder = Path(mlflow.artifacts.download_artifacts(MODEL, dst_path=str(tmp_path / "old")))
    mlmodel = folder / "MLmodel"
    spec = yaml.safe_load(mlmodel.read_text())
    assert spec["flavors"]["python_function"]["loader_module"] == "pipelines.model_package.flavor"
    spec["flavors"]["python_function"]["loader_module"] = "pipelines.hospital.flavor"
    mlmodel.write_text(yaml.safe_dump(spec))
    frame = pd.DataFrame({"path": [str(CHEST)]})
    old, new = mlflow.pyfunc.load_model(str(folder)).predict(frame), mlflow.pyfunc.load_model(MODEL).predict(frame)
    assert list(old["status"]) == ["scored"]
    np.testing.assert_allclose(old["p_Cardiomegaly"].to_numpy(float), new["p_Cardiomegaly"].to_numpy(float), atol=1e-6)

def test_the_contract_and_the_sr_say_what_the_model_was_trained_on(chest_store, tmp_path):
    demo = load_federation(REPO / "sites" / "demo" / "chest.yaml")  # every site stood in by `fedauc synth`
    contract = contract_for(demo, demo.diseases, "small_resnet", {}, (1, 64, 64), "test", None, "0123abcd")
    provenance = contract.provenance
    assert (provenance.federation, provenance.sites, provenance.training_run) == ("demo-chest", 4, "0123abcd")
    assert provenance.synthetic_sites == ["stanford", "nih", "san-juan", "hanoi"] and provenance.synthetic
    assert contract.body_parts == ["CHEST", "THORAX"] and "SCT:816094009" in contract.anatomic_regions
    assert ModelContract.model_validate_json(contract.model_dump_json()) == contract
    # A real federation: no synth entry; a site that declares its images synthetic is named all the same.
    for name, synthetic in (("a", False), ("b", True)):
        (tmp_path / f"{name}.yaml").write_text(yaml.safe_dump({"name": name, "format": "vindr-cxr", "root": ".",
                                                                "task": "chest-xray", "synthetic": synthetic}))
    (tmp_path / "fed.yaml").write_text(yaml.safe_dump({"name": "real", "task": "chest-xray",
                                                       "sites": [{"config": "a.yaml"}, {"config": "b.yaml"}]}))
    real = load_federation(tmp_path / "fed.yaml")
    assert contract_for(real, real.diseases, "small_resnet", {}, (1, 64, 64), "test", None,
                        "r").provenance.synthetic_sites == ["b"]

    # The registered model carries it, and the SR written with it states it and still validates.
    mlflow.set_tracking_uri(chest_store)
    registered = ModelContract.model_validate(mlflow.models.get_model_info(MODEL).metadata[METADATA_KEY])
    assert registered.provenance.federation == "pacs-test" and not registered.provenance.synthetic
    image = pydicom.dcmread(radiograph(tmp_path / "pa.dcm", generate_uid(), "P1", "PA", 1), stop_before_pixels=True)
    row = {"p_A": 0.25, "calibrated_A": 0.031, "A": False}
    sr = dicom_sr.study_report(StudyResult(generate_uid(), [image], [row], ["A"], "fedauc-chest-xray", "3",
                                           "youden", "test", provenance=provenance))
    content = dicom_sr.read_report(sr)
    # The calibrated probability beside the raw score (docs/algorithms.md section 16).
    (scores,) = content["images"].values()
    assert scores == {"A": 0.25, "A calibrated": 0.031, "A decision": "negative"}
    assert content["Training federation"] == "demo-chest" and content["Training sites"] == "4"
    assert content["Training run"] == "0123abcd"
    assert content["Synthetic training data"] == "yes: stanford, nih, san-juan, hanoi"
    if shutil.which("dciodvfy"):
        sr.save_as(tmp_path / "sr.dcm", enforce_file_format=True)
        checked = subprocess.run(["dciodvfy", str(tmp_path / "sr.dcm")], capture_output=True, text=True)
        assert [line for line in (checked.stdout + checked.stderr).splitlines() if line.startswith("Error")] == []
    unknown = dicom_sr.read_report(dicom_sr.study_report(StudyResult(generate_uid(), [image], [row], ["A"], "m", "1",
                                                                         "youden", "test")))
    assert unknown["Synthetic training data"].startswith("unknown")


def test_a_hospital_that_only_scores_declares_no_dataset(tmp_path):
    site = tmp_path / "hue.yaml"
    site.write_text(yaml.safe_dump({"name": "hue", "task": "chest-xray", "views": ["PA"],
                                    "pacs": {"url": "http://pacs.hue.local/dicom-web"}}))
    config = load_site(site)
    assert not config.has_dataset and config.views == ["PA"] and validate_site(site) == []
    assert runner.invoke(app, ["sites", "validate", str(site)]).exit_code == 0
    result = runner.invoke(app, ["preprocess", str(site), "--out", str(tmp_path / "shards")])
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert f"{site}: site 'hue' declares no dataset" in result.output and "to preprocess needs one" in result.output
    (tmp_path / "fed.yaml").write_text(yaml.safe_dump({"name": "f", "task": "chest-xray",
                                                       "sites": [{"config": "hue.yaml"}]}))
    with pytest.raises(SiteConfigError, match=r"hue\.yaml declares no dataset"):
        load_federation(tmp_path / "fed.yaml")
    result = runner.invoke(app, ["predict", str(site), "--out", str(tmp_path / "p.csv")])
    assert result.exit_code == 1 and "to predict on its dataset needs one" in result.output
    with pytest.raises(ConfigError, match="to scan its records needs one"):
        scan_site(config)
    # Half a dataset is a mistake, named: a format without its root.
    site.write_text(yaml.safe_dump({"name": "hue", "task": "chest-xray", "format": "vindr-cxr"}))
    with pytest.raises(SiteConfigError) as err:
        load_site(site)
    assert [p.field for p in err.value.problems] == ["root"]


def _rows(scores: list[float], refused: int = 0) -> list[dict]:
    return ([{"status": "scored", "reason": "", "p_A": p} for p in scores]
            + [{"status": "refused", "reason": "wrong_body_part", "p_A": float("nan")}] * refused)


def test_drift_leaves_once_per_site_and_day(tmp_path):
    reference = np.linspace(0, 1, 60)[:, None]  # quintile edges 0.2, 0.4, 0.6, 0.8
    days = drift.DayTallies(tmp_path / "hue.drift.json")
    monday, tuesday, wednesday = dt.date(2026, 3, 2), dt.date(2026, 3, 3), dt.date(2026, 3, 4)
    assert days.add("m/1", monday, drift.tally([], reference, ["A"])) == []  # a run that scored nothing
    assert not days.path.exists()
    assert days.add("m/1", monday, drift.tally(_rows([0.1] * 6, refused=2), reference, ["A"])) == []
    assert days.add("m/1", monday, drift.tally(_rows([0.9] * 7), reference, ["A"])) == []
    assert stat.S_IMODE(days.path.stat().st_mode) == 0o600  # exact counts: the hospital's only
    (closed,) = days.add("m/1", tuesday, drift.tally([], reference, ["A"]))
    assert closed[:2] == ("m/1", "2026-03-02")
    sent = drift.release(closed[2], SharingPolicy(min_count=5))
    assert sent["scored"] == 13 and sent["refused"] == {"wrong_body_part": "<5"}
    assert sent["histograms"]["A"] == [6, "<5", "<5", "<5", 7]
    # Until the centre has it, the day stays (a centre out of reach loses no day); then it goes.
    assert [c[:2] for c in days.add("m/1", tuesday, drift.tally([], reference, ["A"]))] == [("m/1", "2026-03-02")]
    days.sent("m/1", "2026-03-02")
    assert days.add("m/1", tuesday, drift.tally([], reference, ["A"])) == []
    # The day's total decides what is suppressed: 3 + 3 scored leave as 6, where each run alone is below 5.
    days.add("m/1", tuesday, drift.tally(_rows([0.5] * 3), reference, ["A"]))
    days.add("m/1", tuesday, drift.tally(_rows([0.5] * 3), reference, ["A"]))
    # A new reference (the site's shards written again) mid-day: its bins, the day's counts.
    (closed,) = days.add("m/1", wednesday, drift.tally([], reference, ["A"]))
    day = drift.release(closed[2], SharingPolicy(min_count=5))
    assert day["scored"] == 6 and day["histograms"]["A"] == ["<5", "<5", 6, "<5", "<5"]
    rebinned = drift.merge(closed[2], drift.tally(_rows([0.5]), reference[:50], ["A"]))
    assert rebinned["scored"] == 7 and sum(rebinned["histograms"]["A"]) == 1
    assert rebinned["edges"] == drift.tally(_rows([0.5]), reference[:50], ["A"])["edges"]
    # A site with a privacy budget: counts leave, edges and histograms of its validation scores do not.
    private = drift.release(closed[2], SharingPolicy(min_count=1), withhold_histograms=True)
    assert private["scored"] == 6 and private["edges"] == private["histograms"] == private["reference"] == {}
    assert "privacy budget" in private["withheld"]



def test_the_drift_figure_shows_the_last_days_in_day_order():
    # Drawn again with each day's record: over every day so far a year's figures would grow with the square
    # of the days, and MLflow's first page of runs (1,000) would freeze the figure after three years.
    reference = np.linspace(0, 1, 60)[:, None]
    day_one = dt.date(2026, 3, 1)
    # Recorded out of order, as a centre out of reach for a while receives its days.
    for offset in (0, 4, 1, 3, 2, 5):
        scores = [0.1 + 0.15 * offset] * 10
        summary = drift.release(drift.tally(_rows(scores), reference, ["A"]), SharingPolicy(min_count=1))
        drift.record("melanoma", "drift-window-clinic", MODEL, "1", summary, (day_one + dt.timedelta(days=offset)).isoformat())
    figure = drift.drift_figure("melanoma", "drift-window-clinic", days=3)
    (line,) = [line for line in figure.axes[0].lines if line.get_label() == "A"]
    assert list(line.get_xdata()) == [day_one + dt.timedelta(days=d) for d in (3, 4, 5)]
    assert list(line.get_ydata()) == sorted(line.get_ydata())  # the later days drifted further


@pytest.mark.slow
def test_fedauc_pacs_refuses_a_synthetic_model_unless_told_and_reports_once_a_day(tmp_path, monkeypatch):
    store = register_chest_model(tmp_path / "store", synthetic_sites=("stanford", "hanoi"))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", store)
    monkeypatch.setenv("HUE_PACS_PASSWORD", PASSWORD)
    mlflow.set_tracking_uri(store)
    with orthanc_server(tmp_path / "orthanc") as base:
        site = tmp_path / "hue.yaml"  # a hospital that only scores: no format, no root
        site.write_text(yaml.safe_dump({"name": "hue", "task": "chest-xray", "sharing": {"min_count": 1},
                                        "pacs": {"url": f"{base}/dicom-web", "username": USER,
                                                 "password_env": "HUE_PACS_PASSWORD",
                                                 "stable_minutes": 0}}))  # studies scored the run they arrive
        first, second = generate_uid(), generate_uid()
        upload(base, radiograph(tmp_path / "a.dcm", first, "P1", "PA", 1))
        web = pacs.connect(pacs.PacsSettings(url=f"{base}/dicom-web"), (USER, PASSWORD))
        sr_sink = DicomSrSink(web)
        command = ["pacs", str(site), "--model", MODEL, "--shards", str(tmp_path / "shards")]

        refused = runner.invoke(app, command)
        assert refused.exit_code == 1 and "Traceback" not in refused.output
        assert "was trained on synthetic images" in refused.output and "--allow-synthetic-model" in refused.output
        assert sr_sink.latest(first, "fedauc-chest-xray", "1") is None

        allowed = runner.invoke(app, [*command, "--allow-synthetic-model"])
        assert allowed.exit_code == 0, allowed.output
        (sr,) = reports_in(web, first, tmp_path / "read-back")
        assert dicom_sr.read_report(sr)["Synthetic training data"] == "yes: stanford, hanoi"

        def scoring_runs() -> list:
            return mlflow.search_runs(experiment_names=["chest-xray"], output_format="list",
                                      filter_string="tags.fedauc_role = 'hospital-scoring'")

        now = dt.datetime.now().astimezone()  # the hospital's clock; the drift day is its date
        today = now.date()
        upload(base, radiograph(tmp_path / "b.dcm", second, "P2", "AP", 2))
        later = job.run(site, tmp_path / "shards", MODEL, allow_synthetic_model=True, echo=lambda _: None, now=now)
        assert later["studies_reported"] == 1 and later["sent"] == [] and scoring_runs() == []
        tomorrow = job.run(site, tmp_path / "shards", MODEL, allow_synthetic_model=True, echo=lambda _: None,
                           now=now + dt.timedelta(days=1))
        assert tomorrow["studies_reported"] == 0
        (run,) = scoring_runs()
        assert run.data.tags["day"] == today.isoformat() and run.data.metrics["scored"] == 2
        sent = json.dumps(mlflow.artifacts.load_dict(f"runs:/{run.info.run_id}/scoring_aggregates.json"))
        assert first not in sent and second not in sent and str(tmp_path) not in sent and USER not in sent
        job.run(site, tmp_path / "shards", MODEL, allow_synthetic_model=True, echo=lambda _: None,
                now=now + dt.timedelta(days=1))
        assert len(scoring_runs()) == 1 and json.loads(job.drift_file(tmp_path / "shards", "hue").read_text()) == {}
        # A run that stopped after the centre recorded the day and before it forgot it sends it once all the same.
        aggregates = json.loads(sent)
        assert drift.record("chest-xray", "hue", "fedauc-chest-xray", "1", aggregates, today.isoformat()) == []
        assert len(scoring_runs()) == 1
