"""How a hospital's label columns write positive, negative, uncertain and missing: the site YAML's value maps.

A generic layout's ``options.label_values`` names, per source column, a preset (``yes-no``) or an explicit map
(``{Y: positive, N: negative, U: uncertain, "": missing}``); ``options.default_label_values`` is the preset of
every column not named (``codes``: 1 / 0 / -1, written 1.0 / 0.0 / -1.0 too, CheXpert's convention). Cells are
matched after stripping and case-folding. A blank cell is missing (or negative with ``blank: zeros``) unless the
column's map says otherwise. Reference: docs/datasets.md section 9.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from typing import Literal

import numpy as np
import pandas as pd

from preprocessing.records import UNCERTAIN

Meaning = Literal["positive", "negative", "uncertain", "missing"]
MEANING_CODES: dict[str, float] = {"positive": 1.0, "negative": 0.0, "uncertain": UNCERTAIN, "missing": math.nan}

# Named encodings, as hospitals export them; each also reads a blank cell by the site's ``blank`` rule.
PRESETS: dict[str, dict[str, Meaning]] = {
    "codes": {"1": "positive", "0": "negative", "-1": "uncertain"},  # any numeric spelling: 1.0, -1.00, ...
    "yes-no": {"y": "positive", "yes": "positive", "n": "negative", "no": "negative"},
    "true-false": {"true": "positive", "t": "positive", "false": "negative", "f": "negative"},
    "positive-negative": {"positive": "positive", "pos": "positive", "negative": "negative", "neg": "negative",
                          "uncertain": "uncertain"},
}
DEFAULT_PRESET = "codes"

ValueSpec = str | dict[str, Meaning]  # a preset's name or an explicit map, as written in the YAML


@dataclass(frozen=True)
class ValueMap:
    """One column's decoding: case-folded cell text -> label code (1, 0, -1, NaN)."""

    codes: dict[str, float]
    numeric: bool  # codes preset: "1.0" and "-1.00" read as 1 and -1
    spelled: str  # the accepted values, for messages

    def decode(self, text: pd.Series, blank: float) -> tuple[np.ndarray, np.ndarray]:
        """(float32 codes, mask of cells nothing maps) for a column of stripped strings (NaN: empty cell)."""
        folded = text.fillna("").astype(str).str.strip().str.casefold()
        values = folded.map(self.codes)
        if self.numeric:
            number = pd.to_numeric(folded, errors="coerce")
            values = values.fillna(number.where(number.isin([1.0, 0.0, UNCERTAIN])))
        mapped = folded.isin(self.codes.keys()) | values.notna()
        blank_cell = (folded == "") & ~folded.isin(self.codes.keys())
        values = values.where(~blank_cell, blank)
        return values.to_numpy(dtype=np.float32), (~mapped & ~blank_cell).to_numpy()


def value_map(spec: ValueSpec) -> ValueMap:
    """The ValueMap of a preset's name or an explicit map (checked by ``check_spec`` when the YAML loads)."""
    if isinstance(spec, str):
        codes = {value: MEANING_CODES[meaning] for value, meaning in PRESETS[spec].items()}
        shown = ", ".join(PRESETS[spec])
        if spec == DEFAULT_PRESET:
            shown = "1, 0, -1"
        return ValueMap(codes, numeric=spec == DEFAULT_PRESET, spelled=f"{shown} or blank")
    codes = {str(value).strip().casefold(): MEANING_CODES[meaning] for value, meaning in spec.items()}
    shown = ", ".join(repr(value) if value == "" else str(value) for value in spec)
    return ValueMap(codes, numeric=False, spelled=shown if "" in codes else f"{shown} or blank")


def check_spec(column: str, spec: ValueSpec) -> str | None:
    """Why ``spec`` (the YAML's entry for ``column``) is unusable, or None."""
    if isinstance(spec, str) and spec not in PRESETS:
        return f"unknown preset {spec!r} for column {column}; expected one of {', '.join(PRESETS)} or a map " \
               "{VALUE: positive | negative | uncertain | missing}"
    if isinstance(spec, dict):
        folded = Counter(str(value).strip().casefold() for value in spec)
        clashes = sorted(value for value, n in folded.items() if n > 1)
        if clashes:
            return f"column {column}: values {clashes} are listed twice (matching ignores case and spaces)"
    return None


def column_maps(label_columns: dict[str, str], label_values: dict[str, ValueSpec], default: str) -> dict[str, ValueMap]:
    """Source column -> its ValueMap, for every column ``label_columns`` reads."""
    return {column: value_map(label_values.get(column, default)) for column in label_columns.values()}


def unmapped_values(table: pd.DataFrame, maps: dict[str, ValueMap], blank: float) -> dict[str, Counter]:
    """Per column, each value nothing maps (as written, first spelling seen) and how many rows hold it."""
    found = {}
    for column, mapping in maps.items():
        text = table[column].fillna("").astype(str).str.strip()
        _, unmapped = mapping.decode(text, blank)
        if unmapped.any():
            found[column] = Counter(text[unmapped].to_list())
    return found


def suggestion(column: str, values: Counter) -> str:
    """The YAML that maps ``values``: a preset covering them all, else an explicit map to complete."""
    folded = {value.casefold() for value in values}
    for name, preset in PRESETS.items():
        if folded <= preset.keys() and name != DEFAULT_PRESET:
            return f"label_values: {{{column}: {name}}}"
    guesses = {value: _guess(value) for value in sorted(values, key=str.casefold)}
    entries = ", ".join(f"{_yaml_key(value)}: {meaning}" for value, meaning in guesses.items())
    return f"label_values: {{{column}: {{{entries}}}}}"


def _guess(value: str) -> str:
    for preset in PRESETS.values():
        if value.casefold() in preset:
            return preset[value.casefold()]
    return "EDIT-ME"  # positive, negative, uncertain or missing: only the hospital knows


def _yaml_key(value: str) -> str:
    plain = value and value.replace("-", "").replace(".", "").replace("_", "").isalnum() and not value[0].isdigit()
    return value if plain and value.casefold() not in ("y", "n", "yes", "no", "true", "false", "on", "off", "null") \
        else f'"{value}"'


def yaml_keys_as_text(spec):
    """An explicit map's keys as text: YAML reads ``1: positive`` as the number 1 and an empty key as null. A
    bare yes / no / true / false key is a YAML boolean whose spelling is lost: refused, asking for quotes."""
    if not isinstance(spec, dict):
        return spec
    booleans = [key for key in spec if isinstance(key, bool)]
    if booleans:
        raise ValueError("a bare yes / no / true / false / on / off is a YAML boolean: quote the values, e.g. "
                         '{"yes": positive, "no": negative}, or use the preset yes-no or true-false')
    return {"" if key is None else str(key): meaning for key, meaning in spec.items()}


def unmapped_line(file_name: str, column: str, values: Counter, shown: int = 8) -> str:
    """One line naming ``column`` of ``file_name``, the values nothing maps with their row counts, and the YAML."""
    listed = ", ".join(f"{value!r} ({n} row{'s' if n > 1 else ''})" for value, n in values.most_common(shown))
    more = len(values) - shown
    listed += f" and {more} more value(s)" if more > 0 else ""
    return (f"{file_name} column {column} holds values nothing maps: {listed}; "
            f"add under options: {suggestion(column, values)}")
