"""The labels-only report: counts from first principles, the input = kept + quarantined identity, the CLI."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
from typer.testing import CliRunner

from pipelines.cli import app
from preprocessing.label_report import label_report
from preprocessing.quarantine import Reason, quarantine_rows
from preprocessing.scan import ScanResult


def test_counts_per_split_and_disease():
    records = pd.DataFrame({
        "record_id": ["a", "b", "c", "d", "e"], "source_row": ["f:row 1"] * 5,
        "patient_id": ["p1", "p1", "p2", "p3", "p4"], "study_id": ["s1", "s2", "s3", "s4", "s5"],
        "image_path": ["a", "b", "c", "d", "e"], "view": ["PA", "AP", "PA", "PA", "AP"],
        "sex": ["F"] * 5, "age": [50.0] * 5, "split": ["train", "train", "train", "test", "valid"],
        "Edema": np.array([1, 0, np.nan, 1, 0], np.float32), "Cardiomegaly": np.array([np.nan] * 5, np.float32),
    })
    quarantine = quarantine_rows(records.iloc[:1].assign(record_id="z"), "scan", Reason.DUPLICATE_ROW, "dup")
    report = label_report(ScanResult(records, quarantine, 6, []))
    assert (report["input_rows"], report["kept"], report["quarantined"], report["balanced"]) == (6, 5, 1, True)
    assert report["quarantine_by_reason"] == {"duplicate_row": 1}
    train = report["splits"]["train"]
    assert (train["images"], train["patients"], train["studies"]) == (3, 2, 3)
    assert train["views"] == {"PA": 2, "AP": 1, "LATERAL": 0, "unknown": 0}
    assert label_report(ScanResult(records, quarantine, 6, []), "chest-xray")["all"]["views"]["PA"] == 3
    assert "views" not in label_report(ScanResult(records, quarantine, 6, []), "melanoma")["all"]
    assert train["labels"]["Edema"] == {"positives": 1, "negatives": 1, "missing": 1, "prevalence": 0.5}
    assert report["all"]["labels"]["Edema"]["prevalence"] == 2 / 4
    assert report["all"]["labels"]["Cardiomegaly"] == {"positives": 0, "negatives": 0, "missing": 5, "prevalence": None}
    assert report["splits"]["test"]["labels"]["Edema"]["positives"] == 1
    assert not label_report(ScanResult(records, quarantine, 7, []))["balanced"]


def test_cli_report_json_and_table(tmp_path):
    (tmp_path / "train.csv").write_text(
        "image_name,patient_id,sex,age_approx,anatom_site_general_challenge,diagnosis,benign_malignant,target\n"
        + "".join(f"ISIC_{i},IP_{i % 10},female,40,torso,nevus,benign,{int(i % 7 == 0)}\n" for i in range(50))
        + "ISIC_50,IP_1,female,40,torso,nevus,benign,maybe\n"
    )
    site = tmp_path / "isic.yaml"
    site.write_text(f"name: isic\nformat: siim-isic-2020\nroot: {tmp_path}\ntask: melanoma\n")
    runner = CliRunner()
    result = runner.invoke(app, ["sites", "report", str(site), "--labels-only", "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert (report["input_rows"], report["kept"], report["quarantined"]) == (51, 50, 1)
    assert report["all"]["labels"]["Melanoma"]["positives"] == 8  # i = 0, 7, ..., 49
    assert sum(report["splits"][s]["patients"] for s in ("train", "valid", "test")) == 10
    table = runner.invoke(app, ["sites", "report", str(site), "--labels-only"])
    assert table.exit_code == 0 and "51 input rows = 50 kept + 1 quarantined" in table.output
    assert "unparsable_label" in table.output
    # A dermatology site's images have no projection: no chest X-ray view rows (PA / AP / LATERAL).
    assert "view " not in table.output and "views" not in report["all"] and "patients" in table.output
    assert runner.invoke(app, ["sites", "report", str(site)]).exit_code == 2
    (tmp_path / "train.csv").write_text("image_name,patient_id,sex,age_approx\nISIC_0,IP_0,female,40\n")
    missing = runner.invoke(app, ["sites", "report", str(site), "--labels-only"])
    assert missing.exit_code == 1
    assert f"{tmp_path / 'train.csv'}: missing column(s) ['target']" in missing.output
