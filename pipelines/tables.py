"""Tables for Prefect artifacts, the terminal and files: Markdown, rich, CSV and HTML."""

from __future__ import annotations

import html
import math
from collections.abc import Iterable
from pathlib import Path

import pandas as pd
from rich.table import Table

from preprocessing.errors import ConfigError
from preprocessing.markdown import markdown_cell


def markdown_table(frame: pd.DataFrame, float_format: str = ".3f") -> str:
    header = "| " + " | ".join(map(str, frame.columns)) + " |"
    rule = "|" + "|".join("---:" if pd.api.types.is_numeric_dtype(frame[c]) else "---" for c in frame.columns) + "|"
    body = ["| " + " | ".join(markdown_cell(v, float_format) for v in row) + " |" for row in frame.itertuples(index=False)]
    return "\n".join([header, rule, *body]) + "\n"


def fold_intervals(frame: pd.DataFrame, float_format: str = ".3f") -> pd.DataFrame:
    """A copy for display with each column ``X`` that has ``X low`` and ``X high`` beside it shown as
    ``"value [low, high]"`` and the two bound columns dropped (CSV and HTML keep them as numbers)."""
    out = frame.copy()
    for column in frame.columns:
        low, high = f"{column} low", f"{column} high"
        if low in frame and high in frame:
            out[column] = [markdown_cell(v, float_format) if math.isnan(lo) or math.isnan(hi)
                           else f"{v:{float_format}} [{lo:{float_format}}, {hi:{float_format}}]"
                           for v, lo, hi in zip(frame[column], frame[low], frame[high])]
            out = out.drop(columns=[low, high])
    return out


def rich_table(frame: pd.DataFrame, title: str, keep_whole: Iterable[str] = ()) -> Table:
    """The frame as a rich table; the ``keep_whole`` columns are never shortened (a run name cut to
    "codasca-I…" cannot be told apart from its neighbours), the others wrap when the terminal is narrow."""
    table = Table(title=title)
    keep_whole = set(keep_whole)
    for column in frame.columns:
        numeric = pd.api.types.is_numeric_dtype(frame[column])
        widest = max([len(str(column)), *(len(str(v)) for v in frame[column])]) if column in keep_whole else None
        table.add_column(str(column), justify="right" if numeric else "left", no_wrap=column in keep_whole,
                         min_width=widest)
    for row in frame.itertuples(index=False):
        table.add_row(*(("n/a" if math.isnan(v) else f"{v:.3f}") if isinstance(v, float) else str(v) for v in row))
    return table


def write_table(frame: pd.DataFrame, path: str | Path, title: str = "") -> Path:
    """CSV (full precision) or HTML (three decimals, a titled page) by the file's suffix."""
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix == ".csv":
        frame.to_csv(path, index=False)
    elif suffix in (".html", ".htm"):
        body = frame.to_html(index=False, float_format=lambda v: f"{v:.3f}", na_rep="n/a", border=0)
        path.write_text(f"<!doctype html>\n<html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
                        "<style>table{border-collapse:collapse;font-family:sans-serif}td,th{padding:2px 8px;"
                        "text-align:right}td:first-child{text-align:left}</style></head>\n"
                        f"<body><h1>{html.escape(title)}</h1>\n{body}\n</body></html>\n")
    else:
        raise ConfigError(f"{path}: cannot tell the format from the suffix {suffix!r}", fix="name the file .csv or .html")
    return path
