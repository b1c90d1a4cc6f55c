"""Checkpoints: a training killed with SIGKILL resumes to the model of an uninterrupted run; a checkpoint
refuses another configuration or other data with a ConfigError; checkpoints load without pickle, so a
crafted file that would run code is refused."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
import torch

import federated
from common.errors import ConfigError, DataError
from federated import SyntheticSite, TensorSite, TrainConfig


def _cfg(**kw) -> TrainConfig:
    sites = [SyntheticSite(n_train=48, n_valid=24, n_test=24, shape=(5,), num_classes=2, pos_rate=0.3,
                           shift=0.5 * k, task_seed=4) for k in range(2)]
    base = dict(algorithm="fedxl2", params={"pool_size": 4, "passive_batch": 6}, sites=sites, network="mlp",
                network_kwargs={"hidden": 8}, rounds=4, local_steps=2, batch_size=12, lr=0.3, progress=False,
                loader_workers=0, guarantee_positives=True, eval_every=2)
    base.update(kw)
    return TrainConfig(**base)


def test_a_killed_training_resumes_to_the_uninterrupted_model(tmp_path):
    ckpt = tmp_path / "ckpt"
    (tmp_path / "cfg.json").write_text(_cfg(rounds=100_000, checkpoint_dir=ckpt).model_dump_json())
    script = textwrap.dedent(f"""
        import federated, json
        federated.train(json.loads(open({str(tmp_path / "cfg.json")!r}).read()))
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], env=dict(os.environ, OMP_NUM_THREADS="1"),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 120
        while not ((ckpt / "LATEST").exists() and (ckpt / "LATEST").read_text() >= "round_000002"):
            assert time.monotonic() < deadline and proc.poll() is None, proc.stderr.read() if proc.poll() else ""
            time.sleep(0.05)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.communicate()
    last = int((ckpt / "LATEST").read_text().split("_")[1])
    rounds = last + 3
    resumed = federated.train(_cfg(rounds=rounds, checkpoint_dir=ckpt, resume=True))
    full = federated.train(_cfg(rounds=rounds))
    for key, value in full.global_state.items():
        assert torch.equal(value, resumed.global_state[key]), key
    for name, value in full.site_states[1].items():  # u, momentum, pools (NaN where empty), buffers
        torch.testing.assert_close(value, resumed.site_states[1][name], rtol=0, atol=0, equal_nan=True, msg=name)
    assert [h["round"] for h in resumed.history] == list(range(rounds))
    assert [h["train_loss"] for h in resumed.history] == [h["train_loss"] for h in full.history]
    got, want = resumed.history[-1]["metrics"], full.history[-1]["metrics"]
    assert got.keys() == want.keys()
    np.testing.assert_array_equal([got[k] for k in want], list(want.values()))  # NaN where undefined


def test_a_checkpoint_refuses_another_configuration(tmp_path):
    federated.train(_cfg(rounds=1, checkpoint_dir=tmp_path))
    with pytest.raises(ConfigError, match=r"another training configuration \(differs in: batch_size, params\)") as err:
        federated.train(_cfg(rounds=2, batch_size=10, params={"pool_size": 5, "passive_batch": 6},
                             checkpoint_dir=tmp_path, resume=True))
    assert "fix:" in str(err.value)
    # rounds, eval_every, the progress bar and the learning rate (after a divergence) may change
    federated.train(_cfg(rounds=2, eval_every=0, progress=False, lr=0.1, checkpoint_dir=tmp_path, resume=True))


def test_a_checkpoint_refuses_other_data(tmp_path):
    rng = np.random.default_rng(0)
    data = [(rng.standard_normal((30, 5)).astype(np.float32), (rng.random((30, 2)) < 0.4).astype(np.float32))
            for _ in range(2)]
    sites = [TensorSite(train=d) for d in data]
    base = dict(algorithm="fedavg", params={}, network="linear", checkpoint_dir=tmp_path)
    federated.train(_cfg(rounds=1, sites=sites, **base))
    swapped = [TensorSite(train=data[1]), TensorSite(train=data[0])]  # site 0 now holds site 1's data
    with pytest.raises(ConfigError, match=r"site 0 \(site0\) has other data than the checkpoint was trained on"):
        federated.train(_cfg(rounds=2, sites=swapped, resume=True, **base))


class _Payload:
    """A pickle that runs code when loaded: it creates a directory."""

    def __init__(self, target):
        self.target = str(target)

    def __reduce__(self):
        return os.mkdir, (self.target,)


def test_a_crafted_checkpoint_cannot_run_code(tmp_path):
    ckpt = tmp_path / "ckpt"
    federated.train(_cfg(rounds=1, checkpoint_dir=ckpt))
    site_file = ckpt / "round_000000" / "site_0.pt"
    marker = tmp_path / "pwned"
    torch.save({"model": _Payload(marker)}, site_file)
    with pytest.raises(DataError, match=r"site_0.pt: refused to load: the file holds objects other than tensors"):
        federated.train(_cfg(rounds=2, checkpoint_dir=ckpt, resume=True))
    assert not marker.exists()
    torch.load(site_file, weights_only=False)  # what the old loader did: the payload is real
    assert marker.is_dir()
