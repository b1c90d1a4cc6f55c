"""Small-count suppression, the one rule for every count that leaves a site (docs/privacy.md section 6): a count
below the site's ``sharing.min_count`` N (zero included: "no positive here" singles out as well as "one") leaves
as the string ``"<N"``, in every JSON and MLflow record: the QC summary (``preprocessing.qc``), an evaluation's
suppression record (``federated.evaluation``), a day of PACS scoring (``pipelines.hospital.drift``). A
suppressed count is never a number in a record: it is absent from MLflow's float metrics, and read as 0 where
the centre computes with it (``at_least``).

The evaluation exchange is a fixed-size float array (one row per disease, gathered from every site), which cannot
carry a string: there the same rule marks the cell ``ON_WIRE`` (``to_wire``), and ``from_wire`` turns it into
``"<N"`` before anything is recorded.

It imports numpy only.
"""

from __future__ import annotations

import numpy as np

ON_WIRE = -1.0  # a small count's cell in a float array (counts are never negative)


def is_small(count, min_count: int):
    """Whether ``count`` (or each of an array's) may not leave the site as it is."""
    return np.asarray(count) < min_count if isinstance(count, np.ndarray) else count < min_count


def marker(min_count: int) -> str:
    """What a suppressed count leaves as: ``"<N"``."""
    return f"<{min_count}"


def released(count: int, min_count: int) -> int | str:
    """``count`` as it may leave a site: itself, or ``"<N"`` below ``min_count``."""
    return marker(min_count) if is_small(count, min_count) else int(count)


def is_suppressed(value) -> bool:
    """Whether a released value is a suppressed count (``"<N"``)."""
    return isinstance(value, str) and value.startswith("<")


def at_least(value):
    """What the centre may count a released value as: itself, or 0 for a suppressed one (all it knows is
    that it is below N)."""
    return 0 if is_suppressed(value) else value


def to_wire(counts: np.ndarray, min_count: int) -> np.ndarray:
    """Counts as they leave in a float array: each small one ``ON_WIRE``."""
    return np.where(is_small(counts, min_count), ON_WIRE, counts)


def from_wire(value: float, min_count: int) -> float | str:
    """A count read from a float array (``to_wire``) as records carry it (NaN, no count, stays NaN)."""
    return marker(min_count) if value == ON_WIRE else float(value)
