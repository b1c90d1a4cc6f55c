"""DP at a site, as the engine runs it (federated/engine.py calls ``admit_sites`` before anything leaves the
site, then ``attach`` once the sites are built).

Before a training, each site of this process computes what the job will spend at its own data (rounds x local
steps at its sampling rate q = batch / records, the noise multiplier) and refuses, in one line, a job over its
budget or a job without DP where it has a budget; the ledger is charged for the whole job up front, under its
lock (``ledger.locked``), so that jobs admitted at once see each other's charges. A resumed training is charged
again for every round from the one after its last committed checkpoint (round 0 without one): those rounds leave
the site again, with fresh noise. A run that stops early (an error, the centre's abort) settles its charge to the
rounds whose exchange began (``settling``); a site killed outright keeps the whole charge (conservative).

The noise and the Poisson sampling draw from a generator the site seeds itself: from the operating system's
entropy, or from ``FEDAUC_DP_NOISE_SEED`` in the site process's environment with the job's key (an audit's
reproduction: the centre never chooses it, since whoever knows the noise can subtract it; two jobs never share a
stream).
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from common.accounting import ACCOUNTANTS
from federated.algorithms.base import Site
from federated.checkpoint import latest_round_dir
from federated.config import TrainConfig
from federated.data import Batch, SiteData
from federated.dp.refusals import check_dp_job, check_network
from federated.dp.sgd import PoissonLoader, SampleLoss, private_gradients
from federated.health import TrainingDiverged, lower_lr_fix
from federated.network import build_model
from federated.privacy.ledger import (
    Entry,
    Ledger,
    admit,
    budget_report,
    check_delta,
    epsilon,
    locked,
    site_ledger,
)
from federated.privacy.policy import PrivacyRefused, SiteBudget
from federated.registry import get_algorithm

NOISE_SEED_ENV = "FEDAUC_DP_NOISE_SEED"


def site_seed(name: str, job: str, fresh: bool = False) -> int:
    """The site's own seed of its noise and sampling for job ``job`` (module docstring). Under a fixed seed each job
    draws its own stream (derived from the job's key: two jobs never share noise or batches). ``fresh`` (a resumed
    training, an evaluation job) draws entropy even under a fixed seed: that seed would repeat noise already sent,
    and the difference of two releases with the same noise is a difference of exact values."""
    fixed = os.environ.get(NOISE_SEED_ENV)
    if fixed is None or fresh:
        return secrets.randbits(62)
    return int.from_bytes(hashlib.sha256(f"{fixed}#{name}#{job}".encode()).digest()[:8], "little") >> 2


def noised_summary(report: np.ndarray, histograms: np.ndarray, eval_noise_multiplier: float,
                   generator: torch.Generator) -> tuple[np.ndarray, np.ndarray]:
    """An evaluation's summary of a split as DP lets it leave: no per-site report (NaN rows, as a site without the
    split sends) and the score histograms (C, 2, B) with N(0, (eval_noise_multiplier sqrt(C))^2) on every bin (one
    record moves one bin per disease by 1), floored at 0 (post-processing)."""
    if np.isnan(report[:, 0]).all():  # no such split here: no record to protect
        return report, histograms
    std = eval_noise_multiplier * float(histograms.shape[0]) ** 0.5
    noise = torch.normal(0.0, std, histograms.shape, generator=generator, device=generator.device)
    return np.full_like(report, np.nan), np.clip(histograms + noise.double().cpu().numpy(), 0.0, None)


@dataclass
class SitePrivacy:
    """One site's DP for one training: its noise multiplier and sampling rate, its own generator, what it spends."""

    name: str
    noise_multiplier: float
    max_grad_norm: float
    sample_rate: float
    expected_batch: float
    seed: int
    epsilon: dict  # epsilon_job, epsilon_spent, epsilon_remaining (None: the site has no budget), delta
    eval_noise_multiplier: float | None = None  # None: the site releases no evaluation
    generator: torch.Generator | None = None
    ledger: Path | None = None  # where this run's charge is (None: the site has no budget)
    attempt: str = ""  # this run's entries in that ledger
    start_round: int = 0  # this run's first round (after the last committed checkpoint of a resume)

    def release_summary(self, report: np.ndarray, histograms: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return noised_summary(report, histograms, self.eval_noise_multiplier, self.generator)

    def gradients(self, site: Site, batch: Batch, sample_loss: SampleLoss, extras: list[Tensor]
                  ) -> tuple[Tensor, list[Tensor]]:
        """(loss, privatized gradients of the network's parameters then of ``extras``) of one local step."""
        return private_gradients(site.model, batch.x, batch.y, batch.mask, sample_loss, extras, self.max_grad_norm,
                                 self.noise_multiplier, self.expected_batch, self.generator)


def evaluation_rounds(config: TrainConfig, start: int = 0) -> int:
    """How many evaluations the engine runs in rounds ``start``.. of a training (every ``eval_every`` rounds and
    after the last)."""
    return sum(1 for r in range(start, config.rounds) if config.evaluates_after(r))


def job_key(config: TrainConfig) -> str:
    """What identifies a training across a resume: its config without the resume switch and display settings."""
    text = config.model_dump_json(exclude={"resume", "progress", "sites", "loader_workers", "timeout_s"})
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def first_round(config: TrainConfig) -> int:
    """The round this run starts from: after the last committed checkpoint on a resume, else 0. Every round from
    there is released again, so it is charged again (docs/privacy.md section 2)."""
    if not (config.resume and config.checkpoint_dir):
        return 0
    round_dir = latest_round_dir(Path(config.checkpoint_dir))
    return 0 if round_dir is None else json.loads((round_dir / "meta.json").read_text())["round"] + 1


def training_steps(config: TrainConfig, start: int, rounds_sent: int) -> int:
    """The DP-SGD steps released by ``rounds_sent`` rounds from round ``start`` (an algorithm's extra steps are taken
    in round 0)."""
    extra = get_algorithm(config.algorithm).dp_extra_steps if start == 0 and rounds_sent else 0
    return rounds_sent * config.local_steps + extra


def admit_sites(config: TrainConfig, datas: list[SiteData], indices: list[int],
                input_shape: tuple[int, ...]) -> list[SitePrivacy] | None:
    """Each site's check of the job against its ledger (module docstring); raises ``PrivacyRefused`` naming the
    first site that refuses, before any ledger is charged. None: a training without DP (at no budgeted site).
    The ledgers stay locked from their reading to their charge."""
    sites = [config.sites[k] for k in indices]
    with locked(*(site.privacy_ledger() for site in sites)) as ledgers:
        budgeted = [site_ledger(data.name, site.privacy_ledger(), ledgers, site.declared_privacy())
                    for site, data in zip(sites, datas)]
        return _admit_locked(config, datas, budgeted, input_shape)


def _admit_locked(config: TrainConfig, datas: list[SiteData], budgeted: list[tuple[Ledger, SiteBudget | None]],
                  input_shape: tuple[int, ...]) -> list[SitePrivacy] | None:
    dp = config.dp
    if dp is None:
        for data, (_, budget) in zip(datas, budgeted):
            if budget is not None:
                raise PrivacyRefused(f"site {data.name!r} refuses the job: it has a privacy budget (epsilon "
                                     f"{budget.epsilon:g}, delta {budget.delta:g}) and the job trains "
                                     "without DP (fedauc train --dp --noise-multiplier S --max-grad-norm C)")
        return None
    check_dp_job(config.algorithm, dp, config.guarantee_positives)
    check_network(config.network, build_model(config, input_shape, len(datas[0].diseases)))
    key, start = job_key(config), first_round(config)
    steps = training_steps(config, start, config.rounds - start)
    attempt = uuid.uuid4().hex
    out, charges = [], []
    for data, (ledger, budget) in zip(datas, budgeted):
        n = len(data.train)
        q = min(config.batch_size, n) / n
        delta = dp.delta if budget is None else budget.delta
        accountant = ACCOUNTANTS[dp.accountant if budget is None else budget.accountant]  # a budget's is the site's
        check_delta(data.name, delta, n)
        sigma = dp.noise_multiplier or accountant.noise_multiplier(dp.target_epsilon, delta, q, steps)
        job = [Entry(key, "training", sigma, q, steps, attempt=attempt)] if steps else []
        evaluations = evaluation_rounds(config, start)
        if dp.eval_noise_multiplier is not None and evaluations:
            job.append(Entry(key, "evaluation", dp.eval_noise_multiplier, 1.0, evaluations, attempt=attempt))
        if budget is None:
            spent = epsilon(job, delta, accountant)
            report = {"epsilon_job": spent, "epsilon_spent": spent, "epsilon_remaining": None}
        else:
            report = {**admit(data.name, ledger, job, budget), **budget_report(data.name, ledger, budget)}
            charges.append((ledger, job))
        # A resume draws fresh noise: its checkpoint does not hold the generator's state.
        out.append(SitePrivacy(data.name, sigma, dp.max_grad_norm, q, min(config.batch_size, n),
                               site_seed(data.name, key, fresh=config.resume), {**report, "delta": delta},
                               dp.eval_noise_multiplier, ledger=None if budget is None else ledger.path,
                               attempt=attempt, start_round=start))
    for ledger, job in charges:  # every site of this process agreed: now charge them, still under their locks
        ledger.entries.extend(job)
        ledger.save()
    return out


@dataclass
class Released:
    """What a run has sent so far: rounds whose exchange began, evaluations begun."""

    rounds: int = 0
    evaluations: int = 0


@contextmanager
def settling(config: TrainConfig, privacy: list[SitePrivacy] | None) -> Iterator[Released]:
    """The engine's round loop runs in here and counts what it sends: a run that stops early (an error, the
    centre's abort) charges what it released, not the whole job it was charged for when it started. Each ledger is
    re-read under its lock; only this run's entries change. A site killed outright keeps the whole charge."""
    released = Released()
    try:
        yield released
    except BaseException:
        for p in privacy or ():
            if p.ledger is None:
                continue
            with locked(p.ledger) as ledgers:
                ledger = ledgers[p.ledger]
                ledger.settle(p.attempt, {"training": training_steps(config, p.start_round, released.rounds),
                                          "evaluation": released.evaluations})
                ledger.save()
        raise


def withhold(losses: list[Tensor], norms: list[Tensor], privacy: list[SitePrivacy], round_index: int,
             lr: float) -> tuple[list[Tensor], list[Tensor]]:
    """Under DP a site's loss is computed from its records without noise, and its update norms, per site, would
    tell the centre what secure aggregation hides: each site checks its own here (a non-finite loss or update
    stops the training naming the site) and sends NaN in their place (federated/health.py reads NaN as
    withheld)."""
    for loss, norm, p in zip(losses, norms, privacy):
        what = ("training loss" if not bool(torch.isfinite(loss).all()) else
                "update" if not bool(torch.isfinite(norm).all()) else None)
        if what is not None:
            raise TrainingDiverged(f"site(s) {p.name!r}, round {round_index}: the {what} is not finite (the "
                                   "training diverged)", fix=lower_lr_fix(lr, repr(p.name)))
    return ([torch.full_like(loss, float("nan")) for loss in losses],
            [torch.full_like(norm, float("nan")) for norm in norms])


def attach(sites: list[Site], privacy: list[SitePrivacy] | None) -> None:
    """Give each site its DP: its Poisson sampler and noise generator, both from its own seed."""
    for site, p in zip(sites or (), privacy or ()):
        device = site.loader.device
        p.generator = torch.Generator(device=device).manual_seed(p.seed)
        old = site.loader
        site.loader = PoissonLoader(old, seed=p.seed + 1)
        if old._pool is not None:
            old._pool.shutdown(wait=False)
        site.privacy = p

