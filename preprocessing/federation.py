"""A federation: the hospitals that train one model together, declared in one YAML.

Example (``sites/demo/chest.yaml``)::

    name: demo-chest
    task: chest-xray
    shards: ../../demo_data/shards       # optional: where every site's shards are, relative to this file
    sites:
      - config: stanford.yaml            # a site YAML (preprocessing/sites.py), relative to this file
        synth: {format: chexpert, n: 800, profile: stanford}   # optional: how the demo generates it
      - config: nih.yaml

``synth`` is read only by ``preprocessing.synth.generate_federation``: it says which synthetic hospital
stands in for the site (format, number of images at scale 1, acquisition profile, optionally the image
size instead of the profile's). Real federations
leave it out. A site with ``synth:``, or whose YAML says ``synthetic: true``, trained on synthetic images: the
models the federation registers say so (``synthetic_sites``). Every site of a federation has a dataset: a site
YAML that only scores (no format, no root) is refused by name.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from preprocessing.records import TASK_DISEASES
from preprocessing.sites import Problem, SiteConfig, SiteConfigError, load_site, read_yaml_mapping, validation_problems


class SynthSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")
    format: str
    n: int = Field(ge=1)
    profile: str | None = None  # a name in preprocessing.synth.profiles; None: the format's default
    image_format: Literal["dicom", "jpeg"] | None = None  # SIIM-ISIC only
    size: tuple[int, int] | None = None  # the images' (height, width); None: the profile's


class FederationSite(BaseModel):
    model_config = ConfigDict(extra="forbid")
    config: Path
    synth: SynthSpec | None = None


class FederationSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
    task: Literal["chest-xray", "melanoma"]
    # Where every site's shards are, relative to this file (commands: --shards, else $FEDAUC_SHARDS, else this).
    shards: Path | None = None
    # The diseases the federation learns, in the task's order (default: all of the task's): a disease no site
    # labels cannot be learned, and a training that names it is refused before it starts (pipelines/checks.py).
    diseases: list[str] | None = Field(default=None, min_length=1)
    sites: list[FederationSite] = Field(min_length=1)


class Federation:
    """A loaded federation: its spec and every site's ``SiteConfig``, in the YAML's order."""

    def __init__(self, path: Path, spec: FederationSpec, sites: list[SiteConfig]):
        self.path = path
        self.spec = spec
        self.sites = sites

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def task(self) -> str:
        return self.spec.task

    @property
    def diseases(self) -> tuple[str, ...]:
        """What its models learn and output, in the task's order: the YAML's ``diseases:``, else the task's."""
        chosen = self.spec.diseases or TASK_DISEASES[self.task]
        return tuple(d for d in TASK_DISEASES[self.task] if d in chosen)

    @property
    def shards(self) -> Path | None:
        """The federation's declared shards folder, resolved against the federation file."""
        if self.spec.shards is None:
            return None
        return self.spec.shards if self.spec.shards.is_absolute() else (self.path.parent / self.spec.shards).resolve()

    def synth_specs(self) -> list[tuple[SiteConfig, SynthSpec]]:
        """The sites that declare a synthetic stand-in, with their spec."""
        return [(site, entry.synth) for site, entry in zip(self.sites, self.spec.sites) if entry.synth is not None]

    def synthetic_sites(self) -> list[str]:
        """The sites whose images are synthetic: a ``synth:`` entry here, or ``synthetic: true`` in their YAML."""
        return [site.name for site, entry in zip(self.sites, self.spec.sites)
                if entry.synth is not None or site.synthetic]

    def __repr__(self) -> str:
        return f"Federation({self.name!r}, task={self.task!r}, sites={[s.name for s in self.sites]})"


def load_federation(path: str | Path) -> Federation:
    """Read a federation YAML and every site YAML it lists; all problems are reported at once."""
    path = Path(path)
    shown = str(path)
    try:
        spec = FederationSpec.model_validate(read_yaml_mapping(path, "federation"))
    except ValidationError as err:
        raise SiteConfigError(validation_problems(shown, err)) from None
    problems, sites = [], []
    unknown = sorted(set(spec.diseases or ()) - set(TASK_DISEASES[spec.task]))
    if unknown:
        problems.append(Problem(shown, "diseases", f"unknown disease(s) {unknown} for task {spec.task}; expected some "
                                f"of {list(TASK_DISEASES[spec.task])}"))
    for index, entry in enumerate(spec.sites):
        site_path = entry.config if entry.config.is_absolute() else path.parent / entry.config
        try:
            site = load_site(site_path)
        except SiteConfigError as err:
            problems.extend(err.problems)
            continue
        if not site.has_dataset:
            problems.append(Problem(shown, f"sites.{index}.config", f"{site_path} declares no dataset (no format, "
                                    "no root): a site that only scores cannot train; give it format: and root:"))
            continue
        if site.task != spec.task:
            problems.append(Problem(shown, f"sites.{index}.config", f"{site_path} is a {site.task} site, the federation is {spec.task}"))
        if entry.synth is not None and entry.synth.format != site.format:
            problems.append(Problem(shown, f"sites.{index}.synth.format",
                                    f"{entry.synth.format!r} but {site_path} declares format {site.format!r}"))
        sites.append(site)
    sizes = {site.image_size for site in sites}
    if len(sizes) > 1:
        # One model takes one input shape: a site at another size would fail inside the first round.
        settings = ", ".join(f"{site.name} image_size {site.image_size}" for site in sites)
        problems.append(Problem(shown, "sites", f"the sites do not fit together: {settings}; give every site's YAML "
                                f"the same image_size and preprocess the changed sites again"))
    names = [site.name for site in sites]
    for name in sorted({n for n in names if names.count(n) > 1}):
        problems.append(Problem(shown, "sites", f"site name {name!r} is used twice"))
    if problems:
        raise SiteConfigError(problems)
    return Federation(path, spec, sites)
