"""fedauc against its peers: the same FedAvg training run by fedauc (in-process and over NVIDIA FLARE's simulator),
by NVIDIA FLARE's own FedAvg (its PyTorch recipe and Client API, simulator) and by Flower's simulation (ClientApp +
ServerApp, FedAvg strategy, Ray); and fedauc's AUC-margin step against LibAUC 2.0.1's AUCMLoss + PESG.

One command, one run, one table. K sites (the scale benchmark's federation, benchmarks/scale/federation.py: real
SIIM-ISIC-like shards of 64 images at 32 px) for each K; every system trains small_resnet from the same initial weights on the same rows (each site's train
split exported once as the shard's uint8 tensors, benchmarks/peers/common.py), batch 16, the same local steps,
rounds and learning rate, plain SGD on the masked BCE (fedauc's FedAvg step). Every system runs in a fresh
process tree of its own; a watcher samples every process of the tree for its RSS and CPU seconds.

Columns per system and K: wall seconds per round (median of the rounds after the first and before the last),
compute seconds (the sites' local training: their sum where sites train one after another, in-process and Flower
with one client at a time; their maximum where they train at once, the two simulators), overhead = round -
compute, bytes per round (fedauc's own count of what sites send and receive; the peers': the model's tensors down
and up per site), peak RSS of the largest process and of all together, the tree's CPU seconds, the final pooled
test AUC (every site's test split, the same evaluation for every system). Targets (ratios in this run):
fedauc in-process's overhead <= Flower's, fedauc over FLARE's <= NVFlare's own FedAvg's, at each K; fedauc's
AUC-M steps per CPU second >= 0.9 x LibAUC's. Flower and LibAUC live in virtual environments of their own under
~/.cache/fedauc-peers (benchmarks/peers/envs.py), made on first use; none is a dependency of fedauc.
The FLARE runs hold the POC lock (/tmp/fedauc-poc.lock) once for all of them.

    python -m benchmarks.peers [--quick] [--sizes 4 8 16] [--rounds 6] [--local-steps 4] [--plot docs/peers.png]
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

from benchmarks.peers.common import REPO, network, site_tensors
from benchmarks.peers.envs import peer_python, peer_versions

SYSTEMS = ("fedauc", "flower", "fedauc-flare", "nvflare")
AGAINST = {"fedauc": "flower", "fedauc-flare": "nvflare"}
FLARE = ("fedauc-flare", "nvflare")
LOCK = "/tmp/fedauc-poc.lock"


def prepare(root: Path, K: int, spec: dict) -> dict:
    """The federation of K sites, each site's train and test split exported for the peers, the initial weights."""
    import torch

    from benchmarks.scale.federation import make_federation
    from federated.data import load_shard
    from federated.network import initial_model
    from federated.sites import federation_config
    from preprocessing.federation import load_federation

    federation = make_federation(root, K)
    config = federation_config(load_federation(federation), root / "shards", fedauc_settings(spec))
    data = root / f"export-{K}"
    data.mkdir(exist_ok=True)
    sites = []
    for site in config.sites:
        shard = load_shard(site.path)
        sites.append(shard.name)
        for split in ("train", "test"):
            np.savez(data / f"{shard.name}-{split}.npz" if split == "test" else data / f"{shard.name}.npz",
                     images=np.asarray(shard.splits[split].images), labels=shard.splits[split].labels)
    first = load_shard(config.sites[0].path).train
    channels = 1 if first.images.ndim == 3 else first.images.shape[-1]
    shape = (channels, *first.images.shape[1:3])
    init = root / "init.pt"
    torch.save(initial_model(config, shape, first.labels.shape[1], torch.device("cpu")).state_dict(), init)
    return {**spec, "K": K, "federation": str(federation), "shards": str(root / "shards"), "data": str(data),
            "sites": sites, "init": str(init), "classes": int(first.labels.shape[1]), "channels": channels}


def fedauc_settings(spec: dict) -> dict:
    return dict(algorithm="fedavg", network=spec["network"], rounds=spec["rounds"], local_steps=spec["local_steps"],
                batch_size=spec["batch"], lr=spec["lr"], progress=False, loader_workers=0, device="cpu",
                eval_every=10 ** 6, timeout_s=900, seed=0)


def run_fedauc(job: dict) -> dict:
    """fedauc in-process (``flare``: over NVIDIA FLARE's simulator, one process per site) from this process."""
    import torch

    from federated.sites import federation_config
    from federated.training import train
    from preprocessing.federation import load_federation

    torch.set_num_threads(1)
    fed = load_federation(Path(job["federation"]))
    config = federation_config(fed, Path(job["shards"]), fedauc_settings(job))
    if job["system"] == "fedauc-flare":
        from federated.flare.centre.job import train_flare

        with tempfile.TemporaryDirectory() as workspace:
            result = train_flare(config, fed, Path(job["shards"]), "sim", Path(workspace))
        combine = max
    else:
        result = train(config)
        combine = sum
    torch.save(result.global_state, Path(job["out"]) / "final.pt")
    middle = result.history[1:-1]
    return {"round_s": [r["seconds"] for r in middle], "compute_s": [combine(r["site_compute_s"]) for r in middle],
            "bytes": sum(middle[0]["bytes_sent"]) + sum(middle[0]["bytes_received"])}


def from_site_log(out: Path, system: str, K: int, concurrent: bool) -> dict:
    """A peer's rounds from its sites' lines (common.log_round): a round is the time from its first site's
    start to the next round's; rounds after the first and before the last, as fedauc's."""
    lines = [json.loads(x) for x in (out / f"{system}-rounds.jsonl").read_text().splitlines()]
    rounds = sorted({x["round"] for x in lines})
    start = {r: min(x["start"] for x in lines if x["round"] == r) for r in rounds}
    compute = {r: (max if concurrent else sum)(x["compute_s"] for x in lines if x["round"] == r) for r in rounds}
    middle = rounds[1:-1]
    missing = [r for r in rounds if sum(x["round"] == r for x in lines) != K]
    if missing:
        raise RuntimeError(f"{system}: rounds {missing} lack some of the {K} sites' lines")
    return {"round_s": [start[r + 1] - start[r] for r in middle], "compute_s": [compute[r] for r in middle]}


def watch(pid: int, peaks: dict, done: threading.Event) -> None:
    """Every 0.25 s: RSS of the tree under ``pid`` (largest process, all together) and each process's CPU seconds."""
    import psutil

    root = psutil.Process(pid)
    while not done.wait(0.25):
        try:
            procs = [root, *root.children(recursive=True)]
        except psutil.Error:
            return
        total = 0.0
        for proc in procs:
            try:
                rss, cpu = proc.memory_info().rss / 2 ** 20, proc.cpu_times()
            except psutil.Error:
                continue
            total += rss
            peaks["largest"] = max(peaks["largest"], rss)
            peaks["cpu"][proc.pid] = cpu.user + cpu.system + cpu.children_user + cpu.children_system
        peaks["all"] = max(peaks["all"], total)


def launch(job: dict, cache: Path) -> dict:
    """One system's run in a fresh process tree; its figures and the watcher's."""
    system = job["system"]
    python = str(REPO / ".venv/bin/python") if system.startswith("fedauc") or system == "nvflare" else \
        peer_python(system, cache)
    runner = f"benchmarks.peers.systems.{system}" if system in ("flower", "nvflare", "libauc") else "benchmarks.peers"
    command = [python, "-m", runner, "--one", json.dumps(job)]
    peaks: dict = {"largest": 0.0, "all": 0.0, "cpu": {}}
    done = threading.Event()
    started = time.perf_counter()
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO,
                            env={**os.environ, "PYTHONPATH": str(REPO)})
    watcher = threading.Thread(target=watch, args=(proc.pid, peaks, done), daemon=True)
    watcher.start()
    stdout, stderr = proc.communicate()
    done.set()
    watcher.join()
    line = next((x for x in stdout.splitlines() if x.startswith("RESULT ")), None)
    if proc.returncode or line is None:
        raise RuntimeError(f"{system} K={job.get('K')} failed (exit {proc.returncode}):\n{stderr[-4000:]}")
    return {**json.loads(line[7:]), "wall_s": time.perf_counter() - started, "rss_largest_mb": peaks["largest"],
            "rss_all_mb": peaks["all"], "cpu_s": sum(peaks["cpu"].values())}


def pooled_auc(job: dict, state_path: Path) -> float:
    """The pooled test AUC (macro over diseases) of a final model: every site's test split, one evaluation."""
    import torch
    from sklearn.metrics import roc_auc_score

    model = network(job)
    state = torch.load(state_path, weights_only=True)
    model.load_state_dict({k: torch.as_tensor(v) for k, v in state.items()})
    model.eval()
    xs, ts = zip(*(site_tensors(Path(job["data"]), f"{site}-test") for site in job["sites"]))
    with torch.no_grad():
        scores = torch.cat([model(x) for x in xs]).numpy()
    target = torch.cat(ts).numpy()
    classes = scores.shape[1]
    aucs = [roc_auc_score(target[m, c], scores[m, c]) for c in range(classes)
            if (m := target[:, classes + c] == 1).any() and len(set(target[m, c])) == 2]
    return float(np.mean(aucs)) if aucs else math.nan


def measure(job: dict, cache: Path) -> dict:
    out = Path(job["out"])
    out.mkdir(parents=True, exist_ok=True)
    raw = launch(job, cache)
    if "round_s" not in raw:  # a peer: its sites' own lines
        raw.update(from_site_log(out, job["system"], job["K"], concurrent=job["system"] == "nvflare"))
    row = {"system": job["system"], "K": job["K"], **{k: v for k, v in raw.items() if k not in ("round_s", "compute_s")}}
    row["round_s"] = statistics.median(raw["round_s"])
    row["compute_s"] = statistics.median(raw["compute_s"])
    row["overhead_s"] = statistics.median(r - c for r, c in zip(raw["round_s"], raw["compute_s"]))
    row["auc"] = pooled_auc(job, out / "final.pt")
    return row


COLUMNS = [("round_s", "round s"), ("compute_s", "compute s"), ("overhead_s", "overhead s"), ("bytes", "bytes/round"),
           ("rss_largest_mb", "largest process RSS MB"), ("rss_all_mb", "all RSS MB"), ("cpu_s", "CPU s (run)"),
           ("wall_s", "wall s (run)"), ("auc", "pooled AUC")]


def table(rows: list[dict]) -> str:
    lines = ["| system | K | " + " | ".join(label for _, label in COLUMNS) + " |", "|---|---|" + "---|" * len(COLUMNS)]
    for r in rows:
        cells = [("-" if not math.isfinite(v) else f"{v:,.0f}" if abs(v) >= 100 else f"{v:.3g}")
                 for v in (float(r.get(key, math.nan)) for key, _ in COLUMNS)]
        lines.append(f"| {r['system']} | {r['K']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def verdicts(rows: list[dict], steps: dict | None, systems: list[str]) -> list[str]:
    out = []
    for ours, theirs in AGAINST.items():
        if ours not in systems or theirs not in systems:
            continue
        for K in sorted({r["K"] for r in rows}):
            a = next((r for r in rows if r["system"] == ours and r["K"] == K), None)
            b = next((r for r in rows if r["system"] == theirs and r["K"] == K), None)
            if a is None or b is None:
                out.append(f"NOT MEASURED: {ours} against {theirs} at K = {K} (one of them failed, above)")
                continue
            ok = a["overhead_s"] <= b["overhead_s"]
            out.append(f"{'PASS' if ok else 'FAIL'}: K = {K}, {ours} overhead {a['overhead_s']:.3f} s/round against "
                       f"{theirs} {b['overhead_s']:.3f} s (ratio {a['overhead_s'] / max(b['overhead_s'], 1e-9):.2f}, "
                       f"target <= 1); CPU s per round-site {a['cpu_s'] / (K * a['rounds']):.3f} against "
                       f"{b['cpu_s'] / (K * b['rounds']):.3f}; AUC {a['auc']:.3f} against {b['auc']:.3f}")
    if steps:  # judged on CPU time: on a shared machine the wall-time rates swing with the others' load
        ratio, wall = steps["fedauc_cpu"] / steps["libauc_cpu"], steps["fedauc"] / steps["libauc"]
        out.append(f"{'PASS' if ratio >= 0.9 else 'FAIL'}: AUC-M steps per CPU second, fedauc "
                   f"{steps['fedauc_cpu']:.1f} against LibAUC {steps['libauc_cpu']:.1f} (ratio {ratio:.2f}, target "
                   f">= 0.9); per wall second {steps['fedauc']:.1f} against {steps['libauc']:.1f} (ratio {wall:.2f})")
    return out


def plot(rows: list[dict], steps: dict | None, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(14, 4.2))
    styles = {"fedauc": ("C0", "-"), "flower": ("C1", "-"), "fedauc-flare": ("C0", "--"), "nvflare": ("C2", "--")}
    for system in SYSTEMS:
        points = sorted((r for r in rows if r["system"] == system), key=lambda r: r["K"])
        if not points:
            continue
        color, style = styles[system]
        ks = [r["K"] for r in points]
        axes[0].plot(ks, [r["overhead_s"] for r in points], style, color=color, marker="o", label=system)
        axes[1].plot(ks, [r["rss_all_mb"] / 1024 for r in points], style, color=color, marker="o", label=system)
    for ax, title in zip(axes, ("overhead per round (s, lower is better)", "peak RSS of the whole run (GiB)")):
        ax.set_xscale("log", base=2)
        ax.set_xticks(sorted({r["K"] for r in rows}), [str(k) for k in sorted({r["K"] for r in rows})])
        ax.set_xlabel("sites K")
        ax.set_title(title, fontsize=10)
        ax.legend(fontsize=8)
    axes[0].set_yscale("log")
    if steps:
        axes[2].bar(["fedauc\nAUC-M step", "LibAUC\nAUCMLoss+PESG"], [steps["fedauc_cpu"], steps["libauc_cpu"]],
                    color=["C0", "C3"])
        axes[2].set_title("AUC-M steps per CPU second, one site (higher is better)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def aucm_rates(base: dict, tmp: Path, steps: int, repeats: int, cache: Path) -> dict | None:
    """fedauc's AUC-M step against LibAUC's, ``repeats`` interleaved runs each: the medians of their rates."""
    rates: dict[str, list[dict]] = {"fedauc-aucm": [], "libauc": []}
    for _ in range(repeats):
        for system in rates:
            job = {**base, "system": system, "out": str(tmp / system), "steps": steps}
            Path(job["out"]).mkdir(exist_ok=True)
            try:
                rates[system].append(launch(job, cache))
            except Exception as error:
                print(f"{system}: {error}", file=sys.stderr, flush=True)
                return None
    med = {s: {k: statistics.median(r[k] for r in runs) for k in ("steps_per_s", "steps_per_cpu_s")}
           for s, runs in rates.items()}
    print(f"AUC-M steps/s, {repeats} runs each: fedauc {[round(r['steps_per_s'], 1) for r in rates['fedauc-aucm']]}, "
          f"LibAUC {[round(r['steps_per_s'], 1) for r in rates['libauc']]}", flush=True)
    return {"fedauc": med["fedauc-aucm"]["steps_per_s"], "libauc": med["libauc"]["steps_per_s"],
            "fedauc_cpu": med["fedauc-aucm"]["steps_per_cpu_s"], "libauc_cpu": med["libauc"]["steps_per_cpu_s"]}


@contextlib.contextmanager
def poc_lock():
    """The FLARE runs hold the machine's POC lock, once for all of them (other work queues on it too)."""
    with open(LOCK, "a") as lock:
        print(f"waiting for {LOCK}", flush=True)
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def run_one(base: dict, system: str, tmp: Path, cache: Path, rows: list[dict]) -> None:
    job = {**base, "system": system, "out": str(tmp / f"{system}-{base['K']}")}
    started = time.perf_counter()
    try:
        row = measure(job, cache)
    except Exception as error:  # one system failing leaves the others' rows and says why
        print(f"{system} K={base['K']}: {error}", file=sys.stderr, flush=True)
        return
    rows.append({**row, "rounds": base["rounds"]})
    print(f"{system} K={base['K']}: round {row['round_s']:.3f} s, overhead {row['overhead_s']:.3f} s, AUC "
          f"{row['auc']:.3f} ({time.perf_counter() - started:.0f} s)", flush=True)


def one(job: dict) -> None:
    if job["system"] == "fedauc-aucm":
        from benchmarks.peers.systems.libauc import fedauc_aucm_rate

        result = fedauc_aucm_rate(job)
    else:
        result = run_fedauc(job)
    print("RESULT " + json.dumps(result), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.peers", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="K = 4 only, 4 rounds of 2 local steps (about 5 min; K = 4 and 8 took 13 min on a loaded machine)")
    parser.add_argument("--sizes", type=int, nargs="+", default=[4, 8, 16])
    parser.add_argument("--systems", nargs="+", default=list(SYSTEMS), choices=SYSTEMS)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--local-steps", type=int, default=4)
    parser.add_argument("--aucm-steps", type=int, default=60, help="steps of each AUC-M timing")
    parser.add_argument("--aucm-repeats", type=int, default=3, help="interleaved runs of each AUC-M timing")
    parser.add_argument("--no-aucm", action="store_true", help="skip fedauc's AUC-M step against LibAUC's")
    parser.add_argument("--data", type=Path, help="where the shards are made (reused); default a temp dir")
    parser.add_argument("--peers-cache", type=Path, default=Path.home() / ".cache/fedauc-peers")
    parser.add_argument("--plot", type=Path)
    parser.add_argument("--json", type=Path, help="write every row here")
    parser.add_argument("--tables", type=Path, nargs="+", help="print (and --plot) the rows of these --json files")
    parser.add_argument("--one", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        return one(json.loads(args.one))
    if args.tables:  # runs saved with --json, as one table (the last file with AUC-M rates gives them)
        saved = [json.loads(path.read_text()) for path in args.tables]
        args.json = None
        return report([r for d in saved for r in d["rows"]], next((d["aucm"] for d in saved[::-1] if d["aucm"]), None),
                      args)
    if args.quick:
        args.sizes, args.rounds, args.local_steps, args.aucm_steps, args.aucm_repeats = [4], 4, 2, 30, 1
    import platform

    import nvflare
    import torch

    print(f"machine: {platform.processor() or platform.machine()}, {__import__('os').cpu_count()} cores; load "
          f"{' '.join(f'{v:.2f}' for v in __import__('os').getloadavg())}; torch {torch.__version__}, NVFlare "
          f"{nvflare.__version__}, {peer_versions(args.peers_cache)}", flush=True)
    spec = {"network": "small_resnet", "rounds": args.rounds, "local_steps": args.local_steps, "batch": 16,
            "lr": 0.01, "seed": 0}
    rows: list[dict] = []
    steps = None
    with tempfile.TemporaryDirectory() as tmp:
        data = args.data or Path(tmp) / "data"
        data.mkdir(parents=True, exist_ok=True)
        bases = {K: prepare(data, K, spec) for K in args.sizes}
        plain = [(K, s) for K in args.sizes for s in args.systems if s not in FLARE]
        flare = [(K, s) for K in args.sizes for s in args.systems if s in FLARE]
        for K, system in plain:
            run_one(bases[K], system, Path(tmp), args.peers_cache, rows)
        if not args.no_aucm:  # before the FLARE runs, which may wait on the POC lock
            steps = aucm_rates(bases[args.sizes[0]], Path(tmp), args.aucm_steps, args.aucm_repeats, args.peers_cache)
        if flare:
            with poc_lock():
                for K, system in flare:
                    run_one(bases[K], system, Path(tmp), args.peers_cache, rows)
    report(rows, steps, args)


def report(rows: list[dict], steps: dict | None, args) -> None:
    print()
    print(table(rows))
    print()
    print("\n".join(verdicts(rows, steps, [s for s in args.systems if any(r["system"] == s for r in rows)])))
    print(f"load after: {' '.join(f'{v:.2f}' for v in __import__('os').getloadavg())}")
    if args.json:
        args.json.write_text(json.dumps({"rows": rows, "aucm": steps}, indent=1))
    if args.plot:
        plot(rows, steps, args.plot)

if __name__ == "__main__":
    main()
