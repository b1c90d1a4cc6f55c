"""The torch.distributed backend (gloo, one process per site on localhost, started with torchrun)
against the in-process one, across a checkpoint/resume, and a site that dies mid-training."""

from __future__ import annotations

import ast
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import federated
from federated import SyntheticSite, TrainConfig


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _config(**kw) -> TrainConfig:
    sites = [SyntheticSite(n_train=96, n_valid=24, n_test=32, shape=(6,), num_classes=2, pos_rate=0.25,
                           shift=0.5 * k, task_seed=5) for k in range(2)]
    base = dict(algorithm="codasca", params={"T0": 4, "eta_g": 1.5}, sites=sites, network="mlp",
                network_kwargs={"hidden": 16}, rounds=4, local_steps=2, batch_size=16, lr=0.1, progress=False,
                loader_workers=0, timeout_s=20, guarantee_positives=True)
    base.update(kw)
    return TrainConfig(**base)


def _env():
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env.pop("CUDA_VISIBLE_DEVICES", None)
    return env


def _torchrun(tmp_path, cfg: TrainConfig) -> dict:
    (tmp_path / "cfg.json").write_text(cfg.model_dump_json())
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
           "--master-port", str(_free_port()), "-m", "federated.distributed", str(tmp_path / "cfg.json"),
           "--out", str(tmp_path / "result.pt")]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=_env())
    # The site processes' own lines first (the cause), then torchrun's summary.
    assert proc.returncode == 0, "\n".join([*(line for line in proc.stderr.splitlines() if "fedauc" in line),
                                           proc.stderr[:2000], proc.stderr[-2000:]])
    return torch.load(tmp_path / "result.pt", weights_only=False)


def test_two_processes_resumed_midway_give_the_in_process_model(tmp_path):
    ckpt = tmp_path / "ckpt"
    # Without the out-of-distribution fit, which the first run's last round (1) would add to its bytes alone.
    first = _torchrun(tmp_path, _config(rounds=2, checkpoint_dir=ckpt, ood_false_refusal=0))
    assert sorted(p.name for p in (ckpt / "round_000001").iterdir()) == [
        "meta.json", "site_0.json", "site_0.pt", "site_1.json", "site_1.pt"]
    dist_result = _torchrun(tmp_path, _config(checkpoint_dir=ckpt, resume=True))
    # Rounds 0-1 come from the checkpoint (their wall-clock timings are the first run's), not a rerun.
    assert [h["seconds"] for h in dist_result["history"][:2]] == [h["seconds"] for h in first["history"]]
    local = federated.train(_config())
    for key, value in local.global_state.items():
        assert torch.allclose(value.float(), dist_result["global_state"][key].float(), atol=1e-5), key
    assert len(dist_result["history"]) == len(local.history) == 4
    for mine, theirs in zip(local.history, dist_result["history"]):
        # The first torchrun's last round (1) evaluated: its bytes include the evaluation's exchange, two
        # splits of a report (C = 2 diseases x (3 + 6) float64) and histograms (C x 2 x 1000 bins float64).
        # With K = 2 a site receives as much as it sends.
        evaluation = (int("metrics" in theirs) - int("metrics" in mine)) * 2 * 8 * 2 * (3 + 6 + 2 * 1000)
        assert mine["bytes_sent"] == [b - evaluation for b in theirs["bytes_sent"]]
        assert mine["bytes_received"] == [b - evaluation for b in theirs["bytes_received"]]
        assert mine["train_loss"] == pytest.approx(theirs["train_loss"], abs=1e-5)
    got, want = dist_result["history"][-1]["metrics"], local.history[-1]["metrics"]
    assert got.keys() == want.keys() and "test/pooled/auc_macro" in got
    assert got["test/pooled/auc_macro"] == pytest.approx(want["test/pooled/auc_macro"], abs=1e-4)


def test_a_site_that_dies_fails_the_job_with_a_clear_message(tmp_path):
    cfg = _config(rounds=100_000, checkpoint_dir=tmp_path / "ckpt", timeout_s=15, params={})
    (tmp_path / "cfg.json").write_text(cfg.model_dump_json())
    port = str(_free_port())
    procs = []
    for rank in (0, 1):
        env = dict(_env(), RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=port)
        procs.append(subprocess.Popen([sys.executable, "-m", "federated.distributed", str(tmp_path / "cfg.json")],
                                      env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    try:
        deadline = time.monotonic() + 60
        while not (tmp_path / "ckpt" / "LATEST").exists():
            assert time.monotonic() < deadline, "training never reached its first checkpoint"
            assert procs[0].poll() is None and procs[1].poll() is None
            time.sleep(0.1)
        procs[1].send_signal(signal.SIGKILL)  # the hospital's machine goes away mid-round
        started = time.monotonic()
        _, err = procs[0].communicate(timeout=90)
        assert procs[0].returncode == 1, err[-2000:]
        assert "site 0:" in err and "another site crashed or did not answer within 15 s" in err
        assert time.monotonic() - started < 60
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.communicate()


def test_secure_aggregation_under_torchrun_gives_the_in_process_model_bit_for_bit(tmp_path):
    """Fixed-point ring sums have no order: both backends decode the same sums, whatever their keys."""
    cfg = _config(secure_aggregation=True, rounds=3)
    dist_result = _torchrun(tmp_path, cfg)
    local = federated.train(cfg)
    for key, value in local.global_state.items():
        assert torch.equal(value, dist_result["global_state"][key]), key
    for mine, theirs in zip(local.history, dist_result["history"], strict=True):
        assert mine["train_loss"] == theirs["train_loss"] and mine["bytes_sent"] == theirs["bytes_sent"]
    got, want = dist_result["history"][-1]["metrics"], local.history[-1]["metrics"]
    assert got == pytest.approx(want, abs=0, nan_ok=True)


def test_a_diverging_round_stops_every_process_naming_the_round(tmp_path):
    """federated/health.py under torchrun: every process sees every site's loss in the round's gather and
    stops with the same one-line message and exit status 1."""
    (tmp_path / "cfg.json").write_text(_config(algorithm="fedavg", params={}, lr=1e9).model_dump_json())
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
           "--master-port", str(_free_port()), "-m", "federated.distributed", str(tmp_path / "cfg.json")]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=_env())
    assert proc.returncode == 1
    assert proc.stderr.count("fedauc distributed: site(s) 'synthetic0', 'synthetic1', round 0: the training loss") == 2
    assert "lower the learning rate (--lr, now 1e+09)" in proc.stderr
    assert "Traceback" not in proc.stderr.split("fedauc distributed:")[0]


def test_dp_under_torchrun_gives_the_in_process_model_and_charges_each_site(tmp_path, monkeypatch):
    """Differential privacy (federated/dp) is the engine's, whatever the transport: with the sites' own noise
    seeds fixed, two processes give the in-process model, and each process charges its own site's ledger."""
    from federated.dp.site import NOISE_SEED_ENV
    from federated.privacy.ledger import Ledger
    from federated.privacy.policy import SiteBudget

    monkeypatch.setenv(NOISE_SEED_ENV, "3")
    ledgers = [tmp_path / f"site{k}.privacy-ledger.json" for k in range(2)]
    for path in ledgers:
        Ledger(path, SiteBudget(epsilon=30, delta=1e-5)).save()
    base = _config(network="linear", guarantee_positives=False, dp={"noise_multiplier": 1.0, "max_grad_norm": 1.0})
    cfg = base.model_copy(update={"sites": [s.model_copy(update={"ledger": path}) for s, path in zip(base.sites, ledgers)]})
    dist_result = _torchrun(tmp_path, cfg)
    local = federated.train(cfg)
    for k, v in local.global_state.items():
        torch.testing.assert_close(dist_result["global_state"][k], v, rtol=1e-5, atol=1e-6)
    assert [len(Ledger.load(path).entries) for path in ledgers] == [2, 2]


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="reads the process's threads from /proc (Linux)")
def test_a_dp_site_process_frees_its_process_group_before_exit(tmp_path):
    """Gloo's threads still running when the interpreter exits abort the process (SIGABRT, "terminate called without
    an active exception"), under torchrun about one DP run in three: the accountant's import (Opacus) must not keep
    the process group alive past ``destroy_process_group``. Checked on one process, without the race: once
    ``main`` returns, none of gloo's or its store's threads is left."""
    cfg = _config(algorithm="fedavg", params={}, network="linear", guarantee_positives=False,
                  dp={"noise_multiplier": 1.0, "max_grad_norm": 1.0}, rounds=1)
    cfg = cfg.model_copy(update={"sites": cfg.sites[:1]})
    (tmp_path / "cfg.json").write_text(cfg.model_dump_json())
    script = ("import os, sys; from federated.distributed import main; assert main([sys.argv[1]]) == 0; "
              "print(sorted(open(f'/proc/self/task/{t}/comm').read().strip() for t in os.listdir('/proc/self/task')))")
    env = dict(_env(), RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()))
    proc = subprocess.run([sys.executable, "-c", script, str(tmp_path / "cfg.json")], capture_output=True, text=True,
                          timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    threads = ast.literal_eval(proc.stdout.strip().splitlines()[-1])
    assert not [t for t in threads if "gloo" in t or "tcpstore" in t], threads
