"""A hospital's own export: one CSV row per image, a path column, a patient column, declared label columns.

Input row: one CSV row = one image. ``label_columns`` maps canonical diseases to source columns holding
1 / 0 / -1 (uncertain) / blank, or the values ``label_values`` maps (Y / N, yes / no, ...:
``preprocessing/label_values.py``); a task disease without a mapping is missing (never negative), and blank
cells are missing unless ``blank: zeros``. Optional columns (study, view, sex, age, official split)
fill the record when declared. ``generic-dicom`` reads its labels CSV through the same code.
Reference: docs/datasets.md section 9.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import numpy as np
import pandas as pd
from pydantic import field_validator, model_validator

from preprocessing.adapters.base import (
    Adapter,
    AdapterOptions,
    AdapterOutput,
    MetadataFile,
    age_notes,
    build_records,
    finish,
    normalize_sex,
    normalize_views,
    read_metadata,
    resolve_metadata,
    source_rows,
    to_age,
)
from preprocessing.label_values import (
    DEFAULT_PRESET,
    ValueMap,
    ValueSpec,
    check_spec,
    column_maps,
    yaml_keys_as_text,
)
from preprocessing.labels import parse_label_codes
from preprocessing.quarantine import Reason

VIEW_CODES = {"PA": "PA", "AP": "AP", "LATERAL": "LATERAL", "LAT": "LATERAL", "L": "LATERAL", "LL": "LATERAL", "RL": "LATERAL"}
SPLIT_NAMES = {"train": "train", "valid": "valid", "validate": "valid", "validation": "valid", "val": "valid", "test": "test"}


class LabelTableOptions(AdapterOptions):
    """The labels CSV of a generic layout."""

    labels_csv: str
    patient_column: str
    label_columns: dict[str, str]  # canonical disease -> source column
    study_column: str | None = None  # default: one study per image
    view_column: str | None = None
    default_view: Literal["PA", "AP", "LATERAL", "unknown"] = "unknown"  # when there is no view column
    sex_column: str | None = None
    age_column: str | None = None
    split_column: str | None = None  # an official split (train / valid / test), kept when use_official
    blank: Literal["zeros", "ignore"] = "ignore"
    # How each source column writes its labels: a preset's name or {VALUE: positive | negative | uncertain |
    # missing} (preprocessing/label_values.py); columns not named read ``default_label_values``.
    label_values: dict[str, ValueSpec] = {}
    default_label_values: str = DEFAULT_PRESET

    @field_validator("label_values", mode="before")
    @classmethod
    def _values_as_text(cls, value):
        return {column: yaml_keys_as_text(spec) for column, spec in value.items()} if isinstance(value, dict) else value

    @model_validator(mode="after")
    def _label_values_fit(self) -> LabelTableOptions:
        problems = [f"label_values.{column}: not one of the label_columns' columns "
                    f"({', '.join(self.label_columns.values())})"
                    for column in self.label_values if column not in self.label_columns.values()]
        problems += [f"label_values.{column}: {why}" for column, spec in self.label_values.items()
                     if (why := check_spec(column, spec))]
        if why := check_spec("(default)", self.default_label_values):
            problems.append(f"default_label_values: {why}")
        if problems:
            raise ValueError("\n".join(problems))
        return self

    @property
    def value_maps(self) -> dict[str, ValueMap]:
        return column_maps(self.label_columns, self.label_values, self.default_label_values)

    @property
    def blank_code(self) -> float:
        return 0.0 if self.blank == "zeros" else np.nan


class GenericCsvOptions(LabelTableOptions):
    path_column: str
    image_dir: str = ""  # prefix of the path column's values, relative to the root


def table_columns(options: LabelTableOptions, key_column: str) -> tuple[str, ...]:
    optional = (options.study_column, options.view_column, options.sex_column, options.age_column, options.split_column)
    listed = [key_column, options.patient_column, *options.label_columns.values(), *(c for c in optional if c)]
    return tuple(dict.fromkeys(listed))


def files(options: GenericCsvOptions) -> tuple[MetadataFile, ...]:
    return (MetadataFile("labels_csv", table_columns(options, options.path_column)),)


def read_label_table(
    config, options: LabelTableOptions, key_column: str
) -> tuple[pd.DataFrame, pd.DataFrame, list, Path]:
    """Records of a generic labels CSV (image_path = the key column's value) and their label problems."""
    path = resolve_metadata(config.root, options.labels_csv)
    table = read_metadata(path, table_columns(options, key_column)).apply(lambda c: c.str.strip())
    values, bad_labels, label_detail = parse_label_codes(
        table, options.label_columns, options.blank_code, options.value_maps
    )
    key = table[key_column]
    records = build_records(
        config.task,
        {
            "record_id": key.to_numpy(dtype=object),
            "source_row": source_rows(path, len(table)),
            "patient_id": table[options.patient_column].to_numpy(dtype=object),
            "study_id": table[options.study_column or key_column].to_numpy(dtype=object),
            "image_path": key.to_numpy(dtype=object),
            "view": normalize_views(table[options.view_column], VIEW_CODES).to_numpy(dtype=object)
            if options.view_column else options.default_view,
            "sex": normalize_sex(table[options.sex_column], ("F", "female"), ("M", "male")).to_numpy(dtype=object)
            if options.sex_column else "unknown",
            "age": to_age(table[options.age_column]).to_numpy() if options.age_column else np.nan,
            "split": table[options.split_column].str.lower().map(SPLIT_NAMES).to_numpy(dtype=object)
            if options.split_column else None,
        },
        values,
        len(table),
    )
    return table, records, [(bad_labels, Reason.UNPARSABLE_LABEL, label_detail)], path


def label_table_ages(table: pd.DataFrame, options: LabelTableOptions) -> dict[str, int]:
    return age_notes(table[options.age_column]) if options.age_column else {}


def read(config) -> AdapterOutput:
    options: GenericCsvOptions = config.adapter_options
    table, records, problems, path = read_label_table(config, options, options.path_column)
    if options.image_dir:
        records["image_path"] = options.image_dir.rstrip("/") + "/" + records["image_path"].astype(str)
    return finish(records, problems, len(records), [path], label_table_ages(table, options))


ADAPTER = Adapter(
    name="generic-csv",
    tasks=("chest-xray", "melanoma"),
    options=GenericCsvOptions,
    files=files,
    read=read,
    image_dirs=lambda options: (options.image_dir,) if options.image_dir else (),
)
