"""Markdown table cells, shared by the QC report (``preprocessing.qc``) and the pipelines' tables
(``pipelines.tables``): one escaping rule for every table fedauc writes."""

from __future__ import annotations

import math


def markdown_cell(value, float_format: str = ".3f") -> str:
    """One table cell: floats formatted (NaN as "n/a"), and a '|' or a line break inside a name or an
    error message escaped so that it cannot split the row."""
    if isinstance(value, float):
        return "n/a" if math.isnan(value) else format(value, float_format)
    return str(value).replace("|", "\\|").replace("\n", " ")
