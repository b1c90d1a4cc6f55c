"""The hospital's PACS scoring job over DICOMweb: new studies in, one DICOM SR per study back.

Each run (docs/deploy.md section 3 has the states a study goes through):

* QIDO-RS finds the studies dated from the window's start (``pacs_state.window_start``: ``lookback_days``
  before the last run, before today on the first run, or ``since``) that hold a modality the model's
  contract accepts, then each one's series; the accepted series (``accepted_series``) and their instance
  counts are what the study holds.
* A study is looked at once it has held the same for ``stable_minutes`` (modalities send a study in
  several associations); a study already done for what it holds is skipped, so a second run stores nothing.
* Its accepted series are retrieved one at a time, as stored (``dicomweb.Pacs.retrieve_series``), into a
  private temporary folder (0700), and scored by ``predict.score_items``: preprocessing's decoder and guards,
  the one prediction path, so the SR's numbers are ``fedauc predict``'s for the same files.
* Each of the site's result sinks (``pacs.sinks`` in the site YAML, ``sink_registry``) that has not yet
  delivered the result gets it, the DICOM SR last (``sinks``): one instance in one STOW-RS request, the mark
  that the study is done. The result's identifier is derived from the study, the model version and the
  images (``result``), so a study tried again after a failure writes nothing twice. A study that gains an
  image the model takes after its SR gets a new SR naming the earlier ones in its Predecessor Documents
  Sequence.
* A study that cannot be retrieved whole is failed: nothing of it is stored, it is tried again after a
  backoff, the other studies go on, and the run's summary names it (locally only). A PACS that cannot be
  used at all ends the run with one line (``dicomweb.PacsUnavailable``); the state is written either way.

The PACS address and credentials come from the site YAML's ``pacs:`` block or the environment
(``FEDAUC_PACS_URL``, ``FEDAUC_PACS_USERNAME``, ``FEDAUC_PACS_PASSWORD``); they stay at the hospital, as do
study UIDs: the summary's ``failed`` is for the local log; ``rows`` become the day's drift tally
(``drift.tally``), of which only ``drift.release`` leaves.
"""

from __future__ import annotations

import datetime as dt
import os
import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pydicom

from common.errors import ConfigError
from pipelines.hospital import pacs_state
from pipelines.hospital.dicomweb import Pacs, StudyNotRetrieved
from pipelines.hospital.result import StudyResult
from pipelines.hospital.sinks import DicomSrSink, ResultSink
from pipelines.model_package.predict import SCORED, Item, Scorer, decisions, score_items, view_name
from preprocessing.sites import PacsSettings

URL_ENV, USER_ENV, PASSWORD_ENV = "FEDAUC_PACS_URL", "FEDAUC_PACS_USERNAME", "FEDAUC_PACS_PASSWORD"


def settings_from(site_pacs: PacsSettings | None) -> tuple[PacsSettings, tuple[str, str] | None]:
    """The site's settings, the environment's where the site has none; and the credentials."""
    settings = site_pacs
    if settings is None:
        if not os.environ.get(URL_ENV):
            raise ConfigError("no PACS to score from", fix=f"give the site YAML a pacs: block or set {URL_ENV}")
        settings = PacsSettings(url=os.environ[URL_ENV], username=os.environ.get(USER_ENV), password_env=PASSWORD_ENV)
    auth = None
    if settings.username:
        password = os.environ.get(settings.password_env)
        if password is None:
            raise ConfigError(f"the PACS user {settings.username!r} has no password",
                              fix=f"set the environment variable {settings.password_env}")
        auth = (settings.username, password)
    return settings, auth


def connect(settings: PacsSettings, auth: tuple[str, str] | None) -> Pacs:
    return Pacs(settings.url, auth, settings.timeout_s, settings.password_env)


@dataclass
class RunSummary:
    studies_found: int = 0
    studies_waiting: int = 0  # still changing, or not yet stable for stable_minutes
    studies_skipped: int = 0  # done for what they hold
    studies_reported: int = 0  # a first SR
    studies_superseded: int = 0  # a new SR replacing this model version's earlier one
    studies_without_image: int = 0  # nothing the model takes: no SR
    failed: dict[str, str] = field(default_factory=dict)  # study UID: why (failed this run, or awaiting its retry)
    rows: list[dict] = field(default_factory=list)  # per instance, for drift aggregates; stays here


def accepted_series(scorer: Scorer, series: list[dict]) -> list[dict]:
    """The series the model could take: a modality the contract accepts, a BodyPartExamined it reads (a
    series that names none is taken: predict still checks each image's tag and Anatomic Region Sequence)
    and, for CR (whose ViewPosition the standard puts in the series), a view it accepts. DX/DR name views
    per image: predict checks those. A series left out is never retrieved."""
    contract = scorer.contract
    accepted = []
    for entry in series:
        if entry["modality"] not in contract.allowed_modalities or entry["instances"] == 0:
            continue
        if contract.body_parts and entry["body_part"] and entry["body_part"] not in contract.body_parts:
            continue
        if entry["modality"] == "CR" and contract.views and entry["view"] and \
                view_name(entry["view"]) not in contract.views:
            continue
        accepted.append(entry)
    return accepted


def score_pacs(pacs: Pacs, scorer: Scorer, point: str, thresholds: dict[str, float | None], point_source: str,
               state_path: Path, lookback_days: int = 1, stable_minutes: float = 5, since: dt.date | None = None,
               now: dt.datetime | None = None, sinks: Sequence[ResultSink] | None = None) -> RunSummary:
    """One run of the job (module docstring). ``sinks``: where each result goes, in order, a ``DicomSrSink``
    last (``sink_registry.build_sinks``; the SR alone by default)."""
    now = now or dt.datetime.now().astimezone()  # the hospital's own day: StudyDate is local
    key = f"{scorer.name}/{scorer.version}"
    state = pacs_state.read(state_path)
    mine = state.setdefault(key, {})
    start = pacs_state.window_start(mine, now.date(), lookback_days, since)
    studies = pacs_state.prune(mine.get("studies", {}), start)
    mine["studies"] = studies
    job = _Run(pacs, scorer, point, thresholds, point_source, stable_minutes, now,
               list(sinks or [DicomSrSink(pacs)]))
    try:
        for found in pacs.studies(start, scorer.contract.allowed_modalities):
            job.summary.studies_found += 1
            study = found["study"]
            entry = studies.setdefault(study, {"date": found["date"] or f"{now:%Y%m%d}"})
            try:
                _one_study(job, study, entry)
            except StudyNotRetrieved as err:
                pacs_state.failed(entry, err.reason, now)
                job.summary.failed[study] = err.reason
        mine["last_run"] = now.date().isoformat()
    finally:
        pacs_state.write(state_path, state)
    return job.summary


@dataclass
class _Run:
    """What one run scores with, where results go (the SR last), and its summary so far."""

    pacs: Pacs
    scorer: Scorer
    point: str
    thresholds: dict[str, float | None]
    point_source: str
    stable_minutes: float
    now: dt.datetime
    outputs: list[ResultSink]  # the commit mark, a DicomSrSink, last
    summary: RunSummary = field(default_factory=RunSummary)


def _one_study(job: _Run, study: str, entry: dict) -> None:
    scorer, summary, sr = job.scorer, job.summary, job.outputs[-1]
    series = accepted_series(scorer, job.pacs.series(study))
    pacs_state.observe(entry, {s["series"]: s["instances"] for s in series}, job.now)
    if entry.get("done") == entry["held"]:
        summary.studies_skipped += 1
        return
    if not pacs_state.stable(entry, job.now, job.stable_minutes):
        summary.studies_waiting += 1
        return
    if pacs_state.waiting_to_retry(entry, job.now):
        summary.failed[study] = entry["reason"]
        return
    if "reports" not in entry and (earlier := sr.latest(study, scorer.name, scorer.version)) is not None:
        entry["reports"] = [earlier]  # the state was lost; what the PACS holds says it was scored
        if "done" not in entry:
            pacs_state.done(entry)
            summary.studies_skipped += 1
            return
    if not series:
        pacs_state.done(entry)
        summary.studies_without_image += 1
        return
    rows, images = _retrieve_and_score(job.pacs, scorer, study, series, job.thresholds)
    scored = sorted(image.SOPInstanceUID for image in images)
    if not images or scored == entry.get("images"):  # nothing new the model takes: no new SR
        if entry.get("reports"):
            summary.studies_skipped += 1
        else:
            summary.studies_without_image += 1
        _count(entry, rows, summary)
        pacs_state.done(entry)
        return
    previous = entry.get("reports", [])
    result = StudyResult(study, images, [r for r in rows if r["status"] == SCORED], scorer.contract.diseases,
                         scorer.name, scorer.version, job.point, job.point_source, supersedes=previous,
                         provenance=scorer.contract.provenance)
    for output in job.outputs:
        if not output.written(result):  # a retry after a later sink failed: delivered already
            output.write(result)
    entry.update(reports=[*previous, result.reference()], images=scored)
    _count(entry, rows, summary)
    pacs_state.done(entry)
    if previous:
        summary.studies_superseded += 1
    else:
        summary.studies_reported += 1


def _count(entry: dict, rows: list[dict], summary: RunSummary) -> None:
    """The rows of a study done, for the run's drift counts: a study scored again adds its new images only."""
    counted = set(entry.get("counted", []))
    summary.rows.extend(row for row in rows if not row["sop_uid"] or row["sop_uid"] not in counted)
    entry["counted"] = sorted(counted | {row["sop_uid"] for row in rows if row["sop_uid"]})


def _retrieve_and_score(pacs: Pacs, scorer: Scorer, study: str, series: list[dict],
                        thresholds: dict) -> tuple[list[dict], list[pydicom.Dataset]]:
    folder = Path(tempfile.mkdtemp(prefix="fedauc-study-"))  # mode 0700: the study's images, for this run only
    try:
        paths = [path for entry in series for path in pacs.retrieve_series(study, entry, folder)]
        rows = list(score_items(scorer, [Item(str(p), str(folder)) for p in paths], workers=1))
        images = []
        for row, path in zip(rows, paths):
            row.update(decisions(row, scorer.contract.diseases, thresholds))
            if row["status"] == SCORED:
                images.append(pydicom.dcmread(path, stop_before_pixels=True))
        return rows, images
    finally:
        shutil.rmtree(folder, ignore_errors=True)
