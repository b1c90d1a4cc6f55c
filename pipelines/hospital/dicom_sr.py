"""One DICOM Comprehensive SR per scored study, written with highdicom (docs/deploy.md section 2).

The report's content tree: the model's name and version (DCM 111001 Algorithm Name, 111003 Algorithm
Version), the operating point and where its thresholds come from, a statement that the content is not a
diagnosis (DCM 121106 Comment), then per scored image a container that references it by SOP Class and
Instance UID (IMAGE) and holds per disease its probability (NUM, UCUM "1") and its decision at the operating
point (TEXT); the model's provenance (``contract.Provenance``: its federation, number of sites, training
run, and whether any site's images were synthetic) as TEXT items beside its name. The SR goes into the study
in a series of its own, described ``SERIES_DESCRIPTION`` + model + version: what the scoring job looks for to
know that a study was scored by a model version.
"""

from __future__ import annotations

import highdicom as hd
import numpy as np
import pydicom
from highdicom.sr import (
    CodedConcept,
    ContainerContentItem,
    ImageContentItem,
    NumContentItem,
    RelationshipTypeValues,
    TextContentItem,
)

from pipelines.hospital.result import StudyResult
from pipelines.model_package.contract import Provenance

SERIES_DESCRIPTION = "fedauc scores"
NOT_A_DIAGNOSIS = ("Computer-generated scores of a machine-learning model (fedauc), for research and triage "
                   "support. Not a diagnosis: every image must be read by a qualified radiologist.")
_SCHEME = "99FEDAUC"  # private coding scheme for what no standard code names
_REPORT = CodedConcept("fedauc-report", _SCHEME, "fedauc model output")
_IMAGE_FINDINGS = CodedConcept("fedauc-image", _SCHEME, "Scores of one image")
_PROBABILITY = CodedConcept("fedauc-probability", _SCHEME, "Model probability")
_DECISION = CodedConcept("fedauc-decision", _SCHEME, "Decision at the operating point")
_OPERATING_POINT = CodedConcept("fedauc-operating-point", _SCHEME, "Operating point")
_ALGORITHM_NAME = CodedConcept("111001", "DCM", "Algorithm Name")
_ALGORITHM_VERSION = CodedConcept("111003", "DCM", "Algorithm Version")
_COMMENT = CodedConcept("121106", "DCM", "Comment")
_SOURCE = CodedConcept("121112", "DCM", "Source of Measurement")
_UNIT = CodedConcept("1", "UCUM", "no units")
_FEDERATION = CodedConcept("fedauc-fed", _SCHEME, "Training federation")
_SITES = CodedConcept("fedauc-sites", _SCHEME, "Training sites")
_TRAINING_RUN = CodedConcept("fedauc-run", _SCHEME, "Training run")
_SYNTHETIC = CodedConcept("fedauc-synthetic", _SCHEME, "Synthetic training data")
CONTAINS = RelationshipTypeValues.CONTAINS


def series_description(model: str, version: str) -> str:
    return f"{SERIES_DESCRIPTION} {model} v{version}"[:64]  # LO: at most 64 characters


def study_report(result: StudyResult) -> hd.sr.ComprehensiveSR:
    """The SR of one study: ``result.images`` the scored instances (headers suffice), ``result.rows`` their
    predict rows (``p_<disease>``, ``calibrated_<disease>`` where the model has a map, and the ``<disease>``
    decision, True / False / None). Its SOP Instance UID is the result's id; the SRs it supersedes are named in
    its Predecessor Documents Sequence, and its instance number counts the versions."""
    model, version, diseases = result.model, result.version, result.diseases
    items = [TextContentItem(_ALGORITHM_NAME, model, CONTAINS), TextContentItem(_ALGORITHM_VERSION, version, CONTAINS),
             *provenance_items(result.provenance),
             TextContentItem(_OPERATING_POINT, f"{result.point}: {result.point_source}"[:1024], CONTAINS),
             TextContentItem(_COMMENT, NOT_A_DIAGNOSIS, CONTAINS)]
    for image, row in zip(result.images, result.rows, strict=True):
        finding = ContainerContentItem(_IMAGE_FINDINGS, relationship_type=CONTAINS)
        children = [ImageContentItem(_SOURCE, image.SOPClassUID, image.SOPInstanceUID, relationship_type=CONTAINS)]
        for disease in diseases:
            probability = float(row[f"p_{disease}"])
            decision = row[disease]
            children.append(NumContentItem(CodedConcept(f"fedauc-{disease}"[:16], _SCHEME, f"{disease} probability"),
                                           float(np.round(probability, 6)), _UNIT, relationship_type=CONTAINS))
            calibrated = float(row.get(f"calibrated_{disease}", np.nan))
            if not np.isnan(calibrated):  # a model registered with a calibration map (docs/algorithms.md section 16)
                children.append(NumContentItem(
                    CodedConcept(f"fedauc-c-{disease}"[:16], _SCHEME, f"{disease} calibrated probability"),
                    float(np.round(calibrated, 6)), _UNIT, relationship_type=CONTAINS))
            text = "no operating point" if decision is None else ("positive" if decision else "negative")
            children.append(TextContentItem(_DECISION, f"{disease}: {text}", CONTAINS))
        finding.ContentSequence = children
        items.append(finding)
    root = ContainerContentItem(_REPORT)
    root.ContentSequence = items
    first = result.images[0]
    return hd.sr.ComprehensiveSR(
        evidence=result.images, content=root, series_instance_uid=result.report_series, series_number=9901,
        sop_instance_uid=result.result_id, instance_number=result.number, manufacturer="fedauc",
        is_complete=True, previous_versions=[_predecessor(p) for p in result.supersedes] or None,
        series_description=series_description(model, version),
        institution_name=str(first.get("InstitutionName", "")) or None,
    )


def _predecessor(reference: dict) -> pydicom.Dataset:
    ds = pydicom.Dataset()
    ds.StudyInstanceUID, ds.SeriesInstanceUID = reference["study"], reference["series"]
    ds.SOPInstanceUID, ds.SOPClassUID = reference["sop"], reference["sop_class"]
    return ds


def provenance_items(provenance: Provenance | None) -> list[TextContentItem]:
    """What the model was trained on, as a reader of the SR sees it; "unknown" for a model registered before
    models recorded it."""
    if provenance is None:
        return [TextContentItem(_SYNTHETIC, "unknown: the model does not record what it was trained on", CONTAINS)]
    synthetic = (f"yes: {', '.join(provenance.synthetic_sites)}" if provenance.synthetic else "no")[:1024]
    return [TextContentItem(_FEDERATION, provenance.federation, CONTAINS),
            TextContentItem(_SITES, str(provenance.sites), CONTAINS),
            TextContentItem(_TRAINING_RUN, provenance.training_run, CONTAINS),
            TextContentItem(_SYNTHETIC, synthetic, CONTAINS)]


def read_report(sr: pydicom.Dataset) -> dict:
    """What a reader of the stored SR finds: model, version, the statement, per referenced image its scores."""
    out = {"images": {}}
    for item in sr.ContentSequence:
        meaning = item.ConceptNameCodeSequence[0].CodeMeaning
        if item.ValueType == "TEXT":
            out[meaning] = item.TextValue
        elif item.ValueType == "CONTAINER":
            scores, uid = {}, None
            for child in item.ContentSequence:
                if child.ValueType == "IMAGE":
                    uid = child.ReferencedSOPSequence[0].ReferencedSOPInstanceUID
                elif child.ValueType == "NUM":
                    name = child.ConceptNameCodeSequence[0].CodeMeaning.removesuffix(" probability")
                    scores[name] = float(child.MeasuredValueSequence[0].NumericValue)
                elif child.ValueType == "TEXT":
                    name, decision = child.TextValue.split(": ", 1)
                    scores[f"{name} decision"] = decision
            out["images"][uid] = scores
    return out
