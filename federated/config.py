"""The training configuration: one validated pydantic model, serializable to JSON for torchrun."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Annotated, Any, Literal

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from federated import secagg_graph
from federated.aggregation import RULES
from federated.data import SiteData, SplitData, load_shard, synthetic_site
from federated.privacy.budget import declared_budget
from federated.privacy.ledger import ledger_path
from federated.privacy.policy import DPConfig, SiteBudget
from preprocessing.errors import DataError
from preprocessing.shard_format import shard_content_hash


class ShardSite(BaseModel):
    """A site shard directory written by ``fedauc preprocess`` (docs/shards.md)."""

    kind: Literal["shard"] = "shard"
    path: Path
    name: str | None = None  # the site's name; when given, the shard's own must match (no swapped paths)

    def load(self, index: int) -> SiteData:
        data = load_shard(self.path)
        if self.name is not None and data.name != self.name:
            raise DataError(f"{self.path}: the shard belongs to site {data.name!r}, the config says {self.name!r}",
                            fix=f"point site {self.name!r} at its own shard folder (<shards>/{self.name})")
        return data

    def fingerprint(self, index: int) -> str:
        """What identifies the site's data (checkpoints refuse other data): the shard's content hash."""
        return shard_content_hash(self.path)

    def privacy_ledger(self) -> Path:
        """The site's privacy ledger (federated/privacy/ledger.py): the site's, keyed by its name."""
        return ledger_path(self.path)

    def declared_privacy(self) -> SiteBudget | None:
        """The privacy budget the shards were written under (a site whose ledger is lost refuses every job)."""
        return declared_budget(self.path)


class SyntheticSite(BaseModel):
    """Gaussian multi-label data generated from seeds (tests, benchmarks, torchrun)."""

    kind: Literal["synthetic"] = "synthetic"
    n_train: int = Field(gt=0)
    n_valid: int = Field(default=0, ge=0)
    n_test: int = Field(default=0, ge=0)
    shape: tuple[int, ...] = (16,)
    num_classes: int = Field(default=1, gt=0)
    pos_rate: float | list[float] = 0.3
    shift: float = 0.0
    signal: float = 1.0
    task_seed: int = 0
    site_seed: int | None = None  # default: task_seed + 1000 + site index
    ledger: Path | None = None  # its privacy ledger (federated/privacy/ledger.py); None: no budget

    def privacy_ledger(self) -> Path | None:
        return self.ledger

    def declared_privacy(self) -> None:  # no shards: the ledger, where given, holds the budget
        return None

    def load(self, index: int) -> SiteData:
        seed = self.task_seed + 1000 + index if self.site_seed is None else self.site_seed
        n = {"train": self.n_train, "valid": self.n_valid, "test": self.n_test}
        return synthetic_site(f"synthetic{index}", n, self.shape, self.num_classes, self.pos_rate,
                              self.shift, self.signal, self.task_seed, seed)

    def fingerprint(self, index: int) -> str:
        """The generator's parameters and the site's index determine its data."""
        return hashlib.sha256(f"{self.model_dump_json(exclude={'ledger'})}#{index}".encode()).hexdigest()


class TensorSite(BaseModel):
    """In-memory data (Python API only: not serializable, so not usable under torchrun)."""

    model_config = ConfigDict(arbitrary_types_allowed=True)
    kind: Literal["tensor"] = "tensor"
    name: str = ""
    diseases: tuple[str, ...] | None = None
    train: tuple[Any, Any]
    valid: tuple[Any, Any] | None = None
    test: tuple[Any, Any] | None = None
    ledger: Path | None = None  # its privacy ledger (federated/privacy/ledger.py); None: no budget

    def privacy_ledger(self) -> Path | None:
        return self.ledger

    def declared_privacy(self) -> None:  # no shards: the ledger, where given, holds the budget
        return None

    def load(self, index: int) -> SiteData:
        splits = {}
        for split in ("train", "valid", "test"):
            pair = getattr(self, split)
            if pair is None:
                continue
            x, y = pair
            x = x if isinstance(x, (np.ndarray, torch.Tensor)) else np.asarray(x)
            y = np.asarray(y.cpu() if isinstance(y, torch.Tensor) else y, dtype=np.float32)
            splits[split] = SplitData(x, y.reshape(len(y), -1))
        num_classes = splits["train"].labels.shape[1]
        diseases = self.diseases or tuple(f"class{c}" for c in range(num_classes))
        return SiteData(self.name or f"site{index}", tuple(diseases), splits)

    def fingerprint(self, index: int) -> str:
        """A hash of every split's arrays and the disease names."""
        digest = hashlib.sha256(repr(self.diseases).encode())
        for split, part in self.load(index).splits.items():
            digest.update(split.encode())
            for array in (part.images, part.labels):
                array = array.cpu().numpy() if isinstance(array, torch.Tensor) else np.asarray(array)
                digest.update(f"{array.dtype}{array.shape}".encode())
                digest.update(np.ascontiguousarray(array).tobytes())
        return digest.hexdigest()


SiteSpec = Annotated[ShardSite | SyntheticSite | TensorSite, Field(discriminator="kind")]


def load_sites(sites: list[SiteSpec], indices: list[int]) -> list[SiteData]:
    """The data of ``sites[k]`` for each k of ``indices``; they must label the same diseases in one order."""
    datas = [sites[k].load(k) for k in indices]
    for d in datas[1:]:
        if d.diseases != datas[0].diseases:
            raise ValueError(f"site {d.name!r} has diseases {d.diseases}, site {datas[0].name!r} has "
                             f"{datas[0].diseases}")
    return datas


class TrainSettings(BaseModel):
    """A training but for its sites: what ``fedauc train``, a flow's ``config`` and a deployment's parameters say,
    checked before any site's data is read (the federation YAML decides the sites: federated/sites.py
    ``federation_config``). ``params`` is validated by the algorithm's own model."""

    model_config = ConfigDict(extra="forbid")

    algorithm: str
    params: dict[str, Any] = Field(default_factory=dict)
    network: str = "small_resnet"  # models.networks.build_network name, or "linear" (logistic/AUC regression)
    network_kwargs: dict[str, Any] = Field(default_factory=dict)
    rounds: int = Field(gt=0)
    local_steps: int = Field(default=1, gt=0)  # I: local steps between communications
    batch_size: int = Field(default=32, gt=0)  # per site
    lr: float = Field(default=0.1, gt=0)
    seed: int = 0
    eval_every: int = Field(default=0, ge=0)  # rounds between evaluations; 0: only after the last round
    # Score histogram bins of the site-local evaluation (federated/evaluation.py): the pooled metrics'
    # error bound shrinks as 1/eval_bins, the evaluation payload grows as 16 * C * eval_bins bytes per site.
    eval_bins: int = Field(default=1000, ge=1)
    eval_min_count: int = Field(default=10, ge=1)  # site metrics from fewer positives or negatives are suppressed
    device: str = "auto"  # "auto" = cuda when available; under torchrun cuda:<local rank>
    amp: bool = True  # bfloat16 autocast, CUDA only (CPU stays float32 and deterministic)
    channels_last: bool = True  # CUDA only
    # torch.compile each site's network for its training steps (network.training_forward: state_dict keys
    # unchanged). Pays a compilation at the start (minutes for DenseNet121); a long GPU run's option.
    compile_network: bool = False
    # torch.compile's mode. "reduce-overhead" replays the forward and backward passes as CUDA graphs: at the
    # usual per-site batches a GPU step is bound by kernel launches, not by the GPU (docs/performance.md).
    compile_mode: Literal["default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"] = "default"
    timeout_s: float = Field(default=300.0, gt=0)  # torchrun, FLARE: a silent site fails the job after this
    checkpoint_dir: Path | None = None
    resume: bool = False
    bn_stats: Literal["mean", "local"] = "mean"
    aggregation: Literal["uniform", "weighted"] = "uniform"  # weighted = by number of training samples
    # Pairwise-masked secure aggregation of every mean and sum (federated/secure_aggregation.py): whoever
    # combines (the FLARE server) receives ring elements uniform whatever a site's values, and decodes only sums.
    secure_aggregation: bool = False
    # Differential privacy at every site (federated/privacy/, docs/privacy.md); None: none, refused by a site
    # that has a privacy budget.
    dp: DPConfig | None = None
    # SecAgg+ (federated/secagg_graph.py): each site masks with O(log K) neighbours on a public random graph
    # instead of all K - 1, safe while at most ``secure_colluding`` of the sites collude with the combiner,
    # except with probability 2^-secure_failure_bits; the full graph where that saves little (small K).
    secure_neighbours: Literal["all", "secagg+"] = "all"
    secure_colluding: float = Field(default=1 / 3, ge=0, lt=1)
    secure_failure_bits: int = Field(default=40, ge=1, le=128)
    prior: Literal["global", "local"] = "global"  # docs/algorithms.md section 0
    guarantee_positives: bool = False
    # Rounds of FedAvg (BCE) at the start, out of ``rounds``, before ``algorithm`` starts from the warmed model:
    # LibAUC's recipe (cross-entropy first, then the AUC loss; docs/algorithms.md section 12). federated.train
    # runs it, in-process only; 0: off (docs/claims.md measures it).
    warmup_rounds: int = Field(default=0, ge=0)
    # Training health (federated/health.py): a site's round loss past this multiple of its first round's stops
    # the training as diverged; a site's update norm past this multiple of the other sites' median is named
    # in a warning.
    divergence_factor: float = Field(default=1000.0, gt=1)
    outlier_factor: float = Field(default=10.0, gt=1)
    # How a round's MEAN tensors combine: the weighted mean, or a coordinate-wise robust rule over sites that
    # outvotes a broken site (federated/aggregation.py: when it helps, what it costs).
    robust_aggregation: Literal[RULES] = "mean"
    trim_fraction: float = Field(default=0.2, gt=0, lt=0.5)  # trimmed-mean: the share of sites dropped at each end
    augment_flip: bool = False  # random horizontal flips of training images, on the training device
    augment_shift: int = Field(default=0, ge=0)  # random translations up to this many pixels
    loader_workers: int = Field(default=2, ge=0)
    progress: bool = True

    @field_validator("device")
    @classmethod
    def _device(cls, v: str) -> str:
        if v != "auto":
            torch.device(v)  # raises with a clear message on an unknown device string
        return v

    @model_validator(mode="after")
    def _consistent(self) -> TrainSettings:
        if self.resume and self.checkpoint_dir is None:
            raise ValueError("resume=True needs checkpoint_dir")
        if self.warmup_rounds and (self.warmup_rounds >= self.rounds or self.checkpoint_dir is not None):
            raise ValueError(f"warmup_rounds={self.warmup_rounds} needs rounds > warmup_rounds (got {self.rounds}) "
                             "and no checkpoint_dir (federated.train runs it, in-process)")
        if self.secure_aggregation and self.robust_aggregation != "mean":
            raise ValueError(f"--aggregation {self.robust_aggregation} needs every site's values at the combiner, "
                             "and secure aggregation shows it their sum only: use one or the other")
        if self.compile_mode != "default" and not self.compile_network:
            raise ValueError(f"compile_mode={self.compile_mode!r} needs compile_network=True")
        return self

    def evaluates_after(self, round_index: int) -> bool:
        """Whether round ``round_index`` ends with an evaluation: every ``eval_every`` rounds and after the last."""
        every = self.eval_every
        return round_index == self.rounds - 1 or bool(every and (round_index + 1) % every == 0)

    def resolve_device(self, local_rank: int = 0) -> torch.device:
        if self.device != "auto":
            return torch.device(self.device)
        if torch.cuda.is_available():
            return torch.device("cuda", local_rank % torch.cuda.device_count())
        return torch.device("cpu")


class TrainConfig(TrainSettings):
    """Everything one federated run needs: its settings and its sites."""

    sites: list[SiteSpec] = Field(min_length=1)

    @classmethod
    def on_sites(cls, settings: TrainSettings, sites: list[SiteSpec]) -> TrainConfig:
        """``settings``, validated, on ``sites``."""
        return cls.model_validate({**dict(settings), "sites": sites})

    def mask_degree(self) -> int | None:
        """Secure aggregation's neighbours per site: None for every other site."""
        if self.secure_neighbours == "all":
            return None
        return secagg_graph.degree(len(self.sites), self.secure_colluding, self.secure_failure_bits)
