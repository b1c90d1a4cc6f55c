"""Claim (b) at a long budget (docs/claims.md, "Claim (b) at a long budget"): FedAvg (BCE), CODASCA and
FeDXL2 with every site at 2 % positives, trained long enough for BCE to overfit its few positives.

    .venv/bin/python -m benchmarks.claims --long [--iterations 8192] [--validation-iterations 8192]
        [--validation-seeds 100 101 102] [--seeds 5] [--jobs 2] [--work DIR] [--doc docs/claims.md]

Each method's lr is the one of its candidates with the best mean validation AUC over several validation
seeds (100 and up: their own federation draws, scored on the clinics' valid splits, never reported),
trained at ``--validation-iterations`` (by default the reported runs' budget: the lr a run prefers depends
on its length, docs/claims.md). The defaults are the run docs/claims.md reports. The reported
seeds then train at ``--iterations`` with evaluations along the run (the learning curves); verdicts are
the paired-difference verdicts of python -m benchmarks.claims. Runs are cached in ``--work`` as everywhere else,
and the doc is rewritten after every seed, so a stopped run leaves the tables of the seeds it finished.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from benchmarks import REPO
from benchmarks.claims.plots import plot_curves
from benchmarks.claims.runs import CLINICS, VALIDATION_SEED, Runner, Setting, build_pool, write_doc
from benchmarks.claims.stagewise import NEW as STAGEWISE
from benchmarks.claims.stagewise import OLD as ONE_STAGE
from benchmarks.claims.stats import cell, diff_cell, interval, paired, verdict

NAME = "long-b"
BASELINE = "FedAvg (BCE)"
RATE = 0.02
LONG = Setting(pool=3000, n_train=1000, iterations=8192, rates=(RATE,), seeds=(0, 1, 2, 3, 4), eval_points=16,
               score="macro_over_sites")
VALIDATION_SEEDS = (VALIDATION_SEED, VALIDATION_SEED + 1, VALIDATION_SEED + 2)
VALIDATION_ITERATIONS = 8192
# Two candidates per method: the lr the short-budget run chose on validation ("learnable") and its
# neighbour on the claims grid towards the other side a longer run may favour.
CANDIDATES = {"FedAvg (BCE)": (0.3, 1.0), "CODASCA (AUC-M)": (0.3, 1.0), "FeDXL2 (KL-OPAUC)": (0.1, 0.3),
              "CODASCA, one stage": (0.3, 1.0)}
STAGEWISE_NAME, ONE_STAGE_NAME = "CODASCA (AUC-M)", "CODASCA, one stage"

# The methods and their parameters. CODASCA's are its defaults (LibAUC's stagewise recipe, T0 derived from
# each run's length), spelled out so that the cached runs' keys say what was trained; its former defaults,
# one constant-lr stage, test at this budget what the stagewise defaults were measured against at shorter ones.
METHODS = {"FedAvg (BCE)": ("fedavg", {}), STAGEWISE_NAME: ("codasca", STAGEWISE), "FeDXL2 (KL-OPAUC)": ("fedxl2", {}),
           ONE_STAGE_NAME: ("codasca", ONE_STAGE)}


def choose_lrs(validation: Runner, seeds: tuple[int, ...], jobs: int = 1) -> tuple[dict[str, float], list[str]]:
    """Each method's candidate with the best mean validation AUC over ``seeds``, and the table of them."""
    rates = (RATE,) * len(CLINICS)
    if jobs > 1:
        validation.run_many([((alg, params, lr, rates, seed), {})
                             for name, (alg, params) in METHODS.items()
                             for lr in CANDIDATES[name] for seed in seeds], jobs)
    lines = [f"| method | lr | validation AUC per seed ({', '.join(map(str, seeds))}) | mean |", "|---|---:|---|---|"]
    chosen = {}
    for name, (alg, params) in METHODS.items():
        means = {}
        for lr in CANDIDATES[name]:
            scores = [validation.run(alg, params, lr, rates, seed)["auc"] for seed in seeds]
            means[lr] = float(np.nanmean(scores))
            lines.append(f"| {name} | {lr} | {', '.join(f'{x:.3f}' for x in scores)} | {means[lr]:.3f} |")
        chosen[name] = max(means, key=lambda lr: -1.0 if np.isnan(means[lr]) else means[lr])
    return chosen, lines


def report(runner: Runner, lrs: dict[str, float], runs: dict[str, list[dict]], validation_lines: list[str],
           validation: Setting, validation_seeds: tuple[int, ...]) -> tuple[str, dict[str, str]]:
    """The tables of the seeds finished so far (paired over them) and the verdicts."""
    s = runner.setting
    n = len(runs[BASELINE])
    lines = [f"_Written by `python -m benchmarks.claims --long` (run {NAME!r}: {n} of {len(s.seeds)} seeds finished for FedAvg, "
             f"T = {s.iterations} iterations per site, I = {s.local_steps}, {len(CLINICS)} sites x {s.n_train} "
             f"training rows at {RATE:.0%} positives drawn from {s.pool} images per clinic, score: the {s.scored} "
             f"test AUC, small_resnet widths {s.widths}; lrs chosen on validation seeds "
             f"{', '.join(map(str, validation_seeds))} at T = {validation.iterations})._", "",
             "Learning-rate choice (mean validation AUC over the validation seeds; the reported seeds are never used):",
             "", *validation_lines, ""]
    verdicts = {}
    lines += [f"| method | lr | seeds | {s.scored} test AUC at T = {s.iterations} | best along the run (mean over seeds) | "
              "AUC minus FedAvg (paired) | verdict |", "|---|---:|---:|---|---|---|---|"]
    for name, values in runs.items():
        if not values:
            continue
        curve = np.array([[auc for _, auc in v["curve"]] for v in values])
        peak = int(np.argmax(curve.mean(0)))
        best = f"{curve.mean(0)[peak]:.3f} at {values[0]['curve'][peak][0]}"
        row = f"| {name} | {lrs[name]} | {len(values)} | {cell([v['auc'] for v in values])} | {best} |"
        if name == BASELINE:
            lines.append(row + " | |")
            continue
        d = paired(values, runs[BASELINE][:len(values)])
        verdicts[f"{name} vs FedAvg at {RATE:.0%}, T = {s.iterations}"] = v = verdict(d)
        lines.append(row + f" {diff_cell(d)} | **{v}** |")
    stagewise, one_stage = runs[STAGEWISE_NAME], runs[ONE_STAGE_NAME]
    if stagewise and one_stage:
        d = paired(stagewise, one_stage)
        verdicts[f"{STAGEWISE_NAME} stagewise vs one stage, T = {s.iterations}"] = v = verdict(d)
        lines += ["", f"CODASCA's stagewise defaults minus one constant-lr stage (paired over {len(d)} seeds, each at "
                      f"its own validated lr): {diff_cell(d)}, verdict on \"stagewise is better\": **{v}**."]
    lines += ["", f"{s.scored.capitalize()} test AUC along the run (mean over the finished seeds):", ""]
    iterations = [it for it, _ in runs[BASELINE][0]["curve"]] if n else []
    marks = sorted({iterations[min(len(iterations) - 1, round(q * len(iterations)) - 1)] for q in (0.125, 0.25, 1 / 3, 0.5, 0.75, 1.0)})
    lines += ["| method | " + " | ".join(f"t = {t}" for t in marks) + " |", "|---|" + "---:|" * len(marks)]
    for name, values in runs.items():
        if values:
            at = {it: float(np.mean([v["curve"][i][1] for v in values])) for i, (it, _) in enumerate(values[0]["curve"])}
            lines.append(f"| {name} | " + " | ".join(f"{at[t]:.3f}" for t in marks) + " |")
    if n:
        plot_curves(runs, s, runner.figure("curves"), f"AUC vs iterations at {RATE:.0%} positives (thin: each seed)",
                    each_seed=True)
        lines += ["", f"![{runner.figure('curves').name}]({runner.figure('curves').name})"]
    return "\n".join(lines), verdicts


def run_long(setting: Setting, validation_iterations: int, validation_seeds: tuple[int, ...], work: Path,
             doc: Path, from_cache: bool = False, jobs: int = 1) -> dict[str, str]:
    """Choose the lrs, then train the reported seeds, rewriting ``doc`` after each seed (with ``jobs`` > 1, the
    runs train on that many processes first, seed by seed, and the doc is written after them).
    ``from_cache``: train nothing, write the tables of the runs stored so far (a stopped run's)."""
    work.mkdir(parents=True, exist_ok=True)
    doc.parent.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    pool = build_pool(work, setting)
    path = work / f"runs-{NAME}.jsonl"
    validation = replace(setting, iterations=validation_iterations, eval_points=1)
    validation_runner = Runner(pool, validation, path, doc.parent, NAME, cached_only=from_cache)
    lrs, validation_lines = choose_lrs(validation_runner, validation_seeds, jobs)
    print(f"lrs {lrs} after {time.perf_counter() - started:.0f} s", flush=True)
    runner = Runner(pool, setting, path, doc.parent, NAME, cached_only=from_cache)
    runs = {name: [] for name in lrs}
    rates = (RATE,) * len(CLINICS)
    if jobs > 1:
        runner.run_many([((alg, params, lrs[name], rates, seed), {}) for seed in setting.seeds
                         for name, (alg, params) in METHODS.items()], jobs)
    verdicts = {}
    for i, seed in enumerate(setting.seeds):
        for name, (alg, params) in METHODS.items():
            record = runner.run(alg, params, lrs[name], rates, seed)
            # A seed counts for a method once its earlier seeds and FedAvg's same seed do: paired, in order.
            if record is not None and len(runs[name]) == i and len(runs[BASELINE]) == i + (name != BASELINE):
                runs[name].append(record)
        if len(runs[BASELINE]) <= i:
            break
        body, verdicts = report(runner, lrs, runs, validation_lines, validation, validation_seeds)
        write_doc(doc, body, NAME)
        d = interval(paired(runs["CODASCA (AUC-M)"], runs[BASELINE]))
        print(f"seed {seed} done after {time.perf_counter() - started:.0f} s; CODASCA - FedAvg {d}", flush=True)
    return verdicts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=LONG.iterations, help="T of the reported runs, per site")
    parser.add_argument("--validation-iterations", type=int, default=VALIDATION_ITERATIONS,
                        help="T of the validation runs that choose the lrs")
    parser.add_argument("--validation-seeds", type=int, nargs="+", default=list(VALIDATION_SEEDS),
                        help=f"seeds >= {VALIDATION_SEED}: scored on the valid splits, never reported")
    parser.add_argument("--seeds", type=int, default=len(LONG.seeds), help="reported seeds (0, 1, ...)")
    parser.add_argument("--jobs", type=int, default=1, help="processes training runs side by side (one per core)")
    parser.add_argument("--from-cache", action="store_true",
                        help="train nothing: write the tables of the runs stored so far (a stopped run's)")
    parser.add_argument("--work", type=Path, default=Path(".cache/claims"), help="cache: the pool and runs-long-b.jsonl")
    parser.add_argument("--doc", type=Path, default=REPO / "docs/claims.md",
                        help="markdown file with the run's markers; the figure goes beside it")
    args = parser.parse_args(argv)
    if min(args.validation_seeds) < VALIDATION_SEED:
        parser.error(f"--validation-seeds must be >= {VALIDATION_SEED}: lower seeds are the reported ones")
    setting = replace(LONG, iterations=args.iterations, seeds=tuple(range(args.seeds)))
    run_long(setting, args.validation_iterations, tuple(args.validation_seeds), args.work, args.doc, args.from_cache,
             args.jobs)
    return 0
