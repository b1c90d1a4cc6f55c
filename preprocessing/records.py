"""The canonical record every adapter produces, and the task definitions.

One record is one image. Adapters return a pandas DataFrame with exactly ``RECORD_COLUMNS`` followed by
one float32 label column per disease of the task (named exactly as the disease), so that hundreds of
thousands of rows stay columnar and fast. Label values:

* ``1.0`` positive, ``0.0`` negative, ``NaN`` missing (the dataset never labels it, or blank and the
  policy says so). Missing is never negative: training masks it.
* ``-1.0`` uncertain: only between an adapter and label harmonization, which resolves it with the site's
  per-disease policy (ones / zeros / ignore). Shards never contain -1.
"""

from __future__ import annotations

CHEST_XRAY_DISEASES: tuple[str, ...] = (
    "Cardiomegaly",
    "Edema",
    "Consolidation",
    "Atelectasis",
    "Pleural Effusion",
)
MELANOMA_DISEASES: tuple[str, ...] = ("Melanoma",)

TASK_DISEASES: dict[str, tuple[str, ...]] = {
    "chest-xray": CHEST_XRAY_DISEASES,
    "melanoma": MELANOMA_DISEASES,
}
TASK_CHANNELS: dict[str, int] = {"chest-xray": 1, "melanoma": 3}

VIEWS: tuple[str, ...] = ("PA", "AP", "LATERAL", "unknown")
VIEW_TASKS: tuple[str, ...] = ("chest-xray",)  # tasks whose images have a projection (melanoma's do not)
SPLITS: tuple[str, ...] = ("train", "valid", "test")

UNCERTAIN = -1.0

RECORD_COLUMNS: tuple[str, ...] = (
    "record_id",  # unique within the site, stable across re-runs (e.g. the image path)
    "source_row",  # where the record came from: "<file>:row <n>" (data rows from 1) for the user to find it
    "patient_id",
    "study_id",
    "image_path",  # relative to the site's data root
    "view",  # one of VIEWS
    "sex",  # "F", "M" or "unknown"
    "age",  # float years, NaN when unknown
    "split",  # one of SPLITS when the dataset has an official split, else None (assigned by patient later)
)


def label_columns(task: str) -> tuple[str, ...]:
    """The label columns of a task, in the canonical order."""
    try:
        return TASK_DISEASES[task]
    except KeyError:
        raise ValueError(f"unknown task {task!r}; expected one of {sorted(TASK_DISEASES)}") from None
