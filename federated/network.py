"""The network a federated run trains and the device it trains on.

``build_model(config, input_shape, num_classes)`` is the one place a run's network is made:
``linear`` / ``mlp`` for feature-vector tasks (convex tests, synthetic benchmarks), every other name an
image network of ``models.networks.build_network``. ``initial_model`` seeds it so that every site starts
from the same weights, and ``training_device`` resolves the config's device (one GPU per local rank
under torchrun). ``training_forward`` is what the local steps call when the config compiles the network, and
``local_steps`` the scope they run in.

CUDA graphs (``compile_mode="reduce-overhead"``): each site's forward and backward passes are recorded once per
site (K sites in one process share one compiled graph; cudagraph trees keep one recording per site, told apart
by the addresses of its parameters, which never move: communication and checkpoints copy into them) and
replayed at every step. What a graph cannot hold stays outside, eager and without host syncs: the loss, the
algorithm's update (multi-tensor ``torch._foreach_*`` calls, a handful of launches) and its per-step state.
A step issues no host sync (tests/test_graph_step.py checks every algorithm), so the CPU
queues step t + 1 while the GPU replays step t.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import numpy as np
import torch
from torch import nn

from federated.config import TrainConfig
from federated.data import SiteData
from models import value_checks


def build_model(config: TrainConfig, input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    """The config's network for inputs of ``input_shape`` (without the batch dimension), unseeded."""
    return build_named(config.network, config.network_kwargs, input_shape, num_classes)


def build_named(network: str, network_kwargs: dict, input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    """Network ``network`` (a ``TrainConfig.network`` name) with ``network_kwargs``: what a site rebuilds a
    registered model from, with its own installed code, before loading the weights it was sent."""
    dim = int(np.prod(input_shape))
    if network == "linear":
        return nn.Sequential(nn.Flatten(), nn.Linear(dim, num_classes))
    if network == "mlp":
        hidden = int(network_kwargs.get("hidden", 64))
        return nn.Sequential(nn.Flatten(), nn.Linear(dim, hidden), nn.BatchNorm1d(hidden), nn.ReLU(),
                             nn.Linear(hidden, hidden), nn.BatchNorm1d(hidden), nn.ReLU(),
                             nn.Linear(hidden, num_classes))
    from models.networks import build_network

    return build_network(network, num_classes=num_classes, in_channels=input_shape[0], **network_kwargs)


def initial_model(config: TrainConfig, input_shape: tuple[int, ...], num_classes: int,
                  device: torch.device) -> nn.Module:
    """The run's initial network (seeded by ``config.seed``: the same at every site), on ``device`` in
    train mode, channels-last on CUDA."""
    torch.manual_seed(config.seed)
    model = build_model(config, input_shape, num_classes).to(device)
    if config.channels_last and device.type == "cuda" and len(input_shape) == 3:
        model = model.to(memory_format=torch.channels_last)
    return model.train()


def training_forward(model: nn.Module, config: TrainConfig) -> nn.Module | None:
    """What a site's training steps call when the config compiles the network: ``torch.compile``'s wrapper,
    which shares the network's parameters and leaves its state_dict keys alone. Not ``nn.Module.compile()``:
    it compiles ``Module._call_impl``, which dynamo does not trace under torch 2.13, so it silently ran eager."""
    return torch.compile(model, mode=config.compile_mode) if config.compile_network else None


# torch.compile's modes that replay the compiled graphs as CUDA graphs
CUDA_GRAPH_MODES = ("reduce-overhead", "max-autotune")


@contextlib.contextmanager
def local_steps(config: TrainConfig, model: nn.Module) -> Iterator[Callable[[], None]]:
    """The scope of a site's local steps on ``model``; yields what to call before each step.

    Inside it the losses skip their value checks (models/value_checks.py: the loader's labels and the engine's
    prior hold them by construction; each check is a host sync on a GPU). Under CUDA graphs each step is a new
    cudagraph-trees generation (``torch.compiler.cudagraph_mark_step_begin``): the memory of the previous
    step's graph outputs may be reused, which is safe because algorithms keep only copies
    (``Algorithm.logits``) and consume the gradients within the step. The last step's gradients are released
    at the end: under CUDA graphs they live in the graphs' memory, which the next site's replays reuse, and a
    recording that saw them alive would be re-recorded when they are not (and no hook reads them after the steps)."""
    graphs = config.compile_network and config.compile_mode in CUDA_GRAPH_MODES
    try:
        with value_checks.skipped():
            yield torch.compiler.cudagraph_mark_step_begin if graphs else _no_step_mark
    finally:
        for p in model.parameters():
            p.grad = None


def _no_step_mark() -> None:
    """Eager or compiled without CUDA graphs: a step needs no mark."""


def model_input_shape(data: SiteData) -> tuple[int, ...]:
    """The network's input shape for a site's training rows: (channels, H, W) for uint8 images."""
    images = data.train.images
    if images.dtype == np.uint8 or images.dtype == torch.uint8:
        return (1, *images.shape[1:3]) if images.ndim == 3 else (images.shape[3], *images.shape[1:3])
    return tuple(images.shape[1:])


def training_device(config: TrainConfig, local_rank: int = 0) -> torch.device:
    """The device this process trains on: GPU ``local_rank`` of its machine (under torchrun, the process's
    ``LOCAL_RANK``), or the config's own device."""
    return config.resolve_device(local_rank)
