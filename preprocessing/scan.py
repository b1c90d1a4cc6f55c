"""Scan a site: read its metadata through the adapter, harmonize labels, filter views, assign splits.

Metadata only: no image is opened (the decoder checks the files). Every input row ends either in
``records`` or in ``quarantine`` with its reason; ``input_rows == len(records) + len(quarantine)``.
The stages, in order, each quarantining what it rejects:

1. adapter: unparsable labels, rows without the fields that make a record (stage "scan");
2. missing patient id or image path (MISSING_FIELD);
3. duplicate rows: the same record id twice, the first one is kept (DUPLICATE_ROW);
4. view filter of the site, chest X-ray only (EXCLUDED_VIEW);
5. uncertain labels resolved by the site's policy (nothing quarantined);
6. splits by patient (PATIENT_IN_TWO_SPLITS, stage "split").
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from preprocessing.adapters import ADAPTERS
from preprocessing.labels import apply_uncertain_policy
from preprocessing.quarantine import QUARANTINE_COLUMNS, Reason, quarantine_rows
from preprocessing.records import RECORD_COLUMNS
from preprocessing.splits import assign_splits


@dataclass
class ScanResult:
    records: pd.DataFrame  # RECORD_COLUMNS + one float32 column per task disease; no -1; split assigned
    quarantine: pd.DataFrame  # QUARANTINE_COLUMNS
    input_rows: int  # rows read from the metadata, as the adapter defines them
    metadata_files: list[Path]  # the files read (for the content hash)
    ages: dict[str, int] = field(default_factory=dict)  # top-coded and unreadable ages (adapters.base.age_notes)


def _blank(values: pd.Series) -> np.ndarray:
    return (values.isna() | (values.astype(str).str.strip() == "")).to_numpy()


def scan_site(config) -> ScanResult:
    """Scan ``config`` (a ``preprocessing.sites.SiteConfig``)."""
    config.require_dataset("scan its records")
    output = ADAPTERS[config.format].read(config)
    records = output.records
    quarantined = [output.quarantine]

    def take(mask: np.ndarray, reason: Reason, detail) -> None:
        nonlocal records
        if mask.any():
            if isinstance(detail, pd.Series):
                detail = detail[mask]
            quarantined.append(quarantine_rows(records[mask], "scan", reason, detail))
            records = records[~mask].reset_index(drop=True)

    missing_patient, missing_path = _blank(records["patient_id"]), _blank(records["image_path"])
    take(
        missing_patient | missing_path,
        Reason.MISSING_FIELD,
        pd.Series(np.where(missing_patient, "no patient id", "no image path"), index=records.index),
    )
    duplicate = records["record_id"].duplicated(keep="first").to_numpy()
    first_seen = records.drop_duplicates("record_id").set_index("record_id")["source_row"]
    take(duplicate, Reason.DUPLICATE_ROW, "same record as " + records["record_id"].map(first_seen).astype(str))
    if config.task == "chest-xray":
        excluded = ~records["view"].isin(config.views).to_numpy()
        take(excluded, Reason.EXCLUDED_VIEW, "view " + records["view"].astype(str) + f" not in {config.views}")
    records = apply_uncertain_policy(records, config.uncertain_policy)
    records, split_quarantine = assign_splits(records, config.split)
    quarantined.append(split_quarantine)
    quarantine = pd.concat(quarantined, ignore_index=True)
    records = records[list(RECORD_COLUMNS) + list(config.diseases)]
    if output.input_rows != len(records) + len(quarantine):
        raise AssertionError(
            f"{config.format} adapter lost rows: {output.input_rows} read, {len(records)} kept + {len(quarantine)} quarantined"
        )
    return ScanResult(records, quarantine[list(QUARANTINE_COLUMNS)], output.input_rows, output.metadata_files,
                      output.ages)
