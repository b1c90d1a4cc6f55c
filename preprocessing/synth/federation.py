"""Generate every synthetic hospital of a federation YAML (its sites' ``synth:`` entries)."""

from __future__ import annotations

import hashlib
from pathlib import Path

from preprocessing.federation import load_federation
from preprocessing.synth.generate import SynthResult, generate_site
from preprocessing.synth.sources import source_root


def site_data_dir(root: Path, fmt: str) -> Path:
    """The folder ``generate_site`` writes to, given the data root a site YAML declares."""
    inner = source_root(fmt)
    return root.parent if inner != Path(".") and root.name == inner.name else root


def generate_federation(federation_yaml: str | Path, out_root: str | Path | None = None, scale: float = 1.0,
                        seed: int = 0, *, workers: int | None = None, progress: bool = True,
                        images: bool = True) -> dict[str, SynthResult]:
    """Write each site of the federation that declares ``synth:``; returns ``{site name: SynthResult}``.

    ``out_root``: None writes every site where its YAML's ``root`` points (``demo_data/<site>``); a folder
    writes ``out_root/<site name>`` instead (``SynthResult.root`` is then the root to ingest).
    ``scale`` multiplies every site's ``n`` (at least one image per site). Each site has its own seed,
    derived from ``seed`` and its name, so two hospitals of the same format never share images.
    Existing data in those folders is replaced. ``images=False``: the metadata tables alone (labels and
    patients, hence the splits the sites will have), no image file.
    """
    if scale <= 0:
        raise ValueError(f"scale must be positive, got {scale}")
    federation = load_federation(federation_yaml)
    results = {}
    for site, spec in federation.synth_specs():
        folder = site_data_dir(site.root, site.format) if out_root is None else Path(out_root) / site.name
        site_seed = int.from_bytes(hashlib.sha256(f"{seed}/{site.name}".encode()).digest()[:4], "little")
        results[site.name] = generate_site(
            spec.format, folder, n=max(1, round(spec.n * scale)), seed=site_seed, profile=spec.profile,
            image_format=spec.image_format, workers=workers, overwrite=True, progress=progress, size=spec.size,
            images=images,
        )
    return results
