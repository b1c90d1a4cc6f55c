"""A site: one hospital's dataset, declared once in ``sites/<name>.yaml``.

Example (abridged from ``sites/stanford-chexpert.yaml``)::

    name: stanford
    format: chexpert            # a registered adapter: preprocessing/adapters/
    root: /data/CheXpert-v1.0-small   # relative paths are relative to the YAML's folder
    task: chest-xray            # or melanoma
    uncertain_policy: {Edema: ones, Atelectasis: ones}   # the rest default per docs/datasets.md section 2
    views: [PA, AP]
    split: {seed: 0, valid: 0.1, test: 0.2, use_official: true}
    image_size: 224
    options: {train_csv: train.csv, valid_csv: valid.csv}   # adapter-specific, real names by default
    decode_limits: {max_pixels: 36000000, timeout_s: 60}    # optional; docs/quarantine.md

A hospital that only scores (its PACS, with the consortium's champion) declares no dataset: ``name``,
``task``, ``views`` and ``pacs:``, without ``format`` and ``root``. Commands that need the data (preprocess,
train) refuse such a site by name (``SiteConfig.require_dataset``).

``load_site`` fails on the first unreadable file and reports every field problem of the YAML at once;
``validate_site`` also checks the data: root, metadata files, their columns, image folders.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, field_validator, model_validator

from common.errors import ConfigError, problem_message
from common.privacy_budget import PrivacyBudget
from preprocessing.adapters import ADAPTERS
from preprocessing.adapters.base import AdapterOptions, MetadataError, read_metadata, resolve_metadata
from preprocessing.decode import DecodeLimits
from preprocessing.label_values import unmapped_line, unmapped_values
from preprocessing.labels import UncertainPolicy, default_uncertain_policy
from preprocessing.losses import excess_losses
from preprocessing.records import TASK_DISEASES, VIEWS
from preprocessing.scan import scan_site
from preprocessing.sharing import SharingPolicy


@dataclass(frozen=True)
class Problem:
    file: str
    field: str  # dotted path in the YAML ("split.valid"), or the data file/column concerned
    message: str

    def __str__(self) -> str:
        return f"{self.file}: {self.field}: {self.message}" if self.field else f"{self.file}: {self.message}"


class SiteConfigError(ConfigError):
    """The site YAML is unusable; the message names the file and each offending field."""

    def __init__(self, problems: list[Problem]):
        self.problems = problems
        super().__init__("\n".join(str(p) for p in problems))


class SplitPolicy(BaseModel):
    """Split by patient, seeded. ``valid`` and ``test`` are fractions of patients; with an official split
    (use_official) the official test is kept and ``valid`` is carved out of the official train patients."""

    model_config = ConfigDict(extra="forbid")
    seed: int = 0
    valid: float = Field(0.1, ge=0.0, lt=1.0)
    test: float = Field(0.2, ge=0.0, lt=1.0)
    use_official: bool = True

    @model_validator(mode="after")
    def _leaves_a_train_split(self) -> SplitPolicy:
        if self.valid + self.test >= 1.0:
            raise ValueError(f"valid + test must be below 1 to leave patients for train (got {self.valid} + {self.test})")
        return self


class PacsSettings(BaseModel):
    """``pacs:``: the hospital's DICOMweb PACS that the champion's scoring job reads and writes
    (pipelines/hospital/pacs.py). The password is never written here: ``password_env`` names the environment
    variable that holds it. Read only at the hospital; no part of it is in what a site reports."""

    model_config = ConfigDict(extra="forbid")
    url: str  # the DICOMweb root, e.g. http://pacs.local:8042/dicom-web
    username: str | None = None
    password_env: str = "FEDAUC_PACS_PASSWORD"
    # Studies dated this many days before the last run (before today on the first run) are looked at.
    lookback_days: int = Field(1, ge=0)
    # A study is scored once what it holds has not changed for this long (modalities send a study in parts).
    stable_minutes: float = Field(5.0, ge=0)
    timeout_s: float = Field(60.0, gt=0)
    # Where each scored study's result goes, in order, the DICOM SR last: a name, or a name with its options
    # (`- json-outbox: {folder: /srv/outbox}`); pipelines/hospital/sink_registry.py knows the names.
    sinks: list[str | dict[str, dict | None]] = Field(default_factory=lambda: ["dicom-sr"], min_length=1)


class SiteConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")  # becomes a folder name
    # The dataset: both, or neither for a hospital that only scores (module docstring).
    format: str | None = None
    root: Path | None = None
    task: Literal["chest-xray", "melanoma"]
    uncertain_policy: dict[str, UncertainPolicy] = Field(default_factory=dict)
    views: list[str] = Field(default_factory=lambda: ["PA", "AP"])  # melanoma ignores views
    split: SplitPolicy = Field(default_factory=SplitPolicy)
    image_size: int = Field(224, ge=8)
    # One quarantine reason over this share of the input rows fails validate, report and preprocess
    # (preprocessing/losses.py); the site's own view filter never counts.
    max_quarantine_share: float = Field(0.05, ge=0.0, le=1.0)
    min_image_size: int = Field(64, ge=1)  # smaller source images are quarantined by the decoder
    decode_limits: DecodeLimits = Field(default_factory=DecodeLimits)  # over them: too_large, decode_timeout
    options: dict[str, Any] = Field(default_factory=dict)  # adapter-specific, see the adapter's Options
    sharing: SharingPolicy = Field(default_factory=SharingPolicy)
    # The hospital's differential-privacy budget for its records (docs/privacy.md): every training on them
    # together may spend at most this (epsilon, delta), enforced at the site; none: trainings without DP, as before.
    privacy: PrivacyBudget | None = None
    pacs: PacsSettings | None = None
    # The site's images are synthetic (`fedauc synth` phantoms), not patients': a model trained with it says so in
    # its provenance, and `fedauc pacs` refuses to write its decisions into a PACS unless told to.
    synthetic: bool = False
    # fedauc code versions (federated/flare/site/version.py) besides its own whose FLARE jobs this site runs.
    allowed_code_versions: list[str] = Field(default_factory=list)

    _adapter_options: AdapterOptions = PrivateAttr()
    _path: Path | None = PrivateAttr(default=None)  # the YAML it came from, for messages

    @field_validator("format")
    @classmethod
    def _registered(cls, value: str | None) -> str | None:
        if value is not None and value not in ADAPTERS:
            raise ValueError(f"unknown format {value!r}; expected one of {sorted(ADAPTERS)}")
        return value

    @field_validator("views")
    @classmethod
    def _known_views(cls, value: list[str]) -> list[str]:
        unknown = [v for v in value if v not in VIEWS]
        if unknown:
            raise ValueError(f"unknown view(s) {unknown}; expected some of {list(VIEWS)}")
        if not value:
            raise ValueError("no view allowed: every image would be excluded")
        return value

    @model_validator(mode="after")
    def _task_fits(self) -> SiteConfig:
        # Model-level problems, one "field: message" per line (load_site splits them back per field).
        problems = []
        diseases = TASK_DISEASES[self.task]
        unknown = sorted(set(self.uncertain_policy) - set(diseases))
        if unknown:
            problems.append(
                f"uncertain_policy: unknown disease(s) {unknown} for task {self.task}; expected some of {list(diseases)}"
            )
        if (self.format is None) != (self.root is None):
            missing = "format" if self.format is None else "root"
            problems.append(f"{missing}: a site with a dataset declares format and root; one that only scores, "
                            "neither")
        elif self.format is None and self.options:
            problems.append("options: a site without a dataset (no format, no root) has no adapter options")
        elif self.format is not None:
            adapter = ADAPTERS[self.format]
            if self.task not in adapter.tasks:
                problems.append(f"task: format {self.format!r} serves {list(adapter.tasks)}, not {self.task!r}")
            try:
                self._adapter_options = adapter.options.model_validate(self.options)
            except ValidationError as err:
                for error in err.errors():
                    where = ".".join(str(part) for part in ("options", *error["loc"]))
                    # a check across options names its fields itself, one line each
                    problems += [f"{where}: {line}" if error["loc"] else f"options.{line}"
                                 for line in problem_message(error).splitlines()]
        mapped = getattr(getattr(self, "_adapter_options", None), "label_columns", {})
        for disease in sorted(set(mapped) - set(diseases)):
            problems.append(f"options.label_columns.{disease}: unknown disease for task {self.task}; expected some of {list(diseases)}")
        if self.privacy is not None and self.sharing.qc_grid:
            # Refused here, where the hospital writes it, not at training: the grid (real training images with
            # their labels) leaves with the site's report of every training, and a site with a budget admits
            # only DP trainings, so no job could honour both; ``fedauc preprocess`` stops before writing.
            problems.append("sharing.qc_grid: true sends real training images of the site with every training, "
                            "which no privacy budget counts; a site with `privacy:` keeps qc_grid: false")
        if problems:
            raise ValueError("\n".join(problems))
        self.uncertain_policy = default_uncertain_policy(self.task) | self.uncertain_policy
        return self

    @property
    def has_dataset(self) -> bool:
        return self.format is not None

    def require_dataset(self, purpose: str) -> None:
        """A ``ConfigError`` naming the site and its YAML when it declares no dataset to ``purpose``."""
        if not self.has_dataset:
            where = f"{self._path}: " if self._path else ""
            raise ConfigError(f"{where}site {self.name!r} declares no dataset (no format, no root: a site that "
                              f"only scores its PACS); to {purpose} needs one",
                              fix="give the site YAML format: and root: (its data)")

    @property
    def adapter_options(self) -> AdapterOptions:
        """The ``options:`` block parsed by the adapter's own model (defaults are the real file names)."""
        return self._adapter_options

    @property
    def diseases(self) -> tuple[str, ...]:
        return TASK_DISEASES[self.task]

    @property
    def source(self) -> Path | None:
        """The YAML this config was loaded from (None when built in code)."""
        return self._path


def validation_problems(shown: str, err: ValidationError) -> list[Problem]:
    """A pydantic error as one Problem per field of the file ``shown``, in the words a user reads."""
    problems = []
    for error in err.errors():
        if error["loc"]:
            problems.append(Problem(shown, ".".join(str(part) for part in error["loc"]), problem_message(error)))
            continue
        for line in problem_message(error).splitlines():
            where, _, message = line.partition(": ")
            problems.append(Problem(shown, where, message))
    return problems


def read_yaml_mapping(path: Path, kind: str) -> dict:
    """The YAML file's top-level mapping; a missing or malformed file is a SiteConfigError naming it."""
    shown = str(path)
    try:
        raw = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise SiteConfigError([Problem(shown, "", f"{kind} file not found")]) from None
    except yaml.YAMLError as err:
        raise SiteConfigError([Problem(shown, "", f"malformed YAML: {err}")]) from None
    if not isinstance(raw, dict):
        raise SiteConfigError([Problem(shown, "", f"expected a mapping of fields, got {type(raw).__name__}")])
    return raw


def load_site(path: str | Path) -> SiteConfig:
    """Read and check a site YAML; relative ``root`` is resolved against the YAML's folder.

    A ``SiteConfigError`` lists every problem of the file at once, the ``options:`` block's included even
    when other fields fail too (pydantic checks it only once every field is valid).
    """
    path = Path(path)
    raw = _read_site_yaml(path)
    try:
        config = SiteConfig.model_validate(raw)
    except ValidationError as err:
        problems = validation_problems(str(path), err)
        if not any(p.field.startswith("options") for p in problems):
            problems += _option_problems(str(path), raw)
        raise SiteConfigError(problems) from None
    config._path = path
    return config


def _read_site_yaml(path: Path) -> dict:
    raw = read_yaml_mapping(path, "site")
    if isinstance(raw.get("root"), str) and not Path(raw["root"]).expanduser().is_absolute():
        raw["root"] = str((path.parent / raw["root"]).resolve())
    elif isinstance(raw.get("root"), str):
        raw["root"] = str(Path(raw["root"]).expanduser())
    return raw


def _option_problems(shown: str, raw: dict) -> list[Problem]:
    adapter = ADAPTERS.get(raw.get("format"))
    if adapter is None or not isinstance(raw.get("options", {}), dict):
        return []
    try:
        adapter.options.model_validate(raw.get("options", {}))
    except ValidationError as err:
        return [Problem(shown, f"options.{p.field}", p.message) for p in validation_problems(shown, err)]
    return []


def validate_site(config_or_path: SiteConfig | str | Path, losses: bool = True) -> list[Problem]:
    """Every problem with a site at once: the YAML's fields, then the data root, metadata files (read as
    preprocess reads them: encoding, delimiter, columns) and image folders, as far as the YAML allows.

    ``losses`` (``fedauc sites validate``): also every label value nothing maps, and, when the data is readable,
    each quarantine reason the scan gives more than the site's ``max_quarantine_share`` of its rows. Without it
    (``preprocess``'s check before it starts) those rows are quarantined and the loss is judged on the shards."""
    if isinstance(config_or_path, SiteConfig):
        config = config_or_path
        shown = str(config._path) if config._path else f"site {config.name!r}"
        if not config.has_dataset:  # a site that only scores has no data to check
            return []
        problems = _data_problems(shown, config.root, ADAPTERS[config.format], config.adapter_options, losses)
        if problems or not losses:
            return problems
        scanned = scan_site(config)  # metadata only: what preprocess would quarantine before decoding
        return [Problem(shown, "max_quarantine_share", line)
                for line in excess_losses(scanned.quarantine, scanned.input_rows, config.max_quarantine_share)]
    try:
        config = load_site(config_or_path)
    except SiteConfigError as err:
        return err.problems + _data_problems_of_invalid_yaml(Path(config_or_path), err.problems, losses)
    return validate_site(config, losses)


def _data_problems_of_invalid_yaml(path: Path, yaml_problems: list[Problem], losses: bool) -> list[Problem]:
    """The data checks a YAML with problems still allows: its root, format and options must be usable."""
    if any(p.field in ("", "root", "format") or p.field.startswith("options") for p in yaml_problems):
        return []
    raw = _read_site_yaml(path)
    if "format" not in raw:  # a site that only scores: no data to check
        return []
    adapter = ADAPTERS[raw["format"]]
    options = adapter.options.model_validate(raw.get("options", {}))
    return _data_problems(str(path), Path(raw["root"]), adapter, options, losses)


def unmapped_label_values(config: SiteConfig) -> dict[str, Counter]:
    """Per label column of a generic layout's table, the values its ``label_values`` map nothing to, with their
    row counts (none for the dataset layouts, whose codes are the release's)."""
    options = config.adapter_options
    if not hasattr(options, "value_maps"):
        return {}
    metadata = next(m for m in ADAPTERS[config.format].files(options) if m.option == "labels_csv")
    table = read_metadata(resolve_metadata(config.root, options.labels_csv), metadata.columns)
    return unmapped_values(table, options.value_maps, options.blank_code)


def _data_problems(shown: str, root: Path, adapter, options: AdapterOptions, losses: bool) -> list[Problem]:
    if not root.is_dir():
        return [Problem(shown, "root", f"data root not found: {root}")]
    problems = []
    for metadata in adapter.files(options):
        name = getattr(options, metadata.option)
        file = resolve_metadata(root, name)
        if not file.is_file():
            if metadata.required:
                problems.append(Problem(shown, f"options.{metadata.option}", f"metadata file not found: {file}"))
            continue
        try:
            table = read_metadata(file, metadata.columns)  # what preprocess reads, read the same way
        except MetadataError as err:
            problems.append(Problem(shown, f"options.{metadata.option}", str(err)))
            continue
        if metadata.required and metadata.needs_rows and table.empty:
            problems.append(Problem(shown, f"options.{metadata.option}", f"{file}: no data rows, only a header"))
        if losses and hasattr(options, "value_maps"):  # a generic layout: the hospital declares how its columns write labels
            unmapped = unmapped_values(table, options.value_maps, options.blank_code)
            problems += [Problem(shown, f"options.label_values.{column}", unmapped_line(file.name, column, values))
                         for column, values in unmapped.items()]
    for folder in adapter.image_dirs(options):
        if not (root / folder).is_dir():
            problems.append(Problem(shown, "root", f"image folder not found: {root / folder}"))
    return problems
