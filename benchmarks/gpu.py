"""GPU training as users run it: the federated engine against a plain PyTorch loop, and the data loader alone.

CheXpert-like site shards (docs/shards.md: uint8 1-channel tiles, five diseases with missing labels)
are written to disk and read memory-mapped, as ``fedauc train`` reads them. Three measurements on the
same network and samples, interleaved over ``--repeats``:

* the in-process engine: ``federated.train`` with FedAvg, K sites, I local steps per round, per-site
  batch B, bfloat16 autocast and channels-last on CUDA, the loader's page-locked asynchronous copies and
  on-device augmentation (flips, shifts); images/s over rounds 2.. (round 1 is the warm-up);
* a plain PyTorch loop a careful user would write: one network, batch B drawn from all K shards, the same
  loss (masked BCE), SGD, autocast, channels-last, pinned non-blocking copies, the same augmentation,
  K x I steps per "round" and no federation at all. Sites run one after another in the engine, so this
  is the limit the engine approaches (target: engine >= 0.95 x plain);
* the loader alone: ``SiteLoader.batches`` of one site delivering augmented float batches on the device,
  synchronised, without a network (target: >= 3 x the engine's training rate, so it is never the
  bottleneck).

Reports images/s and peak GPU memory (``torch.cuda.max_memory_allocated``) per measurement. On a machine
without CUDA it runs on the CPU with small defaults (64-pixel tiles, B=8, one timed round, no repeat) so
it finishes in a couple of minutes on an idle 2-core CPU (32-pixel tiles were not faster per image there); the CPU figures check the harness, the GPU figures are the ones the targets are for.
``--compile`` adds ``torch.compile`` to both (``TrainConfig.compile_network``).

    python benchmarks/gpu.py [--network densenet121] [--image 224] [--batch 32] [--sites 5] [--local-steps 8]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch

import federated
from federated import ShardSite, TrainConfig
from federated.data import SiteLoader, augment, device_images, load_shard
from federated.network import initial_model, training_forward
from models.objectives import masked_bce_with_logits
from preprocessing.records import CHEST_XRAY_DISEASES
from preprocessing.shard_format import FORMAT_VERSION, SHARD_FILE, images_path, manifest_path

ENGINE_TARGET = 0.95  # engine / plain loop, images/s
LOADER_TARGET = 3.0  # loader alone / engine, images/s
FLIP, SHIFT = True, 8  # the on-device augmentation both training loops use


def write_shards(root: Path, sites: int, n: int, image: int) -> list[Path]:
    """K CheXpert-like site shards: uint8 tiles, five diseases, labels 1/0 and a quarter missing (NaN)."""
    rng = np.random.default_rng(0)
    dirs = []
    for k in range(sites):
        site = root / f"site{k}"
        images_path(site, "train").parent.mkdir(parents=True)
        labels = (rng.random((n, len(CHEST_XRAY_DISEASES))) < 0.3).astype(np.float32)
        labels[rng.random(labels.shape) < 0.25] = np.nan
        np.save(images_path(site, "train"), rng.integers(0, 256, (n, image, image), dtype=np.uint8))
        pd.DataFrame(labels, columns=list(CHEST_XRAY_DISEASES)).to_parquet(manifest_path(site, "train"))
        info = {"format_version": FORMAT_VERSION, "site": f"site{k}", "task": "chest-xray",
                "diseases": list(CHEST_XRAY_DISEASES), "image_size": image, "channels": 1,
                "counts": {"train": n, "valid": 0, "test": 0}}
        (site / SHARD_FILE).write_text(json.dumps(info))
        dirs.append(site)
    return dirs


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def peak_memory(device: torch.device) -> float:
    """GiB of GPU memory allocated at the peak since the last reset; 0 on the CPU."""
    return torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else 0.0


def reset_peak(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def config(dirs: list[Path], args, rounds: int) -> TrainConfig:
    return TrainConfig(algorithm="fedavg", sites=[ShardSite(path=d) for d in dirs], network=args.network,
                       rounds=rounds, local_steps=args.local_steps, batch_size=args.batch, lr=0.01, progress=False,
                       augment_flip=FLIP, augment_shift=SHIFT, loader_workers=2,
                       compile_network=args.compile is not None, compile_mode=args.compile or "default")


def engine_rate(dirs: list[Path], args, device: torch.device) -> tuple[float, float]:
    """Images/s of the in-process engine over rounds 2..R (the callback runs at each round's end)."""
    reset_peak(device)
    marks: list[float] = []

    def mark(record: dict) -> None:
        synchronize(device)
        marks.append(time.perf_counter())

    federated.train(config(dirs, args, args.rounds + 1), callbacks=[mark])
    images = (len(marks) - 1) * args.sites * args.local_steps * args.batch
    return images / (marks[-1] - marks[0]), peak_memory(device)


def plain_rate(dirs: list[Path], args, device: torch.device) -> tuple[float, float]:
    """Images/s of one network trained with batch B from the pooled shards, K x I steps a round."""
    reset_peak(device)
    sites = [load_shard(d).train for d in dirs]
    cfg = config(dirs, args, 1)
    model = initial_model(cfg, (1, args.image, args.image), len(CHEST_XRAY_DISEASES), device)
    compiled = training_forward(model, cfg)
    forward = model if compiled is None else compiled
    optimizer = torch.optim.SGD(model.parameters(), lr=cfg.lr)
    cuda = device.type == "cuda"
    rng = np.random.default_rng(0)

    def step() -> None:
        k = int(rng.integers(len(sites)))
        rows = np.sort(rng.choice(len(sites[k]), args.batch, replace=False))
        images = torch.from_numpy(np.asarray(sites[k].images[rows]))
        labels = torch.from_numpy(sites[k].labels[rows])
        if cuda:
            images, labels = images.pin_memory(), labels.pin_memory()
        x = augment(device_images(images, device), FLIP, SHIFT)
        if cuda:
            x = x.contiguous(memory_format=torch.channels_last)
        labels = labels.to(device, non_blocking=True)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=cuda):
            logits = forward(x).float()
        loss = masked_bce_with_logits(logits, torch.nan_to_num(labels), (~torch.isnan(labels)).float())
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    per_round = args.sites * args.local_steps
    for _ in range(per_round):  # warm-up round, as the engine's first
        step()
    synchronize(device)
    start = time.perf_counter()
    for _ in range(args.rounds * per_round):
        step()
    synchronize(device)
    return args.rounds * per_round * args.batch / (time.perf_counter() - start), peak_memory(device)


def loader_rate(dirs: list[Path], args, device: torch.device) -> float:
    """Images/s of one site's loader delivering augmented device batches, no network."""
    loader = SiteLoader(load_shard(dirs[0]).train, args.batch, seed=0, device=device, workers=2,
                        flip=FLIP, max_shift=SHIFT)
    steps = args.rounds * args.sites * args.local_steps
    for _ in loader.batches(args.local_steps):  # warm-up
        pass
    synchronize(device)
    start = time.perf_counter()
    done = 0
    while done < steps:
        for batch in loader.batches(args.local_steps):
            batch.x.sum()  # consumed on the device, as a network's first layer would
        done += args.local_steps
    synchronize(device)
    return done * args.batch / (time.perf_counter() - start)


def main() -> int:
    cuda = torch.cuda.is_available()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--network", default="densenet121")
    parser.add_argument("--image", type=int, default=224 if cuda else 64)
    parser.add_argument("--batch", type=int, default=32 if cuda else 8)
    parser.add_argument("--sites", type=int, default=5)
    parser.add_argument("--local-steps", type=int, default=8, help="I")
    parser.add_argument("--rounds", type=int, default=4 if cuda else 1, help="timed rounds after a warm-up round")
    parser.add_argument("--repeats", type=int, default=3 if cuda else 1, help="interleaved repeats; the best is reported")
    parser.add_argument("--compile", nargs="?", const="default", metavar="MODE",
                        help="torch.compile the network in both loops, in this mode (default; reduce-overhead: CUDA graphs)")
    args = parser.parse_args()
    device = torch.device("cuda" if cuda else "cpu")
    if cuda:
        torch.backends.cudnn.benchmark = True
    name = torch.cuda.get_device_name(device) if cuda else f"CPU ({torch.get_num_threads()} threads)"
    with tempfile.TemporaryDirectory(prefix="fedauc-gpu-") as tmp:
        per_site = 2 * (args.rounds + 1) * args.local_steps * args.batch
        dirs = write_shards(Path(tmp), args.sites, per_site, args.image)
        runs: dict[str, list[tuple[float, float]]] = {"engine": [], "plain": []}
        loader = []
        for _ in range(args.repeats):
            runs["plain"].append(plain_rate(dirs, args, device))
            runs["engine"].append(engine_rate(dirs, args, device))
            loader.append(loader_rate(dirs, args, device))
    best = {key: max(rate for rate, _ in values) for key, values in runs.items()}
    memory = {key: max(gib for _, gib in values) for key, values in runs.items()}
    print(f"{name}; {args.network} {args.image}x{args.image} 1-channel, K={args.sites} sites, B={args.batch}, "
          f"I={args.local_steps}, {args.rounds} timed rounds, best of {args.repeats}; "
          f"{'bfloat16 autocast, channels-last' if cuda else 'float32'}{f', torch.compile {args.compile}' if args.compile else ''}")
    for key, label in (("plain", "plain PyTorch loop"), ("engine", "in-process engine")):
        gpu = f"peak GPU memory {memory[key]:.2f} GiB" if cuda else "(no GPU memory on the CPU)"
        print(f"  {label:<20} {best[key]:9.1f} images/s   {gpu}")
    print(f"  loader alone         {max(loader):9.1f} images/s")
    engine_ratio, loader_ratio = best["engine"] / best["plain"], max(loader) / best["engine"]
    print(f"  engine / plain loop: {engine_ratio:.3f}  (target >= {ENGINE_TARGET})")
    print(f"  loader / engine:     {loader_ratio:.1f}  (target >= {LOADER_TARGET})")
    ok = engine_ratio >= ENGINE_TARGET and loader_ratio >= LOADER_TARGET
    print("PASS" if ok else "FAIL: below target")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
