"""The dataset layouts a site can declare (``format:`` in ``sites/<name>.yaml``), one module each.

To add a layout: write a module exposing ``ADAPTER`` (see ``base.Adapter``) and list it here; describe what it
reads in docs/datasets.md.
"""

from __future__ import annotations

from preprocessing.adapters import (
    chexpert,
    generic_csv,
    generic_dicom,
    mimic_cxr_jpg,
    nih_cxr14,
    padchest,
    siim_isic_2020,
    vindr_cxr,
)
from preprocessing.adapters.base import Adapter, AdapterOutput, MetadataError

ADAPTERS: dict[str, Adapter] = {
    module.ADAPTER.name: module.ADAPTER
    for module in (
        chexpert,
        mimic_cxr_jpg,
        nih_cxr14,
        padchest,
        vindr_cxr,
        siim_isic_2020,
        generic_csv,
        generic_dicom,
    )
}


def get_adapter(name: str) -> Adapter:
    try:
        return ADAPTERS[name]
    except KeyError:
        raise KeyError(f"unknown format {name!r}; expected one of {sorted(ADAPTERS)}") from None


__all__ = ["ADAPTERS", "Adapter", "AdapterOutput", "MetadataError", "get_adapter"]
