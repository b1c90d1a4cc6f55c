"""An evaluation job at a site (``fedauc evaluate``) as its privacy budget allows it (docs/privacy.md section 5).

Without an evaluation noise multiplier the site releases its exact summaries, and a site with a budget refuses
the job. With one (S_e), each model's valid and test score histograms leave with Gaussian noise (the training's
noised evaluations' release, ``site.noised_summary``) and no per-site report: one Gaussian mechanism at rate 1
per model, as a training's evaluation round is charged; the subgroup cells (``federated.subgroups``) are withheld. A site with a budget admits the job against its ledger
before it reads its shards and charges it once the models are scored, admitting it again under the ledger's lock
(a training may have been charged meanwhile); a site without one only reports what the
job spent. The noise comes from a generator the site seeds itself with fresh entropy every job (``site.site_seed``:
an audit's fixed seed would give two jobs' releases the same noise).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from federated.data import load_shard
from federated.dp.site import noised_summary, site_seed
from federated.evaluation import SPLITS
from federated.privacy.binding import guarded_ledger
from federated.privacy.budget import declared_budget
from federated.privacy.ledger import Entry, admit, epsilon, locked, site_ledger
from federated.privacy.policy import DPConfig, SiteBudget, refuse_release
from federated.scoring import ModelToScore, score_site
from federated.subgroups import CELL, split_groups
from preprocessing.shard_format import shard_content_hash

# The delta a site without a budget reports its spend at (a site with one uses its own), as a DP training does.
DEFAULT_DELTA: float = DPConfig.model_fields["delta"].default


@dataclass
class EvaluationRelease:
    """What one site releases of an evaluation job it admitted."""

    site: str
    ledger: Path | None  # None: the site has no budget (or the release is exact)
    declared: SiteBudget | None  # the budget its shards declare
    job: list[Entry]  # empty: an exact release
    eval_noise_multiplier: float | None
    privacy: dict | None  # epsilon_job, epsilon_spent, epsilon_remaining (None without a budget), delta
    generator: torch.Generator | None

    def release(self, summaries: list[dict[str, tuple[np.ndarray, np.ndarray]]]
                ) -> list[dict[str, tuple[np.ndarray, np.ndarray]]]:
        """``summaries`` (per model, split -> (report, histograms)) as they leave the site, its ledger charged: the
        ledger is re-read under its lock and the job admitted again against what the site has spent by now (a
        training may have been charged since), then appended; refused, nothing leaves."""
        if self.eval_noise_multiplier is None:
            return summaries
        if self.ledger is not None:
            with locked(self.ledger) as ledgers:
                ledger, budget = site_ledger(self.site, self.ledger, ledgers, self.declared)
                self.privacy = {**admit(self.site, ledger, self.job, budget), "delta": budget.delta}
                ledger.entries.extend(self.job)
                ledger.save()
        # Subgroup cells are withheld: an image lies in several, which the one mechanism per model does not cover.
        return [{split: noised_summary(report, histograms, self.eval_noise_multiplier, self.generator)
                 for split, (report, histograms) in summary.items() if CELL not in split} for summary in summaries]

    def scored(self, shard_dir: Path, models: list[ModelToScore], states: list[dict[str, torch.Tensor]], bins: int,
               min_count: int) -> tuple[list[dict[str, tuple[np.ndarray, np.ndarray]]], str]:
        """The site's own shards scored by ``models`` (``federated.scoring.score_site``, on the CPU) as they leave
        it, with the hash of the shards scored: the one sequence a site runs for an evaluation job, in process
        and over NVIDIA FLARE alike."""
        data = load_shard(shard_dir)
        groups = None if self.eval_noise_multiplier is not None else {
            split: split_groups(shard_dir, split, min_count) for split in SPLITS if split in data.splits}
        summaries = score_site(self.site, models, states, data, bins, min_count, torch.device("cpu"), groups)
        return self.release(summaries), shard_content_hash(shard_dir)


def admit_evaluation(site: str, shard_dir: str | Path, labels: list[str],
                     eval_noise_multiplier: float | None) -> EvaluationRelease:
    """Site ``site``'s check of an evaluation job scoring the models ``labels`` against its ledger (the site's,
    ``binding.guarded_ledger``): raises ``PrivacyRefused`` in one line where the site refuses it, before anything is
    read."""
    path, declared = guarded_ledger(shard_dir), declared_budget(shard_dir)
    with locked(path) as ledgers:
        ledger, budget = site_ledger(site, path, ledgers, declared)
    if eval_noise_multiplier is None:
        refuse_release(site, budget, "an evaluation")
        return EvaluationRelease(site, None, declared, [], None, None, None)
    what = f"evaluation of model(s) {', '.join(labels)}"
    job = [Entry(what, "evaluation", eval_noise_multiplier, 1.0, len(labels))]
    if budget is None:
        delta = DEFAULT_DELTA
        spent = epsilon(job, delta)
        privacy = {"epsilon_job": spent, "epsilon_spent": spent, "epsilon_remaining": None}
    else:
        delta = budget.delta
        privacy = admit(site, ledger, job, budget)
    return EvaluationRelease(site, None if budget is None else path, declared, job, eval_noise_multiplier,
                             {**privacy, "delta": delta},
                             torch.Generator().manual_seed(site_seed(site, what, fresh=True)))
