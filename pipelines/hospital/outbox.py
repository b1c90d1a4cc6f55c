"""The ``json-outbox`` result sink: one JSON file per result in a folder at the hospital, for the hospital's
interface engine (Mirth Connect, Rhapsody, Cloverleaf: each watches a folder) to carry into its RIS or EHR.

The file is ``<folder>/<result id>.json``, written whole by rename and readable by its owner only (it names
the study and its images' scores): an engine never reads half a result, and the name is what ``written`` asks
for, so a study tried again after its SR failed leaves the file as it was. It holds the study, the model
version, the operating point, per scored image its probabilities and decisions (the SR's content, as JSON),
and the results it supersedes. The folder stays at the hospital: nothing of it goes to the centre.
"""

from __future__ import annotations

import math
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from federated.privacy.ledger import write_private
from pipelines.hospital.dicomweb import Pacs
from pipelines.hospital.result import StudyResult
from pipelines.model_package.predict import calibrated_column, probability_column


class OutboxOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    folder: Path  # the folder the interface engine watches


class JsonOutbox:
    name = "json-outbox"
    Options = OutboxOptions

    def __init__(self, pacs: Pacs, options: OutboxOptions):
        self.folder = options.folder.expanduser()

    def written(self, result: StudyResult) -> bool:
        return self._path(result).is_file()

    def write(self, result: StudyResult) -> None:
        write_private(self._path(result), content(result))

    def _path(self, result: StudyResult) -> Path:
        return self.folder / f"{result.result_id}.json"


def content(result: StudyResult) -> dict:
    """What the file says: the SR's content (dicom_sr.study_report) as JSON."""
    images = []
    for image, row in zip(result.images, result.rows, strict=True):
        scores = {}
        for disease in result.diseases:
            scores[disease] = {"probability": float(row[probability_column(disease)]), "decision": row[disease]}
            calibrated = float(row.get(calibrated_column(disease), math.nan))
            if not math.isnan(calibrated):  # a model registered with a calibration map
                scores[disease]["calibrated"] = calibrated
        images.append({"sop_class": str(image.SOPClassUID), "sop": str(image.SOPInstanceUID), "scores": scores})
    return {"result": result.result_id, "study": result.study, "model": result.model, "version": result.version,
            "operating_point": {"name": result.point, "source": result.point_source},
            "supersedes": [previous["sop"] for previous in result.supersedes], "images": images,
            "provenance": None if result.provenance is None else result.provenance.model_dump(mode="json")}
