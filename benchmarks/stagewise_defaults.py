"""The AUC-M family's schedule defaults measured on the claims benchmark's pool (docs/claims.md, "Stagewise
defaults"; docs/algorithms.md section 12): one constant-lr stage with weight decay 1e-5 (the defaults, kept
after this measurement) against two stages of T/2 with lr / 10 at the boundary and weight decay 1e-4 (LibAUC's recipe).

    .venv/bin/python benchmarks/stagewise_defaults.py [--iterations 1024] [--seeds 5] [--work DIR] [--doc ...]

Both schedules are spelled out in full, so the comparison stays the same whatever the defaults are. Paired
over seeds at each lr of a small grid (the lr is not chosen: a schedule that only wins at one lr would
show), verdicts as in benchmarks/claims.py; runs are cached in ``--work`` and reused.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from claims_runs import CLINICS, Runner, Setting, build_pool, write_doc
from claims_stats import cell, diff_cell, paired, verdict

NAME = "stagewise-defaults"
OLD = {"stages": 1, "lr_decay": 3.0, "weight_decay": 1e-5}
NEW = {"stages": 2, "lr_decay": 10.0, "weight_decay": 1e-4}
SETTING = Setting(pool=3000, n_train=1000, iterations=1024, seeds=(0, 1, 2, 3, 4), score="macro_over_sites",
                  eval_points=4)
# (label, algorithm, the sites' positive rates, lrs): claim (b)'s federation at the lr the old schedule chose
# on validation in docs/claims.md's run "learnable" (0.3) and the one the stagewise schedule chose in run
# "long-b" (1.0). Claim (a)'s heterogeneous federation with CODA+ was left out to fit the shared machine.
CASES = (("CODASCA, every site at 2 %", "codasca", (0.02,) * len(CLINICS), (0.3, 1.0)),)


def measure(runner: Runner) -> tuple[str, dict[str, str]]:
    s = runner.setting
    lines = [f"_Written by `benchmarks/stagewise_defaults.py` ({len(s.seeds)} seeds, T = {s.iterations} iterations per "
             f"site, I = {s.local_steps}, {len(CLINICS)} sites x {s.n_train} training rows drawn from {s.pool} images "
             f"per clinic, score: the {s.scored} test AUC, small_resnet widths {s.widths}; old: {OLD}, new: {NEW})._", "",
             "| federation | lr | old: one stage, wd 1e-5 | new: two stages, lr / 10, wd 1e-4 | new minus old (paired) "
             "| verdict on \"new is better\" |", "|---|---:|---|---|---|---|"]
    verdicts = {}
    for label, alg, rates, lrs in CASES:
        for lr in lrs:
            old, new = (runner.seeds(alg, params, lr, rates) for params in (OLD, NEW))
            d = paired(new, old)
            verdicts[f"{label}, lr {lr}"] = v = verdict(d)
            lines.append(f"| {label} | {lr} | {cell([x['auc'] for x in old])} | {cell([x['auc'] for x in new])} | "
                         f"{diff_cell(d)} | {v} |")
            print(lines[-1], flush=True)
    return "\n".join(lines), verdicts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=SETTING.iterations, help="T per run, per site")
    parser.add_argument("--seeds", type=int, default=len(SETTING.seeds), help="reported seeds (0, 1, ...)")
    parser.add_argument("--work", type=Path, default=Path(".cache/claims"), help="cache: the pool and the runs")
    parser.add_argument("--doc", type=Path, default=Path(__file__).resolve().parents[1] / "docs/claims.md",
                        help="markdown file with the run's markers")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)  # the small network is latency-bound: more threads only contend
    setting = replace(SETTING, iterations=args.iterations, seeds=tuple(range(args.seeds)))
    args.work.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    runner = Runner(build_pool(args.work, setting), setting, args.work / f"runs-{NAME}.jsonl", args.doc.parent, NAME)
    body, _ = measure(runner)
    write_doc(args.doc, body, NAME)
    print(f"done after {time.perf_counter() - started:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
