"""A hospital's processes live and die together, and a stopped hospital leaves the consortium, on a real one on
this machine (federated/flare/centre/poc.py: kits from our provisioning, a server and three hospital clients as their
own processes, mutual TLS). The session's consortium (``melanoma_consortium``, tests/conftest.py), the tests in order:

(a) ``kill -9`` of ``fedauc consortium start-site``'s process group (an OOM kill, a crashed supervisor) while
a training runs ends its NVFlare client and the job's process within seconds, the server stops listing
the hospital (its client logged out on its parent-death signal), and the centre's training fails naming the
hospital that left;
(b) a second ``start-site`` of a running kit refuses in one line naming the first's pid; SIGTERM to
``start-site`` (``systemctl stop``) while a training runs makes the hospital leave at once, and the centre's
``fedauc train`` fails within seconds naming the site that left and what to do, on its MLflow runs too;
(c) ``fedauc consortium stop-server`` is refused while a hospital heartbeats, naming it, and succeeds within
60 s of the last hospital stopping, one of them killed without a word (SIGKILL of its client), in a few lines
of its own.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from mlflow import MlflowClient
from typer.testing import CliRunner

from common.lifetime import family, signal_all
from federated.flare.centre.operate import consortium_status
from federated.flare.centre.poc import connected_sites
from federated.schema import DESCRIPTION_TAG, FAILED_SITE_TAG, FAILURE_TAG
from pipelines.cli import app

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def consortium(poc_slot, melanoma_consortium, shared_prefect):
    return melanoma_consortium


def _of_site(kit: Path) -> list[psutil.Process]:
    """Every process here that belongs to the hospital whose kit is ``kit`` (its path on the command line, or
    working in it), zombies aside."""
    found = []
    for process in psutil.process_iter(["cmdline", "cwd", "status"]):
        if process.info["status"] == psutil.STATUS_ZOMBIE:
            continue
        if str(kit) in " ".join(process.info["cmdline"] or []) or (process.info["cwd"] or "").startswith(str(kit)):
            found.append(process)
    return found


def _until(what: str, check, timeout_s: float):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}")


def _start_site(consortium, melanoma_shards, name: str) -> subprocess.Popen:
    """``fedauc consortium start-site`` for hospital ``name``, in a process group of its own, as a service
    manager starts it; returns once the server lists the hospital."""
    root, _ = melanoma_shards
    kit = consortium.kits.sites[name]
    launched = time.time()
    consortium.launch(name, [sys.executable, "-m", "pipelines.cli", "consortium", "start-site", str(kit),
                             "--site-yaml", str(root / f"{name}.yaml"), "--shards", str(root / "shards")], kit)
    _until(f"{name} to connect", lambda: _registered_since(consortium.kits.admin, name) > launched, 180)
    return consortium.processes[name]


def _registered_since(admin: Path, name: str) -> float:
    """When the server last heard from client ``name`` (0 when it does not list it): a client killed without
    a word stays listed, so a restarted one is told by a later time."""
    from federated.flare.centre.operate import admin_session

    session = admin_session(admin)
    try:
        return max((c.last_connect_time for c in session.get_system_info().client_info if c.name == name), default=0.0)
    finally:
        session.close()


def test_sigkill_of_start_sites_process_group_ends_its_client_and_job(consortium, melanoma_shards, tmp_path,
                                                                      monkeypatch, trainings, new_mlflow_store):
    _, federation = melanoma_shards
    kit = consortium.kits.sites["new-york"]
    consortium.kill("new-york")
    _until("the killed new-york's processes to end", lambda: not _of_site(kit), 30)
    started = _start_site(consortium, melanoma_shards, "new-york")

    monkeypatch.setenv("MLFLOW_TRACKING_URI", new_mlflow_store(tmp_path / "mlruns.db"))
    empty = tmp_path / "no-shards-here"
    empty.mkdir()
    args = ["train", "--federation", str(federation), "--shards", str(empty), "--algorithm", "codasca", "-p", "T0=4",
            "--rounds", "400", "--local-steps", "4", "--batch-size", "16", "--eval-every", "50", "--run-name",
            "doomed", "--checkpoint-dir", str(tmp_path / "checkpoints"), "--backend", "flare", "--flare-env", "prod",
            "--kit", str(consortium.kits.admin), "--flare-workspace", str(tmp_path / "flare")]
    thread, outcome = trainings(args)

    def job_process():
        return [p for p in _of_site(kit) if "worker_process" in " ".join(p.cmdline())]

    # Killed once it trains: a site gone before the job's sync leaves the job to NVIDIA FLARE's sync timeout
    # (60 s) instead of the departure the server names at once.
    status = _until("a round of the training", lambda: next(
        (s for s in [consortium_status(consortium.kits.admin)] if any(job.rounds_done for job in s.jobs)), None), 300)
    assert job_process() and len(_of_site(kit)) >= 3  # start-site, NVFlare's client, the job's process
    # `consortium status` meanwhile: the server's start as a time, the running job by its run name.
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d", status.server_started), status.server_started
    assert [job.name for job in status.jobs] == ["doomed"]

    os.killpg(started.pid, signal.SIGKILL)
    started.wait()
    killed_at = time.monotonic()
    consortium.processes.pop("new-york")
    try:
        _until("no process of new-york", lambda: not _of_site(kit), 20)
    except AssertionError:
        raise AssertionError(f"left running: {[' '.join(p.cmdline())[:160] for p in _of_site(kit)]}") from None
    _until("the server to stop listing new-york", lambda: "new-york" not in connected_sites(consortium.kits.admin), 20)
    assert time.monotonic() - killed_at < 30

    thread.join(300)
    assert outcome["exit_code"] == 1, outcome["output"]
    assert "site 'new-york' left the consortium" in outcome["output"], outcome["output"]
    assert outcome["ended"] - killed_at < 30


def test_a_second_start_site_refuses_and_one_stopped_mid_training_leaves_named_at_once(
        consortium, melanoma_shards, tmp_path, monkeypatch, trainings, new_mlflow_store):
    root, federation = melanoma_shards
    kit = consortium.kits.sites["new-york"]
    first = _start_site(consortium, melanoma_shards, "new-york")
    second = CliRunner().invoke(app, ["consortium", "start-site", str(kit), "--site-yaml", str(root / "new-york.yaml"),
                                      "--shards", str(root / "shards")])
    assert second.exit_code == 1, second.output
    assert second.output.strip() == (f"site new-york already runs from {kit} (pid {first.pid}); stop it (`kill "
                                      f"{first.pid}` or `systemctl stop fedauc-site`) before starting it again")
    assert (kit / "local" / "fedauc-site.pid").stat().st_mode & 0o077 == 0

    monkeypatch.setenv("MLFLOW_TRACKING_URI", new_mlflow_store(tmp_path / "mlruns.db"))
    empty = tmp_path / "no-shards-here"
    empty.mkdir()
    thread, outcome = trainings(["train", "--federation", str(federation), "--shards", str(empty), "--algorithm",
                                 "codasca", "-p", "T0=4", "--rounds", "400", "--local-steps", "2", "--batch-size", "8",
                                 "--eval-every", "0", "--run-name", "left", "--backend", "flare", "--flare-env", "prod",
                                 "--kit", str(consortium.kits.admin), "--flare-workspace", str(tmp_path / "flare")])
    _until("a round of the training", lambda: any(job.rounds_done for job in
                                                  consortium_status(consortium.kits.admin).jobs), 300)

    first.send_signal(signal.SIGTERM)
    stopped_at = time.monotonic()
    assert first.wait(60) == 0
    consortium.processes.pop("new-york")
    _until("the server to stop listing new-york", lambda: "new-york" not in connected_sites(consortium.kits.admin), 20)
    assert time.monotonic() - stopped_at < 30
    assert not _of_site(kit) and not (kit / "local" / "fedauc-site.pid").exists()

    thread.join(120)
    output = outcome["output"]
    assert outcome["exit_code"] == 1 and "Traceback" not in output, output
    message = next(line for line in output.splitlines() if line.startswith("error: "))
    assert "failed: site 'new-york' left the consortium (its operator stopped fedauc)" in message, output
    assert "`fedauc consortium start-site`" in message and "`fedauc train --resume`" in message, message
    named_after_s = outcome["ended"] - stopped_at
    assert named_after_s < 30, named_after_s
    mlflow = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlruns.db'}")
    runs = mlflow.search_runs([e.experiment_id for e in mlflow.search_experiments()])
    assert runs and {run.info.status for run in runs} == {"FAILED"}
    for run in runs:
        assert run.data.tags[FAILED_SITE_TAG] == "new-york"
        assert "site 'new-york' left the consortium" in run.data.tags[FAILURE_TAG]
        assert run.data.tags[DESCRIPTION_TAG].startswith("FAILED at site new-york: ")


# Last: it stops the consortium (the next module to take it starts it again).
def test_stop_server_waits_for_no_live_hospital_and_drops_a_silent_one(consortium):
    admin = str(consortium.kits.admin)
    refused = CliRunner().invoke(app, ["consortium", "stop-server", "--kit", admin])
    assert refused.exit_code == 1 and "still has connected hospitals (barcelona, vienna)" in refused.output
    assert "Traceback" not in refused.output and consortium.processes["server"].poll() is None

    # vienna's machine dies (its client gets no chance to log out); barcelona stops cleanly.
    vienna = consortium.processes.pop("vienna")
    signal_all(family(vienna.pid), signal.SIGKILL)
    vienna.wait()
    barcelona = consortium.processes.pop("barcelona")
    signal_all(family(barcelona.pid), signal.SIGTERM)
    barcelona.wait(60)
    last_stopped = time.monotonic()
    assert connected_sites(consortium.kits.admin) == ["vienna"]  # barcelona logged out; vienna is still listed

    stopped = CliRunner().invoke(app, ["consortium", "stop-server", "--kit", admin])
    assert stopped.exit_code == 0, stopped.output
    assert time.monotonic() - last_stopped < 60
    assert stopped.output.splitlines() == [
        "hospital vienna: silent for over 25 s (stopped without logging out), dropped from the server's list",
        "the consortium's server stopped"]
    assert consortium.processes["server"].wait(30) == 0
