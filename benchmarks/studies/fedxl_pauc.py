"""FeDXL2 with score pools against Local Pair, with Centralized as the upper reference (docs/algorithms.md section 7).

    .venv/bin/python -m benchmarks.studies.fedxl_pauc [--seeds 5]

Federation (benchmarks.studies.auc_methods.make_federation): K = 4 sites, 10 % positives each, a large site
offset along one input direction u that also carries a small within-site class signal. Pairs inside a
site see only that within-site signal and overweight u; cross-site pairs (FeDXL2's pools, or all pairs
at one site) learn how little u is worth once the sites are pooled. Linear scorer, I = 8, B = 32, P = 32.
Prints pooled-test AUC and pAUC (FPR <= 0.3, McClish) over seeds and the bytes one site sends per round.
"""

from __future__ import annotations

import argparse

import torch

from benchmarks.studies.auc_methods import make_federation, run, table

METHODS = {
    "local pair": ("localpair", {}, False),
    "fedxl2 (pools, tau=1)": ("fedxl2", {}, False),
    "fedxl2 (pools, tau=2)": ("fedxl2", {"tau": 2}, False),
    "centralized": ("fedxl2", {}, True),
    "fedavg (BCE), reference": ("fedavg", {}, False),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=40)
    args = parser.parse_args()
    torch.set_num_threads(1)
    rows = {name: [] for name in METHODS}
    for seed in range(args.seeds):
        fed = make_federation([0.1] * 4, [-3.0, -1.0, 1.0, 3.0], offset_signal=1.0, seed=seed)
        for name, (alg, params, centralized) in METHODS.items():
            rows[name].append(run(fed, alg, params, rounds=args.rounds, lr=0.5, network="linear", seed=seed,
                                  centralized=centralized))
    table(f"FeDXL2 vs Local Pair vs Centralized, {args.seeds} seeds, {args.rounds} rounds x I = 8, K = 4 "
          "(pooled test)", rows, columns=("auc", "pauc", "bytes_per_round"))
    base = rows["local pair"]
    print("\npaired against local pair (same seed): mean pAUC difference, seeds won")
    for name, runs in rows.items():
        if name != "local pair":
            diffs = [r["pauc"] - b["pauc"] for r, b in zip(runs, base)]
            print(f"  {name:<26} {sum(diffs) / len(diffs):+.4f}   {sum(d > 0 for d in diffs)}/{len(diffs)}")
    print("bytes_per_round: what one site sends in a round after the first (model, v, and FeDXL2's pool "
          "payload of 3 * P * C * 4 = 384 bytes for P = 32, C = 1); Centralized has a single site.")


if __name__ == "__main__":
    main()
