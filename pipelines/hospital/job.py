"""One run of the hospital's scheduled PACS scoring (``fedauc pacs``, the ``score_pacs`` Prefect flow).

At the hospital: the registered model (default the task's champion), the hospital's own operating points
when it has them, the PACS from the site YAML or the environment, ``pacs.score_pacs``; the job's state
(``pacs_state``, per model version) and the day's drift counts live beside the site's shards. A model
trained on synthetic images, or one that does not say what it was trained on, writes nothing into a PACS
unless the run is told ``allow_synthetic_model`` (a demo's or a test's PACS). To the centre: once per day
that scored or refused something, the day's ``drift.release`` under the site's ``sharing:`` and ``privacy:``
settings, recorded against the model version with the drift figure (``drift.record``); the reference is the
site's validation split, scored here. The day is the hospital's own (StudyDate is local).

Studies that could not be retrieved whole are named on ``local`` (this machine's console or log, never
the centre's) and end the run with ``StudiesNotRetrieved`` after the rest was scored and the days'
aggregates recorded: the command exits 1, the Prefect flow run fails, with counts and reasons only.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections import Counter
from pathlib import Path

import numpy as np
import torch

from common.errors import ConfigError, FedaucError
from federated.data import load_shard
from federated.predict import predict_scores
from pipelines.hospital import drift, pacs
from pipelines.hospital.sink_registry import build_sinks
from pipelines.model_package import loading
from pipelines.model_package.predict import Scorer
from pipelines.model_package.thresholds import hospital_file
from preprocessing.sites import load_site


class StudiesNotRetrieved(FedaucError):
    """Some studies could not be retrieved whole this run; the others were scored."""


def state_file(shards_root: Path, site: str) -> Path:
    return Path(shards_root) / "pacs-state" / f"{site}.json"


def drift_file(shards_root: Path, site: str) -> Path:
    return Path(shards_root) / "pacs-state" / f"{site}.drift.json"


def run(site_yaml: str | Path, shards_root: str | Path, model: str | None = None, point: str = "youden",
        report_to_centre: bool = True, echo=print, local=logging.getLogger("fedauc.pacs").warning,
        since: dt.date | None = None, allow_synthetic_model: bool = False, now: dt.datetime | None = None) -> dict:
    """Score the PACS's new studies; returns the days' aggregates that left for the centre and the warnings.
    ``echo`` says what may leave the site (counts); ``local`` what stays (the failed studies' UIDs)."""
    site = load_site(site_yaml)
    settings, auth = pacs.settings_from(site.pacs)
    shards_root, now = Path(shards_root), now or dt.datetime.now().astimezone()
    web = pacs.connect(settings, auth)
    sinks = build_sinks(settings.sinks, web)  # a misnamed sink stops the run before the model is loaded
    with loading.scratch_folder() as folder:
        scorer = loading.load_registered(model, site.task, Path(folder))
        check_provenance(scorer, allow_synthetic_model)
        own = hospital_file(shards_root, site.name, scorer.name, scorer.version)
        chosen = loading.choose_points(scorer, point, own)
        scorer = loading.with_hospital_refit(scorer, own)
        echo(f"model {scorer.name} v{scorer.version}; operating point {point}: {chosen.source}")
        summary = pacs.score_pacs(web, scorer, point, chosen.thresholds, chosen.source,
                                  state_file(shards_root, site.name), settings.lookback_days,
                                  settings.stable_minutes, since, now, sinks)
        reference = _validation_scores(scorer, shards_root / site.name)
    echo(f"{summary.studies_found} studies found, {summary.studies_waiting} waiting to be stable, "
         f"{summary.studies_skipped} already scored, {summary.studies_reported} reported, "
         f"{summary.studies_superseded} reported again with new images, {summary.studies_without_image} without "
         f"an image the model takes, {len(summary.failed)} not retrieved")
    days = drift.DayTallies(drift_file(shards_root, site.name))
    closed = days.add(f"{scorer.name}/{scorer.version}", now.date(),
                      drift.tally(summary.rows, reference, scorer.contract.diseases))
    sent, warnings = [], []
    for key, day, day_tally in closed if report_to_centre else []:
        name, version = key.rsplit("/", 1)
        aggregates = drift.release(day_tally, site.sharing, withhold_histograms=site.privacy is not None)
        warnings += drift.record(site.task, site.name, name, version, aggregates, day)
        days.sent(key, day)
        sent.append({"day": day, "model": name, "model_version": version, "aggregates": aggregates})
    for warning in warnings:
        echo(warning)
    if summary.failed:
        for study, reason in sorted(summary.failed.items()):
            local(f"study {study} not retrieved whole: {reason}")
        reasons = Counter(summary.failed.values())
        raise StudiesNotRetrieved(
            f"{len(summary.failed)} stud{'y' if len(summary.failed) == 1 else 'ies'} not retrieved whole ("
            + "; ".join(f"{n}: {reason}" for reason, n in sorted(reasons.items()))
            + "); nothing of them was stored, they are tried again with backoff, the other studies were scored",
            fix="this machine's log names them; see the PACS's log for why it could not send them")
    return {"sent": sent, "warnings": warnings, "studies_reported": summary.studies_reported}


def check_provenance(scorer: Scorer, allow_synthetic_model: bool) -> None:
    """A ``ConfigError`` for a model whose decisions must not go into a hospital's PACS: one trained on
    synthetic images, or one that does not say what it was trained on, unless allowed."""
    provenance = scorer.contract.provenance
    if allow_synthetic_model or (provenance is not None and not provenance.synthetic):
        return
    what = ("does not say what it was trained on (registered before fedauc recorded it)" if provenance is None
            else f"was trained on synthetic images ({provenance.describe()})")
    raise ConfigError(f"model {scorer.name} v{scorer.version} {what}: its decisions are not written into a PACS",
                      fix="score with a model trained on patients' images, or pass --allow-synthetic-model "
                          "(a demo's or a test's PACS)")


def _validation_scores(scorer: Scorer, site_shards: Path) -> np.ndarray:
    """The site's validation split scored by the model (no reference, hence no histograms, without one)."""
    try:
        valid = load_shard(site_shards).splits.get("valid")
    except FedaucError:  # no shards at this machine: the run's counts still leave, its histograms do not
        return np.zeros((0, len(scorer.contract.diseases)))
    if valid is None or tuple(valid.images.shape[1:]) != tuple(scorer.contract.transform().tile_shape):
        return np.zeros((0, len(scorer.contract.diseases)))
    return predict_scores(scorer.network, valid.images, torch.device("cpu")).astype(np.float64)
