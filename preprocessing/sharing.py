"""What of a site's QC leaves it: the ``sharing:`` block of a site YAML (``preprocessing.sites``).

A module of its own, on pydantic alone, because a hospital's training process (``federated.flare.site.job``)
needs the policy but none of the dataset adapters, decoders and tables that the rest of a site's YAML brings.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class SharingPolicy(BaseModel):
    """What of this site's QC leaves it (README "What leaves a site"). Counts below ``min_count`` are shown
    as "<min_count"; ``qc_grid: true`` sends the QC sample grid, real patient pixels, to the central MLflow."""

    model_config = ConfigDict(extra="forbid")
    qc_grid: bool = False
    min_count: int = Field(10, ge=1)
