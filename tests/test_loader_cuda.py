"""The loader's GPU path: batches page-locked in the reading threads, copied asynchronously, equal to the
CPU loader's. Runs where CUDA is available (benchmarks/throughput/gpu.py measures its speed)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from federated.data import SiteLoader, SplitData

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def test_cuda_batches_are_page_locked_and_equal_the_cpu_loaders():
    rng = np.random.default_rng(0)
    labels = (rng.random((40, 3)) < 0.3).astype(np.float32)
    labels[rng.random(labels.shape) < 0.2] = np.nan
    split = SplitData(rng.integers(0, 256, (40, 16, 16), dtype=np.uint8), labels)
    cuda = torch.device("cuda")
    probe = SiteLoader(split, 8, seed=3, device=cuda, workers=1)
    assert all(t.is_pinned() for t in probe._read(probe.next_indices()))
    cpu_batches = list(SiteLoader(split, 8, seed=3, device=torch.device("cpu"), workers=1).batches(5))
    cuda_batches = list(SiteLoader(split, 8, seed=3, device=cuda, workers=1).batches(5))
    for on_cpu, on_cuda in zip(cpu_batches, cuda_batches):
        assert on_cuda.x.device.type == "cuda"
        for name in ("x", "y", "mask", "index"):
            torch.testing.assert_close(getattr(on_cuda, name).cpu(), getattr(on_cpu, name))
