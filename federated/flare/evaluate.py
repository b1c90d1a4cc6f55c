"""Evaluation at the hospitals over NVIDIA FLARE: a job of kind ``"evaluate"``.

The centre puts the models to score in the job: ``FlareJob.evaluation`` names each model's network, input and
classes (``federated.scoring.ModelToScore``), and their weights go as a file of tensors in the job's
``config/`` folder (``WEIGHTS_FILE``; never code). The server loads the weights and hands the job and the
weights to every site in the call (``site.evaluate``): a site never reads a model from its disk. Each site
scores every model on its own valid and test splits with the site-local evaluation training uses
(``federated.scoring.score_site``), then returns
exactly what a training's evaluation exchanges: per model and split its fixed-size report (metrics with
small counts suppressed at the site) and score histograms, plus its shard hash (which data was scored).
Nothing is read from a site's disk but its own shards; nothing else leaves it. The server writes what came
back to the job's result folder; the submitter reads it and pools it (``evaluation.combine_sites``). No
collective: a site does not wait for the others.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import numpy as np
import torch

from federated.data import load_shard
from federated.flare.environments import check_flare_env
from federated.flare.job import result_folder, submit_in_env
from federated.flare.server import FAILURE_MARK, result_dir
from federated.flare.site_failure import FAILED
from federated.flare.spec import EvaluationRequest, FlareJob
from federated.scoring import ModelToScore, Summary, score_site
from preprocessing.errors import DataError
from preprocessing.federation import Federation
from preprocessing.shard_format import shard_content_hash

_JOB_TIMEOUT_S = 3600.0


# The evaluation job's weights (a list of state dicts, one per model, in the job's order), in its config/ folder.
WEIGHTS_FILE = "fedauc_models.pt"


# --- at the site -----------------------------------------------------------------------------------------
def score_here(spec: FlareJob, name: str, shard_dir: Path, weights: list[dict[str, torch.Tensor]]) -> dict:
    """What site ``name`` returns for an evaluation job: its shard hash and, per model, per split, its report
    and histograms (numpy arrays)."""
    request = spec.evaluation
    summaries = score_site(name, request.models, weights, load_shard(shard_dir), request.bins, request.min_count,
                           torch.device("cpu"))
    return {"shard_hash": shard_content_hash(shard_dir),
            "summaries": [{split: {"report": report, "histograms": histograms}
                           for split, (report, histograms) in summary.items()} for summary in summaries]}


# --- at the server ---------------------------------------------------------------------------------------
def serve_evaluation(spec: FlareJob) -> str:
    """Hand the job and the models' weights to every site, wait for all of them, write what they returned
    (``result.json``)."""
    from nvflare.collab import collab

    config_dir = Path(collab.workspace.get_app_config_dir(collab.fl_ctx.get_job_id()))
    weights = torch.load(config_dir / WEIGHTS_FILE, map_location="cpu", weights_only=True)
    results = collab.clients(timeout=spec.job_timeout_s, blocking=False).evaluate(spec.model_dump(), weights)
    returned = dict(results)
    if results.failures:
        raise RuntimeError(FAILURE_MARK + "; ".join(
            f"site {site!r}: {getattr(err, 'cause', err)}" for site, err in sorted(results.failures.items())))
    failed = {site: result[FAILED] for site, result in returned.items() if FAILED in result}
    if failed:  # each site's one line, paths already replaced there (site_failure.py)
        raise RuntimeError(FAILURE_MARK + "; ".join(f"site {site!r} failed: {line}" for site, line in sorted(failed.items())))
    out = result_dir()

    def plain(summary: dict) -> dict:
        return {split: {key: np.asarray(value).tolist() for key, value in arrays.items()}
                for split, arrays in summary.items()}

    (out / "result.json").write_text(json.dumps({
        "kind": "evaluate", "models": [m.label for m in spec.evaluation.models],
        "sites": {site: {"shard_hash": returned[site]["shard_hash"],
                         "summaries": [plain(s) for s in returned[site]["summaries"]]} for site in spec.sites}}))
    return str(out)


# --- at the centre ---------------------------------------------------------------------------------------
def read_scores(result_root: Path, sites: list[str]) -> tuple[list[list[Summary]], dict[str, str]]:
    """Per site (in ``sites``' order) its summaries, one per model, and every site's shard hash."""
    meta = json.loads((result_folder(result_root) / "result.json").read_text())
    if sorted(meta["sites"]) != sorted(sites):
        raise DataError(f"the evaluation job came back from sites {sorted(meta['sites'])}, the federation lists "
                        f"{sorted(sites)}", fix="start every hospital of the federation, and only those")
    per_site = [[{split: (np.asarray(arrays["report"], dtype=np.float64), np.asarray(arrays["histograms"], dtype=np.float64))
                  for split, arrays in summary.items()} for summary in meta["sites"][site]["summaries"]]
                for site in sites]
    return per_site, {site: meta["sites"][site]["shard_hash"] for site in sites}


def evaluate_flare(models: list[ModelToScore], states: list[dict[str, torch.Tensor]], federation: Federation,
                   shards_root: Path | None, env: str, workspace: Path, kit: str | Path | None, bins: int, min_count: int,
                   name: str = "fedauc-evaluate") -> tuple[list[list[Summary]], dict[str, str]]:
    """Score ``models`` (weights ``states``) at every site of ``federation`` as an NVIDIA FLARE job in ``env``
    (``sim`` / ``poc``: the sites on this machine read ``shards_root``; ``prod``: the running consortium the
    admin kit ``kit`` reaches, each hospital its own shards, nothing read here). Returns :func:`read_scores`'s
    per-site summaries and shard hashes."""
    admin = check_flare_env(env, kit)
    names = [site.name for site in federation.sites]
    request = EvaluationRequest(models=models, bins=bins, min_count=min_count)

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
