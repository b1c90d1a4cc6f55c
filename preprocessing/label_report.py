"""Look at labels before images: per split and per disease, positives / negatives / missing / prevalence.

``label_report`` is a pure function of a ``ScanResult`` (metadata only, seconds on 200k rows);
``render_label_report`` draws it as rich tables. ``fedauc sites report x.yaml --labels-only [--json]``.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from rich.console import Console
from rich.table import Table

from common.errors import DataError
from preprocessing.records import RECORD_COLUMNS, SPLITS, VIEW_TASKS, VIEWS


def _counts(records: pd.DataFrame, diseases: list[str], views: bool) -> dict:
    labels = {}
    for disease in diseases:
        values = records[disease].to_numpy()
        positives = int(np.sum(values == 1.0))
        negatives = int(np.sum(values == 0.0))
        labeled = positives + negatives
        labels[disease] = {
            "positives": positives,
            "negatives": negatives,
            "missing": int(np.isnan(values).sum()),
            "prevalence": positives / labeled if labeled else None,  # among labeled images
        }
    counts = {
        "images": len(records),
        "patients": int(records["patient_id"].nunique()),
        "studies": int(records["study_id"].nunique()),
        "labels": labels,
    }
    if views:
        found = records["view"].value_counts()
        counts["views"] = {view: int(found.get(view, 0)) for view in VIEWS}
    return counts


def label_report(scan_result, task: str | None = None, unmapped: dict | None = None) -> dict:
    """Counts per split (train / valid / test) and overall, and the quarantine summary. Views (PA, AP, ...) are
    counted unless ``task`` is one whose images have none (``records.VIEW_TASKS``: a dermatology site's).
    ``unmapped``: per label column, the values nothing maps and their rows (``sites.unmapped_label_values``).
    Every count is of the metadata, before decoding: ``kept`` rows may still be quarantined by the decoder.

    ``input_rows == kept + quarantined`` is stated in the report (``balanced``) so a reader can check it.
    """
    records = scan_result.records
    diseases = [c for c in records.columns if c not in RECORD_COLUMNS]
    views = task is None or task in VIEW_TASKS
    quarantine = scan_result.quarantine
    kept, quarantined = len(records), len(quarantine)
    report = {
        "input_rows": scan_result.input_rows,
        "kept": kept,
        "quarantined": quarantined,
        "balanced": scan_result.input_rows == kept + quarantined,
        "quarantine_by_reason": {str(k): int(v) for k, v in quarantine["reason"].value_counts().sort_index().items()},
        "diseases": diseases,
        "splits": {split: _counts(records[records["split"] == split], diseases, views) for split in SPLITS},
        "all": _counts(records, diseases, views),
        "metadata_files": [str(p) for p in scan_result.metadata_files],
        "counted": "before decoding",
        "unmapped_label_values": {column: dict(values.most_common()) for column, values in (unmapped or {}).items()},
    }
    report["warnings"] = label_warnings(report)
    return report


def label_warnings(report: dict) -> list[str]:
    """What makes a metric undefined before any training: an empty split, or a split without a positive (or
    negative) for a disease -- its AUC and pAUC cannot be computed there."""
    warnings = []
    for split, counts in report["splits"].items():
        if counts["images"] == 0:
            warnings.append(f"split {split}: no images")
            continue
        for disease, c in counts["labels"].items():
            if c["positives"] == 0 or c["negatives"] == 0:
                missing = "positive" if c["positives"] == 0 else "negative"
                warnings.append(f"split {split}: no {missing} for {disease} ({c['positives'] + c['negatives']} "
                                f"labeled images): its AUC there is undefined")
    return warnings


def require_usable_rows(report: dict, site: str) -> None:
    """A site with no row left after scanning would give an empty shard that only training rejects."""
    if report["kept"] > 0:
        return
    files = ", ".join(report["metadata_files"])
    if report["input_rows"] == 0:
        raise DataError(f"site {site}: {files}: no data rows, only a header",
                        fix="export the labels again with one row per image")
    reasons = ", ".join(f"{reason}: {n}" for reason, n in report["quarantine_by_reason"].items())
    raise DataError(f"site {site}: no usable image row: all {report['input_rows']} rows of {files} are quarantined "
                    f"({reasons})", fix=f"check the site's views and columns; "
                                    f"`fedauc sites report <{site}.yaml> --labels-only` shows the counts")


def render_label_report(report: dict, console: Console, title: str = "labels") -> None:
    console.print(
        f"[bold]{title}[/]: {report['input_rows']} input rows = {report['kept']} kept + "
        f"{report['quarantined']} quarantined" + ("" if report["balanced"] else "  [red]UNBALANCED[/]")
        + " (metadata only, before decoding: `fedauc preprocess` may quarantine more; its qc/report.md counts "
          "what the shards hold)"
    )
    columns = [*SPLITS, "all"]
    sections = {**report["splits"], "all": report["all"]}
    table = Table(title="Labels (prevalence among labeled images)")
    for name in ("split", "disease", "positives", "negatives", "missing", "prevalence"):
        table.add_column(name, justify="left" if name in ("split", "disease") else "right")
    for split in columns:
        for disease in report["diseases"]:
            c = sections[split]["labels"][disease]
            prevalence = "-" if c["prevalence"] is None else f"{100 * c['prevalence']:.1f}%"
            first = split if disease == report["diseases"][0] else ""
            table.add_row(first, disease, str(c["positives"]), str(c["negatives"]), str(c["missing"]), prevalence,
                          end_section=disease == report["diseases"][-1])
    console.print(table)
    views = "views" in report["all"]
    counts = Table(title="Images, patients, studies" + (", views" if views else ""))
    counts.add_column("")
    for split in columns:
        counts.add_column(split, justify="right")
    for key in ("images", "patients", "studies"):
        counts.add_row(key, *(str(sections[s][key]) for s in columns))
    for view in VIEWS if views else ():
        counts.add_row(f"view {view}", *(str(sections[s]["views"][view]) for s in columns))
    console.print(counts)
    if report["quarantine_by_reason"]:
        reasons = Table(title="Quarantined")
        reasons.add_column("reason")
        reasons.add_column("rows", justify="right")
        for reason, count in report["quarantine_by_reason"].items():
            reasons.add_row(reason, str(count))
        console.print(reasons)
    if report.get("unmapped_label_values"):
        values = Table(title="Label values nothing maps (their rows are quarantined as unparsable_label)")
        for name in ("column", "value", "rows"):
            values.add_column(name, justify="right" if name == "rows" else "left")
        for column, counts in report["unmapped_label_values"].items():
            for value, count in counts.items():
                values.add_row(column, repr(value), str(count))
        console.print(values)
    for warning in report.get("warnings", []):
        console.print(f"[yellow]warning[/]: {warning}")
