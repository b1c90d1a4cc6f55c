"""Where a scored study's result goes: one ``ResultSink`` per output.

The PACS job hands each scored study's ``StudyResult`` to every sink in order; the DICOM SR sink comes last
and is the commit mark: a study is scored for a model version once its SR is in the PACS
(``written``), so an output before it that fails leaves no SR, and the study is tried again whole. A
second output (a FHIR DiagnosticReport, an HL7 message) is one more class with these two methods.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import pydicom

from pipelines.hospital import dicom_sr
from pipelines.hospital.dicomweb import Pacs
from pipelines.model_package.contract import Provenance


@dataclass
class StudyResult:
    """One study's scores. ``report_uid``: the identifier of this result (the SR's SOP Instance UID);
    ``supersedes``: the result it replaces (``study``, ``series``, ``sop``, ``sop_class`` of the earlier SR),
    when the study gained an image after that one was written."""

    study: str
    images: list[pydicom.Dataset]  # the scored instances' headers
    rows: list[dict]  # their predict rows, p_<disease> and the <disease> decision
    diseases: list[str]
    model: str
    version: str
    point: str
    point_source: str
    report_uid: str
    report_series: str
    supersedes: list[dict] = field(default_factory=list)
    provenance: Provenance | None = None  # what the model was trained on, as its contract says


class ResultSink(Protocol):
    def written(self, study: str, model: str, version: str) -> dict | None:
        """The reference of this model version's latest result in ``study``, or None when there is none."""

    def write(self, result: StudyResult) -> None:
        """Deliver ``result`` whole, or raise."""


class DicomSrSink:
    """The study's Comprehensive SR (dicom_sr.study_report), stored into the study through STOW-RS."""

    def __init__(self, pacs: Pacs):
        self.pacs = pacs

    def written(self, study: str, model: str, version: str) -> dict | None:
        description = dicom_sr.series_description(model, version)
        # Matched here: PACS differ in how they match a description with spaces (Orthanc 1.10 matches none).
        ours = [s for s in self.pacs.series(study) if s["modality"] == "SR" and s["description"] == description]
        references = [{"study": study, "series": s["series"], **i} for s in ours
                      for i in self.pacs.instances(study, s["series"])]
        if not references:
            return None
        latest = max(references, key=lambda r: r["number"])  # each version numbers itself (dicom_sr.study_report)
        return {k: latest[k] for k in ("study", "series", "sop", "sop_class")}

    def write(self, result: StudyResult) -> None:
        self.pacs.store(dicom_sr.study_report(
            result.images, result.rows, result.diseases, result.model, result.version, result.point,
            result.point_source, sop_instance_uid=result.report_uid, series_instance_uid=result.report_series,
            previous=[_reference(p) for p in result.supersedes], provenance=result.provenance))


def _reference(previous: dict) -> pydicom.Dataset:
    ds = pydicom.Dataset()
    ds.StudyInstanceUID, ds.SeriesInstanceUID = previous["study"], previous["series"]
    ds.SOPInstanceUID, ds.SOPClassUID = previous["sop"], previous["sop_class"]
    return ds
