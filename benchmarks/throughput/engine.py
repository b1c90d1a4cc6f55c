"""Throughput of the federated engine against the limit: one plain PyTorch loop.

The in-process engine with K sites, per-site batch B and I local steps per round processes the same
samples as one plain training loop over the same network with batch K x B (simulation cannot do
less work than that). Both read uint8 images from memory-mapped shards on disk and normalize them on
the training device. Target: engine / plain >= 0.9 on CPU. The distributed backend (K processes,
gloo on CPU, NCCL on GPU, started with torchrun) is measured too; on a 2-core CPU its K processes
share the cores, so its figure measures overhead, not speed-up. On a shared machine, wall-clock rates
swing with other processes' load; the CPU-time rates (samples per CPU second of this process) do not,
and the best of interleaved repeats is reported next to the median.

Secure aggregation's cost (``--secure-sites 3``, 0 skips it): the in-process engine on the first 3 sites
with and without ``secure_aggregation`` (interleaved repeats), bytes each site sends per round (the
engine's records) and the round's seconds; and the aggregation alone, one masked ring sum of the model
against the plain mean of the same tensors. Targets: at most 2x float32's bytes, under 0.5 s added per round.

    python -m benchmarks.throughput.engine [--sites 4] [--batch 32] [--image 48] [--steps 32] [--local-steps 8] [--threads 1]
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
from federated.backends import InProcessTransport
from federated.data import to_model_input
from federated.secure_aggregation import SecureTransport
from models.networks import build_network
from models.objectives import masked_bce_with_logits
from preprocessing.shard_format import (
    FORMAT_VERSION,
    IMAGE_DTYPE,
    LABEL_DTYPE,
    SHARD_FILE,
    images_path,
    manifest_path,
    read_split,
)


def write_shards(root: Path, sites: int, n: int, image: int) -> list[Path]:
    """K site shards (docs/shards.md layout) of random uint8 images and one binary label."""
    rng = np.random.default_rng(0)
    dirs = []
    for k in range(sites):
        d = root / f"site{k}"
        (d / "train").mkdir(parents=True)
        (d / SHARD_FILE).write_text(json.dumps({"format_version": FORMAT_VERSION, "site": f"site{k}", "task": "melanoma",
                                                "diseases": ["Melanoma"]}))
        np.save(images_path(d, "train"), rng.integers(0, 256, (n, image, image), dtype=IMAGE_DTYPE))
        pd.DataFrame({"Melanoma": (rng.random(n) < 0.2).astype(LABEL_DTYPE)}).to_parquet(manifest_path(d, "train"))
        dirs.append(d)
    return dirs


def plain_loop(dirs: list[Path], batch: int, steps: int, device: torch.device, seed: int) -> tuple[float, float]:
    """Samples per wall second and per CPU second of SGD on BCE with batch K x B drawn from all shards."""
    images, labels = zip(*(read_split(d, "train", ["Melanoma"]) for d in dirs))
    labels = [split_labels[:, 0] for split_labels in labels]
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
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(steps):
        step()
    return steps * total / (time.perf_counter() - wall), steps * total / (time.process_time() - cpu)


def engine_config(dirs, args) -> TrainConfig:
    return TrainConfig(algorithm="fedavg", sites=[ShardSite(path=d) for d in dirs], network="small_resnet",
                       rounds=args.steps // args.local_steps + 1, local_steps=args.local_steps,
                       batch_size=args.batch, lr=0.01, progress=False, loader_workers=2)


def rate_from_history(history: list[dict], samples_per_round: int) -> float:
    """Samples per second over all rounds but the first (warm-up), from the engine's own round timer."""
    seconds = sum(h["seconds"] for h in history[1:])
    return (len(history) - 1) * samples_per_round / seconds


def engine_rates(config: TrainConfig, samples_per_round: int) -> tuple[float, float]:
    """Samples per wall second and per CPU second of the in-process engine, rounds 2..R (the callback
    runs at the end of every round, so round 1 is the warm-up)."""
    marks: list[tuple[float, float]] = []
    federated.train(config, callbacks=[lambda record: marks.append((time.perf_counter(), time.process_time()))])
    rounds = len(marks) - 1
    return (rounds * samples_per_round / (marks[-1][0] - marks[0][0]),
            rounds * samples_per_round / (marks[-1][1] - marks[0][1]))


def aggregation_seconds(transport, K: int, repeats: int = 5) -> float:
    """Median seconds of one mean of small_resnet's floating tensors over K sites through ``transport``."""
    states = [[t.clone() for t in build_network("small_resnet", num_classes=1, in_channels=1).state_dict().values()
               if t.is_floating_point()] for _ in range(K)]
    seconds = []
    for _ in range(repeats):
        started = time.perf_counter()
        transport.mean_(states, [1.0 / K] * K)
        seconds.append(time.perf_counter() - started)
    return float(np.median(seconds))


def secure_cost(dirs: list[Path], args) -> None:
    """Bytes and seconds per round with and without secure aggregation, in-process, K = args.secure_sites."""
    K = args.secure_sites
    rows: dict[bool, list[dict]] = {False: [], True: []}
    for _ in range(args.repeats):
        for secure in (False, True):
            config = engine_config(dirs[:K], args).model_copy(update={"secure_aggregation": secure})
            rows[secure].append(federated.train(config).history[1:])  # round 0 is the warm-up
    sent = {s: rows[s][0][0]["bytes_sent"][0] for s in rows}
    seconds = {s: float(np.median([h["seconds"] for run in rows[s] for h in run])) for s in rows}
    plain_mean = aggregation_seconds(InProcessTransport(K), K)
    secure_mean = aggregation_seconds(SecureTransport(InProcessTransport(K), [f"site{k}" for k in range(K)]), K)
    print(f"\nsecure aggregation, in-process, K={K}, small_resnet, I={args.local_steps}, {args.repeats} interleaved repeats")
    print(f"bytes sent per site and round: plain {sent[False]:,}, secure {sent[True]:,} "
          f"(ratio {sent[True] / sent[False]:.2f}, target <= 2)")
    print(f"median round: plain {seconds[False]:.3f} s, secure {seconds[True]:.3f} s "
          f"(added {seconds[True] - seconds[False]:+.3f} s, target < 0.5 s)")
    print(f"one aggregation of the model over {K} sites: plain mean {plain_mean * 1e3:.1f} ms, masked ring sum "
          f"{secure_mean * 1e3:.1f} ms (added {(secure_mean - plain_mean) * 1e3:+.1f} ms)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sites", type=int, default=4)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--image", type=int, default=48)
    parser.add_argument("--steps", type=int, default=32, help="local steps per run (the first round is warm-up)")
    parser.add_argument("--local-steps", type=int, default=8, help="I")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--skip-distributed", action="store_true")
    parser.add_argument("--secure-sites", type=int, default=3, help="K of the secure aggregation rows; 0 skips them")
    parser.add_argument("--secure-only", action="store_true", help="only the secure aggregation rows")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch CPU threads; 1 keeps OpenMP spin-waits out of the CPU-time figures on a shared CPU")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    per_round = args.sites * args.batch * args.local_steps
    with tempfile.TemporaryDirectory() as tmp:
        dirs = write_shards(Path(tmp), max(args.sites, args.secure_sites),
                            4 * args.batch * args.steps // args.sites + args.batch, args.image)
        if args.secure_sites:
            secure_cost(dirs, args)
        if args.secure_only:
            return
        dirs = dirs[:args.sites]
        plain, engine = [], []
        for _ in range(args.repeats):  # interleaved, so load from other processes hits both alike
            plain.append(plain_loop(dirs, args.batch, args.steps, device, seed=0))
            engine.append(engine_rates(engine_config(dirs, args), per_round))
        plain_wall, plain_cpu = np.array(plain).T
        engine_wall, engine_cpu = np.array(engine).T
        print(f"device {device}, threads {torch.get_num_threads()}, small_resnet {args.image}x{args.image}, "
              f"K={args.sites}, B={args.batch}, I={args.local_steps}, {args.repeats} interleaved repeats")
        print("samples/s           wall (best, median)     CPU time (best, median)")
        print(f"plain loop K*B={args.sites * args.batch:<4}  {plain_wall.max():8.1f} {np.median(plain_wall):8.1f}"
              f"        {plain_cpu.max():8.1f} {np.median(plain_cpu):8.1f}")
        print(f"in-process engine    {engine_wall.max():8.1f} {np.median(engine_wall):8.1f}"
              f"        {engine_cpu.max():8.1f} {np.median(engine_cpu):8.1f}")
        p = float(plain_wall.max())
        print(f"ratio engine / plain: wall best {engine_wall.max() / p:.3f}, median {np.median(engine_wall / plain_wall):.3f}; "
              f"CPU time best {engine_cpu.max() / plain_cpu.max():.3f}, median {np.median(engine_cpu / plain_cpu):.3f}"
              "  (target >= 0.9 on CPU)")
        if args.skip_distributed:
            return
        cfg_path = Path(tmp) / "cfg.json"
        cfg_path.write_text(engine_config(dirs, args).model_dump_json())
        out = Path(tmp) / "result.pt"
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(args.sites),
               "--master-addr", "127.0.0.1", "--master-port", "29581", "-m", "federated.distributed",
               str(cfg_path), "--out", str(out)]
        env = dict(os.environ)
        if device.type == "cpu":
            env["OMP_NUM_THREADS"] = "1"
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
        if proc.returncode != 0:
            print(f"distributed run failed (exit {proc.returncode}):\n{proc.stderr[-2000:]}")
            sys.exit(1)
        d = rate_from_history(torch.load(out, weights_only=False)["history"], per_round)
        print(f"distributed engine ({args.sites} processes, {'nccl' if device.type == 'cuda' else 'gloo'}): "
              f"{d:8.1f} samples/s wall  ratio to the plain loop's best wall rate: {d / p:.3f}")


if __name__ == "__main__":
    main()
