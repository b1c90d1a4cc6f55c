"""The hospital's PACS scoring job over DICOMweb: new studies in, one DICOM SR per study back.

Each run: QIDO-RS finds the studies whose StudyDate is on or after the last run's day (less
``lookback_days``, for studies that arrive late); a study that already holds this model version's SR series
(``report.series_description``) is skipped, so a study is scored once per model version however often the
job runs. WADO-RS fetches the rest one study at a time into a private temporary folder, the radiographs the
model accepts are scored (``predict.score_items``: preprocessing's decoder and guards, the one prediction
path), and STOW-RS stores the study's SR: one instance in one request, written last, so a run that stops
mid-study leaves nothing of that study in the PACS and the next run scores it whole. A study with no image
the model accepts gets no SR; the job's local state remembers it for this model version.

The PACS address and credentials come from the site YAML's ``pacs:`` block or the environment
(``FEDAUC_PACS_URL``, ``FEDAUC_PACS_USERNAME``, ``FEDAUC_PACS_PASSWORD``); they stay at the hospital: they
are not part of what a site reports, and the summary a run returns holds counts and histograms only
(pipelines/hospital/drift.py).
"""

from __future__ import annotations

import datetime as dt
import json
import os
import shutil
import tempfile
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from io import BytesIO
from pathlib import Path

import pydicom
import requests

from pipelines.hospital import report
from pipelines.hospital.predict import SCORED, Item, Scorer, decisions, score_items
from preprocessing.errors import ConfigError
from preprocessing.sites import PacsSettings

URL_ENV, USER_ENV, PASSWORD_ENV = "FEDAUC_PACS_URL", "FEDAUC_PACS_USERNAME", "FEDAUC_PACS_PASSWORD"
_DICOM = "application/dicom"


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


class DicomWeb:
    """QIDO-RS, WADO-RS and STOW-RS (DICOM PS3.18) against one DICOMweb root."""

    def __init__(self, url: str, auth: tuple[str, str] | None = None, timeout_s: float = 60.0):
        self.root, self.session, self.timeout = url.rstrip("/"), requests.Session(), timeout_s
        self.session.auth = auth

    def _get(self, path: str, accept: str, params: dict | None = None) -> requests.Response:
        response = self.session.get(f"{self.root}{path}", params=params, headers={"Accept": accept},
                                    timeout=self.timeout)
        response.raise_for_status()
        return response

    def studies_since(self, day: dt.date | None) -> list[str]:
        params = {"includefield": "StudyDate", "limit": 100000}
        if day is not None:
            params["StudyDate"] = f"{day:%Y%m%d}-"
        response = self._get("/studies", "application/dicom+json", params)
        return [entry["0020000D"]["Value"][0] for entry in (response.json() if response.content else [])]

    def has_series(self, study: str, description: str) -> bool:
        # Matched here: PACS differ in how they match a description with spaces (Orthanc 1.10 matches none).
        response = self._get(f"/studies/{study}/series", "application/dicom+json",
                             {"Modality": "SR", "includefield": "0008103E"})
        series = response.json() if response.content else []
        return any(entry.get("0008103E", {}).get("Value", [""])[0] == description for entry in series)

    def retrieve_study(self, study: str) -> list[bytes]:
        response = self._get(f"/studies/{study}", f'multipart/related; type="{_DICOM}"')
        return multipart_parts(response.headers["Content-Type"], response.content)

    def store(self, dataset: pydicom.Dataset) -> None:
        buffer = BytesIO()
        dataset.save_as(buffer, enforce_file_format=True)
        boundary = uuid.uuid4().hex
        body = (f"--{boundary}\r\nContent-Type: {_DICOM}\r\n\r\n".encode() + buffer.getvalue()
                + f"\r\n--{boundary}--\r\n".encode())
        response = self.session.post(f"{self.root}/studies", data=body, timeout=self.timeout, headers={
            "Content-Type": f'multipart/related; type="{_DICOM}"; boundary={boundary}',
            "Accept": "application/dicom+json"})
        response.raise_for_status()
        if response.content and response.json().get("00081198", {}).get("Value"):  # FailedSOPSequence
            raise RuntimeError(f"the PACS refused the SR of study {dataset.StudyInstanceUID}: {response.text[:500]}")


def multipart_parts(content_type: str, body: bytes) -> list[bytes]:
    """The bodies of a multipart/related response (RFC 2046)."""
    boundary = next(part.split("=", 1)[1].strip('"') for part in content_type.split(";")
                    if part.strip().startswith("boundary="))
    parts = []
    for chunk in body.split(f"--{boundary}".encode())[1:]:
        if chunk.startswith(b"--"):
            break
        _, _, content = chunk.partition(b"\r\n\r\n")
        parts.append(content.removesuffix(b"\r\n"))
    return parts


@dataclass
class RunSummary:
    studies_found: int = 0
    studies_skipped: int = 0  # already scored by this model version
    studies_reported: int = 0
    studies_without_image: int = 0  # nothing the model accepts: no SR
    rows: list[dict] = field(default_factory=list)  # per instance, for drift aggregates; stays here


def _read_state(path: Path) -> dict:
    return json.loads(path.read_text()) if path.is_file() else {}


def _write_state(path: Path, state: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(state, indent=2))
    os.chmod(tmp, 0o600)
    os.replace(tmp, path)


def score_pacs(pacs: DicomWeb, scorer: Scorer, point: str, thresholds: dict[str, float | None], point_source: str,
               state_path: Path, lookback_days: int = 1, before_store: Callable[[str], None] | None = None,
               today: dt.date | None = None) -> RunSummary:
    """One run of the job (module docstring). ``before_store(study)`` is called before each SR is stored."""
    today = today or dt.date.today()
    key = f"{scorer.name}/{scorer.version}"
    state = _read_state(state_path)
    mine = state.get(key, {})
    since = dt.date.fromisoformat(mine["last_run"]) - dt.timedelta(days=lookback_days) if "last_run" in mine else None
    without_image = set(mine.get("without_image", []))
    summary = RunSummary()
    description = report.series_description(scorer.name, scorer.version)
    for study in pacs.studies_since(since):
        summary.studies_found += 1
        if study in without_image or pacs.has_series(study, description):
            summary.studies_skipped += 1
            continue
        rows, images = _score_study(pacs, scorer, study, thresholds)
        summary.rows.extend(rows)
        if not images:
            summary.studies_without_image += 1
            without_image.add(study)
            continue
        scored = [row for row in rows if row["status"] == SCORED]
        sr = report.study_report(images, scored, scorer.contract.diseases, scorer.name, scorer.version, point,
                                 point_source, provenance=scorer.contract.provenance)
        if before_store is not None:
            before_store(study)
        pacs.store(sr)
        summary.studies_reported += 1
    state[key] = {"last_run": today.isoformat(), "without_image": sorted(without_image)}
    _write_state(state_path, state)
    return summary


def _score_study(pacs: DicomWeb, scorer: Scorer, study: str, thresholds: dict) -> tuple[list[dict], list]:
    folder = Path(tempfile.mkdtemp(prefix="fedauc-study-"))  # mode 0700: the study's images, for this run only
    try:
        paths = []
        for i, data in enumerate(pacs.retrieve_study(study)):
            paths.append(folder / f"{i}.dcm")
            paths[-1].write_bytes(data)
        rows = list(score_items(scorer, [Item(str(p), str(folder)) for p in paths], workers=1))
        images = []
        for row, path in zip(rows, paths):
            row.update(decisions(row, scorer.contract.diseases, thresholds))
            if row["status"] == SCORED:
                images.append(pydicom.dcmread(path, stop_before_pixels=True))
        return rows, images
    finally:
        shutil.rmtree(folder, ignore_errors=True)
