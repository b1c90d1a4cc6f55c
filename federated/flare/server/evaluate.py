"""An evaluation job at the server (``server.job.run`` calls it for a job of kind ``"evaluate"``): hand the job
and the models' weights to every site, wait for all of them, and say what goes into the job's result.

The weights come as a file of tensors in the job's ``config/`` folder (``protocol.WEIGHTS_FILE``; never
code) and go to the sites in the call (``site.job.evaluate``): a site never reads a model from its disk. No
collective: a site does not wait for the others.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from nvflare.collab import collab

from federated.flare.protocol import FAILED, FAILURE_MARK, WEIGHTS_FILE
from federated.flare.spec import FlareJob


def serve_evaluation(spec: FlareJob) -> dict:
    """Every site's shard hash, privacy spend and summaries (plain JSON), once all of them answered; a site that failed
    fails the job naming it (its one line, paths already replaced at the site: federated/flare/site/failure.py)."""
    config_dir = Path(collab.workspace.get_app_config_dir(collab.fl_ctx.get_job_id()))
    weights = torch.load(config_dir / WEIGHTS_FILE, map_location="cpu", weights_only=True)
    results = collab.clients(timeout=spec.job_timeout_s, blocking=False).evaluate(spec.model_dump(), weights)
    returned = dict(results)
    if results.failures:
        raise RuntimeError(FAILURE_MARK + "; ".join(
            f"site {site!r}: {getattr(err, 'cause', err)}" for site, err in sorted(results.failures.items())))
    failed = {site: result[FAILED] for site, result in returned.items() if FAILED in result}
    if failed:
        raise RuntimeError(FAILURE_MARK + "; ".join(f"site {site!r} failed: {line}" for site, line in sorted(failed.items())))

    def plain(summary: dict) -> dict:
        return {split: {key: np.asarray(value).tolist() for key, value in arrays.items()}
                for split, arrays in summary.items()}

    return {"kind": "evaluate", "models": [m.label for m in spec.evaluation.models],
            "sites": {site: {"shard_hash": returned[site]["shard_hash"], "privacy": returned[site]["privacy"],
                             "summaries": [plain(s) for s in returned[site]["summaries"]]} for site in spec.sites}}
