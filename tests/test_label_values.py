"""Label value maps (preprocessing/label_values.py) and the no-silent-loss rule (preprocessing/losses.py)."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pandas as pd
import pytest
import yaml

from preprocessing.label_values import suggestion, unmapped_values, value_map
from preprocessing.labels import parse_label_codes
from preprocessing.losses import excess_losses, file_pattern
from preprocessing.sites import SiteConfigError, load_site, validate_site


def decode(spec, cells, blank=np.nan):
    values, unmapped = value_map(spec).decode(pd.Series(cells, dtype=object), blank)
    return [None if u else (None if np.isnan(v) else float(v)) for v, u in zip(values, unmapped)], list(unmapped)


def test_presets_match_case_and_spaces_and_leave_blank_to_the_blank_rule():
    assert decode("yes-no", ["Y", " n ", "YES", "No", "", None, "U"]) == (
        [1.0, 0.0, 1.0, 0.0, None, None, None], [False] * 6 + [True])
    assert decode("yes-no", ["", None], blank=0.0)[0] == [0.0, 0.0]
    assert decode("true-false", ["TRUE", "f", "T"])[0] == [1.0, 0.0, 1.0]
    assert decode("positive-negative", ["Positive", "NEG", "uncertain"])[0] == [1.0, 0.0, -1.0]
    # codes reads any numeric spelling of 1 / 0 / -1, nothing else
    assert decode("codes", ["1.0", "-1.00", "0", "2", "yes"]) == ([1.0, -1.0, 0.0, None, None],
                                                                 [False, False, False, True, True])


def test_an_explicit_map_can_send_a_blank_to_negative():
    values, unmapped = decode({"Y": "positive", "N": "negative", "": "negative", "?": "uncertain"}, ["y", "", "?", "x"])
    assert values[:3] == [1.0, 0.0, -1.0] and unmapped == [False, False, False, True]


def test_parse_label_codes_names_the_column_the_value_and_what_it_accepts():
    table = pd.DataFrame({"flag": ["Y", "maybe", "N"], "eff": ["1", "0", "x"]})
    maps = {"flag": value_map("yes-no")}
    values, bad, detail = parse_label_codes(table, {"Cardiomegaly": "flag", "Edema": "eff"}, np.nan, maps)
    assert list(bad) == [False, True, True]
    assert detail[1] == "flag=maybe is not one of y, yes, n, no or blank"
    assert detail[2] == "eff=x is not one of 1, 0, -1 or blank"
    assert values["Cardiomegaly"][0] == 1.0 and np.isnan(values["Cardiomegaly"][1])


def test_unmapped_values_and_the_yaml_that_maps_them():
    table = pd.DataFrame({"flag": ["Y", "N", "N", "", None], "other": ["1", "pending", "1", "0", "x"]})
    found = unmapped_values(table, {"flag": value_map("codes"), "other": value_map("codes")}, np.nan)
    assert found == {"flag": Counter({"N": 2, "Y": 1}), "other": Counter({"pending": 1, "x": 1})}
    assert suggestion("flag", found["flag"]) == "label_values: {flag: yes-no}"
    # no preset covers them: an explicit map, the hospital fills in what only it knows
    assert suggestion("other", Counter({"Pos": 2, "pending": 1})) == \
        "label_values: {other: {pending: EDIT-ME, Pos: positive}}"


def _site(tmp_path, **options):
    (tmp_path / "labels.csv").write_text("file,mrn,flag\na.png,P1,Y\nb.png,P2,N\n")
    site = tmp_path / "site.yaml"
    site.write_text(yaml.safe_dump({"name": "s", "format": "generic-csv", "root": str(tmp_path), "task": "chest-xray",
                                    "options": {"labels_csv": "labels.csv", "path_column": "file",
                                                "patient_column": "mrn", "label_columns": {"Cardiomegaly": "flag"},
                                                **options}}))
    return site


def test_the_site_yaml_refuses_unknown_presets_columns_and_clashing_values(tmp_path):
    site = _site(tmp_path, label_values={"flag": "yesno", "flg": "yes-no"})
    with pytest.raises(SiteConfigError) as err:
        load_site(site)
    fields = [problem.field for problem in err.value.problems]
    assert fields == ["options.label_values.flg", "options.label_values.flag"]
    assert "unknown preset 'yesno'" in str(err.value) and "not one of the label_columns' columns (flag)" in str(err.value)
    site = _site(tmp_path, label_values={"flag": {"Y": "positive", " y": "negative"}})
    with pytest.raises(SiteConfigError, match=r"values \['y'\] are listed twice"):
        load_site(site)


def test_validate_passes_once_the_values_are_mapped(tmp_path):
    (problem,) = validate_site(_site(tmp_path))
    assert problem.field == "options.label_values.flag" and "'Y' (1 row), 'N' (1 row)" in problem.message
    assert validate_site(_site(tmp_path, label_values={"flag": "yes-no"})) == []
    assert validate_site(_site(tmp_path, default_label_values="yes-no")) == []


def _quarantine(reasons_paths):
    return pd.DataFrame([{"record_id": str(i), "source_row": f"l.csv:row {i}", "image_path": path,
                          "stage": "scan" if reason in ("unparsable_label", "excluded_view") else "decode",
                          "reason": reason, "detail": detail} for i, (reason, path, detail) in enumerate(reasons_paths)])


def test_a_reason_over_the_share_is_one_line_and_the_view_filter_never_counts():
    quarantine = _quarantine([("excluded_view", "a.png", "view LATERAL not in ['PA']")] * 30
                             + [("unreadable_file", f"dicom/P{i}/S1/IM1.dcm", "truncated") for i in range(6)]
                             + [("unparsable_label", "x.png", "flag=N is not one of 1, 0, -1 or blank")] * 5)
    (line,) = excess_losses(quarantine, 100, 0.05)  # 6 over 5 %; 5 is not over it
    assert line.startswith("6 of 100 rows (6.0 %) quarantined as unreadable_file, over the site's "
                           "max_quarantine_share of 5 %: truncated (6); files dicom/**/*.dcm (6); fix: ")
    assert len(excess_losses(quarantine, 100, 0.04)) == 2 and excess_losses(quarantine, 100, 0.06) == []


def test_file_patterns_name_no_patient_folder():
    assert file_pattern("dicom/MRN0001/20240101_ACC1/SE0001/IM00001.dcm") == "dicom/**/*.dcm"
    assert file_pattern("PACS exports/ACC1.PNG") == "PACS exports/*.png" and file_pattern("x.jpg") == "*.jpg"
