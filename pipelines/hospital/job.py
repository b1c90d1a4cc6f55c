"""One run of the hospital's scheduled PACS scoring (``fedauc pacs``, the ``score_pacs`` Prefect flow).

At the hospital: the registered model (default the task's champion), the hospital's own operating points
when it has them, the PACS from the site YAML or the environment, ``pacs.score_pacs``; the job's state
(which day it last ran, per model version) lives beside the site's shards. To the centre: only
``drift.aggregates`` of the run under the site's ``sharing:`` policy, recorded against the model version
with the drift figure (``drift.record``); the reference is the site's validation split, scored here.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from federated.data import load_shard
from federated.predict import predict_scores
from pipelines.hospital import batch, drift, pacs
from pipelines.hospital.thresholds import hospital_file
from preprocessing.errors import FedaucError
from preprocessing.sites import load_site


def state_file(shards_root: Path, site: str) -> Path:
    return Path(shards_root) / "pacs-state" / f"{site}.json"


def run(site_yaml: str | Path, shards_root: str | Path, model: str | None = None, point: str = "youden",
        report_to_centre: bool = True, echo=print) -> dict:
    """Score the PACS's new studies; returns what left for the centre (the aggregates) and the warnings."""
    site = load_site(site_yaml)
    settings, auth = pacs.settings_from(site.pacs)
    shards_root = Path(shards_root)
    with batch.scratch_folder() as folder:
        scorer = batch.load_registered(model, site.task, Path(folder))
        chosen = batch.choose_points(scorer, point, hospital_file(shards_root, site.name, scorer.name, scorer.version))
        echo(f"model {scorer.name} v{scorer.version}; operating point {point}: {chosen.source}")
        web = pacs.DicomWeb(settings.url, auth, settings.timeout_s)
        summary = pacs.score_pacs(web, scorer, point, chosen.thresholds, chosen.source,
                                  state_file(shards_root, site.name), settings.lookback_days)
        reference = _validation_scores(scorer, shards_root / site.name)
    echo(f"{summary.studies_found} studies found, {summary.studies_skipped} already scored, "
         f"{summary.studies_reported} reported, {summary.studies_without_image} without an image the model takes")
    aggregates = drift.aggregates(summary.rows, reference, scorer.contract.diseases, site.sharing)
    warnings = drift.record(site.task, site.name, scorer.name, scorer.version, aggregates) if report_to_centre else []
    for warning in warnings:
        echo(warning)
    return {"aggregates": aggregates, "warnings": warnings, "studies_reported": summary.studies_reported}


def _validation_scores(scorer: batch.Scorer, site_shards: Path) -> np.ndarray:
    """The site's validation split scored by the model (no reference, hence no histograms, without one)."""
    try:
        valid = load_shard(site_shards).splits.get("valid")
    except FedaucError:  # no shards at this machine: the run's counts still leave, its histograms do not
        return np.zeros((0, len(scorer.contract.diseases)))
    if valid is None or tuple(valid.images.shape[1:]) != tuple(scorer.contract.transform().tile_shape):
        return np.zeros((0, len(scorer.contract.diseases)))
    return predict_scores(scorer.network, valid.images, torch.device("cpu")).astype(np.float64)
