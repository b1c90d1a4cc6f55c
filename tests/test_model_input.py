"""The model's input from stored rows (federated/data.py): (B, ch, H, W) in [0, 1], laid out channels first
whatever the stored order, and a training step on RGB rows survives the CPU's convolution kernels."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from federated.data import SiteLoader, SplitData, to_model_input
from pipelines.prefect_env import PROJECT_ROOT


@pytest.mark.parametrize("stored_shape", [(6, 16, 16), (6, 16, 16, 3)], ids=["grey", "rgb"])
def test_stored_rows_become_channels_first_contiguous_floats(stored_shape):
    rows = np.random.default_rng(0).integers(0, 256, stored_shape, dtype=np.uint8)
    x = to_model_input(rows, torch.device("cpu"))
    channels = 1 if len(stored_shape) == 3 else 3
    assert x.shape == (6, channels, 16, 16) and x.dtype == torch.float32
    assert x.is_contiguous()
    expected = rows[:, None] if channels == 1 else rows.transpose(0, 3, 1, 2)
    torch.testing.assert_close(x, torch.from_numpy(expected / 255.0).float())


def test_the_loaders_rgb_batches_are_channels_first_contiguous():
    rng = np.random.default_rng(1)
    split = SplitData(rng.integers(0, 256, (20, 8, 8, 3), dtype=np.uint8), (rng.random((20, 2)) < 0.5).astype(np.float32))
    (batch,) = SiteLoader(split, 8, seed=0, device=torch.device("cpu"), workers=0).batches(1)
    assert batch.x.shape == (8, 3, 8, 8) and batch.x.is_contiguous()


# torch 2.13's oneDNN, in its AVX2 kernels (the CPUs without AVX-512: AMD EPYC among them), writes out of bounds in
# the weight gradient of a 1x1 stride-2 convolution given a channels-last input of few channels: small_resnet's
# shortcut on RGB images. The heap is found corrupt a few steps later (SIGABRT, SIGSEGV, or a hang in malloc).
# ONEDNN_MAX_CPU_ISA=AVX2 picks those kernels on a machine that has AVX-512 too; one thread makes it fail at once.
_RGB_STEPS = """
import numpy as np, torch
from federated.data import to_model_input
from models.networks import build_network
torch.set_num_threads(1)
torch.manual_seed(0)
network = build_network("small_resnet_gn", 1, 3, widths=[4, 8])
rows = np.random.default_rng(0).integers(0, 256, (16, 32, 32, 3), dtype=np.uint8)
for _ in range(30):
    torch.autograd.grad(network(to_model_input(rows, torch.device("cpu"))).square().sum(),
                        list(network.parameters()))
print("trained")
"""


def test_training_steps_on_rgb_rows_survive_onednns_avx2_kernels():
    env = {**os.environ, "ONEDNN_MAX_CPU_ISA": "AVX2"}
    done = subprocess.run([sys.executable, "-c", _RGB_STEPS], cwd=PROJECT_ROOT, env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "trained", (done.returncode, done.stderr[-2000:])
