"""What differential privacy costs and what it buys (docs/privacy.md): pooled test AUC at epsilon 1, 3 and 8 and
without DP for FedAvg (BCE) and CODASCA (AUC-M), a loss-threshold membership-inference attack on one site's
members against its held-out records, and the per-step cost of per-sample gradients on this machine's CPU.

The federation: three sites of Gaussian feature vectors (federated/data.py synthetic_site) at a 5 % positive rate
with few training records in many dimensions, so that the model without DP overfits them and the attack has
something to find. Each epsilon is the sites' target (``--target-epsilon``: each site's sigma from its sampling rate
and delta 1e-5, Opacus's RDP accountant). Seeds: the data's task and the run's; intervals: 95 % t over seeds.

    .venv/bin/python -m benchmarks.studies.privacy [--seeds 5] [--rounds 60] [--records 50] [--features 400]
    .venv/bin/python -m benchmarks.studies.privacy --images [--seeds 5] [--rounds 64] [--work .cache/claims]

``--images``: the claims' image federation instead (docs/claims.md; benchmarks/claims/runs.py builds it): three
clinics' melanoma phantoms preprocessed by the real pipeline at 32 px, 1,000 training rows a site drawn at 5 %
positives (claim (b)'s heavy imbalance) from 3,000 images a clinic, ``small_resnet_gn`` of widths (8, 16) (the
claims' small_resnet with GroupNorm: BatchNorm is refused under DP), T = 512 (64 rounds of I = 8), batch 32,
the claims' lrs. The clinics' test splits hold 30 % positives, and a record's loss depends on its label whether it
was trained on or not: site 0's non-members are drawn from its test split at its members' positive rate, so that
the attack cannot score the label mix.
"""

from __future__ import annotations

import argparse
import os
import platform
import time
from dataclasses import replace
from functools import partial
from pathlib import Path

import numpy as np
import torch
from scipy import stats
from sklearn.metrics import roc_auc_score

import federated
from benchmarks.claims.runs import CLINICS, FULL, build_pool, federation
from federated.config import SyntheticSite
from federated.data import SplitData, to_model_input
from federated.dp.sgd import private_gradients
from models.networks import build_network
from models.objectives import masked_bce_with_logits

SITES = 3
SITE = dict(n_train=50, n_test=300, shape=(400,), pos_rate=0.05, signal=0.5, shift=0.3)
EPSILONS = (1.0, 3.0, 8.0, None)
METHODS = {"FedAvg (BCE)": ("fedavg", {}, 0.5), "CODASCA (AUC-M)": ("codasca", {}, 0.1)}
# The claims' run 'learnable' (docs/claims.md): its pool, rows and T, and the lrs its validation federation chose
# for claim (b), not tuned under DP.
IMAGES = replace(FULL, pool=3000, n_train=1000, iterations=512)
IMAGE_RATES = (0.05,) * len(CLINICS)
IMAGE_METHODS = {"FedAvg (BCE)": ("fedavg", {}, 1.0), "CODASCA (AUC-M)": ("codasca", {}, 0.3)}
CPU = torch.device("cpu")


def interval(values: list[float]) -> str:
    values = np.asarray(values, dtype=float)
    mean = values.mean()
    if len(values) < 2:
        return f"{mean:.3f}"
    half = stats.t.ppf(0.975, len(values) - 1) * values.std(ddof=1) / np.sqrt(len(values))
    return f"{mean:.3f} [{mean - half:.3f}, {mean + half:.3f}]"


def logits(model: torch.nn.Module, images) -> torch.Tensor:
    with torch.no_grad():
        return torch.cat([model(to_model_input(images[i:i + 256], CPU)) for i in range(0, len(images), 256)])[:, 0]


def trained(config: dict, sites: list, non_members: SplitData | None = None) -> dict:
    """Train ``config`` on ``sites``; its pooled test AUC, the attack's AUC at site 0 (its training records against
    ``non_members``, by default its test split) and the epsilon spent (the most of any site)."""
    result = federated.train({**config, "sites": sites})
    model = result.model().eval()
    datas = [s.load(k) for k, s in enumerate(sites)]
    tests = [d.splits["test"] for d in datas]
    auc = roc_auc_score(np.concatenate([t.labels[:, 0] for t in tests]), torch.cat([logits(model, t.images) for t in tests]))
    # Loss-threshold attack (Yeom et al., CSF 2018) at site 0: a lower loss says "member".
    bce = torch.nn.functional.binary_cross_entropy_with_logits
    losses = [bce(logits(model, part.images), torch.as_tensor(part.labels[:, 0]), reduction="none").numpy()
              for part in (datas[0].splits["train"], tests[0] if non_members is None else non_members)]
    attack = roc_auc_score(np.r_[np.ones(len(losses[0])), np.zeros(len(losses[1]))], -np.concatenate(losses))
    spent = max(p["epsilon_spent"] for p in result.privacy.values()) if result.privacy else float("inf")
    return {"auc": auc, "attack": attack, "epsilon": spent}


def dp_config(epsilon: float | None) -> dict | None:
    return None if epsilon is None else {"target_epsilon": epsilon, "max_grad_norm": 1.0}


def run(algorithm: str, params: dict, lr: float, epsilon: float | None, seed: int, rounds: int) -> dict:
    sites = [SyntheticSite(**SITE, task_seed=seed) for _ in range(SITES)]
    config = {"algorithm": algorithm, "params": params, "network": "linear", "rounds": rounds, "local_steps": 4,
              "batch_size": 12, "lr": lr, "seed": seed, "progress": False, "loader_workers": 0, "dp": dp_config(epsilon),
              "eval_every": 0}
    return trained(config, sites)


def at_rate(split: SplitData, rate: float, seed: int) -> SplitData:
    """As many of ``split``'s rows as keep every negative and add positives up to ``rate`` (seeded)."""
    y = split.labels[:, 0]
    positives, negatives = np.flatnonzero(y == 1), np.flatnonzero(y == 0)
    n_pos = int(round(rate / (1 - rate) * len(negatives)))
    rows = np.sort(np.r_[negatives, np.random.default_rng([seed, 11]).choice(positives, n_pos, replace=False)])
    return SplitData(split.images[rows], split.labels[rows])


def image_run(pool, algorithm: str, params: dict, lr: float, epsilon: float | None, seed: int, rounds: int) -> dict:
    sites = federation(pool, IMAGE_RATES, IMAGES.n_train, seed)
    members = sites[0].load(0).splits
    rate = float(members["train"].labels.mean())
    # The claims guarantee a positive in every batch; DP refuses that (it picks the batch's records): off here,
    # with and without DP alike, so that the rows differ by DP only.
    config = {"algorithm": algorithm, "params": params, "network": "small_resnet_gn",
              "network_kwargs": {"widths": IMAGES.widths}, "rounds": rounds, "local_steps": IMAGES.local_steps,
              "batch_size": 32, "lr": lr, "seed": seed, "progress": False, "loader_workers": 0, "dp": dp_config(epsilon),
              "eval_every": 0, "guarantee_positives": False}
    return trained(config, sites, at_rate(members["test"], rate, seed))


def step_cost(repeats: int = 20) -> tuple[float, float]:
    """Seconds per local step of small_resnet_gn (64 px, batch 32): the batch gradient, and DP's per-sample one."""
    torch.manual_seed(0)
    model = build_network("small_resnet_gn", num_classes=1, in_channels=1)
    x, y, mask = torch.rand(32, 1, 64, 64), (torch.rand(32, 1) < 0.3).float(), torch.ones(32, 1)
    gen = torch.Generator().manual_seed(0)

    def bce(z, yy, m, ex):
        return (torch.nn.functional.binary_cross_entropy_with_logits(z, yy, reduction="none") * m).sum()

    def plain():
        model.zero_grad()
        masked_bce_with_logits(model(x), y, mask).backward()

    def private():
        private_gradients(model, x, y, mask, bce, [], 1.0, 1.0, 32, gen)

    timings = []
    for fn in (plain, private):
        fn()
        start = time.perf_counter()
        for _ in range(repeats):
            fn()
        timings.append((time.perf_counter() - start) / repeats)
    return timings[0], timings[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", action="store_true", help="the claims' image federation (module docstring)")
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=None, help="default: 60, with --images 64 (T = 512)")
    parser.add_argument("--records", type=int, default=SITE["n_train"], help="training records a site (feature vectors)")
    parser.add_argument("--features", type=int, default=SITE["shape"][0])
    parser.add_argument("--work", type=Path, default=Path(".cache/claims"), help="--images: the claims' pool cache")
    args = parser.parse_args()
    SITE.update(n_train=args.records, shape=(args.features,))
    torch.set_num_threads(int(os.environ.get("FEDAUC_BENCH_THREADS", "1")))
    started = time.perf_counter()
    if args.images:
        args.work.mkdir(parents=True, exist_ok=True)
        one, methods = partial(image_run, build_pool(args.work, IMAGES)), IMAGE_METHODS
        rounds = args.rounds or IMAGES.iterations // IMAGES.local_steps
    else:
        one, methods, rounds = run, METHODS, args.rounds or 60
    rows = ["| method | epsilon (target) | epsilon spent | pooled test AUC | attack AUC (site 0) |", "|---|---:|---:|---|---|"]
    for name, (algorithm, params, lr) in methods.items():
        for epsilon in EPSILONS:
            results = [one(algorithm, params, lr, epsilon, seed, rounds) for seed in range(args.seeds)]
            spent = max(r["epsilon"] for r in results)
            rows.append(f"| {name} | {'no DP' if epsilon is None else f'{epsilon:g}'} | "
                        f"{'inf' if epsilon is None else f'{spent:.2f}'} | {interval([r['auc'] for r in results])} | "
                        f"{interval([r['attack'] for r in results])} |")
            print(rows[-1], f"({time.perf_counter() - started:.0f} s)", flush=True)
    print()
    print("\n".join(rows))
    print()
    if args.images:
        print(f"Setting: {len(CLINICS)} clinics x {IMAGES.n_train} training rows at {IMAGE_RATES[0]:.0%} positives, "
              f"{IMAGES.size} px, small_resnet_gn widths {IMAGES.widths}, {rounds} rounds x I = {IMAGES.local_steps}, "
              f"batch 32 (q = {32 / IMAGES.n_train:.3g}), {args.seeds} seeds, delta 1e-5, C = 1; "
              f"{time.perf_counter() - started:.0f} s")
        return
    plain, private = step_cost()
    print(f"Per local step, small_resnet_gn at 64 px, batch 32, {torch.get_num_threads()} thread(s), "
          f"{platform.processor() or platform.machine()}: batch gradient {plain * 1e3:.1f} ms, per-sample "
          f"(torch.func vmap) clipped and noised {private * 1e3:.1f} ms: {private / plain:.2f}x")
    print(f"Setting: {SITES} sites x {SITE['n_train']} training records, {SITE['shape'][0]} features, positive rate "
          f"{SITE['pos_rate']:.0%}, linear model, {rounds} rounds x I = 4, batch 12 (q = {12 / args.records:.3g}), "
          f"{args.seeds} seeds, delta 1e-5, C = 1")


if __name__ == "__main__":
    main()
