"""Throughput of the federated engine against the limit: one plain PyTorch loop.

The in-process engine with K sites, per-site batch B and I local steps per round processes the same
samples as one plain training loop over the same network with batch K x B (simulation cannot do
less work than that). Both read uint8 images from memory-mapped shards on disk and normalize them on
the training device. Target: engine / plain >= 0.9 on CPU. The distributed backend (K processes,
gloo on CPU, NCCL on GPU, started with torchrun) is measured too; on a 2-core CPU its K processes
share the cores, so its figure measures overhead, not speed-up.

    python benchmarks/engine.py [--sites 4] [--batch 32] [--image 64] [--steps 24] [--local-steps 8]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch

import federated
from federated import ShardSite, TrainConfig
from federated.data import to_model_input
from models.networks import build_network
from models.objectives import masked_bce_with_logits


def write_shards(root: Path, sites: int, n: int, image: int) -> list[Path]:
    """K site shards (docs/shards.md layout) of random uint8 images and one binary label."""
    rng = np.random.default_rng(0)
    dirs = []
    for k in range(sites):
        d = root / f"site{k}"
        (d / "train").mkdir(parents=True)
        (d / "shard.json").write_text(json.dumps({"site": f"site{k}", "task": "melanoma", "diseases": ["Melanoma"]}))
        np.save(d / "train" / "images.npy", rng.integers(0, 256, (n, image, image), dtype=np.uint8))
        pd.DataFrame({"Melanoma": (rng.random(n) < 0.2).astype(np.float32)}).to_parquet(d / "train" / "manifest.parquet")
        dirs.append(d)
    return dirs


def plain_loop(dirs: list[Path], batch: int, steps: int, device: torch.device, seed: int) -> float:
    """Samples per second of SGD on BCE with batch K x B drawn from all shards (memory-mapped)."""
    images = [np.load(d / "train" / "images.npy", mmap_mode="r") for d in dirs]
    labels = [pd.read_parquet(d / "train" / "manifest.parquet")["Melanoma"].to_numpy(np.float32) for d in dirs]
    torch.manual_seed(seed)
    model = build_network("small_resnet", num_classes=1, in_channels=1).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    rng = np.random.default_rng(seed)
    total = batch * len(dirs)

    def step():
        parts = [np.sort(rng.choice(len(im), batch, replace=False)) for im in images]
        x = to_model_input(np.concatenate([im[p] for im, p in zip(images, parts)]), device)
        y = torch.from_numpy(np.concatenate([lab[p] for lab, p in zip(labels, parts)]))[:, None].to(device)
        opt.zero_grad(set_to_none=True)
        masked_bce_with_logits(model(x), y).backward()
        opt.step()

    step()  # warm-up
    start = time.perf_counter()
    for _ in range(steps):
        step()
    return steps * total / (time.perf_counter() - start)


def engine_config(dirs, args, backend: str) -> TrainConfig:
    return TrainConfig(algorithm="fedavg", sites=[ShardSite(path=d) for d in dirs], network="small_resnet",
                       rounds=args.steps // args.local_steps + 1, local_steps=args.local_steps,
                       batch_size=args.batch, lr=0.01, progress=False, backend=backend, loader_workers=2)


def rate_from_history(history: list[dict], samples_per_round: int) -> float:
    """Samples per second over all rounds but the first (warm-up), from the engine's own round timer."""
    seconds = sum(h["seconds"] for h in history[1:])
    return (len(history) - 1) * samples_per_round / seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sites", type=int, default=4)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--image", type=int, default=64)
    parser.add_argument("--steps", type=int, default=24, help="local steps measured per run")
    parser.add_argument("--local-steps", type=int, default=8, help="I")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--skip-distributed", action="store_true")
    args = parser.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    per_round = args.sites * args.batch * args.local_steps
    with tempfile.TemporaryDirectory() as tmp:
        dirs = write_shards(Path(tmp), args.sites, 4 * args.batch * args.steps // args.sites + args.batch, args.image)
        plain, engine = [], []
        for _ in range(args.repeats):  # interleaved, so load from other processes hits both alike
            plain.append(plain_loop(dirs, args.batch, args.steps, device, seed=0))
            engine.append(rate_from_history(federated.train(engine_config(dirs, args, "inprocess")).history, per_round))
        p, e = float(np.median(plain)), float(np.median(engine))
        print(f"device {device}, threads {torch.get_num_threads()}, small_resnet {args.image}x{args.image}, "
              f"K={args.sites}, B={args.batch}, I={args.local_steps}")
        print(f"plain loop, batch K*B={args.sites * args.batch}: {p:8.1f} samples/s  (runs: "
              + ", ".join(f"{v:.1f}" for v in plain) + ")")
        print(f"in-process engine, FedAvg:    {e:8.1f} samples/s  (runs: " + ", ".join(f"{v:.1f}" for v in engine) + ")")
        print(f"ratio engine / plain: {e / p:.3f}  (target >= 0.9 on CPU)")
        if args.skip_distributed:
            return
        cfg_path = Path(tmp) / "cfg.json"
        cfg_path.write_text(engine_config(dirs, args, "distributed").model_dump_json())
        out = Path(tmp) / "result.pt"
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(args.sites),
               "--master-addr", "127.0.0.1", "--master-port", "29581", "-m", "federated.distributed",
               str(cfg_path), "--out", str(out)]
        env = dict(os.environ)
        if device.type == "cpu":
            env["OMP_NUM_THREADS"] = str(max(1, torch.get_num_threads() // args.sites))
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
        if proc.returncode != 0:
            print(f"distributed run failed (exit {proc.returncode}):\n{proc.stderr[-2000:]}")
            sys.exit(1)
        d = rate_from_history(torch.load(out, weights_only=False)["history"], per_round)
        print(f"distributed engine ({args.sites} processes, {'nccl' if device.type == 'cuda' else 'gloo'}): "
              f"{d:8.1f} samples/s  ratio to plain: {d / p:.3f}")


if __name__ == "__main__":
    main()
