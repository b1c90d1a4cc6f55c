"""Markdown tables for Prefect artifacts and the terminal."""

from __future__ import annotations

import math

import pandas as pd


def _cell(value, float_format: str) -> str:
    if isinstance(value, float):
        return "n/a" if math.isnan(value) else format(value, float_format)
    # A '|' inside a name or message would split the row.
    return str(value).replace("|", "\\|").replace("\n", " ")


def markdown_table(frame: pd.DataFrame, float_format: str = ".3f") -> str:
    header = "| " + " | ".join(map(str, frame.columns)) + " |"
    rule = "|" + "|".join("---:" if pd.api.types.is_numeric_dtype(frame[c]) else "---" for c in frame.columns) + "|"
    body = ["| " + " | ".join(_cell(v, float_format) for v in row) + " |" for row in frame.itertuples(index=False)]
    return "\n".join([header, rule, *body]) + "\n"
