"""What a round costs as the consortium grows: K = 4 ... 64 hospitals of small shards (64 images each at 32 px,
real SIIM-ISIC-like shards from preprocessing), small_resnet, FedAvg and CODASCA, with and without secure
aggregation (SecAgg+, docs/algorithms.md section 13), in-process and over NVIDIA FLARE's simulator.

Each configuration runs in a fresh process (its peak RSS is its own). Per K it prints: the round's wall time
(median over the rounds between the first, a warm-up, and the last, which evaluates), the sites' compute (the
engine's per-site compute seconds, federated/timing.py: their sum in-process, where sites run one after
another; their maximum over FLARE, where they run at once), the overhead (round minus compute), the peak RSS
of the process(es) that are not a site (in-process: the one process; FLARE: the simulator's server and this
submitting process) and the median peak RSS and USS (its own pages) of a site process (FLARE); the overhead in
CPU seconds, which the machine's load stretches less and which the verdicts fit: in-process the round's process
time minus the sites' local steps' thread time, over FLARE every process of the job's CPU for the round minus
the sites' local steps' (benchmarks/scale/flare.py says how, and what it includes); the bytes all sites send and receive in
a round, the in-process evaluation's seconds (one ``Engine.evaluate``, every site's valid and test splits; over
FLARE the last round's extra seconds, where the training's evaluation runs), and the MLflow logging seconds of
one round's record (``pipelines.runs.RoundLogger``: the parent run and K site child runs, a real sqlite store).
With secure aggregation also: a site's CPU seconds for its key agreement (once a run) and for its masks in one
round (one masked collective of the round's MEAN tensors), with SecAgg+'s graph and with the full graph.

Then the fitted growth exponent of each cost between K = 16 and the largest K (least squares on log-log) and
PASS/FAIL for the target: the overhead of a plain round grows at most linearly (exponent <= 1.1), in-process
and over the simulator; and SecAgg+'s per-site cost against the full graph's at the largest K.

    python -m benchmarks.scale [--sizes 4 8 16 32] [--flare-sizes 4 8] [--flare-algorithms fedavg]
                               [--secure both|no|yes] [--rounds 5] [--local-steps 2] [--plot docs/scale.png]

The default run (in-process up to K = 32, the simulator up to K = 8) takes about 15 minutes on the shared
2-core development machine; docs/performance.md's figures are ``--sizes 4 8 16 32 64 --flare-sizes 4 8 16``
(about 30 minutes). Every FLARE site is a process of its own (torch and NVIDIA FLARE loaded in each), so the
simulator's largest K is bounded by memory: a K that would not fit in the memory available now is skipped with
the reason (``memory_short``); docs/performance.md says which K this machine held.
"""

from __future__ import annotations

import argparse
import json
import math
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks import REPO
from benchmarks.scale.federation import make_federation
from benchmarks.scale.flare import memory_short, run_flare

TARGET_EXPONENT = 1.1


def settings(job: dict) -> dict:
    params = {"stages": 1} if job["algorithm"] == "codasca" else {}
    return dict(algorithm=job["algorithm"], params=params, network="small_resnet", rounds=job["rounds"],
                local_steps=job["local_steps"], batch_size=16, lr=0.01, progress=False, loader_workers=0,
                secure_aggregation=job["secure"], secure_neighbours="secagg+", device="cpu", timeout_s=600)


def mlflow_seconds(history: list[dict], sites: list[str]) -> float:
    """Median seconds of logging one round's record to MLflow (parent and K child runs), in the store the
    process's entry configured."""
    from mlflow import MlflowClient

    from pipelines import tracking
    from pipelines.runs import RoundLogger, training_runs

    seconds = []
    with training_runs(tracking.experiment_id("melanoma"), "scale", "scale", sites) as (parent, child_ids):
        logger = RoundLogger(MlflowClient(), parent.info.run_id, child_ids)
        for record in history:
            started = time.perf_counter()
            logger(record)
            seconds.append(time.perf_counter() - started)
    return statistics.median(seconds)


def mask_costs(K: int, values: int, colluding: float = 1 / 3, bits: int = 40) -> dict:
    """One site's CPU seconds: key agreement (its key pair, the graph, its pair secrets) and one masked
    collective of ``values`` ring elements, with SecAgg+'s graph and with the full graph."""
    import torch

    from federated.secagg_graph import degree
    from federated.secure_aggregation import PairMasks, new_key

    keys = [new_key() for _ in range(K)]
    publics = [public for _, public in keys]
    encoded = torch.zeros(values, dtype=torch.int64)
    out = {}
    for graph, k in (("plus", degree(K, colluding, bits)), ("full", None)):
        started = time.process_time()
        masks = PairMasks(0, new_key()[0], publics, k)
        out[f"keys_s_{graph}"] = time.process_time() - started
        started = time.process_time()
        masks.mask(encoded, 1)
        out[f"mask_s_{graph}"] = time.process_time() - started
        out[f"neighbours_{graph}"] = len(masks.secrets)
    return out


def cpu_clocked() -> list[float]:
    """From now on, each site's local steps' CPU seconds (this thread's, in site and round order) beside the
    engine's wall clock (federated/timing.py): in-process every site runs on this one thread, so a machine that
    other processes load stretches the wall seconds, not these."""
    from federated.timing import RoundClock

    spent: list[float] = []
    wall_clocked = RoundClock.time

    def clocked(self, local_steps, *args):
        started = time.thread_time()
        out = wall_clocked(self, local_steps, *args)
        spent.append(time.thread_time() - started)
        return out

    RoundClock.time = clocked
    return spent


def run_inprocess(job: dict, federation: Path) -> dict:
    from federated.engine import Engine
    from federated.sites import federation_config
    from preprocessing.federation import load_federation

    fed = load_federation(federation)
    config = federation_config(fed, federation.parent / "shards", settings(job))
    engine = Engine(config)
    site_cpu = cpu_clocked()
    marks = [time.process_time()]
    history = engine.run(callbacks=[lambda record: marks.append(time.process_time())]).history
    started = time.perf_counter()
    engine.evaluate()
    evaluation_s = time.perf_counter() - started
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    middle = history[1:-1]
    out = {"round_s": statistics.median(r["seconds"] for r in middle),
           "compute_s": statistics.median(sum(r["site_compute_s"]) for r in middle),
           "server_rss_mb": peak, "site_rss_mb": math.nan, "evaluation_s": evaluation_s,
           "bytes": sum(middle[0]["bytes_sent"]) + sum(middle[0]["bytes_received"]),
           "round_cpu_s": statistics.median(np.diff(marks)[1:-1]),
           "compute_cpu_s": statistics.median(np.reshape(site_cpu, (len(history), -1)).sum(1)[1:-1])}
    if job["secure"]:
        out.update(mask_costs(len(config.sites), sum(math.prod(s) for s, _ in engine.mean_layout.values())))
    engine.close()
    out["mlflow_s"] = mlflow_seconds(history, [s.name for s in fed.sites])
    return out


def one(job: dict) -> None:
    """Run one configuration (in a fresh process) and print its figures as one JSON line."""
    import torch

    torch.set_num_threads(1)
    federation = Path(job["federation"])
    if job["mode"] == "flare":
        result, history, sites = run_flare(settings(job), federation)
        result["mlflow_s"] = mlflow_seconds(history, sites)
    else:
        result = run_inprocess(job, federation)
    print("RESULT " + json.dumps(result), flush=True)


def exponent(ks: list[int], values: list[float]) -> float:
    """The least-squares slope of log(value) against log(K)."""
    pairs = [(math.log(k), math.log(v)) for k, v in zip(ks, values) if v > 0 and math.isfinite(v)]
    if len(pairs) < 2:
        return math.nan
    x, y = np.array(pairs).T
    return float(np.polyfit(x, y, 1)[0])


COLUMNS = [("round_s", "round s"), ("compute_s", "compute s"), ("overhead_s", "overhead s"),
           ("round_cpu_s", "round CPU s"), ("overhead_cpu_s", "overhead CPU s"), ("server_cpu_s", "no-site CPU s"),
           ("site_idle_cpu_per_s", "site CPU/s outside steps"),
           ("server_rss_mb", "server RSS MB"), ("site_rss_mb", "site RSS MB"), ("site_uss_mb", "site USS MB"), ("bytes", "bytes/round"),
           ("evaluation_s", "eval s"), ("mlflow_s", "MLflow s/round"), ("keys_s_plus", "keys s/site"),
           ("mask_s_plus", "masks s/site/round"), ("mask_s_full", "full graph masks s/site/round")]


def table(rows: list[dict]) -> str:
    lines = ["| mode | algorithm | secure | K | " + " | ".join(label for _, label in COLUMNS) + " |",
             "|---|---|---|---|" + "---|" * len(COLUMNS)]
    for r in rows:
        cells = []
        for key, _ in COLUMNS:
            v = r.get(key, math.nan)
            cells.append("-" if not math.isfinite(v) else f"{v:,.0f}" if abs(v) >= 100 else f"{v:.3g}")
        lines.append(f"| {r['mode']} | {r['algorithm']} | {'yes' if r['secure'] else 'no'} | {r['K']} | "
                     + " | ".join(cells) + " |")
    return "\n".join(lines)


def growth(rows: list[dict], smallest: int = 16) -> list[str]:
    """Fitted exponents from K = ``smallest`` up, per series, and the PASS/FAIL lines."""
    out = []
    series = sorted({(r["mode"], r["algorithm"], r["secure"]) for r in rows})
    for mode, algorithm, secure in series:
        points = sorted((r for r in rows if (r["mode"], r["algorithm"], r["secure"]) == (mode, algorithm, secure)),
                        key=lambda r: r["K"])
        if sum(r["K"] >= smallest for r in points) >= 2:  # else (the simulator's few sizes): every size measured
            points = [r for r in points if r["K"] >= smallest]
        if len(points) < 2:
            continue
        ks = [r["K"] for r in points]
        fits = {key: exponent(ks, [r.get(key, math.nan) for r in points]) for key, _ in COLUMNS}
        text = ", ".join(f"{label} {fits[key]:.2f}" for key, label in COLUMNS if math.isfinite(fits[key]))
        line = f"{mode} {algorithm} {'secure' if secure else 'plain'}, K = {ks[0]}..{ks[-1]}: exponents {text}"
        if not secure:
            # On CPU seconds where measured: the wall-time exponent swings with the machine's load.
            key = "overhead_cpu_s" if math.isfinite(fits["overhead_cpu_s"]) else "overhead_s"
            verdict = "PASS" if fits[key] <= TARGET_EXPONENT else "FAIL"
            line += (f"\n  {verdict}: {dict(COLUMNS)[key]} exponent {fits[key]:.2f} (target <= {TARGET_EXPONENT}); "
                     f"wall {fits['overhead_s']:.2f}, CPU {fits['overhead_cpu_s']:.2f}")
        out.append(line)
    return out


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(14, 4.2))
    for (mode, algorithm, secure) in sorted({(r["mode"], r["algorithm"], r["secure"]) for r in rows}):
        points = sorted((r for r in rows if (r["mode"], r["algorithm"], r["secure"]) == (mode, algorithm, secure)),
                        key=lambda r: r["K"])
        ks = [r["K"] for r in points]
        label = f"{mode} {algorithm}{' secure' if secure else ''}"
        style = "-" if mode == "inprocess" else "--"
        axes[0].plot(ks, [r["overhead_s"] for r in points], style, marker="o", label=label)
        axes[1].plot(ks, [r["round_s"] for r in points], style, marker="o", label=label)
        if secure and mode == "inprocess":
            axes[2].plot(ks, [r["mask_s_plus"] for r in points], "-", marker="o", label=f"{algorithm} SecAgg+")
            axes[2].plot(ks, [r["mask_s_full"] for r in points], ":", marker="x", label=f"{algorithm} full graph")
    lo = min(r["K"] for r in rows)
    axes[0].plot([lo, 64], [0.05, 0.05 * 64 / lo], color="grey", lw=0.8, label="linear")
    for ax, title in zip(axes, ("overhead per round (s)", "round wall time (s)", "masks, CPU s per site per round")):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("sites K")
        ax.set_title(title)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.scale", description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[4, 8, 16, 32], help="in-process K (64: add it)")
    parser.add_argument("--flare-sizes", type=int, nargs="*", default=[4, 8], help="simulator K (16: add it)")
    parser.add_argument("--algorithms", nargs="+", default=["fedavg", "codasca"])
    parser.add_argument("--flare-algorithms", nargs="*", default=["fedavg"])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--local-steps", type=int, default=2)
    parser.add_argument("--data", type=Path, help="where the sites' shards are made (reused); default a temp dir")
    parser.add_argument("--plot", type=Path, help="write the cost-against-K plot here (PNG)")
    parser.add_argument("--json", type=Path, help="write every row here")
    parser.add_argument("--secure", choices=["both", "no", "yes"], default="both", help="with secure aggregation")
    parser.add_argument("--one", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        from pipelines import tracking

        job = json.loads(args.one)
        tracking.configure(Path(job["store"]))  # the child's one store, set at its entry
        return one(job)
    with tempfile.TemporaryDirectory() as tmp:
        data = args.data or Path(tmp) / "data"
        data.mkdir(parents=True, exist_ok=True)
        secure = {"both": (False, True), "no": (False,), "yes": (True,)}[args.secure]
        grid = [("inprocess", a, s, K) for a in args.algorithms for s in secure for K in args.sizes]
        grid += [("flare", a, s, K) for a in args.flare_algorithms for s in secure for K in args.flare_sizes]
        rows = []
        for mode, algorithm, secure, K in grid:
            if mode == "flare" and (short := memory_short(K)):
                print(f"flare {algorithm} secure={secure} K={K} skipped: {short}", flush=True)
                continue
            job = {"mode": mode, "algorithm": algorithm, "secure": secure, "rounds": args.rounds,
                   "local_steps": args.local_steps, "federation": str(make_federation(data, K)),
                   "store": str(Path(tmp) / "mlflow")}  # one store: its tables are made once
            started = time.perf_counter()
            done = subprocess.run([sys.executable, "-m", "benchmarks.scale", "--one", json.dumps(job)],
                                  capture_output=True, text=True, cwd=REPO)
            line = next((x for x in done.stdout.splitlines() if x.startswith("RESULT ")), None)
            if line is None:
                print(f"{mode} {algorithm} secure={secure} K={K} failed:\n{done.stderr[-3000:]}", file=sys.stderr)
                continue
            row = {"mode": mode, "algorithm": algorithm, "secure": secure, "K": K, **json.loads(line[7:])}
            row["overhead_s"] = row["round_s"] - row["compute_s"]
            row["overhead_cpu_s"] = row.get("round_cpu_s", math.nan) - row.get("compute_cpu_s", math.nan)
            rows.append(row)
            print(f"{mode} {algorithm} secure={secure} K={K}: round {row['round_s']:.3f} s, overhead "
                  f"{row['overhead_s']:.3f} s ({time.perf_counter() - started:.0f} s)", flush=True)
        print()
        print(table(rows))
        print()
        print("\n".join(growth(rows)))
        largest = max((r for r in rows if r["mode"] == "inprocess" and r["secure"]), key=lambda r: r["K"], default=None)
        if largest is not None:
            print(f"SecAgg+ at K = {largest['K']} ({largest['neighbours_plus']} neighbours, full graph "
                  f"{largest['neighbours_full']}): a site's masks {largest['mask_s_plus']:.3f} s per round against "
                  f"{largest['mask_s_full']:.3f} s ({largest['mask_s_full'] / largest['mask_s_plus']:.1f}x), its key "
                  f"agreement {largest['keys_s_plus'] * 1e3:.1f} ms against {largest['keys_s_full'] * 1e3:.1f} ms")
        if args.json:
            args.json.write_text(json.dumps(rows, indent=1))
        if args.plot:
            plot(rows, args.plot)


if __name__ == "__main__":
    main()
