"""The server's half of the NVFlare job: start every site's engine, serve their collectives, keep the result.

``run`` (``@collab.main``) calls every site's ``train`` once; while the sites train, their transports call
``collective`` here, which returns only when all K sites have contributed (``Rendezvous``). The server
holds no model of its own and sees what the sites' engines declared for communication. Site 0's final
model, history, summed test histograms and out-of-distribution model (pooled sums), and every site's report on its data (hash, QC summary, model
input) are written to the job's run folder (``RESULT_DIR``), which comes back with the job result; a
failed site fails the job with a message naming it. A job of kind ``"evaluate"`` runs
``federated.flare.server.evaluate.serve_evaluation`` instead (every site's ``evaluate``, no collective)
and writes what it returns.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path

import torch
from nvflare.collab import collab

from federated.flare.protocol import (
    FAILED,
    FAILURE_MARK,
    GRID_SUFFIX,
    JOB_PROP,
    OOD_STATE_FILE,
    RESULT_DIR,
    RESULT_FILE,
    STATE_FILE,
)
from federated.flare.server.evaluate import serve_evaluation
from federated.flare.server.live import LiveRecords, left_reason
from federated.flare.server.rendezvous import COMBINE, Rendezvous
from federated.flare.spec import FlareJob

_rendezvous: Rendezvous | None = None
_live: LiveRecords | None = None


@collab.publish
def collective(seq: int, what: str, site: int, payload):
    return _rendezvous.contribute(seq, what, site, payload, COMBINE[what])


@collab.publish
def site_failed(site: str, message: str) -> None:
    _rendezvous.fail(f"site {site!r} failed: {message}", site)


@collab.publish
def record(record: dict) -> None:
    _live.record(record)


@collab.publish
def heartbeat(site: str, version: str, done: bool) -> None:
    _live.heartbeat(site, version, done)


@collab.publish
def budget(site: str, spent: float, remaining: float | None, change: str | None = None) -> None:
    _live.budget(site, spent, remaining, change)


def _failed(reason: str, site: str | None = None) -> RuntimeError:
    _live.failure(reason, site)
    return RuntimeError(FAILURE_MARK + reason)


def result_dir() -> Path:
    """This job's run folder's ``RESULT_DIR`` (created), which comes back with the job's result."""
    out = Path(collab.workspace.get_run_dir(collab.fl_ctx.get_job_id())) / RESULT_DIR
    out.mkdir(parents=True, exist_ok=True)
    return out


@collab.main
def run() -> str:
    global _rendezvous, _live
    spec = FlareJob.model_validate(collab.get_app_prop(JOB_PROP))
    _rendezvous = Rendezvous(spec.sites, float(spec.settings.get("timeout_s", 300.0)))
    connected = sorted(c.name for c in collab.clients)
    if connected != sorted(spec.sites):
        raise RuntimeError(f"the job runs at sites {connected}, the federation lists {sorted(spec.sites)}")
    if spec.kind == "evaluate":
        scores = serve_evaluation(spec)
        out = result_dir()
        (out / RESULT_FILE).write_text(json.dumps(scores))
        return str(out)
    job_id = collab.fl_ctx.get_job_id()
    _live = LiveRecords(Path(collab.workspace.get_run_dir(job_id)), Path(collab.workspace.get_root_dir()), spec.sites,
                        job_id)
    _live.watch(lambda site, reason: _rendezvous.fail(reason, site))
    results = collab.clients(timeout=spec.job_timeout_s, blocking=False).train(spec.model_dump())
    returned: dict[str, dict] = {}
    finished = threading.Event()

    def collect():  # every site's outcome; a site that died never has one
        for site, result in results:
            returned[site] = result
        finished.set()

    threading.Thread(target=collect, daemon=True, name="fedauc-results").start()
    # A failed collective names the site that failed or never came; the job ends then, not when NVFlare
    # gives up on a dead site's train call (the job's timeout).
    while not finished.wait(0.5) and _rendezvous.failure is None:
        pass
    _live.stop()
    # A site that left mid-job (its client logged out first: federated.flare.site.leave) fails the others' collectives
    # as its job process ends; its departure, not their failures, is why the job stops.
    left = _live.departed([site for site in spec.sites if site not in returned or FAILED in returned[site]])
    if left is not None:
        raise _failed(left_reason(left), left)
    if _rendezvous.failure is not None:
        raise _failed(_rendezvous.failure, _rendezvous.failed_site)
    if results.failures:
        _rendezvous.fail("another site failed")
        raise _failed("; ".join(f"site {site!r}: {getattr(err, 'cause', err)}" for site, err in
                                sorted(results.failures.items())), next(iter(results.failures)) if
                      len(results.failures) == 1 else None)
    # A failed site returns its one line (federated/flare/site/failure.py); its site_failed call normally came first.
    failed = {site: result[FAILED] for site, result in returned.items() if FAILED in result}
    if failed:
        raise _failed("; ".join(f"site {site!r} failed: {line}" for site, line in sorted(failed.items())),
                      next(iter(failed)) if len(failed) == 1 else None)
    leader = returned[spec.sites[0]]
    out = result_dir()
    torch.save(leader["global_state"], out / STATE_FILE)
    if leader.get("ood") is not None:  # pooled sums only, as site 0 decoded them (federated/ood.py)
        torch.save(leader["ood"], out / OOD_STATE_FILE)
    reports = [returned[site]["report"] for site in spec.sites]
    for report in reports:  # the PNG bytes of a site that shares its sample grid, beside the JSON
        grid = report.pop("qc_grid")
        if grid is not None:
            (out / f"{report['site']}.{GRID_SUFFIX}").write_bytes(grid)
    (out / RESULT_FILE).write_text(json.dumps(
        {**{k: leader[k] for k in ("history", "input_shape", "num_classes", "test_histograms", "valid_histograms")}, "sites": reports}))
    return str(out)
