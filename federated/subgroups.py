"""Performance per subgroup (sex, age band, view, manufacturer, site) from score histograms, for the model card.

At the site (an evaluation job's ``EvaluationRelease.scored``), per split, each image's subgroups come from its
shard: sex, age and view from the manifest, the DICOM Manufacturer from ``qc/image_stats.parquet`` ("unknown" for
PNG/JPEG files, DICOMs without the tag, and shards written before preprocessing kept it). A *cell* is one
subgroup, one disease, one site. Each cell leaves as the evaluation's own site summary does (a report row of
counts and a suppression flag, and the positives' and negatives' score histograms), under one stricter rule: a
cell with fewer than ``min_count`` positives or negatives leaves as its suppression flag and "<N" counts only,
its histograms zeros, so that nothing of it reaches the centre. The catalogue of subgroups is fixed (every sex,
age band and, for a task with views, view; manufacturer "unknown" and "other"), so which keys a site sends says nothing of its
patients; a manufacturer is named only as a known vendor (``VENDORS``: the tag's free text never leaves), and one
with fewer than ``min_count`` images of the split joins "other". Under an evaluation
noise multiplier the cells are withheld (``federated.dp.evaluation``): each image falls in several
subgroups, which the one Gaussian mechanism charged per model does not cover.

At the centre (``pooled``), each subgroup's released cells are summed over sites into its AUC, DeLong's
95 % interval from the histograms widened by the binning bound (``models.metrics.histogram_auc_interval``), the
counts and how many sites contributed; the site subgroup is each site's own split summary, where the site
reported the disease. Per attribute and disease, the gap between the best and the worst reported subgroup
("unknown" is no population and is left out) with the interval of that difference (disjoint groups:
``models.metrics.histogram_auc_difference``); best and worst are picked after looking, so the interval is
that of this pair's difference, not a test over all pairs.

Metric keys (``<split>/`` prefixed like the evaluation's): ``subgroup/<attribute>.<value>/auc/<disease>``,
``.../auc_bound/<disease>``, ``.../auc_ci95_low/<disease>``, ``.../auc_ci95_high/<disease>``,
``.../n_pos/<disease>``, ``.../n_neg/<disease>``, ``.../sites/<disease>``; ``subgroup_gap/<attribute>/auc/<disease>``
and its ``auc_ci95_low`` / ``auc_ci95_high``. A subgroup too small to report is absent from the metrics and
says why in the suppression record.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np

from common.small_counts import is_small, to_wire
from models.metrics import histogram_auc, histogram_auc_difference, histogram_auc_interval, score_histograms
from preprocessing.records import VIEW_TASKS, VIEWS
from preprocessing.shard_format import IMAGE_STATS_FILE, manifest_path, read_columns, read_shard_info, rewrite_fix

ATTRIBUTES = ("sex", "age", "view", "manufacturer", "site")  # "site" is formed at the centre
SEXES = ("F", "M", "unknown")
# Age bands in years, [low, high); the labels are MLflow-key safe (no "+").
AGE_BANDS = ((0, 18, "0-17"), (18, 40, "18-39"), (40, 60, "40-59"), (60, 80, "60-79"), (80, math.inf, "80 or more"))
UNKNOWN, OTHER = "unknown", "other"
# The manufacturers a site may name, each with the spellings of its DICOM Manufacturer tag that mean it. The tag
# is free text a modality's installer types (a site's own name or a service engineer's has been seen there), so
# only a known vendor leaves the site; anything else is "other".
VENDORS = {"Agfa": ("agfa",), "Canon": ("canon",), "Carestream": ("carestream", "kodak"), "DRTECH": ("drtech",),
           "Fujifilm": ("fuji",), "GE": ("ge ", "ge healthcare", "ge medical", "general electric"),
           "Hitachi": ("hitachi",), "Hologic": ("hologic",), "Konica Minolta": ("konica",), "Philips": ("philips",),
           "Rayence": ("rayence",), "Samsung": ("samsung",), "Shimadzu": ("shimadzu",), "Siemens": ("siemens",),
           "Toshiba": ("toshiba",), "Varex": ("varex", "varian"), "Vieworks": ("vieworks",)}


def vendor(manufacturer: str) -> str:
    """The known vendor a DICOM Manufacturer names, else "other"."""
    text = manufacturer.strip().lower() + " "
    return next((name for name, spellings in VENDORS.items() if any(text.startswith(s) for s in spellings)), OTHER)
CELL = "@"  # a cell's summary key: "<split>@<attribute>.<value>"
_SCOPE, _GAP = "subgroup", "subgroup_gap"
# The columns of evaluation.site_summary's report this module fills (counts, suppression flag).
_N_POS, _N_NEG, _SUPPRESSED = 0, 1, 2


def group_name(attribute: str, value: str) -> str:
    """``<attribute>.<value>`` with what MLflow refuses in a metric key replaced (a manufacturer's free text)."""
    safe = re.sub(r"[^\w.\- ]", "-", str(value)).strip()[:40] or UNKNOWN
    return f"{attribute}.{safe}"


def _age_band(age) -> str:
    if age is None or not math.isfinite(age) or age < 0:
        return UNKNOWN
    return next(label for low, high, label in AGE_BANDS if low <= age < high)


def split_groups(site_dir: str | Path, split: str, min_count: int) -> dict[str, np.ndarray]:
    """``{group name: boolean mask over the split's rows}`` for every subgroup of the fixed catalogue at this
    site (the module docstring), read from the shard's manifest and ``qc/image_stats.parquet``."""
    site_dir = Path(site_dir)
    table = read_columns(manifest_path(site_dir, split), ["record_id", "sex", "age", "view"], rewrite_fix(site_dir))
    rows = table.to_pydict()
    values = {
        "sex": [s if s in SEXES else UNKNOWN for s in rows["sex"]],
        "age": [_age_band(a) for a in rows["age"]],
        "view": [v if v in VIEWS else UNKNOWN for v in rows["view"]],
        "manufacturer": _manufacturers(site_dir, split, rows["record_id"], min_count),
    }
    catalogue = {"sex": SEXES, "age": [label for *_, label in AGE_BANDS] + [UNKNOWN],
                 "manufacturer": sorted(set(values["manufacturer"]) | {UNKNOWN, OTHER})}
    if read_shard_info(site_dir)["task"] in VIEW_TASKS:  # a skin photograph has no projection
        catalogue["view"] = VIEWS
    return {group_name(attribute, value): np.array([v == value for v in values[attribute]], dtype=bool)
            for attribute, names in catalogue.items() for value in names}


def _manufacturers(site_dir: Path, split: str, record_ids: list[str], min_count: int) -> list[str]:
    """Each row's DICOM Manufacturer; one with fewer than ``min_count`` images of the split is "other"."""
    stats_file = site_dir / IMAGE_STATS_FILE
    found: dict[str, str] = {}
    if stats_file.is_file():
        import pyarrow.parquet as pq

        names = pq.ParquetFile(stats_file).schema_arrow.names
        if "manufacturer" in names:
            stats = pq.read_table(stats_file, columns=["record_id", "split", "manufacturer"]).to_pydict()
            found = {r: m for r, s, m in zip(stats["record_id"], stats["split"], stats["manufacturer"])
                     if s == split and isinstance(m, str) and m}  # an all-null column reads as NaN
    names = [vendor(found[r]) if found.get(r) else UNKNOWN for r in record_ids]
    counts = {n: names.count(n) for n in set(names)}
    return [n if n == UNKNOWN or not is_small(counts[n], min_count) else OTHER for n in names]


def cell_summaries(labels: np.ndarray, scores: np.ndarray, groups: dict[str, np.ndarray], bins: int,
                   min_count: int, report_width: int) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """``{group: (report (C, report_width), histograms (C, 2, bins))}`` of one site's split: per disease the
    cell's counts (small ones ``ON_WIRE``) and suppression flag, no metric (NaN), and the histograms only of a
    cell with at least ``min_count`` positives and negatives (zeros otherwise)."""
    labels, scores = np.asarray(labels, dtype=np.float64), np.asarray(scores, dtype=np.float64)
    C = labels.shape[1]
    out = {}
    for name, mask in groups.items():
        report, histograms = np.full((C, report_width), np.nan), np.zeros((C, 2, bins))
        for c in range(C):
            hp, hn = score_histograms(labels[mask, c], scores[mask, c], bins)
            counts = np.array([hp.sum(), hn.sum()])
            small = bool(is_small(counts, min_count).any())
            report[c, _N_POS : _N_NEG + 1] = to_wire(counts, min_count)
            report[c, _SUPPRESSED] = float(small)
            if not small:
                histograms[c] = hp, hn
        out[name] = report, histograms
    return out


def pooled(summaries: list[dict], site_names: list[str], split: str, diseases: list[str],
           min_count: int) -> tuple[dict[str, float], dict[str, str]]:
    """The split's subgroup metrics and suppression record (keys without the ``<split>/`` prefix; the module
    docstring) from the sites' summaries (``summaries[k]``: site ``site_names[k]``'s, split -> (report,
    histograms), cells under ``<split>@<group>``)."""
    cells: dict[str, list[tuple[np.ndarray, np.ndarray]]] = {}
    for name, summary in zip(site_names, summaries):
        if split in summary and not np.isnan(summary[split][0][:, _N_POS]).all():
            cells.setdefault(group_name("site", name), []).append(summary[split])
        for key, cell in summary.items():
            if key.startswith(split + CELL):
                cells.setdefault(key.removeprefix(split + CELL), []).append(cell)
    metrics: dict[str, float] = {}
    suppressed: dict[str, str] = {}
    released: dict[tuple[str, str], dict[str, tuple[np.ndarray, np.ndarray]]] = {}
    for group, parts in cells.items():
        for c, disease in enumerate(diseases):
            shown = [(r, h) for r, h in parts if r[c, _SUPPRESSED] == 0 and not np.isnan(r[c, _N_POS])]
            held = sum(r[c, _SUPPRESSED] == 1 for r, _ in parts)
            key = f"{_SCOPE}/{group}/auc/{disease}"
            if not shown:
                if held:
                    suppressed[key] = f"too small to report: fewer than {min_count} positives or negatives at every site"
                continue
            hp, hn = np.sum([h[c, 0] for _, h in shown], axis=0), np.sum([h[c, 1] for _, h in shown], axis=0)
            auc, interval = histogram_auc(hp, hn), histogram_auc_interval(hp, hn)
            base = f"{_SCOPE}/{group}"
            metrics.update({key: float(auc.value), f"{base}/auc_bound/{disease}": auc.bound,
                            f"{base}/auc_ci95_low/{disease}": interval.low,
                            f"{base}/auc_ci95_high/{disease}": interval.high,
                            f"{base}/n_pos/{disease}": float(hp.sum()), f"{base}/n_neg/{disease}": float(hn.sum()),
                            f"{base}/sites/{disease}": float(len(shown))})
            if held:
                suppressed[f"{base}/withheld_sites/{disease}"] = (
                    f"{held} site(s) below {min_count} positives or negatives left out")
            released.setdefault((group.split(".", 1)[0], disease), {})[group] = (hp, hn)
    for (attribute, disease), groups in released.items():
        pair = gap_pair({g: metrics[f"{_SCOPE}/{g}/auc/{disease}"] for g in groups
                         if not math.isnan(metrics[f"{_SCOPE}/{g}/auc_ci95_low/{disease}"])})
        if pair is None:
            continue
        difference = histogram_auc_difference(groups[pair[0]], groups[pair[1]])
        base = f"{_GAP}/{attribute}"
        metrics.update({f"{base}/auc/{disease}": difference.value, f"{base}/auc_ci95_low/{disease}": difference.low,
                        f"{base}/auc_ci95_high/{disease}": difference.high})
    return metrics, suppressed


def gap_pair(aucs: dict[str, float]) -> tuple[str, str] | None:
    """(best, worst) of one attribute's subgroups with an interval (``{group: AUC}``), "unknown" left out;
    None with fewer than two."""
    known = {g: v for g, v in aucs.items() if not g.endswith("." + UNKNOWN) and not math.isnan(v)}
    if len(known) < 2:
        return None
    return max(known, key=known.get), min(known, key=known.get)
