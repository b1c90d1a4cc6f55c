"""The papers' central claims, checked on image federations of melanoma phantoms (docs/claims.md).

    .venv/bin/python -m benchmarks.claims [--quick] [--seeds 5] [--work DIR] [--doc docs/claims.md]
    .venv/bin/python -m benchmarks.claims --long [...]     # claim (b) at a long budget: benchmarks/claims/long.py

Data: three dermatology clinics (the vienna / barcelona / new-york dermoscope profiles of
preprocessing.synth, DICOM and JPEG files) are generated once at a high melanoma rate and preprocessed
once with the real stages (``scan_site``, ``shard_site``) at ``--size`` px; the shards are cached in
``--work``. Each federation then draws its sites' training rows from a clinic's train split at the
positive rate the claim needs (down to 1 %), seeded: the sites differ by device and by positive rate.
The score is the pooled AUC (or pAUC) of the averaged model over the clinics' whole test splits, whose
positive rate does not matter to an AUC, or with ``--score macro_over_sites`` the mean of the clinics' own
AUCs (a device's shift of every score counts against the pooled AUC, not against a clinic's); learning rates are chosen on a validation federation (seed 100,
scored on the valid splits), never on the reported seeds.

Each claim gets a table of means with 95 % t-intervals over seeds and a verdict computed from the interval
of a paired (same seed) difference (``verdict``). Every run is appended to ``--work``/runs.jsonl as it
finishes and reused on a rerun, so an interrupted run loses nothing; ``--doc`` is rewritten between its
``<!-- claims:begin NAME -->`` and ``<!-- claims:end NAME -->`` markers (NAME: ``--name``, by default
full or quick) from whatever results exist.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch

from benchmarks import REPO
from benchmarks.claims import long as claims_long
from benchmarks.claims.plots import plot_curves, plot_period, plot_rate
from benchmarks.claims.runs import CLINICS, FULL, QUICK, Runner, Setting, build_pool, write_doc
from benchmarks.claims.stats import cell, curve_area, diff_cell, paired, verdict

HETEROGENEOUS_RATES = (0.05, 0.15, 0.3)
NONINFERIORITY = 0.01  # AUC: "at equal AUC" means no worse than this
FIGURES = ("period", "rate", "rounds")


# --------------------------------------------------------------------------- claims


def claim_period(r: Runner) -> tuple[str, dict]:
    """(a) CODASCA tolerates a >= 4x longer window I than CODA+ at equal AUC under heterogeneity."""
    s = r.setting
    params = {"T0": s.iterations // 2}  # two stages; lr decay and weight decay: the defaults (docs/algorithms.md section 12)
    rates = HETEROGENEOUS_RATES
    lrs = {alg: r.pick_lr(alg, params, rates, local_steps=s.periods[0]) for alg in ("codaplus", "codasca")}
    runs = {(alg, I): r.seeds(alg, params, lrs[alg], rates, local_steps=I) for alg in lrs for I in s.periods}
    lines = [f"Sites at {', '.join(f'{p:.0%}' for p in rates)} positives; T = {s.iterations} iterations at every I; "
             f"two stages (T0 = T/2); lr chosen at I = {s.periods[0]}: CODA+ {lrs['codaplus']}, CODASCA {lrs['codasca']}.",
             "", f"| algorithm | I | rounds | {s.scored} test AUC |", "|---|---:|---:|---|"]
    for (alg, I), values in runs.items():
        lines.append(f"| {alg} | {I} | {s.iterations // I} | {cell([v['auc'] for v in values])} |")
    lines += ["", f"| comparison (paired) | difference | verdict (non-inferiority, margin {NONINFERIORITY}) |", "|---|---|---|"]
    verdicts = {}
    for I in s.periods:
        if 4 * I in s.periods:
            d = paired(runs[("codasca", 4 * I)], runs[("codaplus", I)])
            verdicts[f"codasca I={4 * I} vs codaplus I={I}"] = v = verdict(d, NONINFERIORITY)
            lines.append(f"| CODASCA at I = {4 * I} minus CODA+ at I = {I} (the claim) | {diff_cell(d)} | **{v}** |")
            d = paired(runs[("codaplus", 4 * I)], runs[("codaplus", I)])
            lines.append(f"| CODA+ at I = {4 * I} minus CODA+ at I = {I} (does CODA+ itself tolerate it?) | "
                         f"{diff_cell(d)} | {verdict(d, NONINFERIORITY)} |")
    for I in s.periods[1:]:
        d = paired(runs[("codasca", I)], runs[("codaplus", I)])
        lines.append(f"| CODASCA minus CODA+ at I = {I} (superiority) | {diff_cell(d)} | {verdict(d)} |")
    plot_period(runs, s, r.figure("period"))
    return "\n".join(lines), verdicts


def claim_imbalance(r: Runner) -> tuple[str, dict]:
    """(b) AUC objectives beat cross-entropy (FedAvg, BCE) at low positive rates."""
    s = r.setting
    methods = {"FedAvg (BCE)": ("fedavg", {}), "CODASCA (AUC-M)": ("codasca", {}), "FeDXL2 (KL-OPAUC)": ("fedxl2", {})}
    low = (min(s.rates),) * len(CLINICS)
    lrs = {name: r.pick_lr(alg, params, low) for name, (alg, params) in methods.items()}
    runs = {(name, rate): r.seeds(alg, params, lrs[name], (rate,) * len(CLINICS))
            for rate in s.rates for name, (alg, params) in methods.items()}
    lines = [f"Every site at the same positive rate; T = {s.iterations}, I = {s.local_steps}; "
             f"each method's lr chosen on the validation federation at {min(s.rates):.0%} (the claim's rate).", "",
             f"| positive rate | method | lr | {s.scored} test AUC | AUC minus FedAvg (paired) | verdict |", "|---:|---|---:|---|---|---|"]
    verdicts = {}
    for rate in s.rates:
        for name in methods:
            values = runs[(name, rate)]
            if name == "FedAvg (BCE)":
                lines.append(f"| {rate:.0%} | {name} | {lrs[name]} | {cell([v['auc'] for v in values])} | | |")
                continue
            d = paired(values, runs[("FedAvg (BCE)", rate)])
            v = verdict(d)
            if rate == min(s.rates):
                verdicts[f"{name} vs FedAvg at {rate:.0%}"] = v
            lines.append(f"| {rate:.0%} | {name} | {lrs[name]} | {cell([x['auc'] for x in values])} | "
                         f"{diff_cell(d)} | {'**' + v + '**' if rate == min(s.rates) else v} |")
    plot_rate(runs, methods, s, r.figure("rate"))
    return "\n".join(lines), verdicts


def claim_convergence(r: Runner) -> tuple[str, dict]:
    """(c) LocalSCGDAM converges faster than LocalSGDAM, CoDA and LocalSGDM."""
    s = r.setting
    rates = HETEROGENEOUS_RATES
    methods = {"LocalSCGDAM": ("localscgdam", {}), "LocalSGDAM": ("localsgdam", {}),
               "CoDA": ("coda", {"T0": s.iterations // 2}), "LocalSGDM": ("localsgdm", {})}
    lrs = {name: r.pick_lr(alg, params, rates) for name, (alg, params) in methods.items()}
    runs = {name: r.seeds(alg, params, lrs[name], rates) for name, (alg, params) in methods.items()}
    lines = [f"Sites at {', '.join(f'{p:.0%}' for p in rates)} positives; T = {s.iterations}, I = {s.local_steps}. "
             f"Convergence speed is the mean {s.scored} test AUC over the run's evaluation points (the area under "
             "the AUC-vs-iterations curve, divided by its length): a method that gets there sooner scores higher.", "",
             "| method | lr | mean AUC along the run | final AUC | LocalSCGDAM minus it, along the run (paired) | verdict |",
             "|---|---:|---|---|---|---|"]
    verdicts = {}
    for name, values in runs.items():
        area = [curve_area(v) for v in values]
        row = f"| {name} | {lrs[name]} | {cell(area)} | {cell([v['auc'] for v in values])} |"
        if name == "LocalSCGDAM":
            lines.append(row + " | |")
            continue
        d = [curve_area(a) - curve_area(b) for a, b in zip(runs["LocalSCGDAM"], values)]
        verdicts[f"localscgdam vs {name}"] = v = verdict(d)
        lines.append(row + f" {diff_cell(d)} | **{v}** |")
    plot_curves(runs, s, r.figure("rounds"), "AUC vs iterations, heterogeneous sites")
    return "\n".join(lines), verdicts


def claim_fedxl(r: Runner) -> tuple[str, dict]:
    """(d) FeDXL2 beats Local Pair on one-way pAUC; FeDXL1 is robust to label noise."""
    s = r.setting
    rates = HETEROGENEOUS_RATES
    lrs = {alg: r.pick_lr(alg, {}, rates, metric="pauc") for alg in ("fedxl2", "localpair")}
    runs = {alg: r.seeds(alg, {}, lrs[alg], rates) for alg in lrs}
    d = paired(runs["fedxl2"], runs["localpair"], "pauc")
    verdicts = {"fedxl2 vs localpair (pAUC)": verdict(d)}
    lines = [f"Sites at {', '.join(f'{p:.0%}' for p in rates)} positives; T = {s.iterations}, I = {s.local_steps}; "
             "one-way pAUC at FPR <= 0.3 (McClish-standardised), lr chosen on it.", "",
             f"| method | lr | {s.scored} test pAUC | {s.scored} test AUC |", "|---|---:|---|---|"]
    for alg, values in runs.items():
        lines.append(f"| {alg} | {lrs[alg]} | {cell([v['pauc'] for v in values])} | {cell([v['auc'] for v in values])} |")
    lines += ["", f"FeDXL2 minus Local Pair, pAUC (paired): {diff_cell(d)}: **{verdicts['fedxl2 vs localpair (pAUC)']}**.", ""]

    noisy_rates = (0.1, 0.2, 0.3)
    methods = {"FeDXL1 (squared hinge)": ("fedxl1", {}), "FeDXL1 (sigmoid)": ("fedxl1", {"surrogate": "sigmoid"}),
               "FedAvg (BCE)": ("fedavg", {})}
    drops, lr_of = {}, {}
    lines += [f"Label noise: sites at {', '.join(f'{p:.0%}' for p in noisy_rates)} positives, {s.flip:.0%} of the "
              "training labels flipped (evaluation labels clean); lr chosen on the clean validation federation.", "",
              "| method | lr | AUC, clean | AUC, noisy | drop (noisy minus clean, paired) |", "|---|---:|---|---|---|"]
    for name, (alg, params) in methods.items():
        lr_of[name] = lr = r.pick_lr(alg, params, noisy_rates)
        clean = r.seeds(alg, params, lr, noisy_rates)
        noisy = r.seeds(alg, params, lr, noisy_rates, flip=s.flip)
        drops[name] = paired(noisy, clean)
        lines.append(f"| {name} | {lr} | {cell([v['auc'] for v in clean])} | {cell([v['auc'] for v in noisy])} | "
                     f"{diff_cell(drops[name])} |")
    lines += ["", "| FeDXL1's drop minus the baseline's (paired; > 0: FeDXL1 loses less) | difference | verdict |", "|---|---|---|"]
    for fedxl in ("FeDXL1 (squared hinge)", "FeDXL1 (sigmoid)"):
        d = [a - b for a, b in zip(drops[fedxl], drops["FedAvg (BCE)"])]
        verdicts[f"{fedxl} noise vs FedAvg (BCE)"] = v = verdict(d)
        lines.append(f"| {fedxl} vs FedAvg (BCE) | {diff_cell(d)} | **{v}** |")
    return "\n".join(lines), verdicts


def recipe(r: Runner) -> tuple[str, dict]:
    """The recipe options at the lowest positive rate (BCE warm-up before AUC-M, positive-guaranteed batches),
    and AUC-M's imratio (the global or each site's positive rate) under heterogeneous rates."""
    s = r.setting
    rate = min(s.rates)
    rates = (rate,) * len(CLINICS)
    rounds = s.iterations // s.local_steps
    warm = max(1, rounds // 4)
    lr = r.pick_lr("codasca", {}, rates)
    lr_fedavg = r.pick_lr("fedavg", {}, rates)
    base = r.seeds("codasca", {}, lr, rates)
    warmed = r.seeds("codasca", {}, lr, rates, warmup_rounds=warm)
    lines = [f"Every site at {rate:.0%} positives; T = {s.iterations}, I = {s.local_steps}; lrs as in claim (b).", "",
             f"| setting | {s.scored} test AUC | minus the default (paired) | verdict (superiority) |", "|---|---|---|---|",
             f"| CODASCA, default (no warm-up, positives guaranteed) | {cell([v['auc'] for v in base])} | | |"]
    verdicts = {}
    d = paired(warmed, base)
    verdicts["warm-up"] = verdict(d)
    lines.append(f"| CODASCA, first {warm} of {rounds} rounds FedAvg (BCE) warm-up | {cell([v['auc'] for v in warmed])} | "
                 f"{diff_cell(d)} | {verdicts['warm-up']} |")
    for name, alg, alg_lr, runs in (("CODASCA", "codasca", lr, base),
                                    ("FedAvg (BCE)", "fedavg", lr_fedavg, r.seeds("fedavg", {}, lr_fedavg, rates))):
        uniform = r.seeds(alg, {}, alg_lr, rates, guarantee_positives=False)
        d = paired(runs, uniform)
        verdicts[f"{name} guarantee_positives"] = v = verdict(d)
        lines.append(f"| {name}, uniform batches (guarantee_positives off) | {cell([x['auc'] for x in uniform])} | "
                     f"{diff_cell([-x for x in d])} | guaranteed positives help: {v} |")
    # imratio-aware: AUC-M's p is the global positive rate by default; a site's own rate is the alternative.
    hetero = HETEROGENEOUS_RATES
    lr_h = r.pick_lr("codasca", {}, hetero)
    global_prior = r.seeds("codasca", {}, lr_h, hetero)
    local_prior = r.seeds("codasca", {}, lr_h, hetero, prior="local")
    d = paired(local_prior, global_prior)
    verdicts["CODASCA prior=local"] = v = verdict(d)
    lines += ["", f"AUC-M's imratio p at sites of {', '.join(f'{p:.0%}' for p in hetero)} positives (lr {lr_h}):", "",
              f"| setting | {s.scored} test AUC | minus the default (paired) | verdict (superiority) |", "|---|---|---|---|",
              f"| CODASCA, p = the federation's positive rate (prior=global, default) | {cell([x['auc'] for x in global_prior])} | | |",
              f"| CODASCA, p = each site's own positive rate (prior=local) | {cell([x['auc'] for x in local_prior])} | "
              f"{diff_cell(d)} | {v} |"]
    return "\n".join(lines), verdicts


CLAIMS = {"a": ("(a) CODASCA tolerates a 4x longer communication window than CODA+", claim_period),
          "b": ("(b) AUC objectives beat cross-entropy at low positive rates", claim_imbalance),
          "c": ("(c) LocalSCGDAM converges faster than LocalSGDAM, CoDA and LocalSGDM", claim_convergence),
          "d": ("(d) FeDXL2 beats Local Pair on one-way pAUC; FeDXL1 is robust to label noise", claim_fedxl),
          "recipe": ("Recipe options: BCE warm-up, positive-guaranteed batches, AUC-M's imratio", recipe)}


def run_claims(setting: Setting, work: Path, doc: Path, claims: list[str], name: str) -> dict[str, dict[str, str]]:
    """Run ``claims`` (keys of CLAIMS) as run ``name`` and write ``doc`` after each; returns their verdicts."""
    work.mkdir(parents=True, exist_ok=True)
    doc.parent.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    runner = Runner(build_pool(work, setting), setting, work / f"runs-{name}.jsonl", doc.parent, name)
    sections, summary, verdicts = [], [], {}
    header = (f"_Written by `python -m benchmarks.claims` (run {name!r}: {len(setting.seeds)} seeds, T = {setting.iterations} "
              f"iterations, {len(CLINICS)} sites x {setting.n_train} training rows at {setting.size} px drawn from "
              f"{setting.pool} images per clinic, "
              f"score: the {setting.scored} test AUC, "
              f"small_resnet widths {setting.widths}, lr grid {setting.lr_grid})._")
    for key in claims:
        title, function = CLAIMS[key]
        text, verdicts[key] = function(runner)
        sections.append(f"#### {title}\n\n{text}\n")
        summary += [f"| {title} | {check} | {v} |" for check, v in verdicts[key].items()]
        figures = [f"![{p.name}]({p.name})" for p in map(runner.figure, FIGURES) if p.exists()]
        write_doc(doc, "\n".join([header, "", "#### Verdicts", "", "| claim | check | verdict |", "|---|---|---|",
                                  *summary, "", *sections, *figures]), name)  # after every claim: an interrupted run keeps it
        print(f"{title}: done after {time.perf_counter() - started:.0f} s", flush=True)
    return verdicts


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    torch.set_num_threads(1)  # a two-stage 8/16-channel network is latency-bound: more threads only contend
    if "--long" in argv:
        return claims_long.main([a for a in argv if a != "--long"])
    parser = argparse.ArgumentParser(prog="python -m benchmarks.claims", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller pool, fewer iterations and lrs (< 15 min)")
    parser.add_argument("--long", action="store_true", help="claim (b) at a long budget (its own options: --long --help)")
    parser.add_argument("--seeds", type=int, default=None, help="number of seeds (default 5)")
    parser.add_argument("--iterations", type=int, default=None, help="T, iterations per run (default: the mode's)")
    parser.add_argument("--rates", type=float, nargs="+", default=None, help="claim (b)'s positive rates")
    parser.add_argument("--rows-per-site", type=int, default=None,
                        help="training rows per site (default: the mode's); a larger --pool may be needed")
    parser.add_argument("--pool", type=int, default=None, help="images generated per clinic (default: the mode's)")
    parser.add_argument("--size", type=int, default=None, help="image side in px (default: the mode's)")
    parser.add_argument("--widths", type=int, nargs="+", default=None, help="small_resnet widths (default: the mode's)")
    parser.add_argument("--lr-grid", type=float, nargs="+", default=None, help="lrs tried on the validation federation")
    parser.add_argument("--periods", type=int, nargs="+", default=None,
                        help="claim (a)'s windows I (its lrs are chosen at the first)")
    parser.add_argument("--score", choices=("pooled", "macro_over_sites"), default=None,
                        help="the AUC reported: over the pooled test rows (default) or the mean of the clinics' AUCs")
    parser.add_argument("--claims", nargs="+", default=list(CLAIMS), choices=list(CLAIMS))
    parser.add_argument("--name", default=None, help="the run's name: its markers in the doc, its plots and runs file "
                                                     "(default: quick or full)")
    parser.add_argument("--work", type=Path, default=Path(".cache/claims"), help="cache: shards and runs-<mode>.jsonl")
    parser.add_argument("--doc", type=Path, default=None,
                        help="markdown file to write the results into (default: docs/claims.md in full mode, "
                             "<work>/quick.md with --quick); the plots go beside it")
    args = parser.parse_args(argv)
    setting = QUICK if args.quick else FULL
    if args.seeds is not None:
        setting = replace(setting, seeds=tuple(range(args.seeds)))
    if args.iterations is not None:
        setting = replace(setting, iterations=args.iterations)
    if args.rates is not None:
        setting = replace(setting, rates=tuple(args.rates))
    for option, name in (("rows_per_site", "n_train"), ("pool", "pool"), ("size", "size")):
        if getattr(args, option) is not None:
            setting = replace(setting, **{name: getattr(args, option)})
    if args.widths is not None:
        setting = replace(setting, widths=tuple(args.widths))
    if args.periods is not None:
        setting = replace(setting, periods=tuple(args.periods))
    if args.score is not None:
        setting = replace(setting, score=args.score)
    if args.lr_grid is not None:
        setting = replace(setting, lr_grid=tuple(args.lr_grid))
    doc = args.doc or (args.work / "quick.md" if args.quick else REPO / "docs/claims.md")
    run_claims(setting, args.work, doc, args.claims, args.name or ("quick" if args.quick else "full"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
