"""GPU training near the device's limit: the federated engine against a plain PyTorch loop, eager, compiled and
as CUDA graphs, in one run.

CheXpert-like site shards (docs/shards.md: uint8 1-channel tiles, five diseases, a quarter of the labels
missing) are written to disk and read memory-mapped, as ``fedauc train`` reads them. Rows, for every mode
(``eager``; ``compiled``: ``torch.compile``; ``cuda-graphs``: ``compile_mode="reduce-overhead"``, the forward and
backward replayed as CUDA graphs, federated/network.py):

* the plain PyTorch loop a careful user would write at the papers' per-site batch B (32): one network, batches
  drawn from all K shards, the same masked BCE, SGD, bfloat16 autocast, channels-last, pinned non-blocking copies
  and on-device flips and shifts, K x I steps a "round", no federation;
* the in-process engine at B per site: K sites, I local steps a round, FedAvg and, since their steps do more,
  CODASCA and FeDXL2; images/s over the timed rounds after a warm-up round (compilation, graph recording);
* the plain loop at the ceiling batch (128): what the network can do on the device once launches stop mattering;
* the site loader alone (target: >= 3 x the engine, so it is never the bottleneck).

Per row: images/s, peak GPU memory, and from one extra profiled round (torch.profiler, CUDA kernels): the GPU busy
fraction (the union of kernel and copy intervals over the unprofiled round's wall time), kernel and graph launches
per step, and implicit host syncs per round (``torch.cuda.set_sync_debug_mode``). Targets, printed with PASS/FAIL:
engine FedAvg at B as CUDA graphs >= 0.8 x the best plain loop at the ceiling batch; engine >= 0.95 x the plain
loop at the same batch and mode, in every mode. Without CUDA it stops with a message; ``--smoke`` runs every code
path on the CPU in a couple of minutes with a tiny network (the figures then check the harness, nothing more).

    python -m benchmarks.throughput.gpu [--algorithms fedavg codasca fedxl2] [--modes eager compiled cuda-graphs]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from torch._dynamo.utils import counters
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

import federated
from federated import ShardSite, TrainConfig
from federated.data import SiteLoader, augment, device_images, load_shard
from federated.network import initial_model, local_steps, training_forward
from models.objectives import masked_bce_with_logits
from preprocessing.records import CHEST_XRAY_DISEASES
from preprocessing.shard_format import FORMAT_VERSION, SHARD_FILE, images_path, manifest_path

CEILING_TARGET = 0.8  # engine FedAvg at B as CUDA graphs / best plain loop at the ceiling batch
ENGINE_TARGET = 0.95  # engine / plain loop, same batch and mode
LOADER_TARGET = 3.0  # loader alone / engine
FLIP, SHIFT = True, 8  # the on-device augmentation both training loops use
MODES = {"eager": None, "compiled": "default", "cuda-graphs": "reduce-overhead"}  # row name -> compile_mode
LAUNCHES = {"cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx", "cudaGraphLaunch"}


@dataclass
class Row:
    loop: str  # "plain" or an algorithm
    batch: int
    mode: str
    rate: float  # images/s
    memory: float  # peak GiB (0 on the CPU)
    busy: float | None  # GPU busy fraction of a round (None on the CPU)
    launches: float | None  # kernel and graph launches per step
    syncs: int | None  # implicit host syncs in the profiled round
    # Compiled graphs that inductor runs without CUDA graphs, since the compiler's last reset: rows after the first
    # of a mode and batch reuse its graphs, so they count its skips too.
    graph_skips: int = 0


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


class ProfiledRound:
    """Kernel time, launches and implicit host syncs of one round (start() ... stop())."""

    def __init__(self, device: torch.device, trace: Path | None):
        self.trace = trace  # where to write the round's Chrome trace (chrome://tracing, Perfetto); None: nowhere
        self.cuda = device.type == "cuda"
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.cuda else [])
        self.profiler = profile(activities=activities)
        self.warnings = warnings.catch_warnings(record=True)

    def start(self) -> None:
        self.caught = self.warnings.__enter__()
        warnings.simplefilter("always")
        if self.cuda:
            torch.cuda.set_sync_debug_mode("warn")
        self.profiler.start()

    def stop(self, steps: int, round_seconds: float) -> tuple[float | None, float | None, int | None]:
        """(busy fraction of a round of ``round_seconds``, launches per step, host syncs) of the profiled round."""
        self.profiler.stop()
        if self.trace is not None:
            self.trace.parent.mkdir(parents=True, exist_ok=True)
            self.profiler.export_chrome_trace(str(self.trace))
        if self.cuda:
            torch.cuda.set_sync_debug_mode("default")
        self.warnings.__exit__(None, None, None)
        # Kineto's raw events: building the profiler's Python events for ~100,000 kernels would take longer than the round.
        events = self.profiler.profiler.kineto_results.events()
        spans = sorted((e.start_ns(), e.start_ns() + e.duration_ns()) for e in events
                       if e.device_type() == DeviceType.CUDA)
        busy, end = 0, 0
        for start, stop in spans:  # the union of the intervals: kernels of two streams may overlap
            busy += max(0, stop - max(start, end))
            end = max(end, stop)
        launches = sum(1 for e in events if e.device_type() == DeviceType.CPU and e.name() in LAUNCHES)
        syncs = sum(1 for w in self.caught if "synchronizing" in str(w.message))
        if not self.cuda:  # parsed all the same: --smoke runs this code
            return None, None, None
        return busy * 1e-9 / round_seconds, launches / steps, syncs


def trace_path(args, loop: str, batch: int, mode: str) -> Path | None:
    return Path(args.trace) / f"{loop}-B{batch}-{mode}.json" if args.trace else None


def peak_memory(device: torch.device) -> float:
    return torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else 0.0


def reset_peak(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def config(dirs: list[Path], args, algorithm: str, mode: str, rounds: int) -> TrainConfig:
    return TrainConfig(algorithm=algorithm, sites=[ShardSite(path=d) for d in dirs], network=args.network,
                       rounds=rounds, local_steps=args.local_steps, batch_size=args.batch, lr=0.01, progress=False,
                       augment_flip=FLIP, augment_shift=SHIFT, loader_workers=2,
                       compile_network=MODES[mode] is not None, compile_mode=MODES[mode] or "default")


def engine_row(dirs: list[Path], args, algorithm: str, mode: str, device: torch.device) -> Row:
    """The in-process engine: a warm-up round, ``args.rounds`` timed rounds, one profiled round."""
    reset_peak(device)
    marks: list[float] = []
    steps = args.sites * args.local_steps
    profiled, result = ProfiledRound(device, trace_path(args, algorithm, args.batch, mode)), {}

    def mark(record: dict) -> None:  # runs at each round's end
        synchronize(device)
        marks.append(time.perf_counter())
        if len(marks) == args.rounds + 1:
            profiled.start()
        elif len(marks) == args.rounds + 2:
            result["profile"] = profiled.stop(steps, (marks[-2] - marks[0]) / args.rounds)

    federated.train(config(dirs, args, algorithm, mode, args.rounds + 2), callbacks=[mark])
    rate = args.rounds * steps * args.batch / (marks[-2] - marks[0])
    return Row(algorithm, args.batch, mode, rate, peak_memory(device), *result["profile"])


def plain_row(dirs: list[Path], args, batch: int, mode: str, device: torch.device) -> Row:
    """One network trained with ``batch`` from the pooled shards, K x I steps a round, in the engine's scope for
    local steps (the same loss without value checks; a CUDA-graph step mark)."""
    reset_peak(device)
    sites = [load_shard(d).train for d in dirs]
    cfg = config(dirs, args, "fedavg", mode, 1)
    model = initial_model(cfg, (1, args.image, args.image), len(CHEST_XRAY_DISEASES), device)
    compiled = training_forward(model, cfg)
    forward = model if compiled is None else compiled
    optimizer = torch.optim.SGD(model.parameters(), lr=cfg.lr)
    cuda = device.type == "cuda"
    rng = np.random.default_rng(0)

    def step() -> None:
        k = int(rng.integers(len(sites)))
        rows = np.sort(rng.choice(len(sites[k]), batch, replace=False))
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

    def run_round() -> None:
        with local_steps(cfg, model) as step_begins:
            for _ in range(per_round):
                step_begins()
                step()
        synchronize(device)

    run_round()  # warm-up, as the engine's first round
    start = time.perf_counter()
    for _ in range(args.rounds):
        run_round()
    seconds = time.perf_counter() - start
    profiled = ProfiledRound(device, trace_path(args, "plain", batch, mode))
    profiled.start()
    run_round()
    profile_figures = profiled.stop(per_round, seconds / args.rounds)
    return Row("plain", batch, mode, args.rounds * per_round * batch / seconds, peak_memory(device), *profile_figures)


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


def machine(cuda: bool) -> str:
    if not cuda:
        return f"CPU ({torch.get_num_threads()} threads), torch {torch.__version__}"
    try:
        driver = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                capture_output=True, text=True, timeout=30).stdout.strip().splitlines()[0]
    except (OSError, IndexError, subprocess.SubprocessError):
        driver = "unknown"
    return (f"{torch.cuda.get_device_name()}, driver {driver}, torch {torch.__version__} "
            f"(CUDA {torch.version.cuda}, cuDNN {torch.backends.cudnn.version()})")


def print_row(row: Row, cuda: bool) -> None:
    label = f"{'plain loop' if row.loop == 'plain' else 'engine ' + row.loop} B={row.batch}"
    gpu = (f"{row.memory:6.2f} GiB  busy {row.busy:5.1%}  {row.launches:7.1f} launches/step  {row.syncs:4d} syncs/round"
           if cuda else "(no GPU figures on the CPU)")
    skipped = (f"  CUDA graphs skipped for {row.graph_skips} compiled graph(s) (TORCH_LOGS=perf_hints says why)"
               if row.graph_skips else "")
    print(f"  {label:<22} {row.mode:<12} {row.rate:9.1f} images/s  {gpu}{skipped}", flush=True)


def verdicts(rows: list[Row], args, loader: float) -> bool:
    """Print the target ratios; whether all of them pass."""
    get = {(r.loop, r.batch, r.mode): r.rate for r in rows}
    ok = True

    def check(text: str, value: float, target: float) -> None:
        nonlocal ok
        ok &= value >= target
        print(f"  {text:<62} {value:6.3f}  (target >= {target})  {'PASS' if value >= target else 'FAIL'}")

    print("targets:")
    ceiling = max((r for r in rows if r.loop == "plain" and r.batch == args.ceiling_batch), key=lambda r: r.rate)
    if ("fedavg", args.batch, "cuda-graphs") in get:
        check(f"engine FedAvg B={args.batch} cuda-graphs / plain B={args.ceiling_batch} ({ceiling.mode})",
              get["fedavg", args.batch, "cuda-graphs"] / ceiling.rate, CEILING_TARGET)
    else:
        print("  (no ceiling ratio: it needs the engine's FedAvg row in cuda-graphs mode)")
    for r in rows:
        if r.loop != "plain" and ("plain", r.batch, r.mode) in get:
            check(f"engine {r.loop} / plain loop, B={r.batch}, {r.mode}", r.rate / get["plain", r.batch, r.mode],
                  ENGINE_TARGET)
    check("loader alone / fastest engine", loader / max(r.rate for r in rows if r.loop != "plain"), LOADER_TARGET)
    return ok


def main() -> int:
    cuda = torch.cuda.is_available()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--network", default="densenet121")
    parser.add_argument("--image", type=int, default=224)
    parser.add_argument("--batch", type=int, default=32, help="B per site (engine) and of the plain loop")
    parser.add_argument("--ceiling-batch", type=int, default=128, help="the plain loop's batch for the ceiling")
    parser.add_argument("--sites", type=int, default=5)
    parser.add_argument("--local-steps", type=int, default=8, help="I")
    parser.add_argument("--rounds", type=int, default=4, help="timed rounds after a warm-up round")
    parser.add_argument("--repeats", type=int, default=1, help="interleaved repeats; the best of each row is kept")
    parser.add_argument("--algorithms", nargs="+", default=["fedavg", "codasca", "fedxl2"])
    parser.add_argument("--modes", nargs="+", choices=list(MODES), default=list(MODES))
    parser.add_argument("--trace", metavar="DIR", help="write each row's profiled round there as a Chrome trace")
    parser.add_argument("--smoke", action="store_true",
                        help="check the harness on the CPU: tiny network, images and batches, one timed round")
    args = parser.parse_args()
    if not cuda and not args.smoke:
        print("benchmarks/throughput/gpu.py measures a GPU and this machine has none (torch.cuda.is_available() is False; "
              f"torch {torch.__version__}). Run it on a CUDA machine, or add --smoke to check the harness on the CPU.",
              file=sys.stderr)
        return 2
    if args.smoke:
        cuda = False
        args.network, args.image, args.batch, args.ceiling_batch = "linear", 16, 4, 8
        args.sites, args.local_steps, args.rounds, args.repeats = 2, 2, 1, 1
    device = torch.device("cuda" if cuda else "cpu")
    if cuda:
        torch.backends.cudnn.benchmark = True
    # One graph per batch size, as a run with one B compiles, rather than a dynamic-shape graph for both.
    torch._dynamo.config.automatic_dynamic_shapes = False
    started = time.perf_counter()
    print(f"{machine(cuda)}; {args.network} {args.image}x{args.image} 1-channel, K={args.sites} sites, "
          f"I={args.local_steps}, {args.rounds} timed rounds, best of {args.repeats}; "
          f"{'bfloat16 autocast, channels-last' if cuda else 'float32 (smoke: harness check, not a measurement)'}",
          flush=True)
    rows: list[Row] = []
    loader = []
    with tempfile.TemporaryDirectory(prefix="fedauc-gpu-") as tmp:
        per_site = max(2 * (args.rounds + 2) * args.local_steps * args.batch, 2 * args.ceiling_batch)
        dirs = write_shards(Path(tmp), args.sites, per_site, args.image)
        def add(row: Row) -> None:
            row.graph_skips = counters["inductor"]["cudagraph_skips"] - skips_before
            rows.append(row)
            print_row(row, cuda)

        for _ in range(args.repeats):
            for mode in args.modes:
                # A fresh compiler per mode and batch: graphs and CUDA-graph pools of other rows do not linger.
                torch._dynamo.reset()
                skips_before = counters["inductor"]["cudagraph_skips"]
                add(plain_row(dirs, args, args.batch, mode, device))
                for algorithm in args.algorithms:
                    add(engine_row(dirs, args, algorithm, mode, device))
                torch._dynamo.reset()
                skips_before = counters["inductor"]["cudagraph_skips"]
                add(plain_row(dirs, args, args.ceiling_batch, mode, device))
            loader.append(loader_rate(dirs, args, device))
            print(f"  loader alone B={args.batch}{'':<25} {loader[-1]:9.1f} images/s", flush=True)
    best = {}
    for r in rows:  # the best repeat of each row
        key = (r.loop, r.batch, r.mode)
        if key not in best or r.rate > best[key].rate:
            best[key] = r
    print(f"best of {args.repeats} ({time.perf_counter() - started:.0f} s in all):")
    for r in best.values():
        print_row(r, cuda)
    ok = verdicts(list(best.values()), args, max(loader))
    if args.smoke:
        print("smoke run on the CPU: every code path ran; the figures are not a measurement")
        return 0
    print("PASS" if ok else "FAIL: below target")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
