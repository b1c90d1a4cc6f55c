"""The algorithm contract (docs/algorithms.md section 3) and the per-site object algorithms act on.

An algorithm is a class with

* ``name`` (registry key) and ``Params`` (a pydantic model of its hyperparameters, defaults documented),
* ``state_spec(site)``: its own per-site tensors and their communication kind (the network's parameters
  and buffers are declared by the engine),
* ``init_site_state(site)``: those tensors' initial values,
* ``local_step(site, batch) -> loss``: one local iteration, written like the paper's pseudocode,
* optional hooks: ``before_communication(site)`` (fill tensors that the round sends),
  ``round_end(site)`` (after communication: control variates, extrapolation), and stages:
  ``stage_length`` iterations, ``stage_statistics(site)`` (tensors combined over sites at a stage
  boundary), ``stage_spec(site)`` (how each of them combines: ``Comm.MEAN`` with the aggregation
  weights, like the model, or ``Comm.SUM`` for sums and counts whose ratio is a pooled mean) and
  ``stage_start(site, stats)``.

Every hook sees one site and runs under that site's own RNG stream (``Site.rng``): a hook may draw
random numbers with the global torch RNG. The engine runs each hook for every site in this process and
does all communication in between, so the same class runs in-process and one-site-per-process.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
from pydantic import BaseModel, ConfigDict
from torch import nn

from federated.data import Batch, SiteData, SiteLoader
from federated.state import Comm
from models.objectives import defined_diseases


@dataclass
class FederationContext:
    """What every site knows about the federation (aggregate statistics only, no site's data)."""

    num_sites: int
    local_steps: int  # I
    lr: float
    diseases: tuple[str, ...]
    prior: torch.Tensor  # (C,) positive prior per disease (global by default, section 0)
    positives: torch.Tensor  # (C,) number of positive labels over all sites
    negatives: torch.Tensor  # (C,) number of negative labels over all sites
    device: torch.device
    amp: bool  # bfloat16 autocast (CUDA only)
    channels_last: bool
    iterations: int  # T: the local steps each site takes in this run (rounds x I), for schedules derived from it

    @property
    def num_classes(self) -> int:
        return len(self.diseases)


@dataclass
class Site:
    index: int
    data: SiteData
    model: nn.Module
    loader: SiteLoader
    weight: float  # aggregation weight (sums to 1 over all sites)
    prior: torch.Tensor  # the prior this site's loss uses (the global one unless config.prior = "local")
    state: dict[str, torch.Tensor] = field(default_factory=dict)
    iteration: int = 0  # local steps taken so far (= global iteration t: all sites step together)
    rng_state: torch.Tensor | None = None  # this site's torch RNG (dropout, augmentation)
    cuda_rng_state: torch.Tensor | None = None
    param_list: list[torch.Tensor] | None = None
    param_names: list[str] | None = None
    # What the training steps call: torch.compile's wrapper of ``model`` (same parameters and state_dict) when
    # the config compiles the network; None: the network itself.
    forward: nn.Module | None = None
    # Under DP (federated/dp/site.py SitePrivacy): what privatizes this site's gradients; None without DP.
    privacy: Any = None

    def parameter_names(self) -> list[str]:
        if self.param_names is None:
            self.param_names = [n for n, _ in self.model.named_parameters()]
        return self.param_names

    @contextlib.contextmanager
    def rng(self):
        """Swap the global torch RNG (and the CUDA one, on a GPU) to this site's own stream while the site
        computes: every site draws the same numbers in-process as in its own process."""
        saved = torch.get_rng_state()
        torch.set_rng_state(self.rng_state)
        if self.cuda_rng_state is not None:
            saved_cuda = torch.cuda.get_rng_state()
            torch.cuda.set_rng_state(self.cuda_rng_state)
        try:
            yield
        finally:
            self.rng_state = torch.get_rng_state()
            torch.set_rng_state(saved)
            if self.cuda_rng_state is not None:
                self.cuda_rng_state = torch.cuda.get_rng_state()
                torch.cuda.set_rng_state(saved_cuda)


class NoParams(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Algorithm:
    name: ClassVar[str]
    Params: ClassVar[type[BaseModel]] = NoParams
    stage_length: int | None = None
    # True: before round 0 the engine gathers the GATHER tensors that init_site_state filled, then runs
    # round_end (FeDXL's pools from an initial scoring pass, docs/algorithms.md section 7); the bytes count in round 0.
    initial_gather: ClassVar[bool] = False
    # True: one model on every site's data pooled at one place (a research baseline, not a federation). The
    # command line pools the sites before an in-process training; a backend that keeps data at the hospitals
    # (NVIDIA FLARE) refuses it, since pooling moves patient data.
    pools_sites: ClassVar[bool] = False
    # Differential privacy (federated/dp, docs/privacy.md section 4): the method that privatizes the local step
    # ("DP-SGD", "DP-SGDA"), which counts only where declared on the class itself (a subclass that changes the step
    # declares its own, it inherits none), else why DP refuses it; and the local steps it takes beyond rounds x I,
    # each a release the ledger counts.
    dp_method: ClassVar[str | None] = None
    dp_refusal: ClassVar[str] = "it has no DP analysis"
    dp_extra_steps: ClassVar[int] = 0

    @classmethod
    def dp(cls) -> str | None:
        """The DP method this very class declares (None: refused under DP, ``dp_refusal`` says why)."""
        return cls.__dict__.get("dp_method")

    def __init__(self, params: dict, fed: FederationContext):
        self.p = self.Params(**params)
        self.fed = fed

    # --- the contract -------------------------------------------------------------------------
    def state_spec(self, site: Site) -> dict[str, Comm]:
        return {}

    def init_site_state(self, site: Site) -> dict[str, torch.Tensor]:
        return {}

    def local_step(self, site: Site, batch: Batch) -> torch.Tensor:
        raise NotImplementedError(f"{type(self).__name__} must implement local_step")

    def before_communication(self, site: Site) -> None:
        """Runs after the round's I local steps, before communication."""

    def round_end(self, site: Site) -> None:
        """Runs after communication."""

    def stage_statistics(self, site: Site) -> dict[str, torch.Tensor]:
        return {}

    def stage_spec(self, site: Site) -> dict[str, Comm]:
        """How each stage statistic combines over sites: ``Comm.MEAN`` (aggregation weights) or ``Comm.SUM``."""
        return {}

    def stage_start(self, site: Site, stats: dict[str, torch.Tensor]) -> None:
        """Runs at every stage boundary, with ``stage_statistics`` combined over sites as ``stage_spec`` says."""

    # --- shared helpers -----------------------------------------------------------------------
    def autocast(self):
        if self.fed.amp and self.fed.device.type == "cuda":
            return torch.autocast("cuda", dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def logits(self, site: Site, batch: Batch) -> torch.Tensor:
        """Forward pass in float32 logits (autocast on CUDA), shape (B, C)."""
        x = batch.x
        if self.fed.channels_last and x.ndim == 4 and x.device.type == "cuda":
            x = x.contiguous(memory_format=torch.channels_last)
        with self.autocast():
            out = (site.model if site.forward is None else site.forward)(x)
        # A copy even when already float32: under CUDA graphs the network's output buffer is overwritten by the
        # next replay, and algorithms keep scores across steps (score pools, moving averages).
        return out.to(torch.float32, copy=True).reshape(len(x), -1)

    def sample_loss(self, site: Site, logits: torch.Tensor, y: torch.Tensor, mask: torch.Tensor,
                    extras: list[torch.Tensor]) -> torch.Tensor:
        """One record's loss (``logits``, ``y``, ``mask``: (C,)), for the algorithms that run under DP: their batch
        loss is the batch mean of it (``Algorithm.dp_method``)."""
        raise NotImplementedError(f"{type(self).__name__} has no per-record loss: it does not run under DP")

    def differentiate(self, site: Site, batch: Batch, batch_loss: Callable[[], torch.Tensor],
                      extras: Sequence[torch.Tensor] = ()) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """(loss, gradients of the network's parameters, then of ``extras``) of one local step: what an update
        reads. Under DP (``site.privacy``, which the engine sets) the site's privatized ones, from its own Poisson
        batch: per-record gradients of ``sample_loss``, clipped jointly and noised (federated/dp/sgd.py);
        ``batch_loss`` is not called. Else the autograd of ``batch_loss()``."""
        if site.privacy is not None:
            return site.privacy.gradients(site, batch, lambda z, y, m, ex: self.sample_loss(site, z, y, m, ex),
                                          list(extras))
        loss = batch_loss()
        grads = torch.autograd.grad(loss, self.params(site) + list(extras), allow_unused=True, materialize_grads=True)
        return loss.detach(), list(grads)

    @staticmethod
    def stepped_diseases(site: Site, batch: Batch) -> torch.Tensor:
        """(C,) 1 for the diseases an AUC min-max step moves: those with both classes in the batch. Under DP every
        disease: which ones have both is a fact about the batch's records that no noise covers."""
        defined = defined_diseases(batch.y, batch.mask)
        return torch.ones_like(defined) if site.privacy is not None else defined

    @staticmethod
    def params(site: Site) -> list[torch.Tensor]:
        # Cached: walking the module tree every step costs more than a small model's update.
        # load_state_dict copies into these same tensors, so the list stays valid.
        if site.param_list is None:
            site.param_list = list(site.model.parameters())
        return site.param_list

    @staticmethod
    def named_params(site: Site) -> list[tuple[str, torch.Tensor]]:
        """(name, parameter) pairs from the caches, in the model's order."""
        return list(zip(site.parameter_names(), Algorithm.params(site)))

    @staticmethod
    def grads(site: Site) -> list[torch.Tensor]:
        """Gradients of the network parameters (zeros where a parameter got none)."""
        return [p.grad if p.grad is not None else torch.zeros_like(p) for p in Algorithm.params(site)]

    @staticmethod
    def zero_grad(site: Site) -> None:
        for p in Algorithm.params(site):
            p.grad = None
