"""The counts of a site's QC report and what of them leaves the site (``central_summary``), on numpy and
pyarrow alone.

``preprocessing.qc.build_report`` adds to these counts the image statistics and the quarantine rows, which stay
at the site (pandas). A hospital's training process reports its data to the centre with every training
(``federated.sites.site_report``): it needs only the counts, read here from what is on disk (``shard.json``, the
manifests' label columns, ``quarantine.parquet``'s stage and reason), so it loads no pandas.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np

from common.small_counts import is_suppressed, released
from preprocessing.records import SPLITS
from preprocessing.shard_format import (
    QUARANTINE_FILE,
    float_columns,
    manifest_path,
    read_columns,
    read_shard_info,
    rewrite_fix,
)

SAMPLE_GRID_FILE = "samples.png"
# Complementary suppression: a count hidden because its partner was below the threshold (positives +
# negatives often equal the split size, so one shown count would give the small one away).
WITHHELD = "withheld"


def qc_counts(site_dir: Path) -> dict:
    """The QC report's site, task, content hash, image size, kept images per split, accounting identity,
    label table (per split and disease: positives, negatives, missing, prevalence) and quarantined rows per
    stage and reason."""
    site_dir = Path(site_dir)
    info = read_shard_info(site_dir)
    fix = rewrite_fix(site_dir)
    labels = {split: float_columns(manifest_path(site_dir, split), info["diseases"], fix)
              for split in SPLITS if info["counts"][split]}
    quarantine = read_columns(site_dir / QUARANTINE_FILE, ("stage", "reason"), fix)
    kept = sum(len(table) for table in labels.values())
    accounting = {"input_rows": int(info["input_rows"]), "kept": int(kept), "quarantined": quarantine.num_rows}
    accounting["holds"] = accounting["input_rows"] == accounting["kept"] + accounting["quarantined"]
    # Rows without a stage or reason are not counted under one, as a group-by leaves them out.
    reasons = Counter(pair for pair in zip(quarantine.column("stage").to_pylist(), quarantine.column("reason").to_pylist())
                      if None not in pair)
    return {
        "site": info["site"],
        "task": info["task"],
        "content_hash": info["content_hash"],
        "image_size": info["image_size"],
        "counts": info["counts"],
        "accounting": accounting,
        "labels": [_label_row(split, disease, table[:, k]) for split, table in labels.items()
                   for k, disease in enumerate(info["diseases"])],
        "quarantine": {"count": accounting["quarantined"],
                       "by_stage_and_reason": [{"stage": stage, "reason": reason, "count": count}
                                               for (stage, reason), count in sorted(reasons.items())]},
    }


def _label_row(split: str, disease: str, labels: np.ndarray) -> dict:
    positives, negatives = int((labels == 1.0).sum()), int((labels == 0.0).sum())
    return {
        "split": split,
        "disease": disease,
        "positives": positives,
        "negatives": negatives,
        "missing": int(np.isnan(labels).sum()),
        # Prevalence among labelled images: missing labels are masked in training, not negatives.
        "prevalence": positives / (positives + negatives) if positives + negatives else None,
    }


def suppressed_label_counts(positives: int, negatives: int, min_count: int) -> dict[str, int | str]:
    """Positives and negatives of one disease as they may leave a site: each below ``min_count`` suppressed,
    and its partner withheld (the two often add up to a count shown elsewhere)."""
    cells = {"positives": released(positives, min_count), "negatives": released(negatives, min_count)}
    if is_suppressed(cells["positives"]) != is_suppressed(cells["negatives"]):
        cells = {key: value if is_suppressed(value) else WITHHELD for key, value in cells.items()}
    return cells


def central_summary(report: dict, min_count: int = 10, qc_grid: bool = False) -> dict:
    """What of a QC report (or of its counts, ``qc_counts``) leaves the site. Kept images per split, positives
    and negatives per split and disease, quarantined rows per stage and reason, each below ``min_count``
    suppressed; no totals (a total beside its parts gives a suppressed part away), no rows, paths, ids or
    per-image values. The accounting identity is checked at the site and leaves as yes / no. ``qc_grid``
    records the site's consent to share its sample grid (real pixels)."""
    labels = [{"split": row["split"], "disease": row["disease"],
               **suppressed_label_counts(row["positives"], row["negatives"], min_count)} for row in report["labels"]]
    return {
        "site": report["site"],
        "task": report["task"],
        "content_hash": report["content_hash"],
        "image_size": report["image_size"],
        "min_count": min_count,
        "accounting_holds": bool(report["accounting"]["holds"]),
        "kept_per_split": {split: released(count, min_count) for split, count in report["counts"].items()},
        "labels": labels,
        "quarantine_per_reason": [
            {"stage": row["stage"], "reason": row["reason"], "count": released(row["count"], min_count)}
            for row in report["quarantine"]["by_stage_and_reason"]
        ],
        "qc_grid_shared": bool(qc_grid),
    }
