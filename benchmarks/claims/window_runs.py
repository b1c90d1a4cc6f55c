"""The runs of claim (a) on a heterogeneous federation (python -m benchmarks.claims.window, docs/claims.md):
the cached runner, the validation choice of each method's lr and stage schedule, and the order the runs train in.

Each method's lr and stage schedule are chosen per method and I (per budget for claim (b)) on validation seeds
(``VALIDATION_SEEDS``: their own federation draws, scored on the valid splits, never reported) by the mean of
the sites' own AUCs. The reported seeds are paired: two methods at the same seed see the same federation,
initial network and batches. Every run is appended to the cache file as it finishes and reused.
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field

import numpy as np

from benchmarks.claims.heterogeneous import Heterogeneity, heterogeneous_federation
from benchmarks.claims.runs import VALIDATION_SEED, Pool, Runner, Setting, start_worker, train_in_worker
from benchmarks.claims.stagewise import NEW as STAGEWISE
from benchmarks.claims.stagewise import OLD as ONE_STAGE
from federated import TrainConfig, train

NAME = "window"
SETTING = Setting(pool=2000, size=16, iterations=512, widths=(8, 16), periods=(1, 4, 16, 64),
                  lr_grid=(0.1, 0.3, 1.0), seeds=tuple(range(10)), eval_points=1, score="macro_over_sites")
HETEROGENEITY = Heterogeneity()
B_HETEROGENEITY = Heterogeneity(rate=0.02)  # claim (b)'s federation: the same skews, 2 % positives overall
VALIDATION_SEEDS = (VALIDATION_SEED, VALIDATION_SEED + 1)
SCHEDULES = {"one stage": ONE_STAGE, "two stages": STAGEWISE}
# Claim (b): the short budgets, at the claims benchmark's I = 8.
B_BUDGETS, B_PERIOD = (256, 1024), 8
B_METHODS = {"FedAvg (BCE), positives guaranteed": ("fedavg", {}, True),
             "FedAvg (BCE), uniform batches": ("fedavg", {}, False),
             "CODASCA (AUC-M)": ("codasca", None, True)}  # None: its schedule is chosen like its lr


def train_heterogeneous(pool: Pool, setting: Setting, spec: dict) -> dict:
    """Train the run ``spec`` on its heterogeneous federation; the stored record keeps the sites' mean AUC
    (``auc``), the pooled AUC and every site's own AUC."""
    h = Heterogeneity(**spec["federation"])
    sites, _ = heterogeneous_federation(pool, h, spec["seed"])
    iterations = spec.get("iterations", setting.iterations)
    rounds = iterations // spec["I"]
    config = TrainConfig(algorithm=spec["algorithm"], params=spec["params"], sites=sites, network="small_resnet",
                         network_kwargs={"widths": setting.widths}, rounds=rounds, local_steps=spec["I"], lr=spec["lr"],
                         seed=spec["seed"], eval_every=rounds, guarantee_positives=spec["guarantee_positives"],
                         loader_workers=0, progress=False)
    started, cpu = time.perf_counter(), time.process_time()
    last = train(config).history[-1]["metrics"]
    per_site = [last.get(f"test/site/{k}/auc_macro", float("nan")) for k in range(len(sites))]
    return {**spec, "auc": last["test/macro_over_sites/auc_macro"], "auc_pooled": last["test/pooled/auc_macro"],
            "auc_per_site": per_site, "seconds": time.perf_counter() - started,
            "cpu_seconds": time.process_time() - cpu}


@dataclass
class WindowRunner(Runner):
    """The claims runner on heterogeneous federations: a run's key holds the federation's parameters and its
    budget, so runs of several budgets and federations share one cache file."""

    heterogeneity: Heterogeneity = field(default_factory=Heterogeneity)

    def spec(self, algorithm: str, params: dict, lr: float, seed: int, local_steps: int, iterations: int | None = None,
             guarantee_positives: bool = True) -> dict:
        base = super().spec(algorithm, params, lr, (), seed, local_steps=local_steps,
                            guarantee_positives=guarantee_positives)
        base.pop("key")
        spec = {**base, "federation": self.heterogeneity.describe(), "iterations": iterations or self.setting.iterations}
        return {"key": hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:16], **spec}

    def get(self, *args, **kw) -> dict | None:
        """The stored run, or None (``run_all`` trains them)."""
        return self.done.get(self.spec(*args, **kw)["key"])

    def run_all(self, calls: list[tuple[tuple, dict]], jobs: int, stored: Callable[[], None] = lambda: None) -> None:
        """Train the runs ``calls`` (``spec``'s arguments) not stored yet, on ``jobs`` processes of one torch thread,
        storing each as it finishes (a stopped run keeps every finished one) and calling ``stored`` after each."""
        specs = self.missing(calls)
        if self.cached_only or not specs:
            return
        print(f"  {len(specs)} runs to train", flush=True)
        if jobs <= 1:
            for spec in specs.values():
                self._report(self._store(train_heterogeneous(self.pool, self.setting, spec)))
                stored()
            return
        context = multiprocessing.get_context("spawn")  # fork after torch has started threads can deadlock
        with ProcessPoolExecutor(jobs, mp_context=context, initializer=start_worker, initargs=(self.pool.cache,)) as ex:
            running = [ex.submit(train_in_worker, train_heterogeneous, self.setting, spec) for spec in specs.values()]
            for done in as_completed(running):
                self._report(self._store(done.result()))
                stored()

    @staticmethod
    def _report(record: dict) -> None:
        print(f"  {record['algorithm']} I {record['I']} T {record['iterations']} lr {record['lr']} seed {record['seed']}: "
              f"AUC {record['auc']:.3f} ({record['seconds']:.0f} s)", flush=True)


def candidates(algorithm: str, params: dict | None, lr_grid: tuple[float, ...]) -> list[tuple[dict, float]]:
    """(params, lr) pairs the validation seeds choose among: the lr grid times the stage schedules for the AUC-M
    family (``params`` None), the lr grid alone otherwise."""
    schedules = list(SCHEDULES.values()) if params is None else [params]
    return [(schedule, lr) for schedule in schedules for lr in lr_grid]


def choose(runner: WindowRunner, algorithm: str, params: dict | None, I: int, iterations: int | None = None,
           guarantee_positives: bool = True) -> tuple[tuple[dict, float] | None, list[float]]:
    """The candidate with the best mean validation AUC (None until every validation run is stored) and that mean
    per candidate, in ``candidates``' order."""
    means = []
    for schedule, lr in candidates(algorithm, params, runner.setting.lr_grid):
        runs = [runner.get(algorithm, schedule, lr, seed, I, iterations, guarantee_positives) for seed in VALIDATION_SEEDS]
        means.append(float(np.nanmean([r["auc"] for r in runs])) if all(runs) else float("nan"))
    if any(np.isnan(means)):
        return None, means
    best = int(np.argmax(means))
    return candidates(algorithm, params, runner.setting.lr_grid)[best], means


def validation_calls(runner: WindowRunner, algorithm: str, params: dict | None, I: int, iterations: int | None = None,
                     guarantee_positives: bool = True) -> list[tuple[tuple, dict]]:
    return [((algorithm, schedule, lr, seed, I), {"iterations": iterations, "guarantee_positives": guarantee_positives})
            for schedule, lr in candidates(algorithm, params, runner.setting.lr_grid) for seed in VALIDATION_SEEDS]


def reported_calls(runner: WindowRunner, algorithm: str, chosen: tuple[dict, float], I: int,
                   iterations: int | None = None, guarantee_positives: bool = True) -> list[tuple[tuple, dict]]:
    schedule, lr = chosen
    return [((algorithm, schedule, lr, seed, I), {"iterations": iterations, "guarantee_positives": guarantee_positives})
            for seed in runner.setting.seeds]


def reported(runner: WindowRunner, algorithm: str, chosen: tuple[dict, float] | None, I: int,
             iterations: int | None = None, guarantee_positives: bool = True) -> list[dict]:
    """The stored reported seeds, in order, up to the first missing one (so that pairs stay paired)."""
    if chosen is None:
        return []
    out = []
    for (args, kw) in reported_calls(runner, algorithm, chosen, I, iterations, guarantee_positives):
        record = runner.get(*args, **kw)
        if record is None:
            break
        out.append(record)
    return out


def plan(runner: WindowRunner, b_runner: WindowRunner, parts: list[str]) -> list[tuple[WindowRunner, str, Callable]]:
    """The steps of ``parts`` in order: (the runner, what, a function returning its runs' calls; a reported step's
    are those whose validation choice is made). A validation step comes before the reported seeds it chooses for;
    within a step the runs go seed by seed, so that a stopped run leaves paired seeds for every I."""
    s = runner.setting
    steps: list[tuple[WindowRunner, str, Callable]] = []

    def by_seed(calls):
        return sorted(calls, key=lambda call: call[0][3])

    def chosen_calls(r, a, p, I, T=None, g=True):
        return reported_calls(r, a, c, I, T, g) if (c := choose(r, a, p, I, T, g)[0]) else []

    # The extremes of I first: a run stopped early has the premise's widest comparison on every seed it reached.
    first, *middle, last = s.periods
    methods = (["codaplus"] if "premise" in parts or "claim" in parts else []) + (["codasca"] if "claim" in parts else [])
    for algorithm in methods:
        for group in ((first, last), *((I,) for I in middle)):
            steps.append((runner, f"{algorithm} I={group} validation", lambda a=algorithm, g=group: by_seed(
                [call for I in g for call in validation_calls(runner, a, None, I)])))
            steps.append((runner, f"{algorithm} I={group} reported", lambda a=algorithm, g=group: by_seed(
                [call for I in g for call in chosen_calls(runner, a, None, I)])))
    if "b" in parts:
        for T in B_BUDGETS:
            steps.append((b_runner, f"(b) T={T} validation", lambda T=T: by_seed(
                [call for a, p, g in B_METHODS.values() for call in validation_calls(b_runner, a, p, B_PERIOD, T, g)])))
            steps.append((b_runner, f"(b) T={T} reported", lambda T=T: by_seed(
                [call for a, p, g in B_METHODS.values() for call in chosen_calls(b_runner, a, p, B_PERIOD, T, g)])))
    return steps
