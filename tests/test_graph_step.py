"""The local step as CUDA graphs want it (federated/network.py, ``local_steps``): no host sync in any algorithm's
local steps, one compiled graph for every site and step, and compiled steps equal to eager ones.

No GPU here: host syncs are found by the ATen operations that read a device tensor back to the host (on a GPU
each waits for the queued kernels), recompiles and graph breaks by dynamo's own counters. The CUDA graphs
themselves are recorded only on a GPU (benchmarks/throughput/gpu.py, docs/performance.md)."""

from __future__ import annotations

import collections
import subprocess
import sys
import traceback
from pathlib import Path

import pytest
import torch
from torch._dynamo.utils import counters
from torch.utils._python_dispatch import TorchDispatchMode

import federated
from federated import SyntheticSite, TensorSite, TrainConfig
from federated.algorithms.centralized import centralize
from federated.engine import Engine
from federated.registry import get_algorithm
from models import objectives

ROOT = Path(__file__).resolve().parents[1]

# ATen operations whose result the host needs before it can go on: on CUDA each one synchronises.
HOST_READS = {"_local_scalar_dense", "nonzero", "masked_select", "_unique2", "unique_dim", "unique_consecutive",
              "is_nonzero", "equal", "bincount", "repeat_interleave"}
INDEXING = {"index", "index_put", "index_put_", "_index_put_impl_"}  # a boolean index runs nonzero inside the kernel


class HostSyncs(TorchDispatchMode):
    """Records every operation that reads a tensor's values back to the host, with the repository line that ran it."""

    def __init__(self):
        super().__init__()
        self.found: collections.Counter = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func._schema.name.split("::")[-1]
        boolean_index = name in INDEXING and any(
            isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8) for i in (args[1] or ()))
        if name in HOST_READS or boolean_index:
            ours = [f for f in traceback.extract_stack() if "/federated/" in f.filename or "/models/" in f.filename]
            where = f" at {'/'.join(ours[-1].filename.split('/')[-2:])}:{ours[-1].lineno}" if ours else ""
            self.found[name + where] += 1
        return func(*args, **(kwargs or {}))


def _config(algorithm: str, shape: tuple[int, ...] = (6,), **kw) -> TrainConfig:
    params = {"fedxl1": {"pool_size": 4, "passive_batch": 5}, "fedxl2": {"pool_size": 4, "passive_batch": 5},
              "codaplus": {"T0": 3}, "codasca": {"T0": 3, "eta_g": 1.5}, "coda": {"T0": 3}}.get(algorithm, {})
    sites = [SyntheticSite(n_train=40, shape=shape, num_classes=2, pos_rate=0.4, task_seed=3, shift=0.3 * k)
             for k in range(2)]
    base = dict(algorithm=algorithm, params=params, sites=sites, network="mlp", network_kwargs={"hidden": 8},
                rounds=2, local_steps=3, batch_size=10, lr=0.1, loader_workers=0, progress=False)
    cfg = TrainConfig(**(base | kw))
    return centralize(cfg) if algorithm == "centralized" else cfg


# The product's algorithms, not those that other test modules register (collected in the same process).
ALGORITHMS = [n for n in federated.algorithm_names()
              if get_algorithm(n).__module__.startswith("federated.algorithms.")]


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_local_steps_read_nothing_back_to_the_host(algorithm):
    """Over two rounds (a stage boundary between them where the algorithm has stages), the engine's local steps
    issue no host sync; the same loss called outside them still checks its labels."""
    engine = Engine(_config(algorithm))
    step, syncs = engine.algorithm.local_step, HostSyncs()

    def watched(site, batch):
        with syncs:
            return step(site, batch)

    engine.algorithm.local_step = watched
    engine.run()
    assert engine.sites[0].iteration == 6
    assert not syncs.found, f"{algorithm}: host syncs in local steps: {dict(syncs.found)}"
    with pytest.raises(ValueError, match="labels must be 0, 1 or NaN"):
        objectives.masked_bce_with_logits(torch.zeros(2, 1), torch.tensor([[0.0], [2.0]]))


def test_labels_are_checked_where_they_enter_since_the_steps_do_not():
    """An in-memory site with a label other than 0, 1 or NaN is refused when its data load, naming the entry."""
    labels = torch.tensor([[0.0, 1.0], [float("nan"), 2.0], [1.0, 0.0]])
    site = TensorSite(train=(torch.zeros(3, 4), labels))
    with pytest.raises(ValueError, match=r"labels must be 0, 1 or NaN \(missing\); row 1, disease column 1 holds 2\.0"):
        federated.train(_config("fedavg", sites=[site], batch_size=2))


def test_the_sync_detector_sees_the_syncs_it_looks_for():
    """The detector of the test above finds a tensor read back (.item(), bool) and a boolean index."""
    x = torch.arange(4.0)
    with HostSyncs() as syncs:
        bool(x.sum() > 0)
        x[x > 1].sum()
        x[torch.tensor([0, 2])].sum()  # an integer index needs no sync
    assert sorted(syncs.found) == ["_local_scalar_dense", "index"]


def test_cuda_graph_mode_compiles_one_graph_for_every_site_and_step_and_equals_eager():
    """compile_mode="reduce-overhead" (CUDA graphs on a GPU): two algorithms, two sites, two rounds each run through
    one compiled forward and backward, with no graph break and no recompile (it would re-record the graphs), and
    end at the eager model. CODASCA's step does more than FedAvg's (clipping, control variates, a stage's lr)."""
    torch._dynamo.reset()
    counters.clear()
    for algorithm in ("fedavg", "codasca"):
        eager = federated.train(_config(algorithm))
        with torch._dynamo.config.patch(error_on_recompile=True):
            graphs = federated.train(_config(algorithm, compile_network=True, compile_mode="reduce-overhead"))
        for name, value in eager.global_state.items():
            torch.testing.assert_close(graphs.global_state[name], value, rtol=1e-5, atol=1e-6)
        for name, value in eager.site_states[0].items():
            torch.testing.assert_close(graphs.site_states[0][name], value, rtol=1e-5, atol=1e-6)
    assert counters["stats"]["unique_graphs"] == 1
    assert not counters["graph_break"], dict(counters["graph_break"])


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message of a machine without CUDA")
def test_the_gpu_benchmark_refuses_a_machine_without_cuda():
    """benchmarks/throughput/gpu.py measures a GPU: without one it says so and how to check the harness, and fails."""
    done = subprocess.run([sys.executable, "-m", "benchmarks.throughput.gpu"], capture_output=True, text=True,
                          timeout=120, cwd=ROOT)
    assert done.returncode == 2
    assert "measures a GPU and this machine has none" in done.stderr and "--smoke" in done.stderr


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs and CUDA host syncs need a GPU")
@pytest.mark.parametrize("algorithm", ["fedavg", "codasca", "fedxl2"])
def test_on_a_gpu_the_steps_replay_as_cuda_graphs_without_a_sync_and_equal_eager(algorithm):
    """On a GPU, float32 (no autocast): no cudagraph skip, no implicit host sync in the local steps once the graphs
    are recorded (round 0 records them; torch.cuda's sync debug mode raises on a sync in the later rounds), and
    the model after three rounds equals eager's up to kernel rounding."""
    torch._dynamo.reset()
    counters.clear()
    kw = dict(shape=(1, 16, 16), network="small_resnet", device="cuda", amp=False)
    eager = federated.train(_config(algorithm, **kw, rounds=3))
    engine = Engine(_config(algorithm, **kw, rounds=3, compile_network=True, compile_mode="reduce-overhead"))
    step = engine.algorithm.local_step

    def strict(site, batch):
        if site.iteration < engine.config.local_steps:  # round 0: warm-up and recording synchronise
            return step(site, batch)
        torch.cuda.set_sync_debug_mode("error")
        try:
            return step(site, batch)
        finally:
            torch.cuda.set_sync_debug_mode("default")

    engine.algorithm.local_step = strict
    graphs = engine.run()
    assert not counters["inductor"]["cudagraph_skips"], "CUDA graphs were skipped (TORCH_LOGS=perf_hints says why)"
    for name, value in eager.global_state.items():
        torch.testing.assert_close(graphs.global_state[name], value, rtol=1e-2, atol=1e-3, msg=name)
