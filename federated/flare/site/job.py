"""The hospital's half of the NVFlare job: ``train`` runs the fedauc engine for this site; ``evaluate`` scores
the models an evaluation job sends (federated/flare/site/evaluate.py). Both start with ``prelude``.

The engine is the one every transport runs (federated/engine.py); its collectives go to the server through
:class:`FlareTransport`. Everything the site holds (its data, its LOCAL tensors, its loader and RNG state)
lives in this call's engine; only the tensors a collective carries, every site's report on its data
(``federated.sites.site_report``: shard hash, QC summary as its sharing policy allows, model input) and,
from site 0, the final global model, the round history (bytes, losses, metrics: what the in-process run
reports), the test histograms summed over sites (the pooled ROC) and the out-of-distribution refusal's model
(fitted from sums over sites, federated/ood.py) are returned.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from nvflare.collab import collab

from federated import ood
from federated.engine import Engine
from federated.flare.protocol import HEARTBEAT_S, INPUTS_SEQ, Collective
from federated.flare.site.backend import FlareTransport
from federated.flare.site.evaluate import score_here
from federated.flare.site.failure import report_failure
from federated.flare.site.heartbeat import Heartbeat
from federated.flare.site.keys import SiteKeys, load_identity
from federated.flare.site.resume import agree_on_round, site_checkpoint_dir
from federated.flare.site.version import check_code_version
from federated.flare.spec import FlareJob, local_site
from federated.network import training_device
from federated.sites import check_model_inputs, site_report
from preprocessing.sharing import SharingPolicy

# Seconds a site's collective call may take beyond the server's own timeout (it answers within that).
_CALL_MARGIN_S = 30.0


@dataclass
class SiteJob:
    spec: FlareJob
    name: str  # this site's
    index: int  # its place in the federation
    shard_dir: Path
    sharing: SharingPolicy  # what of its QC may leave it


def prelude(job: dict) -> SiteJob:
    """What every site-published function does first: refuse a job from another fedauc code version (before
    reading the job: another version's job may not even parse here), then find this site in the federation,
    its own shards and sharing policy, and set torch's threads."""
    name = collab.site_name
    config_dir = Path(collab.workspace.get_site_config_dir())
    check_code_version(name, str(job.get("code_version")), local_site(config_dir).get("allowed_code_versions", []))
    spec = FlareJob.model_validate(job)
    if spec.threads is not None:
        torch.set_num_threads(spec.threads)
    index = spec.site_index(name)
    shard_dir, sharing = spec.own_shards(name, config_dir)
    return SiteJob(spec, name, index, shard_dir, sharing)


@collab.publish
def train(job: dict) -> dict:
    # From the first moment, whatever the training does: the centre tells a dead site from a slow one.
    with Heartbeat(collab.server(timeout=2 * HEARTBEAT_S).heartbeat, collab.site_name):
        return _train(job)


def _train(job: dict) -> dict:
    name = collab.site_name
    try:
        run = prelude(job)
        spec, site, shard_dir, sharing = run.spec, run.index, run.shard_dir, run.sharing
        config = spec.train_config(name, shard_dir)
        server = collab.server(timeout=config.timeout_s + _CALL_MARGIN_S)
        ckpt_dir = site_checkpoint_dir(spec, name, Path(collab.workspace.get_root_dir()))
        config = config.model_copy(update={"checkpoint_dir": ckpt_dir})
        if ckpt_dir is not None and config.resume:
            agree_on_round(server.collective, site, spec.sites, ckpt_dir)
        keys = SiteKeys(load_identity(collab.workspace.get_startup_kit_dir()), collab.fl_ctx.get_job_id(), spec.sites)
        transport = FlareTransport(len(spec.sites), site, server.collective, training_device(config), keys)
        engine = Engine(config, transport=transport, own_checkpoints=True)
        for admitted in engine.privacy or ():  # what the site's own ledger says, for `fedauc consortium status`
            collab.server(timeout=_CALL_MARGIN_S, optional=True).budget(
                name, admitted.epsilon["epsilon_spent"], admitted.epsilon["epsilon_remaining"],
                admitted.epsilon.get("budget_change"))
        # Before the first step: a site whose images give another model input than site 0's stops the job
        # now, naming itself, not after the training (the centre checks the reports again).
        inputs = {"site": name, "input_shape": list(engine.input_shape), "num_classes": engine.fed.num_classes}
        check_model_inputs([server.collective(INPUTS_SEQ, Collective.INPUTS, site, inputs)[0], inputs])
        # Site 0's round records, as each round ends, to the centre (federated/flare/server/live.py).
        result = engine.run(callbacks=[collab.server(timeout=_CALL_MARGIN_S, optional=True).record])
        report = site_report(name, shard_dir, sharing, engine.input_shape, engine.fed.num_classes,
                             private=config.dp is not None)
        report["privacy"] = result.privacy.get(name)  # what the job spent of its budget (aggregate numbers)
    except Exception as err:
        # The server hears at once (the other sites stop waiting), in one line that names no path.
        return report_failure(name, err)
    if site != 0:
        return {"report": report}
    def listed(histograms):
        return None if histograms is None else histograms.tolist()

    return {"report": report, "global_state": result.global_state, "history": result.history,
            "input_shape": list(result.input_shape), "num_classes": result.num_classes,
            "test_histograms": listed(result.test_histograms), "valid_histograms": listed(result.valid_histograms),
            "ood": ood.to_saved(result.ood)}


@collab.publish
def evaluate(job: dict, weights: list) -> dict:
    """Score the models of the job (their weights: ``weights``, sent in this call) on this site's own valid and
    test splits, as its privacy budget allows (federated/flare/site/evaluate.py)."""
    try:
        run = prelude(job)
        return score_here(run.spec, run.name, run.shard_dir, weights)
    except Exception as err:
        # As in training: NVFlare would send the centre the traceback, with this site's paths in it.
        return report_failure(collab.site_name, err)
