"""The AUC-M family's schedule defaults measured on the claims benchmark's pool (docs/claims.md, "Stagewise
defaults"; docs/algorithms.md section 12): one constant-lr stage with weight decay 1e-5 (the defaults before
this measurement) against LibAUC's recipe, two stages of T/2 with lr / 10 at the boundary, weight decay 1e-4
and the iterate carrying on through the boundary (the defaults after it). That recipe was chosen among
stagewise candidates by the mean AUC over validation seeds (never reported) at claim (b)'s long budget;
the first table shows them.

    .venv/bin/python -m benchmarks.claims.stagewise [--iterations 1024 2752] [--seeds 10] [--jobs 2]
        [--work DIR] [--doc ...]

Both schedules are spelled out in full, so the comparison stays the same whatever the defaults are. Paired
over seeds at each lr of a small grid and at each budget (the lr is not chosen: a schedule that only wins at
one lr would show), verdicts as in python -m benchmarks.claims; runs are cached in ``--work`` and reused. Beside
the final AUC, how far each run ends below its own best evaluation: what stopping at T instead of at a
checkpoint nobody can pick without labels costs.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

from benchmarks import REPO
from benchmarks.claims.runs import CLINICS, VALIDATION_SEED, Runner, Setting, build_pool, write_doc
from benchmarks.claims.stats import cell, diff_cell, paired, verdict

NAME = "stagewise-defaults"
OLD = {"stages": 1, "lr_decay": 3.0, "weight_decay": 1e-5}
NEW = {"stages": 2, "lr_decay": 10.0, "weight_decay": 1e-4, "stage_restart": False}
SETTING = Setting(pool=3000, n_train=1000, iterations=1024, seeds=tuple(range(10)), score="macro_over_sites",
                  eval_points=8)
BUDGETS = (1024, 2752)  # twice run "learnable"'s T, and claim (b)'s long budget (docs/claims.md)
# (label, algorithm, the sites' positive rates, lrs): claim (b)'s federation at the lr the one-stage schedule
# chose on validation in docs/claims.md's run "learnable" (0.3) and the one both schedules chose in run
# "long-b" (1.0).
CASES = (("CODASCA, every site at 2 %", "codasca", (0.02,) * len(CLINICS), (0.3, 1.0)),)
# The choice among schedules: CODASCA on claim (b)'s federation at the long budget and the lr every
# schedule preferred there (docs/claims.md run "long-b"), on validation seeds that score on the valid splits.
CHOICE_ITERATIONS, CHOICE_LR = 2752, 1.0
CHOICE_SEEDS = (VALIDATION_SEED, VALIDATION_SEED + 1, VALIDATION_SEED + 2)


def candidates(iterations: int, local_steps: int) -> dict[str, dict]:
    """The schedules the new defaults were chosen from, spelled out for a run of ``iterations``."""
    late = iterations * 3 // 4 // local_steps * local_steps  # one decay at 3/4 of the run, on a round
    return {"one stage, wd 1e-5 (the old defaults)": OLD,
            "two stages, lr / 10, wd 1e-4, restart from the stage mean (the papers' Algorithm)": NEW | {"stage_restart": True},
            "two stages, lr / 10, wd 1e-4, the iterate carries on (LibAUC's; the new defaults)": NEW,
            "one decay at 3/4, lr / 10, wd 1e-4": {"T0": late, "lr_decay": 10.0, "weight_decay": 1e-4, "stage_restart": False},
            "one decay at 3/4, lr / 10, wd 1e-5": {"T0": late, "lr_decay": 10.0, "weight_decay": 1e-5, "stage_restart": False},
            "one decay at 3/4, lr / 3, wd 1e-5": {"T0": late, "lr_decay": 3.0, "weight_decay": 1e-5, "stage_restart": False}}


def choose(runner: Runner, jobs: int = 1) -> list[str]:
    """The validation table of the candidate schedules, from which the new defaults were chosen (best mean)."""
    s = runner.setting
    rates = CASES[0][2]
    schedules = candidates(s.iterations, s.local_steps)
    if jobs > 1:
        runner.run_many([(("codasca", params, CHOICE_LR, rates, seed), {}) for params in schedules.values()
                         for seed in CHOICE_SEEDS], jobs)
    lines = [f"Schedules on validation seeds {', '.join(map(str, CHOICE_SEEDS))} (never reported), CODASCA, T = "
             f"{s.iterations}, lr {CHOICE_LR}:", "", "| schedule | validation AUC per seed | mean |", "|---|---|---:|"]
    for label, params in schedules.items():
        scores = [runner.run("codasca", params, CHOICE_LR, rates, seed)["auc"] for seed in CHOICE_SEEDS]
        lines.append(f"| {label} | {', '.join(f'{x:.3f}' for x in scores)} | {np.mean(scores):.3f} |")
    return lines


def shortfall(records: list[dict]) -> str:
    """Mean over seeds of (best evaluation along the run - final AUC)."""
    return f"{np.mean([max(a for _, a in r['curve']) - r['auc'] for r in records]):.3f}"


def measure(runners: list[Runner], jobs: int = 1, choice: list[str] | None = None) -> tuple[str, dict[str, str]]:
    s = runners[0].setting
    lines = [f"_Written by `python -m benchmarks.claims.stagewise` ({len(s.seeds)} seeds, I = {s.local_steps}, {len(CLINICS)} "
             f"sites x {s.n_train} training rows drawn from {s.pool} images per clinic, score: the {s.scored} test AUC, "
             f"small_resnet widths {s.widths}, {s.eval_points} evaluations a run; old: {OLD}, new: {NEW})._", "",
             *(choice + ["", "The new defaults against the old on the reported seeds:", ""] if choice else []),
             "| federation | T per site | lr | old: one stage, wd 1e-5 | new: two stages, lr / 10, wd 1e-4 | new minus old "
             "(paired) | verdict on \"new is better\" | final below the run's best, old / new |",
             "|---|---:|---:|---|---|---|---|---|"]
    verdicts = {}
    for runner in runners:
        T = runner.setting.iterations
        if jobs > 1:
            runner.run_many([((alg, params, lr, rates, seed), {}) for _, alg, rates, lrs in CASES for lr in lrs
                             for seed in runner.setting.seeds for params in (OLD, NEW)], jobs)
        for label, alg, rates, lrs in CASES:
            for lr in lrs:
                old, new = (runner.seeds(alg, params, lr, rates) for params in (OLD, NEW))
                d = paired(new, old)
                verdicts[f"{label}, T {T}, lr {lr}"] = v = verdict(d)
                lines.append(f"| {label} | {T} | {lr} | {cell([x['auc'] for x in old])} | {cell([x['auc'] for x in new])} "
                             f"| {diff_cell(d)} | {v} | {shortfall(old)} / {shortfall(new)} |")
                print(lines[-1], flush=True)
    return "\n".join(lines), verdicts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, nargs="+", default=list(BUDGETS), help="budgets T per site")
    parser.add_argument("--seeds", type=int, default=len(SETTING.seeds), help="reported seeds (0, 1, ...)")
    parser.add_argument("--jobs", type=int, default=1, help="processes training runs side by side (one per core)")
    parser.add_argument("--work", type=Path, default=Path(".cache/claims"), help="cache: the pool and the runs")
    parser.add_argument("--doc", type=Path, default=REPO / "docs/claims.md",
                        help="markdown file with the run's markers")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)  # the small network is latency-bound: more threads only contend
    args.work.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    settings = [replace(SETTING, iterations=T, seeds=tuple(range(args.seeds))) for T in args.iterations]
    pool = build_pool(args.work, settings[0])
    path = args.work / f"runs-{NAME}.jsonl"
    runners = [Runner(pool, s, path, args.doc.parent, NAME) for s in settings]
    choice = choose(Runner(pool, replace(SETTING, iterations=CHOICE_ITERATIONS), path, args.doc.parent, NAME), args.jobs)
    body, _ = measure(runners, args.jobs, choice)
    write_doc(args.doc, body, NAME)
    print(f"done after {time.perf_counter() - started:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
