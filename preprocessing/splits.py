"""Train / valid / test by patient: seeded, deterministic, official splits first.

With ``use_official`` and an official split in the data (CheXpert valid.csv as test, NIH lists, MIMIC
split.csv), the official assignment is kept; a patient found in two official splits is quarantined
(PATIENT_IN_TWO_SPLITS): leaking a patient across splits inflates test AUC. Records without an official
split follow their patient's official split, or, for patients with none, the seeded draw below.
``valid`` is carved out of the train patients when the official split has no valid of its own.

The draw: the sorted unique patients are permuted by ``numpy.random.default_rng(seed)``; the first
``round(test * n)`` go to test, the next ``round(valid * n)`` to valid, the rest to train. Same patients
and seed, same split, whatever the row order.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from preprocessing.quarantine import Reason, empty_quarantine, quarantine_rows


def draw_patients(patients: np.ndarray, seed: int, fractions: dict[str, float], rest: str) -> dict[str, str]:
    """Assign each patient of ``patients`` to a split; ``fractions`` in order, ``rest`` takes the remainder."""
    ordered = np.sort(np.asarray(pd.unique(patients), dtype=object).astype(str))
    shuffled = ordered[np.random.default_rng(seed).permutation(len(ordered))]
    assignment = {}
    start = 0
    for split, fraction in fractions.items():
        count = int(round(fraction * len(shuffled)))
        assignment.update(dict.fromkeys(shuffled[start : start + count], split))
        start += count
    assignment.update(dict.fromkeys(shuffled[start:], rest))
    return assignment


def assign_splits(records: pd.DataFrame, policy) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Fill ``split`` for every record; returns (records, quarantine of stage "split")."""
    records = records.copy()
    patients = records["patient_id"].astype(str)
    official = records["split"] if policy.use_official else pd.Series(None, index=records.index, dtype=object)
    quarantine = empty_quarantine()
    if official.notna().any():
        splits_per_patient = official.groupby(patients).nunique()
        conflicted = splits_per_patient.index[splits_per_patient > 1]
        leak = patients.isin(conflicted).to_numpy()
        if leak.any():
            seen = official[leak].groupby(patients[leak]).agg(lambda s: ", ".join(sorted(s.dropna().unique())))
            detail = "patient " + patients[leak] + " is in official splits " + patients[leak].map(seen)
            quarantine = quarantine_rows(records[leak], "split", Reason.PATIENT_IN_TWO_SPLITS, detail)
            records, official, patients = records[~leak], official[~leak], patients[~leak]
        # a record without an official split follows its patient's other records
        patient_split = official.dropna().groupby(patients[official.notna()]).first()
        official = official.fillna(patients.map(patient_split))
    split = official.copy()
    undrawn = split.isna()
    if undrawn.any():
        drawn = draw_patients(patients[undrawn].to_numpy(), policy.seed, {"test": policy.test, "valid": policy.valid}, "train")
        split[undrawn] = patients[undrawn].map(drawn)
    has_official_valid = (official == "valid").any()
    if not has_official_valid and not undrawn.all():
        # official train + test: carve valid out of the official train patients
        train = (official == "train").to_numpy()
        carved = draw_patients(patients[train].to_numpy(), policy.seed, {"valid": policy.valid}, "train")
        split[train] = patients[train].map(carved)
    records["split"] = split.astype(object).to_numpy()
    return records.reset_index(drop=True), quarantine
