"""The rate sweep behind the defaults of LocalSCGDAM and FedSGDA-M (no author code, no published rates).

    .venv/bin/python -m benchmarks.studies.sweep_rates

Coordinate-wise: starting from a base setting, each rate in turn is swept over a grid with the others
fixed, and the best value (mean pooled-validation AUC over two seeds of the heterogeneous synthetic
federation of benchmarks/studies/auc_methods.py, seeds 100 and 101, disjoint from the benchmark seeds) is kept
for the next rate. ``lr`` is the engine's learning rate (the effective primal step gamma_x eta,
c_hat eta); the others are algorithm parameters. Prints markdown tables for docs/sweeps.md.
"""

from __future__ import annotations

import argparse

import numpy as np
import torch

from benchmarks.studies.auc_methods import HETEROGENEOUS, make_federation, run

SEEDS = (100, 101)

GRIDS = {
    "localscgdam": {"lr": [0.03, 0.1, 0.3, 1.0], "dual_lr": [0.01, 0.1, 0.5], "beta": [0.1, 0.5, 1.0],
                    "h_rate": [0.1, 0.5, 1.0], "rho": [0.0, 0.05, 0.2, 0.5]},
    "fedsgda_m": {"lr": [0.03, 0.1, 0.3, 1.0], "dual_lr": [0.01, 0.1, 0.5], "storm_x": [0.1, 0.5, 1.0],
                  "storm_y": [0.1, 0.5, 1.0]},
}
BASE = {
    "localscgdam": {"lr": 0.1, "dual_lr": 0.1, "beta": 0.5, "h_rate": 0.5, "rho": 0.1},
    "fedsgda_m": {"lr": 0.1, "dual_lr": 0.1, "storm_x": 0.5, "storm_y": 0.5},
}


def score(algorithm: str, setting: dict, feds) -> float:
    params = {k: v for k, v in setting.items() if k not in ("lr", "beta")}
    if "beta" in setting:  # one momentum weight for primal and dual
        params |= {"beta_x": setting["beta"], "beta_y": setting["beta"]}
    return float(np.mean([run(fed, algorithm, params, lr=setting["lr"], seed=s)["auc"]
                          for fed, s in zip(feds, SEEDS)]))


def main() -> None:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args()  # --help, not an unasked sweep
    torch.set_num_threads(1)
    feds = [make_federation(**HETEROGENEOUS, seed=s) for s in SEEDS]
    for algorithm, grid in GRIDS.items():
        setting = dict(BASE[algorithm])
        print(f"\n### {algorithm}\n\n| rate | value | validation AUC |\n|---|---|---|")
        for rate, values in grid.items():
            results = {}
            for value in values:
                results[value] = score(algorithm, setting | {rate: value}, feds)
                print(f"| {rate} | {value} | {results[value]:.4f} |", flush=True)
            setting[rate] = max(results, key=results.get)
        print(f"\nchosen: {setting}")


if __name__ == "__main__":
    main()
