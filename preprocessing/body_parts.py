"""The body parts a task's images show, and the one rule that keeps other body parts out: preprocessing
quarantines such a DICOM ``wrong_body_part`` before it reaches a shard (``preprocessing.decode_dicom``), and
scoring refuses it with the same reason (``pipelines.model_package.predict``), both with this definition.

A DICOM names its body part in BodyPartExamined (0018,0015) defined terms and in Anatomic Region Sequence
(0008,2218) codes (``<scheme>:<code>``). Chest X-ray: CHEST and THORAX; SNOMED CT 816094009 (Chest, Thorax:
DICOM's current code), 51185008 (Thoracic structure, its earlier one) and SNOMED-RT T-D3000 (Chest, as older
files carry it). Dermoscopy has no gate: a lesion may be anywhere on the skin, and XC/OT/GM dermoscopy files
rarely carry either attribute. A file that names no body part (an empty tag, a PNG) passes, as one without a
Modality or ViewPosition does: many archives never fill the tag.
"""

from __future__ import annotations

from collections.abc import Sequence

import pydicom

BODY_PARTS: dict[str, tuple[str, ...]] = {"chest-xray": ("CHEST", "THORAX"), "melanoma": ()}
ANATOMIC_REGIONS: dict[str, tuple[str, ...]] = {
    "chest-xray": ("SCT:816094009", "SCT:51185008", "SRT:T-D3000"), "melanoma": ()}


def body_parts_named(header: pydicom.Dataset) -> tuple[list[str], list[str]]:
    """The body parts a DICOM header names: its BodyPartExamined (upper case; an empty tag names none) and its
    Anatomic Region Sequence codes as ``<scheme>:<code>``."""
    part = str(header.get("BodyPartExamined", "") or "").strip().upper()
    codes = [f"{str(item.get('CodingSchemeDesignator', '')).strip()}:{str(item.get('CodeValue', '')).strip()}"
             for item in header.get("AnatomicRegionSequence", None) or []]
    return ([part] if part else []), codes


def outside_body_parts(header: pydicom.Dataset, parts: Sequence[str], regions: Sequence[str]) -> list[str]:
    """What in ``header`` names a body part outside ``parts`` (BodyPartExamined) or ``regions`` (Anatomic
    Region codes), as ``"BodyPartExamined LEG"``; empty when it names none of another part. An empty
    ``parts`` or ``regions`` accepts any value of that attribute."""
    named_parts, named_regions = body_parts_named(header)
    return ([f"BodyPartExamined {part}" for part in named_parts if parts and part not in parts]
            + [f"Anatomic Region {code}" for code in named_regions if regions and code not in regions])
