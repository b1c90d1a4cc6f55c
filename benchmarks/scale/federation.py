"""The scale benchmark's consortium, also what the peers benchmark trains on: K melanoma phantom sites
preprocessed by fedauc's own pipeline."""

from __future__ import annotations

from pathlib import Path

import yaml

IMAGES = 64


def make_federation(root: Path, K: int) -> Path:
    """K melanoma sites of IMAGES images each, preprocessed into shards under root/shards (reused if there)."""
    from preprocessing.scan import scan_site
    from preprocessing.shards import shard_site
    from preprocessing.sites import load_site
    from preprocessing.synth import generate_site

    entries = []
    for k in range(K):
        name = f"h{k:02d}"
        config_path = root / f"{name}.yaml"
        if not (root / "shards" / name).is_dir():
            generate_site("siim-isic-2020", root / "data" / name, n=IMAGES, seed=k, profile="vienna",
                          image_format="jpeg", workers=0, progress=False, prevalence=0.3)
            config_path.write_text(yaml.safe_dump({
                "name": name, "format": "siim-isic-2020", "root": f"data/{name}", "task": "melanoma",
                "image_size": 32, "min_image_size": 16, "split": {"seed": 0, "valid": 0.2, "test": 0.25},
                "options": {"image_format": "jpeg"}}))
            shard_site(load_site(config_path), scan_site(load_site(config_path)), root / "shards", workers=0,
                       progress=False)
        entries.append({"config": config_path.name})
    federation = root / f"scale-{K}.yaml"
    federation.write_text(yaml.safe_dump({"name": f"scale-{K}", "task": "melanoma", "sites": entries}))
    return federation
