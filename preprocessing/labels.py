"""Label harmonization shared by the adapters: CheXpert-style label codes and the uncertain-label policy.

Conventions (docs/datasets.md section 2): 1 positive, 0 negative, -1 uncertain, blank
"not mentioned". The uncertain policy per disease is U-Ones, U-Zeros or U-Ignore (masked, NaN); the common
DAM choice, our default, is U-Ones for Edema and Atelectasis and U-Zeros for the others.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
import pandas as pd

from preprocessing.label_values import DEFAULT_PRESET, ValueMap, value_map
from preprocessing.records import UNCERTAIN, label_columns

UncertainPolicy = Literal["ones", "zeros", "ignore"]
UNCERTAIN_RESOLUTION: dict[str, float] = {"ones": 1.0, "zeros": 0.0, "ignore": np.nan}
U_ONES_BY_DEFAULT = ("Edema", "Atelectasis")


def default_uncertain_policy(task: str) -> dict[str, UncertainPolicy]:
    return {d: ("ones" if d in U_ONES_BY_DEFAULT else "zeros") for d in label_columns(task)}


def parse_label_codes(
    table: pd.DataFrame, columns: dict[str, str], blank: float, maps: dict[str, ValueMap] | None = None
) -> tuple[dict[str, np.ndarray], np.ndarray, pd.Series]:
    """Parse text label columns into {1, 0, -1, ``blank`` for empty cells}.

    ``columns`` maps canonical disease -> source column; ``maps`` source column -> how it writes its labels
    (``preprocessing/label_values.py``; a column not in it reads the codes 1 / 0 / -1). Returns the float32
    values per disease, a mask of rows holding a value nothing maps, and a detail naming the column and value.
    """
    values: dict[str, np.ndarray] = {}
    bad = np.zeros(len(table), dtype=bool)
    detail = pd.Series("", index=range(len(table)), dtype=object)
    for disease, column in columns.items():
        mapping = (maps or {}).get(column) or value_map(DEFAULT_PRESET)
        text = table[column].reset_index(drop=True).str.strip()
        parsed, unparsable = mapping.decode(text, blank)
        new = unparsable & ~bad
        detail[new] = f"{column}=" + text[new].astype(str) + f" is not one of {mapping.spelled}"
        bad |= unparsable
        values[disease] = np.where(unparsable, np.float32(np.nan), parsed)  # its row is quarantined anyway
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
