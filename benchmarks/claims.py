"""The papers' central claims, checked on image federations of melanoma phantoms (docs/claims.md).

    .venv/bin/python benchmarks/claims.py [--quick] [--seeds 5] [--work DIR] [--doc docs/claims.md]

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
import hashlib
import json
import math
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import torch
from scipy import stats

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from federated import TensorSite, TrainConfig, train
from preprocessing.records import MELANOMA_DISEASES
from preprocessing.scan import scan_site
from preprocessing.shard_format import read_split
from preprocessing.shards import shard_site
from preprocessing.sites import SiteConfig
from preprocessing.synth import generate_site

CLINICS = (("vienna", "dicom"), ("barcelona", "jpeg"), ("new-york", "jpeg"))
POOL_PREVALENCE = 0.3  # generated rate: enough positives to draw any federation rate from one pool
VALIDATION_SEED = 100
HETEROGENEOUS_RATES = (0.05, 0.15, 0.3)
NONINFERIORITY = 0.01  # AUC: "at equal AUC" means no worse than this
FIGURES = ("period", "rate", "rounds")


def markers(name: str) -> tuple[str, str]:
    """Where run ``name``'s results go in the doc (one doc can hold several runs: full, long, ...)."""
    return f"<!-- claims:begin {name} -->", f"<!-- claims:end {name} -->"


@dataclass(frozen=True)
class Setting:
    """One mode's sizes. ``iterations`` is T, the same for every method and every I of a claim."""

    pool: int = 1500  # images generated per clinic
    size: int = 32
    n_train: int = 400  # training rows per site
    iterations: int = 256
    local_steps: int = 8
    periods: tuple[int, ...] = (1, 4, 16)
    rates: tuple[float, ...] = (0.01, 0.05, 0.2)
    lr_grid: tuple[float, ...] = (0.1, 0.3, 1.0)
    seeds: tuple[int, ...] = (0, 1, 2, 3, 4)
    flip: float = 0.2
    widths: tuple[int, ...] = (8, 16)  # small_resnet: stem 8, one stage of 16
    eval_points: int = 8  # evaluations along the run (AUC-vs-rounds curves)
    # "pooled": one ranking over every clinic's test rows; "macro_over_sites": the mean of the clinics' own
    # AUCs, what each hospital sees. Devices shift a model's scores per clinic, which the pooled AUC counts
    # as ranking errors.
    score: str = "pooled"

    @property
    def scored(self) -> str:
        return "pooled" if self.score == "pooled" else "clinics' mean"


FULL = Setting()
QUICK = Setting(pool=600, n_train=200, iterations=96, periods=(1, 4), rates=(0.01, 0.2), lr_grid=(0.3, 1.0),
                seeds=(0, 1, 2), eval_points=4)


# --------------------------------------------------------------------------- data


@dataclass
class Pool:
    """Per clinic and split: uint8 images (N, H, W, 3) and labels (N,)."""

    splits: dict[str, dict[str, tuple[np.ndarray, np.ndarray]]]


def build_pool(work: Path, setting: Setting, workers: int = 2) -> Pool:
    """Generate and preprocess the clinics once; later calls read the cached arrays."""
    cache = work / f"pool-n{setting.pool}-px{setting.size}-p{POOL_PREVALENCE}.npz"
    if not cache.exists():
        arrays = {}
        for k, (profile, image_format) in enumerate(CLINICS):
            result = generate_site("siim-isic-2020", work / "raw" / profile, n=setting.pool, seed=k, profile=profile,
                                   image_format=image_format, prevalence=POOL_PREVALENCE, workers=workers,
                                   overwrite=True, progress=False)
            config = SiteConfig(name=profile, format="siim-isic-2020", root=result.root, task="melanoma",
                                image_size=setting.size, split={"seed": 0, "valid": 0.2, "test": 0.25},
                                options={"image_format": image_format})
            summary = shard_site(config, scan_site(config), work / "shards", workers=workers, progress=False)
            for split in ("train", "valid", "test"):
                images, labels = read_split(summary.site_dir, split, MELANOMA_DISEASES)
                arrays[f"{profile}/{split}/x"] = np.array(images)
                arrays[f"{profile}/{split}/y"] = np.asarray(labels[:, 0])
        tmp = cache.with_suffix(".tmp.npz")
        np.savez(tmp, **arrays)
        tmp.rename(cache)
    with np.load(cache) as data:
        return Pool({p: {s: (data[f"{p}/{s}/x"], data[f"{p}/{s}/y"]) for s in ("train", "valid", "test")}
                     for p, _ in CLINICS})


def federation(pool: Pool, rates: tuple[float, ...], n_train: int, seed: int, flip: float = 0.0) -> list[TensorSite]:
    """Site k: clinic k's training rows drawn at positive rate ``rates[k]`` (at least one positive),
    ``flip`` of them with the label flipped (the evaluation split stays clean). The validation seed scores
    on the valid splits, every other seed on the test splits."""
    rng = np.random.default_rng([seed, 7])
    evaluation = "valid" if seed == VALIDATION_SEED else "test"
    sites = []
    for (profile, _), rate in zip(CLINICS, rates):
        x, y = pool.splits[profile]["train"]
        n_pos = max(1, int(round(rate * n_train)))
        positives, negatives = np.flatnonzero(y == 1), np.flatnonzero(y == 0)
        if n_pos > len(positives) or n_train - n_pos > len(negatives):
            raise ValueError(f"clinic {profile}: {n_train} rows at {rate:.0%} need {n_pos} positives and "
                             f"{n_train - n_pos} negatives, the pool has {len(positives)} and {len(negatives)}")
        rows = np.sort(np.concatenate([rng.choice(positives, n_pos, replace=False),
                                       rng.choice(negatives, n_train - n_pos, replace=False)]))
        labels = y[rows].astype(np.float32)
        if flip:
            labels = np.where(rng.random(len(rows)) < flip, 1 - labels, labels).astype(np.float32)
        xe, ye = pool.splits[profile][evaluation]
        sites.append(TensorSite(name=profile, diseases=MELANOMA_DISEASES, train=(x[rows], labels[:, None]),
                                test=(xe, ye[:, None].astype(np.float32))))
    return sites


# --------------------------------------------------------------------------- runs


@dataclass
class Runner:
    """Runs one configuration on one federation, or returns its stored result (``runs.jsonl``)."""

    pool: Pool
    setting: Setting
    path: Path
    figures: Path  # where the plots go (beside the doc that embeds them)
    name: str  # the run's name: its plots are claims_<name>_<figure>.png
    done: dict[str, dict] = field(default_factory=dict)

    def __post_init__(self):
        if self.path.exists():
            for line in self.path.read_text().splitlines():
                if line.strip():
                    record = json.loads(line)
                    self.done[record["key"]] = record

    def run(self, algorithm: str, params: dict, lr: float, rates: tuple[float, ...], seed: int, local_steps: int | None = None,
            flip: float = 0.0, warmup_rounds: int = 0, guarantee_positives: bool = True, prior: str = "global") -> dict:
        s = self.setting
        I = local_steps or s.local_steps
        rounds = s.iterations // I
        spec = {"algorithm": algorithm, "params": params, "lr": lr, "rates": list(rates), "seed": seed, "I": I,
                "flip": flip, "warmup_rounds": warmup_rounds, "guarantee_positives": guarantee_positives,
                "setting": [s.pool, s.size, s.n_train, s.iterations, list(s.widths)]}
        if prior != "global":  # only when set: the stored runs' keys stay valid
            spec["prior"] = prior
        if s.score != "pooled":
            spec["score"] = s.score
        key = hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:16]
        if key in self.done:
            return self.done[key]
        sites = federation(self.pool, rates, s.n_train, seed, flip)
        config = TrainConfig(algorithm=algorithm, params=params, sites=sites, network="small_resnet",
                             network_kwargs={"widths": s.widths}, rounds=rounds, local_steps=I, lr=lr, seed=seed,
                             eval_every=max(1, rounds // s.eval_points), guarantee_positives=guarantee_positives,
                             warmup_rounds=warmup_rounds, prior=prior, loader_workers=0, progress=False)
        started = time.perf_counter()
        history = train(config).history
        curve = [(h["iteration"], h["metrics"][f"test/{s.score}/auc_macro"]) for h in history if "metrics" in h]
        last = history[-1]["metrics"]
        record = {"key": key, **spec, "auc": last[f"test/{s.score}/auc_macro"],
                  "pauc": last[f"test/{s.score}/pauc_fpr0.3_mcclish_macro"], "curve": curve,
                  "auc_pooled": last["test/pooled/auc_macro"], "auc_sites": last["test/macro_over_sites/auc_macro"],
                  "seconds": time.perf_counter() - started}
        with self.path.open("a") as f:
            f.write(json.dumps(record) + "\n")
        self.done[key] = record
        return record

    def figure(self, kind: str) -> Path:
        return self.figures / f"claims_{self.name}_{kind}.png"

    def pick_lr(self, algorithm: str, params: dict, rates: tuple[float, ...], metric: str = "auc", **kw) -> float:
        """The lr of the grid with the best score on the validation federation."""
        scores = {lr: self.run(algorithm, params, lr, rates, VALIDATION_SEED, **kw)[metric] for lr in self.setting.lr_grid}
        return max(scores, key=lambda lr: -1.0 if math.isnan(scores[lr]) else scores[lr])

    def seeds(self, algorithm: str, params: dict, lr: float, rates: tuple[float, ...], **kw) -> list[dict]:
        return [self.run(algorithm, params, lr, rates, seed, **kw) for seed in self.setting.seeds]


# --------------------------------------------------------------------------- statistics


def interval(values) -> tuple[float, float, float]:
    """Mean and 95 % t-interval over seeds (NaN bounds with fewer than two values)."""
    v = np.asarray(values, dtype=float)
    mean = float(v.mean())
    if len(v) < 2:
        return mean, math.nan, math.nan
    half = float(stats.t.ppf(0.975, len(v) - 1) * v.std(ddof=1) / math.sqrt(len(v)))
    return mean, mean - half, mean + half


def verdict(differences, margin: float = 0.0) -> str:
    """The verdict on a claimed effect from paired differences oriented so that the claim says "> -margin"
    (margin 0: a superiority claim; margin > 0: non-inferiority, "no worse than margin").

    reproduced: the 95 % interval lies above -margin; not reproduced: it lies below -margin (the opposite
    of the claim is shown); inconclusive: it contains -margin (or fewer than two seeds).
    """
    _, low, high = interval(differences)
    if math.isnan(low):
        return "inconclusive"
    if low > -margin:
        return "reproduced"
    if high < -margin:
        return "not reproduced"
    return "inconclusive"


def cell(values) -> str:
    mean, low, high = interval(values)
    return f"{mean:.3f} [{low:.3f}, {high:.3f}]" if not math.isnan(low) else f"{mean:.3f}"


def diff_cell(values) -> str:
    mean, low, high = interval(values)
    return f"{mean:+.3f} [{low:+.3f}, {high:+.3f}]" if not math.isnan(low) else f"{mean:+.3f}"


def paired(a: list[dict], b: list[dict], metric: str = "auc") -> list[float]:
    return [x[metric] - y[metric] for x, y in zip(a, b)]


def curve_area(record: dict) -> float:
    """Mean AUC over the evaluation points: higher when a method gets there sooner."""
    return float(np.mean([auc for _, auc in record["curve"]]))


# --------------------------------------------------------------------------- claims


def claim_period(r: Runner) -> tuple[str, dict]:
    """(a) CODASCA tolerates a >= 4x longer window I than CODA+ at equal AUC under heterogeneity."""
    s = r.setting
    params = {"T0": s.iterations // 2}  # two stages, lr / 3 at the boundary (the papers' stagewise schedule)
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
    plot_rounds(runs, s, r.figure("rounds"))
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


# --------------------------------------------------------------------------- plots


def _plot(path: Path, draw) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 3.6), dpi=110)
    draw(ax)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def _band(ax, x, per_x, label, **kw):
    cells = [interval(v) for v in per_x]
    ax.plot(x, [c[0] for c in cells], marker="o", label=label, **kw)
    if all(not math.isnan(c[1]) for c in cells):
        ax.fill_between(x, [c[1] for c in cells], [c[2] for c in cells], alpha=0.2)


def plot_period(runs, s: Setting, path: Path) -> None:
    def draw(ax):
        for alg in ("codaplus", "codasca"):
            _band(ax, list(s.periods), [[v["auc"] for v in runs[(alg, I)]] for I in s.periods], alg)
        ax.set_xscale("log", base=2)
        ax.set(xlabel="communication window I (local steps)", ylabel=f"{s.scored} test AUC",
               title=f"AUC vs I at T = {s.iterations} iterations")
    _plot(path, draw)


def plot_rate(runs, methods, s: Setting, path: Path) -> None:
    def draw(ax):
        for name in methods:
            _band(ax, [100 * p for p in s.rates], [[v["auc"] for v in runs[(name, p)]] for p in s.rates], name)
        ax.set_xscale("log")
        ax.set(xlabel="positive rate at every site (%)", ylabel=f"{s.scored} test AUC", title="AUC vs positive rate")
    _plot(path, draw)


def plot_rounds(runs, s: Setting, path: Path) -> None:
    def draw(ax):
        for name, values in runs.items():
            iterations = [it for it, _ in values[0]["curve"]]
            _band(ax, iterations, [[v["curve"][i][1] for v in values] for i in range(len(iterations))], name)
        ax.set(xlabel="iteration (local steps)", ylabel=f"{s.scored} test AUC", title="AUC vs iterations, heterogeneous sites")
    _plot(path, draw)


# --------------------------------------------------------------------------- report


def write_doc(doc: Path, body: str, name: str) -> None:
    """Replace the text between run ``name``'s markers (the hand-written text around them stays)."""
    begin, end = markers(name)
    text = doc.read_text() if doc.exists() else f"# Claims\n\n{begin}\n{end}\n"
    if begin not in text or end not in text:
        raise ValueError(f"{doc}: the markers {begin} and {end} are missing; add them where the results go")
    head, rest = text.split(begin, 1)
    tail = rest.split(end, 1)[1]
    doc.write_text(f"{head}{begin}\n{body}\n{end}{tail}")


def run_claims(setting: Setting, work: Path, doc: Path, claims: list[str], name: str) -> dict[str, dict[str, str]]:
    """Run ``claims`` (keys of CLAIMS) as run ``name`` and write ``doc`` after each; returns their verdicts."""
    work.mkdir(parents=True, exist_ok=True)
    doc.parent.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    runner = Runner(build_pool(work, setting), setting, work / f"runs-{name}.jsonl", doc.parent, name)
    sections, summary, verdicts = [], [], {}
    header = (f"_Written by `benchmarks/claims.py` (run {name!r}: {len(setting.seeds)} seeds, T = {setting.iterations} "
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
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller pool, fewer iterations and lrs (< 15 min)")
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
    doc = args.doc or (args.work / "quick.md" if args.quick else Path(__file__).resolve().parents[1] / "docs/claims.md")
    torch.set_num_threads(1)  # a two-stage 8/16-channel network is latency-bound: more threads only contend
    run_claims(setting, args.work, doc, args.claims, args.name or ("quick" if args.quick else "full"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
