"""What differential privacy costs and what it buys (docs/privacy.md): pooled test AUC at epsilon 1, 3 and 8 and
without DP for FedAvg (BCE) and CODASCA (AUC-M), a loss-threshold membership-inference attack on one site's
members against its held-out records, and the per-step cost of per-sample gradients on this machine's CPU.

The federation: three sites of Gaussian feature vectors (federated/data.py synthetic_site) at a 5 % positive rate
with few training records in many dimensions, so that the model without DP overfits them and the attack has
something to find. Each epsilon is the sites' target (``--target-epsilon``: each site's sigma from its sampling rate
and delta 1e-5, Opacus's RDP accountant). Seeds: the data's task and the run's; intervals: 95 % t over seeds.

    .venv/bin/python benchmarks/privacy.py [--seeds 5] [--rounds 60] [--records 50] [--features 400]
"""

from __future__ import annotations

import argparse
import os
import platform
import time

import numpy as np
import torch
from scipy import stats
from sklearn.metrics import roc_auc_score

import federated
from federated.config import SyntheticSite
from federated.privacy.sgd import private_gradients
from models.networks import build_network
from models.objectives import masked_bce_with_logits

SITES = 3
SITE = dict(n_train=50, n_test=300, shape=(400,), pos_rate=0.05, signal=0.5, shift=0.3)
EPSILONS = (1.0, 3.0, 8.0, None)
METHODS = {"FedAvg (BCE)": ("fedavg", {}, 0.5), "CODASCA (AUC-M)": ("codasca", {}, 0.1)}


def interval(values: list[float]) -> str:
    values = np.asarray(values, dtype=float)
    mean = values.mean()
    if len(values) < 2:
        return f"{mean:.3f}"
    half = stats.t.ppf(0.975, len(values) - 1) * values.std(ddof=1) / np.sqrt(len(values))
    return f"{mean:.3f} [{mean - half:.3f}, {mean + half:.3f}]"


def run(algorithm: str, params: dict, lr: float, epsilon: float | None, seed: int, rounds: int) -> dict:
    sites = [SyntheticSite(**SITE, task_seed=seed) for _ in range(SITES)]
    dp = None if epsilon is None else {"target_epsilon": epsilon, "max_grad_norm": 1.0}
    config = {"algorithm": algorithm, "params": params, "sites": sites, "network": "linear", "rounds": rounds,
              "local_steps": 4, "batch_size": 12, "lr": lr, "seed": seed, "progress": False, "loader_workers": 0,
              "dp": dp, "eval_every": 0}
    result = federated.train(config)
    model = result.model().eval()
    datas = [s.load(k) for k, s in enumerate(sites)]
    with torch.no_grad():
        scores = [model(torch.as_tensor(d.splits["test"].images).float()).squeeze(1).numpy() for d in datas]
        auc = roc_auc_score(np.concatenate([d.splits["test"].labels[:, 0] for d in datas]), np.concatenate(scores))
        # Loss-threshold attack (Yeom et al., CSF 2018) at site 0: a lower loss says "member".
        losses = {}
        for split in ("train", "test"):
            part = datas[0].splits[split]
            logits = model(torch.as_tensor(part.images).float())
            y = torch.as_tensor(part.labels)
            losses[split] = torch.nn.functional.binary_cross_entropy_with_logits(logits, y, reduction="none").squeeze(1)
    member = np.r_[np.ones(len(losses["train"])), np.zeros(len(losses["test"]))]
    attack = roc_auc_score(member, -np.concatenate([losses["train"].numpy(), losses["test"].numpy()]))
    spent = max(p["epsilon_spent"] for p in result.privacy.values()) if result.privacy else float("inf")
    return {"auc": auc, "attack": attack, "epsilon": spent}


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
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=60)
    parser.add_argument("--records", type=int, default=SITE["n_train"], help="training records a site")
    parser.add_argument("--features", type=int, default=SITE["shape"][0])
    args = parser.parse_args()
    SITE.update(n_train=args.records, shape=(args.features,))
    torch.set_num_threads(int(os.environ.get("FEDAUC_BENCH_THREADS", "1")))
    rows = ["| method | epsilon (target) | epsilon spent | pooled test AUC | attack AUC (site 0) |", "|---|---:|---:|---|---|"]
    for name, (algorithm, params, lr) in METHODS.items():
        for epsilon in EPSILONS:
            results = [run(algorithm, params, lr, epsilon, seed, args.rounds) for seed in range(args.seeds)]
            spent = max(r["epsilon"] for r in results)
            rows.append(f"| {name} | {'no DP' if epsilon is None else f'{epsilon:g}'} | "
                        f"{'inf' if epsilon is None else f'{spent:.2f}'} | {interval([r['auc'] for r in results])} | "
                        f"{interval([r['attack'] for r in results])} |")
            print(rows[-1], flush=True)
    plain, private = step_cost()
    print()
    print("\n".join(rows))
    print()
    print(f"Per local step, small_resnet_gn at 64 px, batch 32, {torch.get_num_threads()} thread(s), "
          f"{platform.processor() or platform.machine()}: batch gradient {plain * 1e3:.1f} ms, per-sample "
          f"(torch.func vmap) clipped and noised {private * 1e3:.1f} ms: {private / plain:.2f}x")
    print(f"Setting: {SITES} sites x {SITE['n_train']} training records, {SITE['shape'][0]} features, positive rate "
          f"{SITE['pos_rate']:.0%}, linear model, {args.rounds} rounds x I = 4, batch 12 (q = {12 / args.records:.3g}), "
          f"{args.seeds} seeds, delta 1e-5, C = 1")


if __name__ == "__main__":
    main()
