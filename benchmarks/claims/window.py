"""Claim (a) on a heterogeneous federation (docs/claims.md, "Claim (a) on a heterogeneous federation"): first
the premise (CODA+ loses AUC as its window I grows at a fixed budget T), then the claim (CODASCA at I and at 4I
against CODA+ at I), then claim (b) at short budgets against both BCE baselines.

    .venv/bin/python -m benchmarks.claims.window [--parts premise claim b] [--seeds 10] [--jobs 2]
        [--from-cache] [--work .cache/claims] [--doc docs/claims.md]

The federation is ``benchmarks.claims.heterogeneous``'s; the runs, their cache and the validation choice of
each method's lr and stage schedule are ``benchmarks.claims.window_runs``'. A stopped run resumes where it
stopped; the doc is rewritten after every step from what is stored (``--from-cache``: train nothing, write the
tables of the stored runs and the estimate of what is left).
"""

from __future__ import annotations

import argparse
import math
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

from benchmarks import REPO
from benchmarks.claims.__main__ import NONINFERIORITY
from benchmarks.claims.heterogeneous import draw
from benchmarks.claims.plots import _band, _plot
from benchmarks.claims.runs import build_pool, write_doc
from benchmarks.claims.stats import cell, diff_cell, verdict
from benchmarks.claims.window_runs import (
    B_BUDGETS,
    B_HETEROGENEITY,
    B_METHODS,
    B_PERIOD,
    HETEROGENEITY,
    NAME,
    SCHEDULES,
    SETTING,
    VALIDATION_SEEDS,
    WindowRunner,
    candidates,
    choose,
    plan,
    reported,
)

METRICS = {"auc": "sites' mean AUC", "auc_pooled": "pooled AUC", "auc_worst": "worst site's AUC"}


def _chosen_text(chosen: tuple[dict, float] | None) -> str:
    if chosen is None:
        return "pending"
    schedule, lr = chosen
    names = [name for name, params in SCHEDULES.items() if params == schedule]
    return f"{names[0]}, lr {lr}" if names else f"lr {lr}"


def _values(records: list[dict], metric: str) -> list[float]:
    return [r[metric] if metric != "auc_worst" else float(np.nanmin(r["auc_per_site"])) for r in records]


def _paired(a: list[dict], b: list[dict], metric: str = "auc") -> list[float]:
    n = min(len(a), len(b))
    return [x - y for x, y in zip(_values(a[:n], metric), _values(b[:n], metric))]


def _cells(records: list[dict]) -> str:
    return " | ".join(cell(_values(records, m)) if records else "pending" for m in METRICS)


def window_runs(runner: WindowRunner, algorithms: tuple[str, ...]) -> dict[tuple[str, int], tuple]:
    """(algorithm, I) -> (its choice, its reported records so far)."""
    out = {}
    for algorithm in algorithms:
        for I in runner.setting.periods:
            chosen, _ = choose(runner, algorithm, None, I)
            out[(algorithm, I)] = (chosen, reported(runner, algorithm, chosen, I))
    return out


def federation_text(runner: WindowRunner) -> list[str]:
    h, s = runner.heterogeneity, runner.setting
    d = draw(h, s.seeds[0])
    return [f"{h.sites} sites, {h.rows} training rows at {h.rate:.0%} positives; label skew: the positives shared by "
            f"Dirichlet(alpha = {h.alpha}); quantity skew: the sizes by Dirichlet(beta = {h.beta}), at least {h.min_rows} "
            f"rows; feature skew: each site's acquisition (strength {h.acquisition}). Seed {s.seeds[0]}'s draw: sizes "
            f"{d.sizes.min()} to {d.sizes.max()} rows, positive rates {d.rates.min():.1%} to {d.rates.max():.1%} "
            f"(positives per site {', '.join(map(str, d.positives))}), {sum(a.downsample > 1 for a in d.acquisitions)} "
            f"of {h.sites} sites at half resolution, gamma {min(a.gamma for a in d.acquisitions):.2f} to "
            f"{max(a.gamma for a in d.acquisitions):.2f}."]


def validation_table(runner: WindowRunner, rows: list[tuple[str, str, dict | None, int, int | None, bool]]) -> list[str]:
    """Every candidate's mean validation AUC, one row per (method, I or budget)."""
    labels = [f"{_chosen_text((p, lr))}" for p, lr in candidates("codasca", None, runner.setting.lr_grid)]
    lines = [f"| method | I | T | {' | '.join(labels)} |", "|---|---:|---:|" + "---:|" * len(labels)]
    for label, algorithm, params, I, T, guaranteed in rows:
        _, means = choose(runner, algorithm, params, I, T, guaranteed)
        if params is not None:  # no schedule to choose: its lrs sit under the first schedule's columns
            means = means + [math.nan] * (len(labels) - len(means))
        lines.append(f"| {label} | {I} | {T or runner.setting.iterations} | "
                     + " | ".join("" if math.isnan(m) else f"{m:.3f}" for m in means) + " |")
    return lines


def premise_and_claim(runner: WindowRunner) -> tuple[list[str], dict[str, str]]:
    s = runner.setting
    algorithms = ("codaplus", "codasca")
    runs = window_runs(runner, algorithms)
    names = {"codaplus": "CODA+", "codasca": "CODASCA"}
    lines = [f"| method | I | rounds | chosen on validation | {' | '.join(METRICS.values())} | seeds |",
             "|---|---:|---:|---|---|---|---|---:|"]
    for (algorithm, I), (chosen, records) in runs.items():
        lines.append(f"| {names[algorithm]} | {I} | {s.iterations // I} | {_chosen_text(chosen)} | {_cells(records)} | "
                     f"{len(records)} |")
    verdicts = {}
    lines += ["", "The premise: CODA+ at I minus CODA+ at I = 1 (paired; a loss is negative; verdict on \"CODA+ loses\", "
                  "superiority of I = 1):", "",
              f"| comparison | {' | '.join(METRICS.values())} | verdict (sites' mean) |", "|---|---|---|---|---|"]
    first = runs[("codaplus", s.periods[0])][1]
    for I in s.periods[1:]:
        other = runs[("codaplus", I)][1]
        if first and other:
            d = _paired(first, other)
            verdicts[f"premise: CODA+ loses from I = {s.periods[0]} to {I}"] = v = verdict(d)
            lines.append(f"| CODA+ at I = {I} minus I = {s.periods[0]} | "
                         + " | ".join(diff_cell([-x for x in _paired(first, other, m)]) for m in METRICS) + f" | {v} |")
    lines += ["", f"The claim: CODASCA at 4I minus CODA+ at I (paired; non-inferiority, margin {NONINFERIORITY}), and "
                  "CODASCA minus CODA+ at the same I (superiority):", "",
              f"| comparison | {' | '.join(METRICS.values())} | verdict (sites' mean) |", "|---|---|---|---|---|"]
    for I in s.periods:
        base = runs[("codaplus", I)][1]
        for label, other, margin in ((f"CODASCA at I = {4 * I} minus CODA+ at I = {I} (the claim)", ("codasca", 4 * I),
                                      NONINFERIORITY),
                                     (f"CODASCA minus CODA+ at I = {I}", ("codasca", I), 0.0)):
            if other not in runs or not base or not runs[other][1]:
                continue
            d = _paired(runs[other][1], base)
            v = verdict(d, margin)
            if margin:
                verdicts[f"(a) CODASCA at I = {4 * I} vs CODA+ at I = {I}"] = v
            lines.append(f"| {label} | " + " | ".join(diff_cell(_paired(runs[other][1], base, m)) for m in METRICS)
                         + f" | {'**' + v + '**' if margin else v} |")
    if any(records for _, records in runs.values()):
        plot_window(runs, runner)
    return lines, verdicts


def plot_window(runs: dict, runner: WindowRunner) -> None:
    periods = runner.setting.periods

    def draw_panel(ax, metric):
        for algorithm in ("codaplus", "codasca"):
            xs = [I for I in periods if runs[(algorithm, I)][1]]
            if xs:
                _band(ax, xs, [_values(runs[(algorithm, I)][1], metric) for I in xs], f"{algorithm}, {METRICS[metric]}")
        ax.set_xscale("log", base=2)
        ax.set(xlabel="communication window I (local steps)", ylabel="test AUC",
               title=f"AUC vs I, T = {runner.setting.iterations}, {runner.heterogeneity.sites} heterogeneous sites")

    _plot(runner.figure("auc_vs_I"), lambda ax: (draw_panel(ax, "auc"), draw_panel(ax, "auc_pooled")))


def claim_b(runner: WindowRunner) -> tuple[list[str], dict[str, str]]:
    baseline, uniform = list(B_METHODS)[:2]
    lines = [f"| T | method | chosen on validation | {' | '.join(METRICS.values())} | minus {baseline} | "
             f"minus {uniform} | seeds |", "|---:|---|---|---|---|---|---|---|---:|"]
    verdicts = {}
    for T in B_BUDGETS:
        records = {}
        for name, (algorithm, params, guaranteed) in B_METHODS.items():
            chosen, _ = choose(runner, algorithm, params, B_PERIOD, T, guaranteed)
            records[name] = (chosen, reported(runner, algorithm, chosen, B_PERIOD, T, guaranteed))
        for name, (chosen, values) in records.items():
            diffs = []
            for base in (baseline, uniform):
                if name == base or not values or not records[base][1]:
                    diffs.append("")
                    continue
                d = _paired(values, records[base][1])
                v = verdict(d)
                verdicts[f"(b) {name} vs {base}, T = {T}"] = v
                diffs.append(f"{diff_cell(d)} ({v})")
            lines.append(f"| {T} | {name} | {_chosen_text(chosen)} | {_cells(values)} | {' | '.join(diffs)} | {len(values)} |")
    return lines, verdicts


def wall_time(runners: list[WindowRunner], parts: list[str], jobs: int) -> list[str]:
    """What the stored runs cost (CPU seconds of one torch thread: what a free core takes) and the whole plan's
    estimate from it: every validation run plus the reported seeds of every (method, I or budget)."""
    stored = [r for r in runners[0].done.values() if "cpu_seconds" in r]  # the runners share one store
    if not stored:
        return ["No run stored yet."]
    per_iteration = sum(r["cpu_seconds"] for r in stored) / sum(r["iterations"] for r in stored)
    runner = runners[0]
    s = runner.setting
    planned = []  # the budget T of every run of the plan
    if "premise" in parts or "claim" in parts:
        methods = 1 + ("claim" in parts)
        per_config = len(candidates("codasca", None, s.lr_grid)) * len(VALIDATION_SEEDS) + len(s.seeds)
        planned += [s.iterations] * methods * len(s.periods) * per_config
    if "b" in parts:
        for T in B_BUDGETS:
            for algorithm, params, _ in B_METHODS.values():
                planned += [T] * (len(candidates(algorithm, params, s.lr_grid)) * len(VALIDATION_SEEDS) + len(s.seeds))
    done = sum(r["iterations"] for r in stored)
    return [f"{len(stored)} of the plan's {len(planned)} runs are stored; they took {per_iteration * 1000:.0f} ms of CPU "
            f"per iteration (one torch thread, {runner.heterogeneity.sites} sites), {sum(r['cpu_seconds'] for r in stored) / 60:.0f} "
            f"CPU minutes in all. The whole plan: about {per_iteration * sum(planned) / jobs / 3600:.1f} h on {jobs} free "
            f"core(s), {per_iteration * max(0, sum(planned) - done) / jobs / 3600:.1f} h of it still to run."]


def write(runner: WindowRunner, b_runner: WindowRunner, parts: list[str], doc: Path, jobs: int) -> None:
    s = runner.setting
    body = [f"_Written by `python -m benchmarks.claims.window` (run {runner.name!r}: T = {s.iterations} iterations per site, "
            f"{s.size} px, small_resnet widths {s.widths}, batch 32 per site with positive-guaranteed batches unless "
            f"said, {len(s.seeds)} reported seeds, choices on validation seeds {', '.join(map(str, VALIDATION_SEEDS))} "
            f"among lrs {s.lr_grid} x stage schedules ({', '.join(SCHEDULES)}))._", "", *federation_text(runner), ""]
    verdicts = {}
    if "premise" in parts or "claim" in parts:
        lines, verdicts = premise_and_claim(runner)
        figure = runner.figure("auc_vs_I")
        body += lines + ["", f"![{figure.name}]({figure.name})" if figure.exists() else "", ""]
    if "b" in parts:
        lines, b_verdicts = claim_b(b_runner)
        verdicts |= b_verdicts
        body += [f"Claim (b) at short budgets, I = {B_PERIOD}, the same skews at {B_HETEROGENEITY.rate:.0%} positives "
                 "overall:", "", *lines, ""]
    rows = [(name, a, None, I, None, True) for a, name in (("codaplus", "CODA+"), ("codasca", "CODASCA")) for I in s.periods]
    rows += [(name, a, p, B_PERIOD, T, g) for T in B_BUDGETS for name, (a, p, g) in B_METHODS.items()]
    body += ["Mean validation AUC (sites' mean) of every candidate; the best is the one reported (FedAvg has no stage "
             "schedule: its lrs fill the first columns):", "",
             *validation_table(runner, rows[:2 * len(s.periods)]), *validation_table(b_runner, rows[2 * len(s.periods):])[2:],
             "", *wall_time([runner, b_runner], parts, jobs), "", "| verdict | |", "|---|---|",
             *(f"| {k} | {v} |" for k, v in verdicts.items())]
    write_doc(doc, "\n".join(body), runner.name)


def main(argv: list[str] | None = None) -> int:
    torch.set_num_threads(1)  # the small network is latency-bound: more threads only contend
    parser = argparse.ArgumentParser(prog="python -m benchmarks.claims.window", description=__doc__.splitlines()[0])
    parser.add_argument("--parts", nargs="+", default=["premise", "claim", "b"], choices=["premise", "claim", "b"])
    parser.add_argument("--seeds", type=int, default=len(SETTING.seeds), help="reported seeds (0, 1, ...)")
    parser.add_argument("--jobs", type=int, default=1, help="processes training side by side (one per free core)")
    parser.add_argument("--from-cache", action="store_true", help="train nothing: write the tables of the stored runs")
    parser.add_argument("--iterations", type=int, default=SETTING.iterations, help="T of claim (a)'s runs, per site")
    parser.add_argument("--sites", type=int, default=HETEROGENEITY.sites, help="sites of the federation (8 to 16)")
    parser.add_argument("--alpha", type=float, default=HETEROGENEITY.alpha,
                        help="label skew: Dirichlet concentration of the positives over the sites (smaller: more skew)")
    parser.add_argument("--acquisition", type=float, default=HETEROGENEITY.acquisition,
                        help="feature skew: the spread of the sites' acquisition chains (0: none)")
    parser.add_argument("--name", default=NAME, help="the run's markers in the doc, its figure and its runs file; "
                                                     "a federation other than the reported one wants its own")
    parser.add_argument("--work", type=Path, default=Path(".cache/claims"), help="cache: the pool and runs-<name>.jsonl")
    parser.add_argument("--doc", type=Path, default=REPO / "docs/claims.md",
                        help="markdown file with the run's markers; the figure goes beside it")
    args = parser.parse_args(argv)
    setting = replace(SETTING, seeds=tuple(range(args.seeds)), iterations=args.iterations)
    skews = {"sites": args.sites, "alpha": args.alpha, "acquisition": args.acquisition}
    args.work.mkdir(parents=True, exist_ok=True)
    pool = build_pool(args.work, setting)
    path = args.work / f"runs-{args.name}.jsonl"
    runner = WindowRunner(pool, setting, path, args.doc.parent, args.name, cached_only=args.from_cache,
                          heterogeneity=replace(HETEROGENEITY, **skews))
    b_runner = WindowRunner(pool, setting, path, args.doc.parent, args.name, cached_only=args.from_cache,
                            heterogeneity=replace(B_HETEROGENEITY, **skews))
    b_runner.done = runner.done  # one file, one store: each sees what the other trains
    started = time.perf_counter()
    for step_runner, what, make in plan(runner, b_runner, args.parts):
        step_runner.run_all(make(), args.jobs, lambda: write(runner, b_runner, args.parts, args.doc, args.jobs))
        print(f"{what}: done after {time.perf_counter() - started:.0f} s", flush=True)
    write(runner, b_runner, args.parts, args.doc, args.jobs)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
