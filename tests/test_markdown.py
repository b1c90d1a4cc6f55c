"""One Markdown cell rule for every table fedauc writes: the QC report's and the pipelines' tables."""

import math

import pandas as pd

from common.markdown import markdown_cell
from pipelines.tables import markdown_table
from preprocessing.qc import render_markdown


def test_cells_escape_pipes_and_line_breaks_and_format_floats():
    assert markdown_cell("a|b\nc") == "a\\|b c"
    assert markdown_cell(0.12345) == "0.123" and markdown_cell(0.12345, ".1f") == "0.1"
    assert markdown_cell(math.nan) == "n/a" and markdown_cell(7) == "7"


def test_the_qc_report_and_the_pipeline_tables_escape_alike():
    detail = "bad | header\nline 2"
    table = markdown_table(pd.DataFrame({"detail": [detail]}))
    report = {
        "site": "s", "task": "melanoma", "content_hash": "0" * 16, "image_size": 8, "counts": {"train": 0},
        "accounting": {"input_rows": 1, "kept": 0, "quarantined": 1, "holds": True}, "labels": [],
        "images": {"count": 0},
        "quarantine": {"count": 1, "by_stage_and_reason": [{"stage": "decode", "reason": "unreadable_file", "count": 1}],
                       "rows": [{"record_id": "r|1", "source_row": "x.csv:2", "image_path": "a.dcm", "stage": "decode",
                                 "reason": "unreadable_file", "detail": detail}]},
    }
    qc = render_markdown(report)
    assert markdown_cell(detail) in table.splitlines()[2]
    assert "| r\\|1 | x.csv:2 | a.dcm | decode | unreadable_file | " + markdown_cell(detail) + " |" in qc.splitlines()
