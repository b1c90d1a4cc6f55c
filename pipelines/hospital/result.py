"""One scored study's result, the value every result sink receives whole (``sinks``).

Its identifier is derived from what it says, not drawn at random: the study, the model version, the scored
images and the results it supersedes name one UID (a name-based UUID, RFC 4122 version 5, in the 2.25 form of
PS3.5 B.2), so a study scored again after a failed attempt carries the same identifier, and a sink that
already delivered it can tell.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field

import pydicom
from pydicom.uid import ComprehensiveSRStorage

from pipelines.model_package.contract import Provenance


@dataclass
class StudyResult:
    """One study's scores. ``supersedes``: the SRs it replaces (``sr_reference``), when the study gained an
    image after they were written. ``result_id``: this result's identifier (its SR's SOP Instance UID);
    ``report_series``: its SR's series."""

    study: str
    images: list[pydicom.Dataset]  # the scored instances' headers
    rows: list[dict]  # their predict rows, p_<disease> and the <disease> decision
    diseases: list[str]
    model: str
    version: str
    point: str
    point_source: str
    supersedes: list[dict] = field(default_factory=list)
    provenance: Provenance | None = None  # what the model was trained on, as its contract says
    result_id: str = field(init=False)
    report_series: str = field(init=False)

    def __post_init__(self):
        # The superseded SRs are part of what is hashed: a study that loses the image it gained is a new
        # result, not the earlier one's UID again.
        said = [self.study, self.model, self.version, *sorted(image.SOPInstanceUID for image in self.images),
                *(previous["sop"] for previous in self.supersedes)]
        self.result_id = _named_uid([*said, "result"])
        self.report_series = _named_uid([*said, "series"])

    @property
    def number(self) -> int:
        """Which version of this model's result in the study this is, from 1."""
        return len(self.supersedes) + 1

    def reference(self) -> dict:
        """Its SR's reference, as the next result's ``supersedes`` names it."""
        return sr_reference(self.study, self.report_series, self.result_id)


def _named_uid(names: list[str]) -> str:
    return f"2.25.{uuid.uuid5(uuid.NAMESPACE_OID, chr(10).join(names)).int}"


def sr_reference(study: str, series: str, sop: str, sop_class: str = ComprehensiveSRStorage) -> dict:
    """A stored SR's reference: what the job's state keeps and a superseding SR's Predecessor Documents name."""
    return {"study": study, "series": series, "sop": sop, "sop_class": sop_class}
