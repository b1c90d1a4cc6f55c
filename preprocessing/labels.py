"""Label harmonization shared by the adapters: CheXpert-style label codes and the uncertain-label policy.

Conventions (docs/datasets.md section 2): 1 positive, 0 negative, -1 uncertain, blank
"not mentioned". The uncertain policy per disease is U-Ones, U-Zeros or U-Ignore (masked, NaN); the common
DAM choice, our default, is U-Ones for Edema and Atelectasis and U-Zeros for the others.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
import pandas as pd

from preprocessing.records import UNCERTAIN, label_columns

UncertainPolicy = Literal["ones", "zeros", "ignore"]
UNCERTAIN_RESOLUTION: dict[str, float] = {"ones": 1.0, "zeros": 0.0, "ignore": np.nan}
U_ONES_BY_DEFAULT = ("Edema", "Atelectasis")

# Label codes as written by CheXpert, MIMIC-CXR and hospitals exporting in their style ("1.0", "-1", ...).
_CODES = (1.0, 0.0, UNCERTAIN)


def default_uncertain_policy(task: str) -> dict[str, UncertainPolicy]:
    return {d: ("ones" if d in U_ONES_BY_DEFAULT else "zeros") for d in label_columns(task)}


def parse_label_codes(
    table: pd.DataFrame, columns: dict[str, str], blank: float
) -> tuple[dict[str, np.ndarray], np.ndarray, pd.Series]:
    """Parse text label columns into {1, 0, -1, ``blank`` for empty cells}.

    ``columns`` maps canonical disease -> source column. Returns the float32 values per disease, a mask
    of rows holding a value that is no label code, and a detail naming the column and the bad value.
    """
    values: dict[str, np.ndarray] = {}
    bad = np.zeros(len(table), dtype=bool)
    detail = pd.Series("", index=range(len(table)), dtype=object)
    for disease, column in columns.items():
        text = table[column].reset_index(drop=True).str.strip()
        parsed = pd.to_numeric(text, errors="coerce")
        blank_cell = text.isna() | (text == "")
        unparsable = (~parsed.isin(_CODES) & ~blank_cell).to_numpy()
        new = unparsable & ~bad
        detail[new] = f"{column}=" + text[new].astype(str) + " is not one of 1, 0, -1 or blank"
        bad |= unparsable
        # a code outside 1 / 0 / -1 ("2") is NaN here; its row is quarantined anyway
        values[disease] = parsed.where(~unparsable, np.nan).where(~blank_cell, blank).to_numpy(dtype=np.float32)
    return values, bad, detail


def apply_uncertain_policy(records: pd.DataFrame, policy: dict[str, UncertainPolicy]) -> pd.DataFrame:
    """Resolve every -1 with the per-disease policy; no -1 is left afterwards."""
    records = records.copy()
    for disease, rule in policy.items():
        if disease in records.columns:
            column = records[disease].to_numpy(dtype=np.float32, copy=True)
            column[column == UNCERTAIN] = UNCERTAIN_RESOLUTION[rule]
            records[disease] = column
    return records
