"""Byte-identical files kept under two patients or in two splits would leak a test image into training:
all but the first are quarantined DUPLICATE_CONTENT (stage "dedup") before the shards are finalized."""

from __future__ import annotations

import numpy as np
import pandas as pd

from preprocessing.quarantine import Reason


def quarantine_duplicate_content(splits: dict[str, pd.DataFrame], outcomes: dict[str, pd.DataFrame]) -> None:
    """Turn the outcomes of leaked duplicates into DUPLICATE_CONTENT failures (in place).

    A group of byte-identical kept files is a leak when it spans patients or splits; its first file (in
    SPLITS order, then record order) stays. Duplicates within one patient and split are not a leak and stay.
    """
    kept = []
    for name, part in splits.items():
        ok = outcomes[name]["ok"].to_numpy(dtype=bool)
        kept.append(
            pd.DataFrame(
                {
                    "split": name,
                    "row": np.flatnonzero(ok),
                    "sha256": outcomes[name].loc[ok, "sha256"].to_numpy(),
                    "patient_id": part.loc[ok, "patient_id"].astype(str).to_numpy(),
                    "image_path": part.loc[ok, "image_path"].astype(str).to_numpy(),
                    "source_row": part.loc[ok, "source_row"].astype(str).to_numpy(),
                }
            )
        )
    if not kept:
        return
    files = pd.concat(kept, ignore_index=True)
    groups = files.groupby("sha256")
    leak = (groups["patient_id"].transform("nunique") > 1) | (groups["split"].transform("nunique") > 1)
    duplicates = files[leak & files["sha256"].duplicated(keep="first")]
    first = files.drop_duplicates("sha256").set_index("sha256")
    for row in duplicates.itertuples(index=False):
        original = first.loc[row.sha256]
        outcomes[row.split].loc[row.row, ["ok", "reason", "detail"]] = [
            False,
            Reason.DUPLICATE_CONTENT.value,
            f"{row.image_path} ({row.split}) is byte-identical to {original.image_path} "
            f"({original.source_row}, {original.split}), kept under another patient or in another split",
        ]
