"""Tables for Prefect artifacts, the terminal and files: Markdown, rich, CSV and HTML.

pandas is imported where a frame is made or read, not at the top: ``fedauc compare`` over HTTP prints its rows
without it (its import is a third of that command's start)."""

from __future__ import annotations

import html
import math
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from rich.table import Table

from common.errors import ConfigError
from common.markdown import markdown_cell

if TYPE_CHECKING:
    import pandas as pd

NAN = float("nan")


def markdown_table(frame: pd.DataFrame, float_format: str = ".3f") -> str:
    import pandas as pd

    header = "| " + " | ".join(map(str, frame.columns)) + " |"
    rule = "|" + "|".join("---:" if pd.api.types.is_numeric_dtype(frame[c]) else "---" for c in frame.columns) + "|"
    body = ["| " + " | ".join(markdown_cell(v, float_format) for v in row) + " |" for row in frame.itertuples(index=False)]
    return "\n".join([header, rule, *body]) + "\n"


def interval_columns(columns: Iterable[str]) -> list[str]:
    """The columns ``X`` that have ``X low`` and ``X high`` beside them."""
    columns = list(columns)
    return [c for c in columns if f"{c} low" in columns and f"{c} high" in columns]


def interval_cell(value: float, low: float, high: float, float_format: str = ".3f") -> str:
    """``"value [low, high]"``, or the value alone where a bound is missing."""
    if math.isnan(low) or math.isnan(high):
        return markdown_cell(value, float_format)
    return f"{value:{float_format}} [{low:{float_format}}, {high:{float_format}}]"


def fold_intervals(frame: pd.DataFrame, float_format: str = ".3f") -> pd.DataFrame:
    """A copy for display with each column ``X`` that has ``X low`` and ``X high`` beside it shown as
    ``"value [low, high]"`` and the two bound columns dropped (CSV and HTML keep them as numbers)."""
    out = frame.copy()
    for column in interval_columns(frame.columns):
        low, high = f"{column} low", f"{column} high"
        out[column] = [interval_cell(v, lo, hi, float_format) for v, lo, hi in zip(frame[column], frame[low], frame[high])]
        out = out.drop(columns=[low, high])
    return out


def fold_interval_rows(columns: Sequence[str], rows: list[dict], float_format: str = ".3f") -> tuple[list[str], list[dict]]:
    """``fold_intervals`` of plain rows (a missing cell is NaN, as in a frame made of them): the columns shown
    and the rows with their folded cells."""
    folded = interval_columns(columns)
    bounds = {f"{column} {end}" for column in folded for end in ("low", "high")}
    shown = [column for column in columns if column not in bounds]
    return shown, [{column: interval_cell(row.get(column, NAN), row.get(f"{column} low", NAN),
                                          row.get(f"{column} high", NAN), float_format)
                    if column in folded else row.get(column, NAN) for column in shown} for row in rows]


def rich_table(columns: Sequence[str], rows: list[dict], title: str, keep_whole: Iterable[str] = ()) -> Table:
    """Plain rows as a rich table (a missing cell is NaN); numbers right-aligned; the ``keep_whole`` columns
    are never shortened (a run name cut to "codasca-I…" cannot be told apart from its neighbours), the others
    wrap when the terminal is narrow."""
    table = Table(title=title)
    keep_whole = set(keep_whole)
    cells = [[row.get(column, NAN) for column in columns] for row in rows]
    for i, column in enumerate(columns):
        numeric = all(isinstance(r[i], (int, float)) and not isinstance(r[i], bool) for r in cells)
        widest = max([len(str(column)), *(len(str(r[i])) for r in cells)]) if column in keep_whole else None
        table.add_column(str(column), justify="right" if numeric else "left", no_wrap=column in keep_whole,
                         min_width=widest)
    for row in cells:
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
