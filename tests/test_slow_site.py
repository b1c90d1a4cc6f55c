"""The slow hospital named (federated/timing.py): each site's compute and wait seconds (and their CPU seconds) of
every round reach the centre with the round's record, MLflow holds them per site (the site's child run), and the
live progress line and ``fedauc consortium status`` name the round's slowest site and how long it held the round
up.

Over NVIDIA FLARE's simulator, one hospital is slowed for real: its site process (and its children) is
stopped and continued by the test, nine tenths of the time stopped, as a machine that gives the job a tenth
of a CPU would run it; nothing in the product knows.
"""

from __future__ import annotations

import contextlib
import signal
import threading
import time

import psutil
import pytest
from mlflow import MlflowClient

import federated
from federated import SyntheticSite, TrainConfig
from federated.flare.centre.feed import local_reader
from federated.flare.centre.job import train_flare
from federated.flare.centre.operate import ConsortiumStatus, job_status
from federated.sites import federation_config
from pipelines import tracking
from pipelines.runs import RoundLogger, training_runs
from preprocessing.federation import load_federation

SLOW = "vienna"


def test_every_round_record_times_every_site_and_names_the_slowest():
    sites = [SyntheticSite(n_train=32, shape=(6,), task_seed=1, shift=0.2 * k) for k in range(4)]
    cfg = TrainConfig(algorithm="fedavg", sites=sites, network="mlp", rounds=3, local_steps=4, batch_size=8,
                      progress=False, loader_workers=0)
    names = [f"synthetic{k}" for k in range(4)]
    for record in federated.train(cfg).history:
        compute, wait = record["site_compute_s"], record["site_wait_s"]
        assert len(compute) == len(wait) == 4 and min(compute) > 0 and min(wait) > 0
        # In one process the sites run one after another: the first site waits for the three others' steps.
        assert wait[0] >= sum(compute[1:])
        slowest = max(range(4), key=lambda k: compute[k])
        assert record["slowest"]["site"] == names[slowest]
        assert record["slowest"]["held_up_s"] == pytest.approx(compute[slowest] - sorted(compute)[-2])
        # CPU seconds: each site's local steps on this one thread, inside the round's process time up to the gather.
        compute_cpu, process_cpu = record["site_compute_cpu_s"], record["site_process_cpu_s"]
        assert len(compute_cpu) == len(process_cpu) == 4 and min(compute_cpu) > 0
        assert min(process_cpu) >= sum(compute_cpu)


def _site_processes(site: str) -> list[psutil.Process]:
    """This test's simulator worker process of ``site`` (``--client <site>``) and everything it started: among
    this process's descendants only, since another test's simulator on the machine has a site of that name too
    (one slowed there left this training's rounds unslowed)."""
    for proc in psutil.Process().children(recursive=True):
        try:
            cmd = proc.cmdline()
            if "--client" in cmd and cmd[cmd.index("--client") + 1:][:1] == [site]:
                return [proc, *proc.children(recursive=True)]
        except psutil.NoSuchProcess:
            continue
    return []


def _signal(procs: list[psutil.Process], sig: int) -> None:
    for proc in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.send_signal(sig)


def _throttle(site: str, started, done: threading.Event, throttled: list, stopped_s: float = 0.45,
              running_s: float = 0.05) -> None:
    """From when ``started()`` (the server runs the job: every site has joined it), keep ``site`` stopped
    ``stopped_s`` of every ``stopped_s + running_s`` seconds until ``done``; ``throttled`` gets the pids.
    The site's processes are looked up while waiting: a scan of every process on a loaded machine can outlast
    a round, which then ran unslowed."""
    procs: list[psutil.Process] = []
    while not started() and not done.wait(0.05):
        procs = procs or _site_processes(site)
    while not done.is_set():
        throttled.extend(p.pid for p in procs if p.pid not in throttled)
        _signal(procs, signal.SIGSTOP)
        time.sleep(stopped_s if procs else 0.05)
        _signal(procs, signal.SIGCONT)
        time.sleep(running_s)
        procs = _site_processes(site)


@pytest.mark.slow
def test_a_slowed_hospital_is_named_live_in_mlflow_and_in_consortium_status(melanoma_shards, tmp_path, monkeypatch,
                                                                         capsys):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    root, federation_yaml = melanoma_shards
    federation = load_federation(federation_yaml)
    rounds = 5
    config = federation_config(federation, root / "shards", dict(
        algorithm="fedavg", network="small_resnet", network_kwargs={"widths": [8, 16, 32]}, rounds=rounds,
        local_steps=32, batch_size=32, lr=0.1, progress=True, loader_workers=0, timeout_s=120, device="cpu"))
    names = [site.name for site in federation.sites]
    tracking.configure(tmp_path / "mlflow")
    done = threading.Event()
    # From when the server's live file exists: slowed while joining, the site would miss NVIDIA FLARE's start.
    throttled: list[int] = []
    throttle = threading.Thread(target=_throttle, args=(SLOW, local_reader(tmp_path / "sim").read, done, throttled),
                                daemon=True)
    throttle.start()
    try:
        with training_runs(tracking.experiment_id("melanoma"), "slow", federation.name, names) as (parent, child_ids):
            logger = RoundLogger(MlflowClient(), parent.info.run_id, child_ids)
            result = train_flare(config, federation, root / "shards", "sim", tmp_path / "sim", callbacks=[logger])
    finally:
        done.set()
        throttle.join()
    assert throttled, "the test did not find the slowed site's process"
    slow = names.index(SLOW)
    # Rounds 0 and 1 may start before the first stop (the live file appears as round 0 runs); from round 2 on
    # the site is slowed throughout.
    for record in result.history[2:]:
        assert record["slowest"]["site"] == SLOW, record["site_compute_s"]
        compute = record["site_compute_s"]
        assert record["slowest"]["held_up_s"] > 2 * max(c for k, c in enumerate(compute) if k != slow)
        # The others waited for it at the round's collectives; it did not wait for them.
        assert min(w for k, w in enumerate(record["site_wait_s"]) if k != slow) > record["site_wait_s"][slow]
    # The live progress line at the centre names it.
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith(f"round {rounds}/{rounds}")]
    assert len(lines) == 1 and f"slowest site '{SLOW}'" in lines[0] and "held the round up" in lines[0]
    # MLflow: every site's child run holds its compute and wait seconds per round; the slow one's are longest.
    client = MlflowClient()
    computes = {name: [m.value for m in client.get_metric_history(run_id, "compute_seconds")]
                for name, run_id in zip(names, child_ids)}
    assert all(len(v) == rounds for v in computes.values())
    assert all(len(client.get_metric_history(run_id, "wait_seconds")) == rounds for run_id in child_ids)
    assert computes[SLOW][-1] == max(v[-1] for v in computes.values())
    # `fedauc consortium status` reads a running job's live file from the server (through the admin kit);
    # the simulator's server wrote the same file here.
    text = local_reader(tmp_path / "sim").read()
    status = ConsortiumStatus("now", [], [job_status("job-1", "slow", text)])
    assert status.jobs[0].rounds_done == rounds
    row = next(line for line in status.markdown().splitlines() if line.startswith("| job-1 "))
    assert f"slowest site '{SLOW}'" in row and "held the round up" in row
