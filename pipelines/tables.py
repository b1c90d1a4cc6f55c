"""Markdown tables for Prefect artifacts and the terminal."""

from __future__ import annotations

import pandas as pd

from preprocessing.markdown import markdown_cell


def markdown_table(frame: pd.DataFrame, float_format: str = ".3f") -> str:
    header = "| " + " | ".join(map(str, frame.columns)) + " |"
    rule = "|" + "|".join("---:" if pd.api.types.is_numeric_dtype(frame[c]) else "---" for c in frame.columns) + "|"
    body = ["| " + " | ".join(markdown_cell(v, float_format) for v in row) + " |" for row in frame.itertuples(index=False)]
    return "\n".join([header, rule, *body]) + "\n"
