"""A centre's records written through fedauc's own recording code, with synthetic numbers: a training (its
runs, per-round records, privacy spending, the registered model), a night's evaluation and a site's day of
PACS scoring. What python -m benchmarks.year writes a year of, and what tests/test_prune.py prunes.

Only the numbers are made up: every MLflow record goes through the function a training
(``runs.training_runs``, ``runs.RoundLogger``, ``runs.log_privacy``, ``registry.register_model``), an evaluation
(``federated.evaluation.site_summary`` / ``combine_sites``, ``evaluations.record``) or a PACS scoring job
(``drift.tally``, ``drift.release``, ``drift.record``) uses, so the stores grow as the product's do.
"""

from __future__ import annotations

import datetime as dt
from types import SimpleNamespace

import mlflow
import numpy as np
from mlflow import MlflowClient

from federated.evaluation import combine_sites, site_summary
from federated.launch import InProcess
from federated.schema import SELECTION_METRIC
from models.networks import build_network
from pipelines import evaluations, registry, runs, tracking
from pipelines.hospital import drift
from preprocessing.records import TASK_DISEASES
from preprocessing.sites import SharingPolicy

TASK = "chest-xray"
DISEASES = list(TASK_DISEASES[TASK])
BINS, MIN_COUNT = evaluations.BINS, evaluations.MIN_COUNT
UPDATE_GROUPS = ("stem", "stage1", "stage2", "stage3", "head")


def federation(sites: list[str], name: str = "chest-consortium") -> SimpleNamespace:
    """What the recording functions read of a federation: its name, task and sites' names and diseases."""
    return SimpleNamespace(name=name, task=TASK,
                           sites=[SimpleNamespace(name=site, diseases=DISEASES) for site in sites])


def _split_summary(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
    labels = (rng.random((n, len(DISEASES))) < 0.2).astype(np.float64)
    scores = np.clip(0.5 * labels + rng.random(labels.shape) * 0.7, 0, 1)
    return site_summary(labels, scores, BINS, MIN_COUNT)


def synthetic_evaluation(rng: np.random.Generator, site_ids: list, n: int = 300):
    """An evaluation of every site's valid and test splits, pooled as a real one is (``combine_sites``)."""
    summaries = [{split: _split_summary(rng, n) for split in ("valid", "test")} for _ in site_ids]
    return combine_sites(summaries, site_ids, DISEASES, MIN_COUNT)


def _round(rng: np.random.Generator, index: int, k: int, evaluate: bool) -> dict:
    record = {"round": index, "iteration": 8 * (index + 1), "bytes_sent": [1_300_000] * k,
              "bytes_received": [1_300_000] * k, "train_loss": float(rng.random()), "seconds": 3.0,
              "lr": 1.0, "site_losses": rng.random(k).tolist(), "site_compute_s": rng.random(k).tolist(),
              "site_wait_s": rng.random(k).tolist(), "slowest": {"site": 0, "compute_s": 2.0, "held_up_s": 1.0},
              "update_norm": {g: rng.random(k).tolist() for g in UPDATE_GROUPS},
              "update_norm_rel": {g: rng.random(k).tolist() for g in UPDATE_GROUPS}}
    if evaluate:
        record["metrics"] = synthetic_evaluation(rng, list(range(k)), n=120).metrics
    return record


def record_training(fed, run_name: str, rng: np.random.Generator, rounds: int = 40, eval_every: int = 5,
                    network: str = "small_resnet") -> tuple[str, str]:
    """One finished training (parent and site runs, ``rounds`` per-round records, every site's privacy
    spending) and its model registered (the champion alias moved when it is better); (run id, version)."""
    tracking.configure()
    client = MlflowClient()
    experiment = tracking.experiment_id(fed.task)
    names = [site.name for site in fed.sites]
    with runs.training_runs(experiment, run_name, fed.name, names) as (parent, child_ids):
        mlflow.log_params({"algorithm": "codasca", "rounds": rounds, "local_steps": 8, "network": network,
                           "K": len(names), "sites": ",".join(names), "federation": fed.name, "task": fed.task})
        logger = runs.RoundLogger(client, parent.info.run_id, child_ids)
        for index in range(rounds):
            logger(_round(rng, index, len(names), (index + 1) % eval_every == 0))
        runs.log_privacy(client, names, child_ids, {
            name: {"epsilon_job": 0.5, "epsilon_spent": 0.5 * (1 + rng.random()), "delta": 1e-5,
                   "epsilon_remaining": 8.0, "budget_epsilon": 10.0} for name in names})
        mlflow.log_dict({"algorithm": "codasca", "rounds": rounds}, "config.json")
        score = float(0.7 + 0.2 * rng.random())
        model = build_network(network, num_classes=len(DISEASES), in_channels=1)
        example = rng.normal(size=(2, 1, 32, 32)).astype(np.float32)
        version, _ = registry.register_model(model, fed.task, example, score)
        mlflow.log_metric(f"registered_model/{SELECTION_METRIC}", score)
    return parent.info.run_id, version


def record_evaluation(fed, rng: np.random.Generator, noise_multiplier: float | None = None) -> str:
    """A night's evaluation of the champion on every site (noised, and its privacy spending recorded, with
    ``noise_multiplier``); its run id."""
    tracking.configure()
    names = [site.name for site in fed.sites]
    champion = registry.champion_version(fed.task)
    privacy = ({name: {"epsilon_spent": 0.1, "delta": 1e-5} for name in names} if noise_multiplier else {})
    scored = evaluations.Scored(champion, synthetic_evaluation(rng, names),
                                {name: f"{i:064x}" for i, name in enumerate(names)}, noise_multiplier, privacy)
    return evaluations.record(fed, scored, InProcess(), champion)


def record_scoring_day(fed, site: str, day: dt.date, rng: np.random.Generator, studies: int = 150) -> None:
    """A site's day of PACS scoring as the centre receives it: the day's tally of the 15-minute runs,
    released under the site's sharing policy, recorded against the champion with the drift figure."""
    tracking.configure()
    version = registry.champion_version(fed.task)
    reference = rng.random((400, len(DISEASES)))
    rows = [{"status": "scored", **{f"p_{d}": float(p) for d, p in zip(DISEASES, rng.random(len(DISEASES)))}}
            for _ in range(studies)]
    rows += [{"status": "refused", "reason": "body part not in the contract"}] * 12
    counted = drift.tally(rows, reference, DISEASES)
    aggregates = drift.release(counted, SharingPolicy())
    drift.record(fed.task, site, registry.registered_model_name(fed.task), version, aggregates, day.isoformat())
