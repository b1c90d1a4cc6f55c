"""Scoring image files with a registered model, the way the federation scored its shards.

One decoding path: each file goes through preprocessing's own tile maker (``preprocessing.tiles.process_file``
with the model contract's ``TransformSettings``, in ``preprocessing.pool``'s workers, which kill a decoder
stuck past the time limit or crashed) and the tiles through ``federated.predict.predict_scores``, the
function the federated evaluation scores shards with. A file the decoder refuses (outside the folder it was
given, not a regular file, over the decode limits, unreadable, wrong modality, too small, constant) or one
out of the contract (a DICOM whose ViewPosition the model was not trained on, or whose BodyPartExamined or
Anatomic Region Sequence names a body part the model does not read) gets a row with the reason, never an
exception and never a silent drop. So does an image whose penultimate features lie further from the training
images' than the contract's threshold (``out_of_distribution``, federated/ood.py), its distance in ``ood_distance``.

Files are read in chunks of ``batch_size`` and rows are yielded chunk by chunk: memory does not grow with
the number of files.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pydicom
import torch
from torch import nn

from federated.ood import Gaussian, scores_and_features
from federated.predict import predict_scores
from pipelines.model_package.contract import ModelContract
from preprocessing.body_parts import outside_body_parts
from preprocessing.pool import decode_chunks
from preprocessing.quarantine import Reason
from preprocessing.tiles import Chunk

SCORED, REFUSED = "scored", "refused"
OUT_OF_DISTRIBUTION = Reason.OUT_OF_DISTRIBUTION.value
OOD_COLUMN = "ood_distance"
UID_COLUMNS = ("study_uid", "series_uid", "sop_uid")
# DICOM ViewPosition (0018,5101) values as the site YAMLs name views (preprocessing.records.VIEWS).
_VIEW_NAMES = {"PA": "PA", "AP": "AP", "LL": "LATERAL", "RL": "LATERAL", "LAT": "LATERAL", "LATERAL": "LATERAL"}


@dataclass
class Scorer:
    """A registered model ready to score: its contract and the network built from it (eval mode)."""

    contract: ModelContract
    network: nn.Module
    name: str = ""
    version: str = ""
    ood: Gaussian | None = None  # the out-of-distribution refusal's, with the contract's threshold

    @classmethod
    def from_state(cls, contract: ModelContract, state: dict[str, torch.Tensor], name: str = "", version: str = "",
                   ood: Gaussian | None = None):
        # The network rebuilt from its name and the registered weights, as the federated evaluation builds it
        # (federated.scoring.ModelToScore.build): the same module, so the same scores.
        return cls(contract, contract.model_to_score(version or "model").build(state), name, version, ood)


@dataclass(frozen=True)
class Item:
    path: str
    root: str | None  # the folder the file must resolve inside (None: any regular file)


def probability_column(disease: str) -> str:
    return f"p_{disease}"


def calibrated_column(disease: str) -> str:
    """The calibrated probability beside the raw score ``p_<disease>`` (NaN where the model has no map)."""
    return f"calibrated_{disease}"


def view_name(position: str) -> str:
    """A DICOM ViewPosition as the site YAMLs name views (``unknown`` for one they do not)."""
    return _VIEW_NAMES.get(position.strip().upper(), "unknown")


def score_items(scorer: Scorer, items: Iterable[Item], batch_size: int = 64, workers: int = 1,
                on_done=None) -> Iterator[dict]:
    """One row per item, in order: ``source``, ``status`` (scored | refused), ``reason``, ``detail``, the DICOM
    UIDs where the file is a DICOM, ``p_<disease>`` per output (NaN when refused), ``calibrated_<disease>`` (the
    contract's calibration map of it, pipelines/model_package/calibration.py) and ``ood_distance`` (NaN where
    the model has no refusal model or the file was not decoded). ``workers`` decoding
    processes (0: this process, without the per-file time limit). ``on_done(n)`` after each chunk."""
    transform = scorer.contract.transform()
    paths_of: dict[int, list[str]] = {}

    def chunks() -> Iterator[Chunk]:
        start, remaining = 0, iter(items)
        while batch := list(itertools.islice(remaining, batch_size)):
            # A chunk has one root; items of several roots (files given one by one) go in chunks of their own.
            for root, group in _by_root(batch):
                paths_of[start] = [item.path for item in group]
                yield Chunk("predict", start, tuple(paths_of[start]), root)
                start += len(group)

    pending, expected = {}, 0
    for result in decode_chunks(chunks(), transform, workers):
        pending[result.start] = result
        while expected in pending:  # workers may finish chunks out of order; rows keep the input's
            paths = paths_of.pop(expected)
            yield from _rows(scorer, paths, pending.pop(expected))
            expected += len(paths)
            if on_done is not None:
                on_done(len(paths))


def _by_root(batch: list[Item]) -> list[tuple[str | None, list[Item]]]:
    groups: list[tuple[str | None, list[Item]]] = []
    for item in batch:
        if groups and groups[-1][0] == item.root:
            groups[-1][1].append(item)
        else:
            groups.append((item.root, [item]))
    return groups


def _rows(scorer: Scorer, paths: list[str], result) -> list[dict]:
    contract = scorer.contract
    rows, keep = [], []
    for offset, (path, outcome) in enumerate(zip(paths, result.outcomes)):
        row = {"source": path, "status": SCORED, "reason": "", "detail": "", **dict.fromkeys(UID_COLUMNS, "")}
        if not outcome["ok"]:
            row.update(status=REFUSED, reason=outcome["reason"], detail=outcome["detail"])
        elif outcome["format"] == "dicom":
            refusal = _out_of_contract(contract, path, row)
            if refusal is not None:
                row.update(status=REFUSED, reason=refusal[0].value, detail=refusal[1])
        if row["status"] == SCORED:
            keep.append(offset)
        rows.append(row)
    probabilities = np.full((len(paths), len(contract.diseases)), np.nan, dtype=np.float64)
    distances = np.full(len(paths), np.nan)
    if keep and scorer.ood is not None:
        probabilities[keep], features = scores_and_features(scorer.network, result.tiles[keep], torch.device("cpu"))
        distances[keep] = scorer.ood.distances(features)
    elif keep:
        probabilities[keep] = predict_scores(scorer.network, result.tiles[keep], torch.device("cpu"))
    for row, p, distance in zip(rows, probabilities, distances):
        row[OOD_COLUMN] = float(distance)
        if contract.ood is not None and distance > contract.ood.threshold:  # NaN (not scored) compares False
            # Unlike anything the federation trained on: no score is stated, as for a file the decoder refused.
            p = np.full_like(p, np.nan)
            row.update(status=REFUSED, reason=OUT_OF_DISTRIBUTION, detail=(
                f"{row['source']}: distance {distance:.2f} to the training images (federated/ood.py), above "
                f"the threshold {contract.ood.threshold:.2f} read from the {contract.ood.source} (which it "
                f"refuses {contract.ood.valid_false_refusal:.1%} of)"))
        row.update({probability_column(d): float(v) for d, v in zip(contract.diseases, p)})
        row.update({calibrated_column(d): float(contract.calibration.apply(d, v)) if contract.calibration else np.nan
                    for d, v in zip(contract.diseases, p)})
    return rows


def _out_of_contract(contract: ModelContract, path: str, row: dict) -> tuple[Reason, str] | None:
    """Fill the row's UIDs from a DICOM the decoder accepted; the reason and detail when its view or body part
    is one the model does not take (a DICOM that names neither is taken)."""
    header = pydicom.dcmread(path, stop_before_pixels=True, specific_tags=[
        "StudyInstanceUID", "SeriesInstanceUID", "SOPInstanceUID", "ViewPosition", "BodyPartExamined",
        "AnatomicRegionSequence"])
    row["study_uid"] = str(header.get("StudyInstanceUID", ""))
    row["series_uid"] = str(header.get("SeriesInstanceUID", ""))
    row["sop_uid"] = str(header.get("SOPInstanceUID", ""))
    position = str(header.get("ViewPosition", "") or "").strip().upper()
    view = _VIEW_NAMES.get(position, "unknown") if position else None
    if contract.views and view is not None and view not in contract.views:
        return Reason.EXCLUDED_VIEW, (f"{path}: ViewPosition {position} (view {view}); the model was trained on "
                                      f"{', '.join(contract.views)}")
    outside = outside_body_parts(header, contract.body_parts, contract.anatomic_regions)
    if outside:
        return Reason.WRONG_BODY_PART, (f"{path}: {', '.join(outside)}; the model reads "
                                        f"{', '.join(contract.body_parts)} (BodyPartExamined) only")
    return None


def folder_items(folder: Path) -> Iterator[Item]:
    """Every file under ``folder`` (sorted, symlinks not followed into other folders), rooted there: a link
    that leads out of it is refused by the decoder, never read."""
    root = str(folder.resolve())
    for current, dirs, files in os.walk(folder):
        dirs.sort()
        for name in sorted(files):
            yield Item(str(Path(current) / name), root)


def decisions(row: dict, diseases: list[str], thresholds: dict[str, float | None]) -> dict:
    """``<disease>`` columns: True / False at the operating point, None where refused or no threshold."""
    out = {}
    for disease in diseases:
        p, t = row[probability_column(disease)], thresholds.get(disease)
        out[disease] = None if t is None or np.isnan(p) else bool(p >= t)
    return out
