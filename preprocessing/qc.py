"""The QC report of a site's shards: label table, image statistics, quarantine, and the accounting identity.

Built from what is on disk (``shard.json``, the manifests, ``quarantine.parquet``, ``qc/image_stats.parquet``),
so it describes exactly what training will read. Written as ``qc/report.json`` and ``qc/report.md``, which
stay at the site: they hold quarantine rows (record ids, file paths, details) and per-image extremes.

What leaves the site is ``central_summary``: counts per split, per split and disease, per quarantine reason,
small counts suppressed; the site writes it as ``qc/central.json`` so it can read exactly what it shares,
and the Prefect flow and MLflow publish only that.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd

from common.markdown import markdown_cell
from preprocessing.qc_counts import SAMPLE_GRID_FILE, qc_counts
from preprocessing.records import SPLITS
from preprocessing.shard_format import (
    IMAGE_STATS_FILE,
    QC_DIR,
    QUARANTINE_FILE,
    images_path,
    manifest_path,
    read_shard_info,
)


class AccountingError(RuntimeError):
    """``input rows != kept + quarantined``: a record was lost or counted twice somewhere."""


def build_report(site_dir: Path, ages: dict[str, int] | None = None) -> dict:
    """The site's full QC report: its counts (``preprocessing.qc_counts.qc_counts``), the image statistics and
    the quarantine rows; ``ages``: the scan's top-coded and unreadable ages (``ScanResult.ages``), which stay
    here (a count of patients over 89 is a small count)."""
    site_dir = Path(site_dir)
    counts = qc_counts(site_dir)
    quarantine = pd.read_parquet(site_dir / QUARANTINE_FILE)
    stats = pd.read_parquet(site_dir / IMAGE_STATS_FILE)
    return {
        **{key: counts[key] for key in ("site", "task", "content_hash", "image_size", "counts", "accounting", "labels")},
        "ages": dict(ages or {}),
        "images": _image_statistics(stats),
        "quarantine": {
            **counts["quarantine"],
            "rows": quarantine.astype(object).where(quarantine.notna(), None).to_dict(orient="records"),
        },
    }


def check_accounting(report: dict) -> None:
    """Raise ``AccountingError`` unless ``input rows = kept + quarantined``."""
    counts = report["accounting"]
    if not counts["holds"]:
        raise AccountingError(
            f"site {report['site']}: input rows {counts['input_rows']} != kept {counts['kept']} "
            f"+ quarantined {counts['quarantined']}"
        )


def write_report(site_dir: Path, report: dict) -> tuple[Path, Path]:
    """Write ``qc/report.json``, ``qc/report.md`` and, when images were kept, the sample grid
    ``qc/samples.png`` the Markdown shows; returns the report paths."""
    qc_dir = Path(site_dir) / QC_DIR
    qc_dir.mkdir(parents=True, exist_ok=True)
    json_path, md_path = qc_dir / "report.json", qc_dir / "report.md"
    json_path.write_text(json.dumps(report, indent=2) + "\n")
    md_path.write_text(render_markdown(report))
    if report["images"]["count"]:
        write_sample_grid(site_dir, qc_dir / SAMPLE_GRID_FILE)
    return json_path, md_path


CENTRAL_SUMMARY_FILE = "central.json"


def write_central_summary(site_dir: Path, summary: dict) -> Path:
    """``qc/central.json``: the site's own copy of what it shares."""
    path = Path(site_dir) / QC_DIR / CENTRAL_SUMMARY_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(summary, indent=2) + "\n")
    return path


def render_central_markdown(summary: dict) -> str:
    lines = [
        f"# QC summary: site `{summary['site']}` ({summary['task']})",
        "",
        f"Content hash `{summary['content_hash'][:16]}`, images {summary['image_size']}x{summary['image_size']}; "
        f"input rows = kept + quarantined: {'holds' if summary['accounting_holds'] else '**DOES NOT HOLD**'} "
        f"(checked at the site). Counts below {summary['min_count']} are shown as \"<{summary['min_count']}\".",
        "",
        "Kept per split: " + ", ".join(f"{split} {count}" for split, count in summary["kept_per_split"].items()) + ".",
        "",
        "| split | disease | positives | negatives |",
        "|---|---|---:|---:|",
    ]
    lines += [f"| {r['split']} | {r['disease']} | {r['positives']} | {r['negatives']} |" for r in summary["labels"]]
    lines += ["", "| quarantine stage | reason | rows |", "|---|---|---:|"]
    lines += [f"| {r['stage']} | {r['reason']} | {r['count']} |" for r in summary["quarantine_per_reason"]]
    if not summary["quarantine_per_reason"]:
        lines.append("| - | nothing quarantined | 0 |")
    return "\n".join(lines) + "\n"


def write_sample_grid(site_dir: Path, path: Path, columns: int = 8, rows: int = 2) -> Path:
    """The first split's images as training reads them, evenly spaced through the shard, each titled with its
    positive findings (first five letters; '-' none, '?' any missing label): a look at what the numbers
    describe."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    site_dir = Path(site_dir)
    info = read_shard_info(site_dir)
    split = next(split for split in SPLITS if info["counts"][split])
    images = np.load(images_path(site_dir, split), mmap_mode="r")
    labels = pd.read_parquet(manifest_path(site_dir, split), columns=list(info["diseases"]))
    picks = np.unique(np.linspace(0, len(images) - 1, min(len(images), columns * rows)).round().astype(int))
    figure, axes = plt.subplots(rows, columns, figsize=(1.6 * columns, 1.9 * rows), squeeze=False)
    for ax in axes.flat:
        ax.axis("off")
    for ax, index in zip(axes.flat, picks):
        ax.imshow(images[index], cmap="gray" if images.ndim == 3 else None, vmin=0, vmax=255)
        row = labels.iloc[index]
        title = ", ".join(d[:5] for d in info["diseases"] if row[d] == 1.0) or "-"
        ax.set_title(title + (" ?" if row.isna().any() else ""), fontsize=6)
    figure.suptitle(f"{info['site']}: {split} samples", fontsize=9)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return path


def _intensity(frame: pd.DataFrame) -> dict:
    """Mean and standard deviation of 0-255 intensities over images, each image weighted equally.

    The pooled variance is E[std_i^2 + mean_i^2] - (E[mean_i])^2 over the per-image content statistics.
    """
    mean = float(frame["mean"].mean())
    second_moment = float((frame["std"] ** 2 + frame["mean"] ** 2).mean())
    return {"count": int(len(frame)), "mean": mean, "std": math.sqrt(max(second_moment - mean**2, 0.0))}


def _image_statistics(stats: pd.DataFrame) -> dict:
    if stats.empty:
        return {"count": 0}
    sizes = stats[["rows", "columns"]].astype(int)
    return {
        **_intensity(stats),
        "inverted": int(stats["inverted"].astype(bool).sum()),
        "size_before_resize": {
            axis: {"min": int(sizes[axis].min()), "median": float(sizes[axis].median()), "max": int(sizes[axis].max())}
            for axis in ("rows", "columns")
        },
        "by_view": {str(view): _intensity(group) for view, group in stats.groupby("view", dropna=False)},
        "by_split": {str(split): _intensity(group) for split, group in stats.groupby("split")},
        "formats": _counts(stats["format"]),
        "modalities": _counts(stats["modality"]),
        "photometric": _counts(stats["photometric"]),
        "intensity_transform": _counts(stats["intensity"]),
        "transfer_syntaxes": _counts(stats["transfer_syntax"]),
    }


def _counts(column: pd.Series) -> dict[str, int]:
    return {str(key): int(value) for key, value in column.fillna("none").value_counts().sort_index().items()}


def _age_lines(ages: dict[str, int]) -> list[str]:
    if not ages:
        return []
    return [f"Ages (input rows): {ages['top_coded']} top-coded (`90+`, `>89`: read as their bound), "
            f"{ages['unreadable']} unreadable (unknown in the shards).", ""]


def render_markdown(report: dict) -> str:
    accounting = report["accounting"]
    verdict = "holds" if accounting["holds"] else "**DOES NOT HOLD**"
    lines = [
        f"# QC report: site `{report['site']}` ({report['task']})",
        "",
        f"Content hash `{report['content_hash'][:16]}`, images {report['image_size']}x{report['image_size']}.",
        "",
        f"**input rows {accounting['input_rows']} = kept {accounting['kept']} + quarantined "
        f"{accounting['quarantined']}**: {verdict}.",
        "",
        "Kept per split: " + ", ".join(f"{split} {count}" for split, count in report["counts"].items()) + ".",
        "",
        *_age_lines(report.get("ages") or {}),
        "## Labels",
        "",
        "| split | disease | positives | negatives | missing | prevalence |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for row in report["labels"]:
        prevalence = "n/a" if row["prevalence"] is None else f"{row['prevalence']:.3f}"
        lines.append(
            f"| {row['split']} | {row['disease']} | {row['positives']} | {row['negatives']} | "
            f"{row['missing']} | {prevalence} |"
        )
    lines += ["", "## Images", ""]
    images = report["images"]
    if images["count"]:
        size = images["size_before_resize"]
        lines += [
            f"{images['count']} images; intensity (0-255) mean {images['mean']:.1f}, std {images['std']:.1f}; "
            f"{images['inverted']} inverted from MONOCHROME1.",
            "",
            f"Size before resize: rows {size['rows']['min']}-{size['rows']['max']} "
            f"(median {size['rows']['median']:.0f}), columns {size['columns']['min']}-{size['columns']['max']} "
            f"(median {size['columns']['median']:.0f}).",
            "",
            "| view | images | mean | std |",
            "|---|---:|---:|---:|",
        ]
        lines += [
            f"| {view} | {group['count']} | {group['mean']:.1f} | {group['std']:.1f} |"
            for view, group in images["by_view"].items()
        ]
        lines.append("")
        for key in ("formats", "modalities", "photometric", "intensity_transform", "transfer_syntaxes"):
            lines.append(f"- {key.replace('_', ' ')}: " + ", ".join(f"{k} {v}" for k, v in images[key].items()))
        lines += ["", f"![sample images]({SAMPLE_GRID_FILE})"]
    else:
        lines.append("No image was kept.")
    quarantine = report["quarantine"]
    lines += ["", f"## Quarantine ({quarantine['count']})", ""]
    if quarantine["count"]:
        lines += ["| stage | reason | count |", "|---|---|---:|"]
        lines += [f"| {r['stage']} | {r['reason']} | {r['count']} |" for r in quarantine["by_stage_and_reason"]]
        lines += ["", "| record | source row | image | stage | reason | detail |", "|---|---|---|---|---|---|"]
        columns = ("record_id", "source_row", "image_path", "stage", "reason", "detail")
        lines += ["| " + " | ".join(markdown_cell(row[column]) for column in columns) + " |" for row in quarantine["rows"]]
    else:
        lines.append("Nothing quarantined.")
    return "\n".join(lines) + "\n"
