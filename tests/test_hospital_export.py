"""A hospital's own export (tests/hospital_export.py) onboarded through the commands, as its data engineer would:
each planted problem's fate and each exit code. Nothing is dropped in silence: a label encoding the YAML does not
map fails `sites validate` by column and value, and a loss over the site's share fails `sites report` and
`preprocess`, which still write the shards and the whole QC report."""

from __future__ import annotations

import json

import pandas as pd
import pydicom
import pytest
from hospital_export import TOP_CODED_AGES, UNREADABLE_AGES, build_hospital_export
from PIL import Image
from typer.testing import CliRunner

from federated.privacy.ledger import state_dir
from pipelines.cli import app
from preprocessing.adapters.base import age_notes, to_age
from preprocessing.decode import inspect_file
from preprocessing.losses import LOSS_EXIT_CODE
from preprocessing.shard_format import QUARANTINE_FILE

runner = CliRunner()


@pytest.fixture(scope="module")
def export(tmp_path_factory):
    return build_hospital_export(tmp_path_factory.mktemp("riverbank") / "export")


def fedauc(*args):
    return runner.invoke(app, [str(arg) for arg in args])


def test_the_export_holds_what_it_plants(export):
    files = [row["image_file"] for row in export.rows]
    assert len({f.rsplit("/", 1)[1] for f in files if f.endswith(".dcm")}) == 1  # every DICOM is IM00001.dcm
    assert export.labels_csv.read_bytes().startswith(b"\xef\xbb\xbfaccession,") and b"\r\n" in export.labels_csv.read_bytes()
    source = pydicom.dcmread(export.root / export.png_of)
    copy = pydicom.dcmread(export.root / export.planted["reuid_copy"])
    assert (copy.pixel_array == source.pixel_array).all() and copy.PatientID != source.PatientID
    assert copy.SOPInstanceUID != source.SOPInstanceUID and copy.StudyInstanceUID != source.StudyInstanceUID
    assert pydicom.dcmread(export.root / export.planted["leg"]).BodyPartExamined == "EXTREMITY"
    assert export.row("leg")["projection"] == "PA" and export.row("lateral")["projection"] == "LATERAL"
    with Image.open(export.root / export.planted["png_reexport"]) as png:
        assert png.mode == "L" and png.size == (source.Columns, source.Rows)
    assert export.row("png_reexport")["accession"] == pydicom.dcmread(export.root / export.png_of).AccessionNumber
    assert inspect_file(export.root / export.planted["truncated"])["error"] is not None
    assert inspect_file(export.root / export.planted["jpeg"])["error"] is None


def test_unmapped_values_fail_validate_and_report_by_column_and_value(export, tmp_path):
    site = export.site_yaml(tmp_path / "riverbank.yaml")
    validate = fedauc("sites", "validate", site)
    assert validate.exit_code == 1
    (line,) = validate.output.splitlines()  # one line, for the one column nothing maps
    n, y = export.count("cardiomegaly_flag", "N"), export.count("cardiomegaly_flag", "Y")
    assert line.startswith(f"{site}: options.label_values.cardiomegaly_flag: labels.csv column cardiomegaly_flag "
                           "holds values nothing maps: ")
    assert f"'N' ({n} rows)" in line and f"'Y' ({y} rows)" in line
    assert line.endswith("; add under options: label_values: {cardiomegaly_flag: yes-no}")
    # effusion's 1 / 0 / -1 and edema's 1.0 / 0.0 / -1.0 are the default codes: not named
    assert "effusion" not in validate.output and "edema" not in validate.output

    report = fedauc("sites", "report", site, "--labels-only", "--json")
    assert report.exit_code == 1
    counts = json.loads(report.output[:report.output.rindex("}") + 1])
    assert counts["unmapped_label_values"] == {"cardiomegaly_flag": {"N": n, "Y": y}}
    assert counts["counted"] == "before decoding" and counts["quarantine_by_reason"]["unparsable_label"] == n + y
    assert f"{n + y} of {len(export.rows)} rows" in report.output and "quarantined as unparsable_label" in report.output
    table = fedauc("sites", "report", site, "--labels-only")
    assert table.exit_code == 1 and "before decoding" in table.output
    assert "cardiomegaly_flag │ 'N'" in table.output and "cardiomegaly_flag │ 'Y'" in table.output


def test_yaml_values_that_yaml_turns_into_booleans_are_refused_in_one_line(export, tmp_path):
    site = export.site_yaml(tmp_path / "riverbank.yaml")
    site.write_text(site.read_text() + "  label_values: {cardiomegaly_flag: {yes: positive, no: negative}}\n")
    validate = fedauc("sites", "validate", site)
    assert validate.exit_code == 1 and "quote the values" in validate.output and "Traceback" not in validate.output


@pytest.mark.slow
def test_the_export_onboards_with_its_values_mapped(export, tmp_path):
    site = export.site_yaml(tmp_path / "riverbank.yaml", options={"label_values": {"cardiomegaly_flag": "yes-no"}})
    assert fedauc("sites", "validate", site).output == f"{site}: ok\n"
    report = fedauc("sites", "report", site, "--labels-only", "--json")
    assert report.exit_code == 0, report.output
    counts = json.loads(report.output)
    # every Y and N now reads: only the lateral is left out before decoding (the site's view filter, not a loss)
    assert counts["quarantine_by_reason"] == {"excluded_view": 1}
    lateral_y = export.row("lateral")["cardiomegaly_flag"] == "Y"
    assert counts["all"]["labels"]["Cardiomegaly"]["positives"] == export.count("cardiomegaly_flag", "Y") - lateral_y

    out = tmp_path / "shards"
    result = fedauc("preprocess", site, "--out", out, "--workers", "0")
    # The same picture three times (a copy with new UIDs under another patient, an 8-bit PNG export of one of
    # them) is 3 of 42 rows, over the site's 5 %: the exit code says so, the shards are written.
    assert result.exit_code == LOSS_EXIT_CODE, result.output
    assert "3 of 42 rows (7.1 %) quarantined as near_duplicate, over the site's max_quarantine_share" in result.output
    quarantine = pd.read_parquet(out / "riverbank" / QUARANTINE_FILE).set_index("image_path")
    assert quarantine.loc[export.planted["truncated"], "reason"] == "unreadable_file"
    assert quarantine.loc[export.planted["lateral"], "reason"] == "excluded_view"
    assert quarantine.loc[export.planted["leg"], "reason"] == "wrong_body_part"  # a leg filed as a chest study
    copies = (export.png_of, export.planted["reuid_copy"], export.planted["png_reexport"])
    assert set(quarantine.loc[list(copies), "reason"]) == {"near_duplicate"}
    assert export.planted["reuid_copy"] in quarantine.loc[export.png_of, "detail"]  # each names the other
    assert export.png_of in quarantine.loc[export.planted["reuid_copy"], "detail"]
    assert export.planted["jpeg"] not in quarantine.index  # a JPEG export of a picture of its own is kept
    qc = json.loads((out / "riverbank" / "qc" / "report.json").read_text())
    assert qc["accounting"]["holds"] and qc["accounting"]["input_rows"] == len(export.rows)
    assert len(qc["quarantine"]["rows"]) == 6
    kept = pd.concat(pd.read_parquet(path) for path in (out / "riverbank").glob("*/manifest.parquet"))
    assert not set(kept["image_path"]) & set(quarantine.index)
    assert qc["ages"] == {"top_coded": len(TOP_CODED_AGES), "unreadable": len(UNREADABLE_AGES)}
    assert "3 top-coded (`90+`, `>89`: read as their bound), 2 unreadable" in (
        out / "riverbank" / "qc" / "report.md").read_text()
    ages = pd.concat(pd.read_parquet(path) for path in (out / "riverbank").glob("*/manifest.parquet"))
    read = ages.set_index("image_path")["age"]
    assert [read[row["image_file"]] for row in export.rows if row["age_at_exam"] in TOP_CODED_AGES] == [90, 89, 89]
    assert all(read[row["image_file"]] != read[row["image_file"]] for row in export.rows  # NaN: unknown
               if row["age_at_exam"] in UNREADABLE_AGES)
    # a site without a privacy budget leaves nothing in the site's state directory, not even a ledger lock
    assert not list(state_dir().glob("riverbank*"))

    # A stricter site: the one truncated file is now over its share; the shards are still written.
    strict = export.site_yaml(tmp_path / "strict.yaml", options={"label_values": {"cardiomegaly_flag": "yes-no"}},
                              max_quarantine_share=0.01)
    result = fedauc("preprocess", strict, "--out", out, "--workers", "0")
    assert result.exit_code == LOSS_EXIT_CODE, result.output
    assert "shards unchanged, nothing to do" in result.output  # the share tolerated changes no shard
    assert ("1 of 42 rows (2.4 %) quarantined as unreadable_file, over the site's max_quarantine_share of 1 %"
            in result.output) and "files dicom/**/*.dcm (1)" in result.output
    assert "quarantined as wrong_body_part, over the site's max_quarantine_share of 1 %" in result.output
    assert (out / "riverbank" / "shard.json").is_file()


@pytest.mark.slow
def test_preprocess_of_unmapped_values_writes_the_shards_and_fails(export, tmp_path):
    site = export.site_yaml(tmp_path / "riverbank.yaml")
    out = tmp_path / "shards"
    result = fedauc("preprocess", site, "--out", out, "--workers", "0")
    assert result.exit_code == LOSS_EXIT_CODE, result.output
    lost = export.count("cardiomegaly_flag", "N") + export.count("cardiomegaly_flag", "Y")
    assert f"{lost} of {len(export.rows)} rows" in result.output and "cardiomegaly_flag=N" in result.output
    qc = json.loads((out / "riverbank" / "qc" / "report.json").read_text())
    assert qc["accounting"]["holds"] and len(qc["quarantine"]["rows"]) == qc["accounting"]["quarantined"]
    assert sum(row["reason"] == "unparsable_label" for row in qc["quarantine"]["rows"]) == lost


def test_top_coded_ages_read_as_their_bound_and_are_counted():
    ages = pd.Series(["90+", ">89", "89+", ">=90", "45", "45.5", "", None, "n/a", "unknown", "1+2"])
    assert to_age(ages).fillna(-1).tolist() == [90, 89, 89, 90, 45, 45.5, -1, -1, -1, -1, -1]
    assert age_notes(ages) == {"top_coded": 4, "unreadable": 3}
