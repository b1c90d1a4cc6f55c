"""An evaluation job at the hospital (``site.job.evaluate`` calls it): score the models the job names, with the
weights the server sent in the call, on this site's own valid and test splits.

The site-local evaluation training uses (``EvaluationRelease.scored``: ``federated.scoring.score_site``), so what leaves is exactly what
a training's evaluation exchanges: per model and split its fixed-size report (metrics with small counts
suppressed here) and score histograms, plus the shard hash (which data was scored). With the job's
evaluation noise multiplier the site releases noised histograms only and what the job spent of its budget
(federated/dp/evaluation.py); without one, a site with a budget refuses the job before reading its
shards. Nothing is read from the site's disk but its own shards and ledger; no model is read from its disk.
"""

from __future__ import annotations

from pathlib import Path

import torch

from federated.dp.evaluation import admit_evaluation
from federated.flare.spec import FlareJob


def score_here(spec: FlareJob, name: str, shard_dir: Path, weights: list[dict[str, torch.Tensor]]) -> dict:
    """What site ``name`` returns for an evaluation job: its shard hash, what the job spent of its budget (None:
    an exact release) and, per model, per split, its report and histograms (numpy arrays)."""
    request = spec.evaluation
    release = admit_evaluation(name, shard_dir, [model.label for model in request.models],
                               request.eval_noise_multiplier)
    summaries, shard_hash = release.scored(shard_dir, request.models, weights, request.bins, request.min_count)
    return {"shard_hash": shard_hash, "privacy": release.privacy,
            "summaries": [{split: {"report": report, "histograms": histograms}
                           for split, (report, histograms) in summary.items()} for summary in summaries]}
