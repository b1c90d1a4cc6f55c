"""Operating a running consortium from the centre, on a real one on this machine (federated/flare/centre/poc.py: kits
from our provisioning, a server and three hospital clients as their own processes, mutual TLS), trainings
submitted as the centre submits them (``fedauc train --flare-env prod --kit <admin kit>``, no shards here).
The session's consortium (``melanoma_consortium``, tests/conftest.py), the tests in order:

(a) while a training runs MLflow already holds its first rounds' metrics (parent and child runs, RUNNING);
a hospital killed (SIGKILL, its whole process tree) is named at the centre within 60 s of its death by its
missing heartbeats, not by a collective's timeout (``--site-timeout`` is 300 s here); the FAILED runs keep
every round's metrics logged before and say why (reason and site, as tags and in the description). The
hospital is started again with ``fedauc consortium start-site``, ``fedauc train --resume`` continues every
site from its own checkpoint under its own kit, and the model equals an uninterrupted in-process training
of the same configuration; ``fedauc consortium status`` shows the running job's round and every site's
fedauc version meanwhile.
(b) SIGTERM to ``fedauc consortium start-site`` ends it and every process it started; ``fedauc consortium
stop-server`` (no question asked) is refused while hospitals are connected (NVIDIA FLARE's rule), naming them.
"""

from __future__ import annotations

import signal
import sys
import threading
import time

import pytest
import torch
from mlflow import MlflowClient
from typer.testing import CliRunner

import federated
from common.lifetime import family
from federated.checkpoint import committed_rounds
from federated.flare.centre.operate import consortium_status
from federated.flare.centre.poc import connected_sites
from federated.flare.site.resume import CHECKPOINTS
from federated.privacy.ledger import Ledger, ledger_path
from federated.privacy.policy import SiteBudget
from federated.schema import DESCRIPTION_TAG, FAILED_SITE_TAG, FAILURE_TAG
from federated.sites import federation_config
from pipelines.cli import app
from preprocessing.federation import load_federation

pytestmark = pytest.mark.slow

SITES = ["barcelona", "new-york", "vienna"]
ROUNDS = 16
# Four local steps a round (T0 = 4: one a stage): on an idle machine two steps made a round so short (16 rounds in 38 s) that the job
# ended before the centre's feed (a poll every 2 s through the admin kit) had logged two rounds of a running job.
TRAINING = ["--algorithm", "codasca", "-p", "T0=4", "--rounds", str(ROUNDS), "--local-steps", "4", "--batch-size",
            "16", "--eval-every", "2", "--run-name", "live"]
# What `fedauc train` makes of TRAINING (its defaults: lr 0.1, small_resnet, seed 0).
SETTINGS = dict(algorithm="codasca", params={"T0": 4}, rounds=ROUNDS, local_steps=4, batch_size=16, eval_every=2,
                lr=0.1, network="small_resnet", seed=0, progress=False, loader_workers=0)


@pytest.fixture(scope="module")
def consortium(poc_slot, melanoma_consortium, shared_prefect):
    return melanoma_consortium


def _until(what: str, check, timeout_s: float, thread: threading.Thread | None = None):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        assert thread is None or thread.is_alive(), f"the training ended before {what}"
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}")


def _parent(client: MlflowClient):
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()],
                              "tags.fedauc_role = 'federated-training'", order_by=["attributes.start_time DESC"])
    return runs[0] if runs else None


def _steps(client: MlflowClient, run_id: str, metric: str) -> list[int]:
    return [m.step for m in client.get_metric_history(run_id, metric)]


def test_live_records_a_dead_site_named_and_resume_to_the_uninterrupted_model(consortium, melanoma_shards, tmp_path,
                                                                               monkeypatch, trainings,
                                                                               new_mlflow_store):
    root, federation = melanoma_shards
    monkeypatch.setenv("MLFLOW_TRACKING_URI", new_mlflow_store(tmp_path / "mlruns.db"))
    empty = tmp_path / "no-shards-here"
    empty.mkdir()
    args = ["train", "--federation", str(federation), "--shards", str(empty), *TRAINING, "--checkpoint-dir",
            str(tmp_path / "checkpoints" / "live"), "--backend", "flare", "--flare-env", "prod", "--kit",
            str(consortium.kits.admin), "--flare-workspace", str(tmp_path / "flare")]
    # Named, not from the environment: a test that ran before in this worker may have set mlflow's global URI,
    # which an argument-less client prefers to MLFLOW_TRACKING_URI (the CLI's training writes to this store).
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlruns.db'}")

    thread, outcome = trainings(args)

    def two_rounds_while_running():
        parent = _parent(client)
        if parent is None or parent.info.status != "RUNNING" or len(_steps(client, parent.info.run_id, "train_loss")) < 2:
            return None
        return parent

    running = _until("two rounds in MLflow", two_rounds_while_running, 300, thread)
    children = client.search_runs([running.info.experiment_id], f"tags.mlflow.parentRunId = '{running.info.run_id}'")
    assert {c.info.status for c in children} == {"RUNNING"}
    assert all(_steps(client, c.info.run_id, "bytes_sent") for c in children)

    consortium.kill("new-york")
    killed_at = time.monotonic()
    thread.join(300)
    output = outcome["output"]
    assert outcome["exit_code"] == 1, output
    message = next(line for line in output.splitlines() if line.startswith("error: "))
    assert "site 'new-york' stopped answering" in message and "Traceback" not in output
    assert f"round 2/{ROUNDS}: train loss " in output and "pooled valid AUC" in output
    named_after_s = outcome["ended"] - killed_at
    assert named_after_s < 60, named_after_s

    failed = client.get_run(running.info.run_id)
    logged = _steps(client, failed.info.run_id, "train_loss")
    assert failed.info.status == "FAILED" and len(logged) >= 2
    for run in [failed, *(client.get_run(c.info.run_id) for c in children)]:
        assert run.info.status == "FAILED"
        assert run.data.tags[FAILED_SITE_TAG] == "new-york"
        assert "site 'new-york' stopped answering" in run.data.tags[FAILURE_TAG]
        assert run.data.tags[DESCRIPTION_TAG].startswith("FAILED at site new-york: ")
    # Each hospital checkpointed under its own kit, the centre nowhere.
    assert not (tmp_path / "checkpoints").exists()
    held = {site: committed_rounds(consortium.kits.sites[site] / CHECKPOINTS / "live") for site in SITES}
    assert all(held.values())
    common = min(max(rounds) for rounds in held.values())  # the last round every site completed

    # The hospital comes back as a hospital starts: `fedauc consortium start-site`.
    kit = consortium.kits.sites["new-york"]
    consortium.launch("new-york", [sys.executable, "-m", "pipelines.cli", "consortium", "start-site", str(kit),
                                   "--site-yaml", str(root / "new-york.yaml"), "--shards", str(root / "shards")], kit)
    _until("new-york to reconnect", lambda: connected_sites(consortium.kits.admin) == SITES, 120)

    thread, outcome = trainings([*args, "--resume"])
    status = _until("the running job in `consortium status`",
                    lambda: next((s for s in [consortium_status(consortium.kits.admin)]
                                  if s.jobs and s.jobs[0].rounds_done > 0), None), 300, thread)
    assert [s.name for s in status.sites] == SITES and all(s.fedauc for s in status.sites)
    assert status.jobs[0].sites == ["vienna", "barcelona", "new-york"]
    thread.join(300)
    assert outcome["exit_code"] == 0, outcome["output"]
    resumed = _parent(client)
    assert resumed.info.status == "FINISHED"
    steps = _steps(client, resumed.info.run_id, "train_loss")
    assert steps == list(range(common + 2, ROUNDS + 1))  # the rounds it ran (MLflow steps are 1-based rounds)

    uninterrupted = tmp_path / "uninterrupted"
    federated.train(federation_config(load_federation(federation), root / "shards",
                                      {**SETTINGS, "checkpoint_dir": str(uninterrupted)}))
    last = f"round_{ROUNDS - 1:06d}"
    for index, site in enumerate(["vienna", "barcelona", "new-york"]):
        got = torch.load(consortium.kits.sites[site] / CHECKPOINTS / "live" / last / f"site_{index}.pt",
                         weights_only=True)["model"]
        want = torch.load(uninterrupted / last / f"site_{index}.pt", weights_only=True)["model"]
        worst = max((got[k].float() - v.float()).abs().max().item() for k, v in want.items())
        assert worst <= 1e-5, (site, worst)


def test_over_poc_a_site_refuses_a_dp_job_over_its_budget_and_status_shows_each_sites_epsilon(
        consortium, melanoma_shards, tmp_path, monkeypatch, trainings, new_mlflow_store):
    """Each hospital's fedauc reads its own ledger (its state directory), on its own machine: one over its budget
    refuses the job before any step, in one line the centre hears; after a DP training `fedauc consortium
    status` shows what each site's ledger has spent and has left."""
    root, federation = melanoma_shards
    ledgers = {site: ledger_path(root / "shards" / site) for site in SITES}
    budget = {"barcelona": 40.0, "new-york": 30.0, "vienna": 50.0}
    monkeypatch.setenv("MLFLOW_TRACKING_URI", new_mlflow_store(tmp_path / "mlruns.db"))
    empty = tmp_path / "no-shards-here"
    empty.mkdir()
    args = ["train", "--federation", str(federation), "--shards", str(empty), "--algorithm", "codasca", "-p", "T0=4",
            "--network", "small_resnet_gn", "--rounds", "2", "--local-steps", "2", "--batch-size", "16",
            "--eval-every", "0", "--dp", "--noise-multiplier", "1.0", "--backend", "flare", "--flare-env", "prod",
            "--kit", str(consortium.kits.admin), "--flare-workspace", str(tmp_path / "flare")]
    try:
        for site, path in ledgers.items():
            Ledger(path, SiteBudget(epsilon=0.05 if site == "barcelona" else budget[site], delta=1e-5)).save()
        thread, refused = trainings([*args, "--run-name", "dp-refused"])
        thread.join(300)
        assert refused["exit_code"] == 1, refused["output"]
        message = next(line for line in refused["output"].splitlines() if line.startswith("error: "))
        assert "site 'barcelona' refuses the job: it would spend epsilon " in message, message
        assert "over the site's budget of 0.05 (remaining 0.05)" in message and "Traceback" not in refused["output"]
        assert Ledger.load(ledgers["barcelona"]).entries == []

        for site, path in ledgers.items():
            Ledger(path, SiteBudget(epsilon=budget[site], delta=1e-5)).save()
        thread, trained = trainings([*args, "--run-name", "dp-trained"])
        thread.join(300)
        assert trained["exit_code"] == 0, trained["output"]
        status = consortium_status(consortium.kits.admin)
        for site in status.sites:
            spent = Ledger.load(ledgers[site.name]).spent(1e-5)
            assert site.epsilon_spent == pytest.approx(spent) and spent > 0, site
            assert site.epsilon_remaining == pytest.approx(budget[site.name] - spent), site
        rows = [line for line in status.markdown().splitlines() if line.startswith("| barcelona ")]
        assert len(rows) == 1 and rows[0].endswith(f" | {status.sites[0].epsilon_spent:.3g} spent, "
                                                   f"{status.sites[0].epsilon_remaining:.3g} left |"), rows
    finally:  # the shards are the session's other tests' too, which train without DP
        for path in ledgers.values():
            path.unlink(missing_ok=True)


# Last: it stops a hospital (the next module to take the consortium starts it again).
def test_start_site_stops_with_its_processes_and_stop_server_names_the_connected_sites(consortium):
    started_as_hospital = consortium.processes["new-york"]  # `fedauc consortium start-site`, from the test above
    members = family(started_as_hospital.pid)
    assert len(members) >= 2  # fedauc, NVFlare's start script and client
    started_as_hospital.send_signal(signal.SIGTERM)
    assert started_as_hospital.wait(60) == 0
    time.sleep(1)
    assert [m.pid for m in members if m.is_running() and m.status() != "zombie"] == []

    refused = CliRunner().invoke(app, ["consortium", "stop-server", "--kit", str(consortium.kits.admin)])
    assert refused.exit_code == 1 and "still has connected hospitals (barcelona, " in refused.output
    assert "Traceback" not in refused.output and consortium.processes["server"].poll() is None
