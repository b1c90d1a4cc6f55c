"""torchrun on real shards against the in-process engine: the same computation (a CNN with BatchNorm at a
learning rate where a few ulps of difference grow into another model), sites mapped to processes by name
whatever the rank order, and processes that disagree on the job refused."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys

import pytest
import torch

import federated
from common.errors import DataError
from federated.sites import federation_config
from preprocessing.federation import load_federation

SITES = ("vienna", "barcelona", "new-york")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(**extra) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1", **extra)  # the in-process run below uses one thread too
    env.pop("CUDA_VISIBLE_DEVICES", None)
    return env


def _config(melanoma_shards, **kw):
    root, federation = melanoma_shards
    # lr 1.0 with element-wise clipped steps (the demo's CODASCA setting): a one-ulp difference in an
    # average flips signs of near-zero gradients and the models part within two rounds.
    settings = dict(algorithm="codasca", params={"T0": 16}, network="small_resnet",
                    network_kwargs={"widths": [8, 16, 32]}, rounds=2, local_steps=8, batch_size=32, lr=1.0,
                    guarantee_positives=True, progress=False, loader_workers=0, timeout_s=60, device="cpu")
    settings.update(kw)
    return federation_config(load_federation(federation), root / "shards", settings)


def _assert_same_training(local, dist_result):
    """Bit for bit: same numbers summed in the same order, on the same thread count."""
    assert [h["train_loss"] for h in dist_result["history"]] == [h["train_loss"] for h in local.history]
    for key, value in local.global_state.items():
        assert torch.equal(value, dist_result["global_state"][key]), \
            (key, (value.float() - dist_result["global_state"][key].float()).abs().max().item())


def test_torchrun_on_shards_trains_the_in_process_model(tmp_path, melanoma_shards):
    cfg = _config(melanoma_shards)
    (tmp_path / "cfg.json").write_text(cfg.model_dump_json())
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "3", "--master-addr", "127.0.0.1",
           "--master-port", str(_free_port()), "-m", "federated.distributed", str(tmp_path / "cfg.json"),
           "--out", str(tmp_path / "result.pt")]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=_env())
    assert proc.returncode == 0, proc.stderr[-3000:]
    _assert_same_training(federated.train(cfg), torch.load(tmp_path / "result.pt", weights_only=False))


def _launch(tmp_path, configs: list, sites: list[str], out: bool = False) -> list[subprocess.CompletedProcess]:
    """One process per rank as separate machines would start them (LOCAL_RANK 0 each), rank r running
    ``sites[r]`` with ``configs[r]``."""
    port = str(_free_port())
    procs = []
    for rank, (cfg, site) in enumerate(zip(configs, sites)):
        path = tmp_path / f"cfg{rank}.json"
        path.write_text(cfg.model_dump_json())
        env = _env(RANK=str(rank), LOCAL_RANK="0", LOCAL_WORLD_SIZE="1", WORLD_SIZE=str(len(sites)),
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
        cmd = [sys.executable, "-m", "federated.distributed", str(path), "--site", site]
        if out:
            cmd += ["--out", str(tmp_path / "result.pt")]
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    done = []
    for p in procs:
        stdout, stderr = p.communicate(timeout=300)
        done.append(subprocess.CompletedProcess(p.args, p.returncode, stdout, stderr))
    return done


def test_sites_are_mapped_to_processes_by_name_not_by_rank(tmp_path, melanoma_shards):
    cfg = _config(melanoma_shards)
    # The machines reached the rendezvous in another order than the config lists the sites.
    procs = _launch(tmp_path, [cfg] * 3, ["new-york", "vienna", "barcelona"], out=True)
    assert [p.returncode for p in procs] == [0, 0, 0], procs[0].stderr[-3000:]
    _assert_same_training(federated.train(cfg), torch.load(tmp_path / "result.pt", weights_only=False))


def test_processes_disagreeing_on_the_job_or_the_sites_are_refused(tmp_path, melanoma_shards):
    cfg = _config(melanoma_shards)
    rogue = cfg.model_copy(update={"lr": 5.0})
    procs = _launch(tmp_path, [cfg, cfg, rogue], list(SITES))
    assert [p.returncode for p in procs] == [2, 2, 2]
    assert all("the processes of site(s) new-york run another config than site 'vienna'" in p.stderr for p in procs)

    procs = _launch(tmp_path, [cfg] * 3, ["vienna", "vienna", "new-york"])
    assert [p.returncode for p in procs] == [2, 2, 2]
    assert "site(s) [0] twice, site(s) [1] by none" in procs[0].stderr

    env = _env(RANK="0", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1", WORLD_SIZE="3")
    (tmp_path / "cfg.json").write_text(cfg.model_dump_json())
    proc = subprocess.run([sys.executable, "-m", "federated.distributed", str(tmp_path / "cfg.json")],
                          env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "start every process with `--site <name>`" in proc.stderr
    proc = subprocess.run([sys.executable, "-m", "federated.distributed", str(tmp_path / "cfg.json"), "--site", "paris"],
                          env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "site 'paris' is not in the config (its sites: vienna, barcelona, new-york)" in proc.stderr


def test_federation_config_names_sites_and_refuses_shards_that_do_not_fit(tmp_path, melanoma_shards):
    root, federation_yaml = melanoma_shards
    federation = load_federation(federation_yaml)
    cfg = federation_config(federation, root / "shards", {"algorithm": "fedavg", "rounds": 1})
    assert [(s.name, s.path) for s in cfg.sites] == [(n, root / "shards" / n) for n in SITES]
    with pytest.raises(DataError, match=r"federation 'tiny-melanoma': no shards at .*missing/vienna"):
        federation_config(federation, tmp_path / "missing", {"algorithm": "fedavg", "rounds": 1})
    # Another hospital's shards in vienna's folder, then shards of another task.
    swapped = tmp_path / "swapped"
    shutil.copytree(root / "shards", swapped)
    (swapped / "vienna" / "shard.json").write_text((root / "shards" / "barcelona" / "shard.json").read_text())
    with pytest.raises(DataError, match="the shards belong to site 'barcelona', not 'vienna'"):
        federation_config(federation, swapped, {"algorithm": "fedavg", "rounds": 1})
    meta = json.loads((root / "shards" / "vienna" / "shard.json").read_text())
    (swapped / "vienna" / "shard.json").write_text(json.dumps({**meta, "task": "chest-xray"}))
    with pytest.raises(DataError, match="site 'vienna': its shards are a 'chest-xray' task, the federation trains 'melanoma'"):
        federation_config(federation, swapped, {"algorithm": "fedavg", "rounds": 1})
    (swapped / "vienna" / "shard.json").write_text(json.dumps({**meta, "diseases": ["Nevus"]}))
    with pytest.raises(DataError, match=r"its shards have diseases \['Nevus'\], the federation trains \['Melanoma'\]"):
        federation_config(federation, swapped, {"algorithm": "fedavg", "rounds": 1})


def test_the_torchrun_launcher_trains_the_in_process_model_and_reports_every_site(melanoma_shards):
    """`fedauc train --backend torchrun`'s launcher: one process per site, the same model bit for bit, every
    round's record to the callbacks, and the sites' reports checked as every launcher's are."""
    from federated.launch import InProcess, Torchrun

    root, federation = melanoma_shards
    cfg = _config(melanoma_shards)
    records = []
    launched = Torchrun().train(cfg, load_federation(federation), root / "shards", [records.append])
    local = InProcess().train(cfg, load_federation(federation), root / "shards")
    assert [r["round"] for r in records] == [0, 1]
    _assert_same_training(local.result, {"history": launched.result.history,
                                         "global_state": launched.result.global_state})
    assert [r["site"] for r in launched.site_reports] == list(SITES)
    assert launched.site_reports == local.site_reports
