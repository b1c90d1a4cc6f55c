"""Onboarding a hospital into a federation: a commented site YAML to start from, a federation file that
lists it, and the one place shards live by default.

``site_template`` writes the YAML ``fedauc sites new`` starts a hospital with (every field commented,
the format's options with their defaults, placeholders where only the hospital knows the answer);
``add_site`` appends a site to a federation YAML (creating it on first use) and keeps it only if the
federation still loads; ``shards_root`` is the rule every command follows for where shards are.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import yaml

from common.errors import ConfigError
from preprocessing.adapters import ADAPTERS
from preprocessing.federation import Federation, load_federation
from preprocessing.records import TASK_DISEASES
from preprocessing.sites import SiteConfigError, load_site

SHARDS_ENV = "FEDAUC_SHARDS"
DEFAULT_SHARDS = Path("shards")
EDIT = "EDIT-ME"
# The layouts whose releases carry an official split (generic-csv: when it names a split_column).
OFFICIAL_SPLITS = ("chexpert", "mimic-cxr-jpg", "nih-cxr14")

# What the options of the generic layouts mean (the dataset layouts need none: their defaults are the
# released file names).
OPTION_HINTS = {
    "labels_csv": "the labels CSV, relative to root: one row per image",
    "path_column": "column with each image's path, relative to image_dir",
    "image_dir": "folder of the images, relative to root ('' = root itself)",
    "key_column": "column that identifies each DICOM or study (matched by the `key` below)",
    "key": "file_name (the path under dicom_dir), sop_instance_uid (one row per image), or accession_number / "
           "study_instance_uid (one row per study, its labels on each image its view filter keeps)",
    "dicom_dir": "folder searched for DICOM files, relative to root",
    "patient_column": "column with a (pseudonymized) patient id: splits never share a patient",
    "label_columns": "canonical disease -> your column holding 1 / 0 / -1 (uncertain) / blank, or what "
                     "label_values maps",
    "label_values": "per column: a preset (codes, yes-no, true-false, positive-negative) or {VALUE: positive | "
                    "negative | uncertain | missing}; `sites validate` names values nothing maps",
    "default_label_values": "the preset of every column label_values does not name",
    "study_column": "column with a study id (default: one study per image)",
    "view_column": "column with PA / AP / LATERAL (chest X-ray)",
    "default_view": "view of every image when there is no view column",
    "sex_column": "column with F / M",
    "age_column": "column with the age in years (top-coded 90+ or >89: read as the bound, counted in the QC report)",
    "split_column": "column with an official split (train / valid / test), kept when use_official",
    "blank": "a blank label cell: ignore (missing) or zeros (negative)",
}


def site_template(name: str, fmt: str, root: str, task: str | None = None,
                  options: dict[str, object] | None = None) -> str:
    """The commented site YAML for a new hospital. Values in ``options`` fill the format's options;
    a required option left out becomes an ``EDIT-ME`` placeholder that ``fedauc sites validate`` names."""
    if fmt not in ADAPTERS:
        raise ConfigError(f"unknown format {fmt!r}", fix=f"use one of {', '.join(sorted(ADAPTERS))}")
    adapter = ADAPTERS[fmt]
    task = task or adapter.tasks[0]
    if task not in adapter.tasks:
        raise ConfigError(f"format {fmt!r} serves {', '.join(adapter.tasks)}, not {task!r}")
    options = dict(options or {})
    fields = adapter.options.model_fields
    unknown = sorted(set(options) - set(fields))
    if unknown:
        raise ConfigError(f"unknown option(s) {unknown} for format {fmt!r}", fix=f"known: {', '.join(fields)}")
    diseases = TASK_DISEASES[task]
    lines = [
        f"# {name}: written by `fedauc sites new`; edit, then `fedauc sites validate` this file.",
        f"name: {name}                 # the shard folder's name; unique within a federation",
        f"format: {fmt}",
        f"root: {root}   # the data folder at this hospital; a relative path resolves against this file",
        f"task: {task}                 # diseases: {', '.join(diseases)}",
    ]
    if task == "chest-xray":
        lines += ["# uncertain_policy: {Edema: ones, Atelectasis: ones}   # ones / zeros / ignore per disease; rest U-Zeros",
                  "views: [PA, AP]              # other views are quarantined as excluded_view"]
    # use_official only where the layout can carry an official split (preprocessing/splits.py).
    official = "true" if fmt in OFFICIAL_SPLITS or options.get("split_column") else "false"
    lines += [f"split: {{seed: 0, valid: 0.1, test: 0.2, use_official: {official}}}   # fractions of patients",
              "image_size: 224              # shard images are image_size x image_size",
              "# max_quarantine_share: 0.05   # one quarantine reason over this share of the rows fails validate, "
              "report and preprocess",
              "# decode_limits: {max_pixels: 36000000, timeout_s: 60}   # over them a file is quarantined"]
    option_lines = []
    for field, info in fields.items():
        hint = f"   # {OPTION_HINTS[field]}" if field in OPTION_HINTS else ""
        if field in options:
            option_lines.append(f"  {field}: {_flow_yaml(options[field])}{hint}")
        elif info.is_required() and field == "label_columns":
            example = dict.fromkeys(diseases[:2], EDIT)
            option_lines.append(f"  label_columns: {_flow_yaml(example)}{hint}")
        elif info.is_required():
            option_lines.append(f"  {field}: {EDIT}{hint}")
        elif field == "label_values":
            option_lines.append(f"  # label_values: {{your_column: yes-no}}{hint}")
        else:
            option_lines.append(f"  # {field}: {_flow_yaml(info.default)}{hint}")
    if option_lines:
        # All commented out, "options:" alone would read as null: then the header is a comment too.
        commented = all(line.lstrip().startswith("#") for line in option_lines)
        lines += ["# options:   # the release's own file names by default" if commented else "options:", *option_lines]
    return "\n".join(lines) + "\n"


def _flow_yaml(value) -> str:
    return "null" if value is None else yaml.safe_dump(value, default_flow_style=True, width=10_000).strip().removesuffix("\n...").strip()


def write_site_template(path: str | Path, text: str, overwrite: bool = False) -> Path:
    path = Path(path)
    if path.exists() and not overwrite:
        raise ConfigError(f"{path} already exists", fix="choose another name or --out, or pass --force")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def parse_assignments(items: list[str], flag: str) -> dict[str, object]:
    """NAME=VALUE pairs (VALUE as JSON when it parses, else a string)."""
    parsed = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"{flag} {item!r}: expected NAME=VALUE")
        try:
            parsed[key] = json.loads(value)
        except json.JSONDecodeError:
            parsed[key] = value
    return parsed


def add_site(federation_yaml: str | Path, site_yaml: str | Path, name: str | None = None) -> Federation:
    """Append ``site_yaml`` to the federation (created with ``name`` and the site's task when the file does
    not exist). The site is listed relative to the federation file; the file is written only if the
    federation then loads, so a bad site never lands in it."""
    federation_yaml, site_yaml = Path(federation_yaml), Path(site_yaml)
    site = load_site(site_yaml)
    if federation_yaml.exists():
        text = federation_yaml.read_text()
        spec = yaml.safe_load(text) or {}
    else:
        text, spec = "", {"name": name or federation_yaml.stem, "task": site.task, "sites": []}
    entries = spec.get("sites") or []
    entry = os.path.relpath(site_yaml.resolve(), federation_yaml.resolve().parent)
    listed = {str((federation_yaml.parent / e["config"]).resolve()) for e in entries if isinstance(e, dict) and "config" in e}
    if str(site_yaml.resolve()) in listed:
        raise ConfigError(f"{federation_yaml} already lists {site_yaml}")
    wanted = [*entries, {"config": entry}]
    if text:
        # Appended as text, so the file's comments and layout stay as the consortium wrote them; rewritten
        # (comments lost) only when the list is not the end of the file.
        updated = text.rstrip("\n") + f"\n  - config: {entry}\n"
        try:
            appended = (yaml.safe_load(updated) or {}).get("sites")
        except yaml.YAMLError:
            appended = None
        if appended != wanted:
            updated = yaml.safe_dump({**spec, "sites": wanted}, sort_keys=False)
    else:
        updated = (f"# The hospitals that train together; `fedauc federation add` appends to sites.\n"
                   f"name: {spec['name']}\ntask: {spec['task']}\n"
                   f"# shards: shards        # where every site's shards are (default: $FEDAUC_SHARDS, else shards/)\n"
                   f"sites:\n  - config: {entry}\n")
    federation_yaml.parent.mkdir(parents=True, exist_ok=True)
    previous = federation_yaml.read_text() if federation_yaml.exists() else None
    federation_yaml.write_text(updated)
    try:
        return load_federation(federation_yaml)
    except SiteConfigError:
        if previous is None:
            federation_yaml.unlink()
        else:
            federation_yaml.write_text(previous)
        raise


def shards_root(explicit: str | Path | None = None, federation: Federation | None = None) -> Path:
    """Where shards are: the command's own option, else $FEDAUC_SHARDS, else the federation's ``shards:``,
    else ``shards/`` in the current folder. ``fedauc preprocess`` and ``fedauc train`` follow the same rule,
    so a hospital sets the location once."""
    if explicit:
        return Path(explicit)
    if os.environ.get(SHARDS_ENV):
        return Path(os.environ[SHARDS_ENV])
    if federation is not None and federation.shards is not None:
        return federation.shards
    return DEFAULT_SHARDS
