"""A tiny federation of phantom hospitals (``preprocessing.synth``), preprocessed into real shards by the product's
own scan and sharding: what the tests' federations and the throughput benchmarks train on."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import yaml

from preprocessing.scan import scan_site
from preprocessing.shards import shard_site
from preprocessing.sites import load_site
from preprocessing.synth import generate_site
from preprocessing.synth.sources import source_root


@dataclass(frozen=True)
class PhantomSite:
    """One hospital: its name, the dataset layout its export has, the phantoms' seed, the acquisition profile it
    imitates (None: the layout's own) and, for SIIM-ISIC, its image format (dicom or jpeg)."""

    name: str
    format: str
    seed: int = 0
    profile: str | None = None
    image_format: str | None = None


# Three dermatology clinics like the demo's: SIIM-ISIC exports, DICOM at one and JPEG at two, their own colour casts.
DERMATOLOGY_CLINICS = tuple(PhantomSite(name, "siim-isic-2020", seed=3, profile=name, image_format=image_format)
                            for name, image_format in (("vienna", "dicom"), ("barcelona", "jpeg"),
                                                       ("new-york", "jpeg")))


def phantom_federation(federation_yaml: Path, name: str, task: str, sites: tuple[PhantomSite, ...], *, n: int,
                       image_size: int = 32, valid: float = 0.2, test: float = 0.25, prevalence: float | None = None,
                       synthetic: bool = False) -> Path:
    """Write each site's export (``n`` images) under ``data/<site>`` beside ``federation_yaml``, its site YAML and
    its shards (``shards/<site>``), then the federation YAML naming them; returns ``federation_yaml``.
    ``prevalence``: the SIIM-ISIC phantoms' melanoma rate (None: the release's); ``synthetic``: the site YAMLs say
    their images are phantoms (a model trained on them says so in its contract)."""
    root = federation_yaml.parent
    entries = []
    for site in sites:
        generate_site(site.format, root / "data" / site.name, n=n, seed=site.seed, profile=site.profile,
                      image_format=site.image_format, workers=0, progress=False, prevalence=prevalence)
        config = {"name": site.name, "format": site.format,
                  "root": (Path("data") / site.name / source_root(site.format)).as_posix(), "task": task,
                  "image_size": image_size, "min_image_size": 16, "split": {"seed": 0, "valid": valid, "test": test}}
        if site.image_format is not None:
            config["options"] = {"image_format": site.image_format}
        if synthetic:
            config["synthetic"] = True
        (root / f"{site.name}.yaml").write_text(yaml.safe_dump(config))
        loaded = load_site(root / f"{site.name}.yaml")
        shard_site(loaded, scan_site(loaded), root / "shards", workers=0, progress=False)
        entries.append({"config": f"{site.name}.yaml"})
    federation_yaml.write_text(yaml.safe_dump({"name": name, "task": task, "sites": entries}))
    return federation_yaml
