"""Is the demo chest federation a fair task? Central AUC per disease and a site-to-site transfer matrix.

The demo is only useful if the phantoms are neither trivial nor hopeless and if its hospitals differ:
1. generate the demo chest federation (``sites/demo/chest.yaml``) into a scratch folder;
2. preprocess every site with the real stages (``scan_site`` then ``shard_site``: decode, resize, shards);
3. train ``small_resnet`` centrally on the union of the sites' train splits (masked BCE: a missing label,
   VinDr's Edema, is not a negative) and report the per-disease test AUC on the union of the test splits
   (target: every disease in [0.70, 0.95]);
4. train one model per site and report its mean AUC on each site's test split: the diagonal (same site)
   should beat the off-diagonal (another hospital's acquisition and population).

Run: ``.venv/bin/python -m benchmarks.studies.demo_difficulty [--scale 1.0] [--epochs 8] [--size 64]``.
Prints the tables and the ratio of mean off-diagonal to mean diagonal AUC.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F
from sklearn.metrics import roc_auc_score

from models.networks import build_network
from preprocessing.federation import load_federation
from preprocessing.records import CHEST_XRAY_DISEASES
from preprocessing.scan import scan_site
from preprocessing.shard_format import read_split
from preprocessing.shards import shard_site
from preprocessing.synth import generate_federation

FEDERATION = Path(__file__).resolve().parents[1] / "sites" / "demo" / "chest.yaml"
MIN_POSITIVES = 5  # an AUC on fewer positives (or negatives) is noise, not a measurement


def load_split(site_dir: Path, split: str, size: int) -> tuple[torch.Tensor, np.ndarray]:
    arrays = read_split(site_dir, split, CHEST_XRAY_DISEASES)
    if arrays is None:
        return torch.zeros(0, 1, size, size), np.zeros((0, len(CHEST_XRAY_DISEASES)), np.float32)
    images = torch.from_numpy(np.array(arrays[0])).float().div(255.0).sub(0.5).unsqueeze(1)
    if images.shape[-1] != size:
        images = F.interpolate(images, size=(size, size), mode="area")
    return images, arrays[1]


def train(images: torch.Tensor, labels: np.ndarray, epochs: int, seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    model = build_network("small_resnet", num_classes=len(CHEST_XRAY_DISEASES), in_channels=1)
    optimiser = torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=1e-4)
    target = torch.from_numpy(np.nan_to_num(labels, nan=0.0))
    known = torch.from_numpy(~np.isnan(labels)).float()
    steps = epochs * int(np.ceil(len(images) / 64))
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimiser, max_lr=2e-3, total_steps=steps)
    generator = torch.Generator().manual_seed(seed)
    model.train()
    for _ in range(epochs):
        for batch in torch.randperm(len(images), generator=generator).split(64):
            x = images[batch]
            if torch.rand(1, generator=generator).item() < 0.5:  # left-right flips: the signs sit on either side
                x = x.flip(-1)
            loss = F.binary_cross_entropy_with_logits(model(x), target[batch], weight=known[batch], reduction="sum")
            optimiser.zero_grad()
            (loss / known[batch].sum().clamp(min=1)).backward()
            optimiser.step()
            schedule.step()
    return model.eval()


@torch.no_grad()
def predict(model: torch.nn.Module, images: torch.Tensor) -> np.ndarray:
    return torch.cat([torch.sigmoid(model(x)) for x in images.split(256)]).numpy()


def aucs(labels: np.ndarray, scores: np.ndarray) -> dict[str, float]:
    result = {}
    for k, disease in enumerate(CHEST_XRAY_DISEASES):
        known = ~np.isnan(labels[:, k])
        y = labels[known, k]
        if y.sum() >= MIN_POSITIVES and (1 - y).sum() >= MIN_POSITIVES:
            result[disease] = float(roc_auc_score(y, scores[known, k]))
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", type=float, default=1.0)
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--size", type=int, default=64, help="training resolution (shards are resized)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--work", type=Path, default=None, help="scratch folder (default: a temporary one)")
    args = parser.parse_args()
    torch.set_num_threads(2)
    work = args.work or Path(tempfile.mkdtemp(prefix="fedauc-difficulty-"))
    started = time.perf_counter()
    results = generate_federation(FEDERATION, work / "data", scale=args.scale, seed=args.seed, progress=False)
    generated = time.perf_counter()
    federation = load_federation(FEDERATION)
    data = {}
    for site in federation.sites:
        config = site.model_copy(update={"root": results[site.name].root})
        summary = shard_site(config, scan_site(config), work / "shards", workers=2, progress=False)
        data[site.name] = {split: load_split(summary.site_dir, split, args.size) for split in ("train", "valid", "test")}
    preprocessed = time.perf_counter()

    def union(split: str):
        return (torch.cat([d[split][0] for d in data.values()]), np.concatenate([d[split][1] for d in data.values()]))

    train_x, train_y = union("train")
    test_x, test_y = union("test")
    central = train(train_x, train_y, args.epochs, args.seed)
    central_auc = aucs(test_y, predict(central, test_x))
    print(f"\ncentral small_resnet, {len(train_x)} train / {len(test_x)} test images at {args.size} px, {args.epochs} epochs")
    print(f"{'disease':<18}{'test positives':>15}{'AUC':>8}")
    for k, disease in enumerate(CHEST_XRAY_DISEASES):
        positives = int(np.nansum(test_y[:, k]))
        print(f"{disease:<18}{positives:>15}{central_auc.get(disease, float('nan')):>8.3f}")
    in_band = all(0.70 <= central_auc.get(d, 0.0) <= 0.95 for d in CHEST_XRAY_DISEASES)

    names = list(data)
    matrix = pd.DataFrame(index=names, columns=names, dtype=float)
    for source in names:
        model = train(*data[source]["train"], args.epochs, args.seed)
        for target in names:
            test_images, test_labels = data[target]["test"]
            per_disease = aucs(test_labels, predict(model, test_images))
            matrix.loc[source, target] = np.mean(list(per_disease.values())) if per_disease else np.nan
    print("\nmean test AUC (diseases with >= 5 positives), rows: trained at, columns: tested at")
    print(matrix.round(3).to_string())
    diagonal = np.nanmean(np.diag(matrix.to_numpy()))
    off = np.nanmean(matrix.to_numpy()[~np.eye(len(names), dtype=bool)])
    finished = time.perf_counter()
    print(f"\nmean same-site AUC {diagonal:.3f}, mean other-site AUC {off:.3f}, ratio other/same {off / diagonal:.3f}")
    print(f"time: generation {generated - started:.0f} s, preprocessing {preprocessed - generated:.0f} s, "
          f"training {finished - preprocessed:.0f} s")
    print(json.dumps({"central_auc": central_auc, "all_in_0.70_0.95": in_band, "same_site": diagonal,
                      "other_site": off}))
    return 0 if in_band and off < diagonal else 1


if __name__ == "__main__":
    sys.exit(main())
