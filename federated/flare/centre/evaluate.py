"""Evaluation at the hospitals over NVIDIA FLARE, from the centre: submit a job of kind ``"evaluate"`` and
read back what the sites returned.

The job names each model's network, input and classes (``FlareJob.evaluation``: ``federated.scoring.
ModelToScore``); their weights go as a file of tensors in the job's ``config/`` folder
(``protocol.WEIGHTS_FILE``; never code). The server hands both to every site (federated/flare/server/evaluate.py), each
site scores every model on its own valid and test splits (federated/flare/site/evaluate.py) and returns its fixed-size
reports, score histograms and shard hash; the server writes them to the job's result, which is read here
and pooled by the caller (``evaluation.combine_sites``).
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import numpy as np
import torch

from common.errors import DataError
from federated.flare.centre.environments import check_flare_env
from federated.flare.centre.job import result_folder, submit_in_env
from federated.flare.protocol import RESULT_FILE, WEIGHTS_FILE
from federated.flare.spec import EvaluationRequest, FlareJob
from federated.scoring import ModelToScore, Scores
from preprocessing.federation import Federation

_JOB_TIMEOUT_S = 3600.0


def read_scores(result_root: Path, sites: list[str]) -> Scores:
    """Per site (in ``sites``' order) its summaries, one per model, every site's shard hash and what the job spent
    of its privacy budget (None: an exact release)."""
    meta = json.loads((result_folder(result_root) / RESULT_FILE).read_text())
    if sorted(meta["sites"]) != sorted(sites):
        raise DataError(f"the evaluation job came back from sites {sorted(meta['sites'])}, the federation lists "
                        f"{sorted(sites)}", fix="start every hospital of the federation, and only those")
    per_site = [[{split: (np.asarray(arrays["report"], dtype=np.float64), np.asarray(arrays["histograms"], dtype=np.float64))
                  for split, arrays in summary.items()} for summary in meta["sites"][site]["summaries"]]
                for site in sites]
    return (per_site, {site: meta["sites"][site]["shard_hash"] for site in sites},
            {site: meta["sites"][site]["privacy"] for site in sites})


def evaluate_flare(models: list[ModelToScore], states: list[dict[str, torch.Tensor]], federation: Federation,
                   shards_root: Path | None, env: str, workspace: Path, kit: str | Path | None, bins: int, min_count: int,
                   eval_noise_multiplier: float | None = None, name: str = "fedauc-evaluate") -> Scores:
    """Score ``models`` (weights ``states``) at every site of ``federation`` as an NVIDIA FLARE job in ``env``
    (``sim`` / ``poc``: the sites on this machine read ``shards_root``; ``prod``: the running consortium the
    admin kit ``kit`` reaches, each hospital its own shards, nothing read here), with noised releases where
    ``eval_noise_multiplier`` is set. Returns :func:`read_scores`'s per-site summaries, shard hashes and
    privacy spends."""
    admin = check_flare_env(env, kit)
    names = [site.name for site in federation.sites]
    request = EvaluationRequest(models=models, bins=bins, min_count=min_count,
                                eval_noise_multiplier=eval_noise_multiplier)

    def make_job(share_paths: bool, threads: int | None, sharing: dict) -> FlareJob:
        # The sites run in NVFlare's workspace, not here: a relative path would name another folder.
        dirs = {n: str((Path(shards_root) / n).resolve()) for n in names} if share_paths else {}
        return FlareJob(kind="evaluate", settings={}, sites=names, task=federation.task,
                        diseases=tuple(federation.sites[0].diseases), shard_dirs=dirs,
                        sharing=sharing if share_paths else {}, job_timeout_s=_JOB_TIMEOUT_S, threads=threads,
                        evaluation=request)

    workspace = Path(workspace)
    with tempfile.TemporaryDirectory(prefix="fedauc-models-") as folder:
        weights = Path(folder) / WEIGHTS_FILE
        torch.save([{k: v.detach().cpu().contiguous() for k, v in state.items()} for state in states], weights)
        return submit_in_env(env, federation, shards_root, workspace, admin, name, make_job,
                             lambda result: read_scores(result, names), server_files=[weights])
