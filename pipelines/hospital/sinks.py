"""Where a scored study's result goes: the contract every result sink keeps, and the DICOM SR sink.

A sink is a class with a registry ``name``, its own ``Options`` (a pydantic model of what the site YAML may
say to it, nothing by default), built from the PACS and those options, and two methods: ``written(result)``,
whether it already delivered this result (by ``result.result_id``, which a retry of the study repeats), and
``write(result)``, deliver it whole or raise. The PACS job asks each sink, in the site YAML's order
(``pacs.sinks``; ``sink_registry`` resolves the names), whether it wrote the result, and writes it where not:
a study tried again after a failure writes nothing twice. The DICOM SR sink comes last and is the commit mark:
a study is scored for a model version once its SR is in the PACS (``latest``), so an output before it that
fails leaves no SR, and the study is tried again whole. Adding a sink: docs/deploy.md section 3, "Result sinks".
"""

from __future__ import annotations

from typing import ClassVar, Protocol

from pydantic import BaseModel, ConfigDict

from pipelines.hospital import dicom_sr
from pipelines.hospital.dicomweb import Pacs
from pipelines.hospital.result import StudyResult, sr_reference


class NoOptions(BaseModel):
    """A sink the site YAML names only."""

    model_config = ConfigDict(extra="forbid")


class ResultSink(Protocol):
    name: ClassVar[str]  # what the site YAML's pacs.sinks calls it
    Options: ClassVar[type[BaseModel]]

    def __init__(self, pacs: Pacs, options: BaseModel): ...

    def written(self, result: StudyResult) -> bool:
        """Whether this sink already delivered ``result`` (its ``result_id``)."""

    def write(self, result: StudyResult) -> None:
        """Deliver ``result`` whole, or raise."""


class DicomSrSink:
    """The study's Comprehensive SR (dicom_sr.study_report), stored into the study through STOW-RS."""

    name = "dicom-sr"
    Options = NoOptions

    def __init__(self, pacs: Pacs, options: BaseModel | None = None):
        self.pacs = pacs

    def latest(self, study: str, model: str, version: str) -> dict | None:
        """The reference of this model version's latest SR in ``study``, or None when there is none."""
        references = self._references(study, model, version)
        # Each version numbers itself (StudyResult.number).
        return max(references, key=lambda r: r[0])[1] if references else None

    def written(self, result: StudyResult) -> bool:
        return any(reference["sop"] == result.result_id
                   for _, reference in self._references(result.study, result.model, result.version))

    def write(self, result: StudyResult) -> None:
        self.pacs.store(dicom_sr.study_report(result))

    def _references(self, study: str, model: str, version: str) -> list[tuple[int, dict]]:
        description = dicom_sr.series_description(model, version)
        # Matched here: PACS differ in how they match a description with spaces (Orthanc 1.10 matches none).
        ours = [s["series"] for s in self.pacs.series(study) if s["modality"] == "SR" and s["description"] == description]
        return [(i["number"], sr_reference(study, series, i["sop"], i["sop_class"]))
                for series in ours for i in self.pacs.instances(study, series)]
