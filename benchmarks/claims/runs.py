"""The claims benchmark's data and runs (python -m benchmarks.claims, docs/claims.md): the phantom clinics' pool,
the federations drawn from it, and the cached runner that trains one configuration on one federation."""

from __future__ import annotations

import hashlib
import json
import math
import multiprocessing
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from federated import TensorSite, TrainConfig, train
from federated.registry import get_algorithm
from preprocessing.records import MELANOMA_DISEASES
from preprocessing.scan import scan_site
from preprocessing.shard_format import read_split
from preprocessing.shards import shard_site
from preprocessing.sites import SiteConfig
from preprocessing.synth import generate_site

CLINICS = (("vienna", "dicom"), ("barcelona", "jpeg"), ("new-york", "jpeg"))
POOL_PREVALENCE = 0.3  # generated rate: enough positives to draw any federation rate from one pool
VALIDATION_SEED = 100  # this seed and the ones above it are validation federations, never reported


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
    """Per clinic and split: uint8 images (N, H, W, 3) and labels (N,), and the file they were read from
    (``Runner.run_many``'s worker processes read it again)."""

    splits: dict[str, dict[str, tuple[np.ndarray, np.ndarray]]]
    cache: Path | None = None


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
    return load_pool(cache)


def load_pool(cache: Path) -> Pool:
    with np.load(cache) as data:
        return Pool({p: {s: (data[f"{p}/{s}/x"], data[f"{p}/{s}/y"]) for s in ("train", "valid", "test")}
                     for p, _ in CLINICS}, cache)


def federation(pool: Pool, rates: tuple[float, ...], n_train: int, seed: int, flip: float = 0.0) -> list[TensorSite]:
    """Site k: clinic k's training rows drawn at positive rate ``rates[k]`` (at least one positive),
    ``flip`` of them with the label flipped (the evaluation split stays clean). Validation seeds (from
    ``VALIDATION_SEED`` up) score on the valid splits, every other seed on the test splits."""
    rng = np.random.default_rng([seed, 7])
    evaluation = "valid" if seed >= VALIDATION_SEED else "test"
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


def train_record(pool: Pool, setting: Setting, spec: dict) -> dict:
    """Train the run ``spec`` (``Runner.spec``) and return its stored record: final scores and the curve."""
    s = setting
    rounds = s.iterations // spec["I"]
    sites = federation(pool, tuple(spec["rates"]), s.n_train, spec["seed"], spec["flip"])
    config = TrainConfig(algorithm=spec["algorithm"], params=spec["params"], sites=sites, network="small_resnet",
                         network_kwargs={"widths": s.widths}, rounds=rounds, local_steps=spec["I"], lr=spec["lr"],
                         seed=spec["seed"], eval_every=max(1, rounds // s.eval_points),
                         guarantee_positives=spec["guarantee_positives"], warmup_rounds=spec["warmup_rounds"],
                         prior=spec.get("prior", "global"), loader_workers=0, progress=False)
    started = time.perf_counter()
    history = train(config).history
    curve = [(h["iteration"], h["metrics"][f"test/{s.score}/auc_macro"]) for h in history if "metrics" in h]
    last = history[-1]["metrics"]
    return {**spec, "auc": last[f"test/{s.score}/auc_macro"], "pauc": last[f"test/{s.score}/pauc_fpr0.3_mcclish_macro"],
            "curve": curve, "auc_pooled": last["test/pooled/auc_macro"],
            "auc_sites": last["test/macro_over_sites/auc_macro"], "seconds": time.perf_counter() - started}


_worker_pool: Pool | None = None  # a run_many worker's copy of the pool, read once per process


def start_worker(cache: Path) -> None:
    """A run_many worker's initializer: one torch thread, the pool read from its file."""
    global _worker_pool
    torch.set_num_threads(1)
    _worker_pool = load_pool(cache)


def train_in_worker(train_run: Callable[[Pool, Setting, dict], dict], setting: Setting, spec: dict) -> dict:
    """``train_run`` (a module-level function: the worker imports it by name) on the worker's pool."""
    return train_run(_worker_pool, setting, spec)


@dataclass
class Runner:
    """Runs one configuration on one federation, or returns its stored result (``runs.jsonl``)."""

    pool: Pool
    setting: Setting
    path: Path
    figures: Path  # where the plots go (beside the doc that embeds them)
    name: str  # the run's name: its plots are claims_<name>_<figure>.png
    done: dict[str, dict] = field(default_factory=dict)
    cached_only: bool = False  # True: a run not stored yet is None, not trained (tables from a stopped run)

    def __post_init__(self):
        if self.path.exists():
            for line in self.path.read_text().splitlines():
                if line.strip():
                    record = json.loads(line)
                    self.done[record["key"]] = record

    def spec(self, algorithm: str, params: dict, lr: float, rates: tuple[float, ...], seed: int,
             local_steps: int | None = None, flip: float = 0.0, warmup_rounds: int = 0, guarantee_positives: bool = True,
             prior: str = "global") -> dict:
        """What one run is, as stored: its key is the hash of everything but the key. ``resolved`` is the
        algorithm's parameters with its defaults filled in, so that a run stored under other defaults is
        not taken for this one."""
        s = self.setting
        resolved = get_algorithm(algorithm).Params(**params).model_dump(mode="json")
        spec = {"algorithm": algorithm, "params": params, "resolved": resolved, "lr": lr, "rates": list(rates), "seed": seed,
                "I": local_steps or s.local_steps, "flip": flip, "warmup_rounds": warmup_rounds,
                "guarantee_positives": guarantee_positives, "setting": [s.pool, s.size, s.n_train, s.iterations, list(s.widths)]}
        if prior != "global":  # only when set: the stored runs' keys stay valid
            spec["prior"] = prior
        if s.score != "pooled":
            spec["score"] = s.score
        return {"key": hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:16], **spec}

    def run(self, algorithm: str, params: dict, lr: float, rates: tuple[float, ...], seed: int, **kw) -> dict | None:
        spec = self.spec(algorithm, params, lr, rates, seed, **kw)
        if spec["key"] in self.done:
            return self.done[spec["key"]]
        if self.cached_only:
            return None
        return self._store(train_record(self.pool, self.setting, spec))

    def run_many(self, calls: list[tuple[tuple, dict]], jobs: int) -> None:
        """Train the runs ``calls`` (``run``'s arguments: (args, kwargs)) not stored yet on ``jobs`` processes
        of one torch thread each, storing each as it finishes; ``run`` then reads them back. The small
        network is latency-bound, so one process per core beats more threads in one process."""
        specs = self.missing(calls)
        if self.cached_only or not specs:
            return
        if jobs == 1:  # one at a time needs no process of its own (starting one imports torch again)
            threads = torch.get_num_threads()
            torch.set_num_threads(1)  # as a worker trains
            try:
                for spec in specs.values():
                    self._report(self._store(train_record(self.pool, self.setting, spec)))
            finally:
                torch.set_num_threads(threads)
            return
        if self.pool.cache is None:
            raise ValueError("run_many's processes read the pool from its file: build it with build_pool")
        context = multiprocessing.get_context("spawn")  # fork after torch has started threads can deadlock
        with ProcessPoolExecutor(jobs, mp_context=context, initializer=start_worker, initargs=(self.pool.cache,)) as ex:
            running = [ex.submit(train_in_worker, train_record, self.setting, spec) for spec in specs.values()]
            for done in as_completed(running):
                self._report(self._store(done.result()))

    @staticmethod
    def _report(record: dict) -> None:
        print(f"  {record['algorithm']} lr {record['lr']} seed {record['seed']}: AUC {record['auc']:.3f} "
              f"({record['seconds']:.0f} s)", flush=True)

    def missing(self, calls: list[tuple[tuple, dict]]) -> dict[str, dict]:
        """key -> spec of the runs ``calls`` (``spec``'s arguments: (args, kwargs)) not stored yet, once each."""
        specs = {}
        for args, kw in calls:
            spec = self.spec(*args, **kw)
            if spec["key"] not in self.done:
                specs[spec["key"]] = spec
        return specs

    def _store(self, record: dict) -> dict:
        with self.path.open("a") as f:
            f.write(json.dumps(record) + "\n")
        self.done[record["key"]] = record
        return record

    def figure(self, kind: str) -> Path:
        return self.figures / f"claims_{self.name}_{kind}.png"

    def pick_lr(self, algorithm: str, params: dict, rates: tuple[float, ...], metric: str = "auc", **kw) -> float:
        """The lr of the grid with the best score on the validation federation."""
        scores = {lr: self.run(algorithm, params, lr, rates, VALIDATION_SEED, **kw)[metric] for lr in self.setting.lr_grid}
        return max(scores, key=lambda lr: -1.0 if math.isnan(scores[lr]) else scores[lr])

    def seeds(self, algorithm: str, params: dict, lr: float, rates: tuple[float, ...], **kw) -> list[dict]:
        return [self.run(algorithm, params, lr, rates, seed, **kw) for seed in self.setting.seeds]


def write_doc(doc: Path, body: str, name: str) -> None:
    """Replace the text between run ``name``'s markers (the hand-written text around them stays)."""
    begin, end = markers(name)
    text = doc.read_text() if doc.exists() else f"# Claims\n\n{begin}\n{end}\n"
    if begin not in text or end not in text:
        raise ValueError(f"{doc}: the markers {begin} and {end} are missing; add them where the results go")
    head, rest = text.split(begin, 1)
    tail = rest.split(end, 1)[1]
    doc.write_text(f"{head}{begin}\n{body}\n{end}{tail}")

