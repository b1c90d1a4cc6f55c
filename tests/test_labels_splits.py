"""Uncertain-label policy, label codes, and patient splits."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from preprocessing.labels import apply_uncertain_policy, default_uncertain_policy, parse_label_codes
from preprocessing.sites import SplitPolicy
from preprocessing.splits import assign_splits, draw_patients


def test_default_policy_follows_dam_convention():
    assert default_uncertain_policy("chest-xray") == {"Cardiomegaly": "zeros", "Edema": "ones", "Consolidation": "zeros",
                                                      "Atelectasis": "ones", "Pleural Effusion": "zeros"}


def test_uncertain_policy_resolves_every_minus_one():
    records = pd.DataFrame({"Edema": np.array([-1, 1, 0, np.nan], np.float32),
                            "Cardiomegaly": np.array([-1, -1, 0, 1], np.float32),
                            "Atelectasis": np.array([-1, 0, np.nan, 1], np.float32)})
    out = apply_uncertain_policy(records, {"Edema": "ones", "Cardiomegaly": "zeros", "Atelectasis": "ignore"})
    np.testing.assert_array_equal(out["Edema"], [1, 1, 0, np.nan])
    np.testing.assert_array_equal(out["Cardiomegaly"], [0, 0, 0, 1])
    np.testing.assert_array_equal(out["Atelectasis"], [np.nan, 0, np.nan, 1])
    assert out["Edema"].dtype == np.float32
    assert records["Edema"].iloc[0] == -1  # the input is not modified


def test_parse_label_codes():
    table = pd.DataFrame({"c": ["1.0", "-1", "", None, "0", "2"], "e": ["1", "x", "0.0", "-1.0", "", ""]})
    values, bad, detail = parse_label_codes(table, {"Cardiomegaly": "c", "Edema": "e"}, blank=0.0)
    np.testing.assert_array_equal(values["Cardiomegaly"], [1, -1, 0, 0, 0, np.nan])
    np.testing.assert_array_equal(values["Edema"], [1, np.nan, 0, -1, 0, 0])
    assert bad.tolist() == [False, True, False, False, False, True]
    assert detail[1] == "e=x is not one of 1, 0, -1 or blank" and detail[5] == "c=2 is not one of 1, 0, -1 or blank"
    values, _, _ = parse_label_codes(table, {"Edema": "e"}, blank=np.nan)
    assert np.isnan(values["Edema"][4])


def records(patients, splits=None):
    n = len(patients)
    return pd.DataFrame({"record_id": [f"r{i}" for i in range(n)], "source_row": [f"f.csv:row {i + 1}" for i in range(n)],
                         "patient_id": patients, "image_path": [f"{i}.png" for i in range(n)],
                         "split": splits if splits is not None else [None] * n})


def test_draw_is_by_patient_seeded_and_order_free():
    patients = [f"p{i}" for i in range(1000)] * 3
    policy = SplitPolicy(seed=7, valid=0.1, test=0.2)
    out, quarantine = assign_splits(records(patients), policy)
    assert len(quarantine) == 0
    per_patient = out.groupby("patient_id")["split"].agg(["nunique", "first"])
    assert (per_patient["nunique"] == 1).all()
    assert per_patient["first"].value_counts().to_dict() == {"train": 700, "test": 200, "valid": 100}
    shuffled, _ = assign_splits(records(patients[::-1]), policy)
    assert shuffled.set_index("patient_id")["split"].groupby(level=0).first().equals(per_patient["first"].rename("split"))
    other_seed, _ = assign_splits(records(patients), SplitPolicy(seed=8))
    assert not other_seed["split"].equals(out["split"])


def test_draw_patients_exact_fractions():
    assignment = draw_patients(np.array(["a", "b", "c", "d"], dtype=object), 0, {"test": 0.25, "valid": 0.25}, "train")
    assert sorted(assignment.values()) == ["test", "train", "train", "valid"]


def test_official_split_kept_and_valid_carved_from_train():
    patients = [f"p{i}" for i in range(100)]
    splits = ["test"] * 30 + ["train"] * 70
    out, quarantine = assign_splits(records(patients, splits), SplitPolicy(valid=0.1))
    assert len(quarantine) == 0
    assert (out["split"][:30] == "test").all()
    assert out["split"][30:].value_counts().to_dict() == {"train": 63, "valid": 7}  # round(0.1 * 70)
    ignored, _ = assign_splits(records(patients, splits), SplitPolicy(use_official=False, test=0.5, valid=0.0))
    assert ignored["split"].value_counts().to_dict() == {"test": 50, "train": 50}


def test_patient_in_two_official_splits_is_quarantined():
    out, quarantine = assign_splits(records(["a", "a", "b", "c", "c"], ["train", "test", "train", "test", None]),
                                    SplitPolicy(valid=0.0))
    assert out["patient_id"].tolist() == ["b", "c", "c"]
    assert out["split"].tolist() == ["train", "test", "test"]  # c's unlisted image follows c's listed one
    assert quarantine["reason"].tolist() == ["patient_in_two_splits"] * 2
    assert quarantine["stage"].tolist() == ["split"] * 2
    assert quarantine["detail"].iloc[0] == "patient a is in official splits test, train"


@pytest.mark.parametrize("valid,test", [(0.5, 0.5), (1.0, 0.0), (-0.1, 0.2)])
def test_split_fractions_validated(valid, test):
    with pytest.raises(ValueError):
        SplitPolicy(valid=valid, test=test)
