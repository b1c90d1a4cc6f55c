"""``fedauc predict`` and ``fedauc thresholds``: a registered model on a hospital's files, written to a table.

Inputs are files, folders or site YAMLs (a site's dataset as its adapter lists it, optionally one split).
The output (CSV or Parquet, by its suffix) has one row per image, written chunk by chunk: the source file,
the DICOM UIDs, the model's name and version, which operating points were used, per disease its
probability and its decision, and for a refused file the reason. It stays at the hospital: it holds per-image
scores and paths.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pa_csv
import pyarrow.parquet as pq
import torch

from common.errors import ConfigError, DataError
from federated import ood
from federated.data import load_shard
from models.metrics.histograms import score_histograms
from pipelines.model_package import calibration as cal
from pipelines.model_package import thresholds as op
from pipelines.model_package.loading import Chosen
from pipelines.model_package.predict import (
    OOD_COLUMN,
    REFUSED,
    SCORED,
    UID_COLUMNS,
    Item,
    Scorer,
    calibrated_column,
    decisions,
    folder_items,
    probability_column,
    score_items,
)
from preprocessing.sites import SiteConfig, load_site


def input_items(inputs: list[str], split: str | None, set_aside: list[dict] | None = None) -> Iterator[Item]:
    """Files (rooted at their own folder), folders (every file under them) and site YAMLs (the site's records,
    rooted at its data root), in the order given. ``set_aside`` receives a refused row for every record a site's
    scan quarantined (scoring its whole dataset, no ``split``): nothing a site lists is dropped silently."""
    for text in inputs:
        path = Path(text)
        if path.suffix in (".yaml", ".yml") and path.is_file():
            site = load_site(path)
            yield from site_items(site, split, set_aside)
        elif path.is_dir():
            yield from folder_items(path)
        else:  # a missing or hostile file is a row with its reason, not an error of the command
            yield Item(str(path), str(path.parent.resolve()))


def site_items(site: SiteConfig, split: str | None, set_aside: list[dict] | None = None) -> Iterator[Item]:
    from preprocessing.scan import scan_site

    scan = scan_site(site)
    records = scan.records
    if split:  # quarantined records belong to no split
        records = records[records["split"] == split]
    elif set_aside is not None:
        set_aside.extend(scan_refusals(site, scan.quarantine))
    root = str(Path(site.root).resolve())
    for image_path in records["image_path"]:
        yield Item(str(Path(site.root) / image_path), root)


def scan_refusals(site: SiteConfig, quarantine) -> list[dict]:
    """A refused row per record the site's scan quarantined (its metadata row or image, with the scan's
    reason): the rows a prediction table ends with."""
    rows = []
    for record in quarantine.itertuples(index=False):
        image = str(record.image_path) if isinstance(record.image_path, str) and record.image_path else ""
        source = str(Path(site.root) / image) if image else f"{site.name}: metadata row {record.source_row}"
        rows.append({"source": source, "status": REFUSED, "reason": str(record.reason), "detail": str(record.detail)})
    return rows


def output_schema(diseases: list[str]) -> pa.Schema:
    fields = [("source", pa.string()), ("status", pa.string()), ("reason", pa.string()), ("detail", pa.string())]
    fields += [(c, pa.string()) for c in UID_COLUMNS]
    fields += [("model", pa.string()), ("model_version", pa.string()), ("operating_point", pa.string())]
    fields += [(probability_column(d), pa.float64()) for d in diseases] + [(d, pa.bool_()) for d in diseases]
    fields += [(calibrated_column(d), pa.float64()) for d in diseases]
    return pa.schema([*fields, (OOD_COLUMN, pa.float64())])


class TableWriter:
    """CSV or Parquet by the output's suffix, a chunk at a time; written to a temporary name and renamed at
    the end, so that a run that stops leaves no half table under the name asked for."""

    def __init__(self, path: Path, schema: pa.Schema):
        if path.suffix not in (".csv", ".parquet"):
            raise ConfigError(f"--out {path}: unknown table format", fix="name the output *.csv or *.parquet")
        self.path, self.schema = path, schema
        self.partial = path.with_name(path.name + ".partial")
        path.parent.mkdir(parents=True, exist_ok=True)
        self.writer = (pq.ParquetWriter(self.partial, schema) if path.suffix == ".parquet"
                       else pa_csv.CSVWriter(self.partial, schema))

    def write(self, rows: list[dict]) -> None:
        self.writer.write_table(pa.Table.from_pylist(rows, schema=self.schema))

    def close(self, complete: bool) -> None:
        self.writer.close()
        if complete:
            self.partial.replace(self.path)
        else:
            self.partial.unlink(missing_ok=True)


def predict_to_table(scorer: Scorer, items: Iterator[Item], out: Path, chosen: Chosen, batch_size: int = 64,
                     workers: int = 1, progress=None, set_aside: list[dict] = ()) -> dict[str, int]:
    """Score ``items`` into ``out``, then the rows ``set_aside`` holds once they are read (the records their
    site's scan refused); returns the counts of rows by status and refusal reason."""
    diseases = scorer.contract.diseases
    writer = TableWriter(out, output_schema(diseases))
    counts: dict[str, int] = {}
    complete = False
    try:
        chunk: list[dict] = []
        for row in score_items(scorer, items, batch_size, workers, progress):
            row.update(model=scorer.name, model_version=scorer.version, operating_point=chosen.point,
                       **decisions(row, diseases, chosen.thresholds))
            key = SCORED if row["status"] == SCORED else f"refused: {row['reason']}"
            counts[key] = counts.get(key, 0) + 1
            chunk.append(row)
            if len(chunk) >= batch_size:
                writer.write(chunk)
                chunk = []
        for row in set_aside:
            row.update(model=scorer.name, model_version=scorer.version, operating_point=chosen.point)
            counts[f"refused: {row['reason']}"] = counts.get(f"refused: {row['reason']}", 0) + 1
            chunk.append(row)
        if chunk:
            writer.write(chunk)
        complete = True
    finally:
        writer.close(complete)
    return counts


def recalibrate(scorer: Scorer, site: SiteConfig, site_shards: Path) -> op.OperatingPoints:
    """The operating points, the out-of-distribution threshold and the calibration map on this hospital's own
    validation split (its shards: the tiles the same decoder made), scored by the one prediction path; the
    scores and distances stay here. The site's test split, where it has one, states how they hold out of sample."""
    data = load_shard(site_shards)
    valid = data.splits.get("valid")
    if valid is None or len(valid) == 0:
        raise DataError(f"site {site.name!r}: the shards at {site_shards} hold no validation split",
                        fix="give the site a validation fraction (split.valid) and run `fedauc preprocess` again")
    shape = tuple(valid.images.shape[1:])
    want = scorer.contract.transform().tile_shape
    if shape != tuple(want) or list(data.diseases) != scorer.contract.diseases:
        raise DataError(f"site {site.name!r}: its shards hold {shape} tiles of {list(data.diseases)}, model "
                        f"{scorer.name} v{scorer.version} takes {tuple(want)} of {scorer.contract.diseases}",
                        fix=f"preprocess the site with image_size: {scorer.contract.image_size} for this model")
    source, diseases = f"validation split of site {site.name}", list(data.diseases)
    scored = {split: ood.scores_and_features(scorer.network, part.images, torch.device("cpu"))
              for split, part in data.splits.items() if split in ("valid", "test") and len(part)}
    histograms = {split: np.stack([np.stack(score_histograms(data.splits[split].labels[:, c], scores[:, c],
                                                             op.HISTOGRAM_BINS)) for c in range(len(diseases))])
                  for split, (scores, _) in scored.items()}
    points = op.from_histograms(histograms["valid"], diseases, source)
    return points.model_copy(update={
        "ood": _own_refusal(scorer, {split: features for split, (_, features) in scored.items()}, source),
        "calibration": cal.from_histograms(histograms["valid"], diseases, source, histograms.get("test"))})


def _own_refusal(scorer: Scorer, features: dict[str, np.ndarray], source: str) -> ood.OodReference | None:
    """The registered refusal model's threshold read again on this site's validation distances, at the
    contract's rate (None where the model has no refusal model)."""
    registered = scorer.contract.ood
    if registered is None or scorer.ood is None:
        return None
    histograms = {split: ood.distance_histogram(scorer.ood.distances(f)) for split, f in features.items()}
    threshold, how = ood.site_threshold(histograms["valid"], registered)
    test = histograms.get("test")
    return registered.model_copy(update={
        "threshold": threshold, "valid_false_refusal": ood.refused_fraction(histograms["valid"], threshold),
        "valid_median": ood.median_of(histograms["valid"]), "source": f"{source}: {how}",
        "test_false_refusal": None if test is None else ood.refused_fraction(test, threshold)})
