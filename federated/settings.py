"""A training's settings (``TrainSettings``) and the names the command line offers as choices (``RULES``,
``LAUNCHER_KINDS``), one definition each. Light on purpose: pydantic, no torch, so that ``fedauc --help`` and
the daily commands that validate or show settings start without loading the training stack (docs/performance.md,
"Command start-up"). ``federated.config`` adds the sites; ``federated.aggregation`` and ``federated.launch``
implement what these names name."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, field_validator, model_validator

from federated.privacy.policy import DPConfig

if TYPE_CHECKING:
    import torch

# How a round's MEAN tensors combine (federated/aggregation.py): the weighted mean or a robust rule over sites.
RULES = ("mean", "trimmed-mean", "median")

# Where a training runs (federated/launch.py ``LAUNCHERS``, whose keys are these, in this order).
LAUNCHER_KINDS = ("inprocess", "torchrun", "flare")
DEFAULT_LAUNCHER = "inprocess"  # every site in this process: the research default and the demo's


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
    # The diseases it learns, in the shards' order (fewer than its sites label); None: the federation's
    # (federated/sites.py federation_config), else every one the shards label.
    diseases: tuple[str, ...] | None = Field(default=None, min_length=1)
    local_steps: int = Field(default=1, gt=0)  # I: local steps between communications
    batch_size: int = Field(default=32, gt=0)  # per site
    lr: float = Field(default=0.1, gt=0)
    seed: int = 0
    eval_every: int = Field(default=0, ge=0)  # rounds between evaluations; 0: only after the last round
    # Score histogram bins of the site-local evaluation (federated/evaluation.py): the pooled metrics'
    # error bound shrinks as 1/eval_bins, the evaluation payload grows as 16 * C * eval_bins bytes per site.
    eval_bins: int = Field(default=1000, ge=1, description="Score histogram bins of the site-local evaluation.")
    eval_min_count: int = Field(default=10, ge=1, description="Site metrics from fewer positives or negatives are "
                                "suppressed.")
    # The out-of-distribution refusal's target false-refusal rate on the pooled validation split (federated/ood.py),
    # fitted after the last round; 0: no refusal model (never under differential privacy: docs/privacy.md section 5).
    ood_false_refusal: float = Field(default=0.01, ge=0.0, lt=1.0, description="The refusal of foreign images' target "
                                     "false-refusal rate on the pooled validation split; 0: no refusal model.")
    device: str = Field(default="auto", description="auto: cuda where available (under torchrun cuda:<local rank>), "
                        "else cpu; or a torch device.")
    amp: bool = Field(default=True, description="bfloat16 autocast, CUDA only (CPU stays float32 and deterministic).")
    channels_last: bool = Field(default=True, description="Channels-last memory format, CUDA only.")
    # torch.compile each site's network for its training steps (network.training_forward: state_dict keys
    # unchanged). Pays a compilation at the start (minutes for DenseNet121); a long GPU run's option.
    compile_network: bool = Field(default=False, description="torch.compile each site's network for its training "
                                     "steps.")
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
    warmup_rounds: int = Field(default=0, ge=0, description="Rounds of FedAvg (BCE) first, out of --rounds, in "
                               "this process only.")
    # Training health (federated/health.py): a site's round loss past this multiple of its first round's stops
    # the training as diverged; a site's update norm past this multiple of the other sites' median is named
    # in a warning.
    divergence_factor: float = Field(default=1000.0, gt=1, description="A site's round loss past this multiple of its "
                                     "first round's stops the training.")
    outlier_factor: float = Field(default=10.0, gt=1, description="A site's update norm past this multiple of the "
                                  "other sites' median is warned of.")
    # How a round's MEAN tensors combine: the weighted mean, or a coordinate-wise robust rule over sites that
    # outvotes a broken site (federated/aggregation.py: when it helps, what it costs).
    robust_aggregation: Literal[RULES] = "mean"
    trim_fraction: float = Field(default=0.2, gt=0, lt=0.5, description="With --aggregation trimmed-mean: the share of "
                                 "sites dropped at each end.")
    augment_flip: bool = Field(default=False, description="Random horizontal flips of training images.")
    augment_shift: int = Field(default=0, ge=0, description="Random translations up to this many pixels.")
    loader_workers: int = Field(default=2, ge=0)
    progress: bool = True
    # Set by federated.sites.training_settings once the algorithm's hyperparameters are checked as well: a layer
    # handed these settings trusts them instead of validating them again, as scikit-learn's
    # _fit_context(prefer_skip_nested_validation=True) lets an estimator's inner calls trust its parameters.
    _checked: bool = PrivateAttr(default=False)

    @property
    def checked(self) -> bool:
        """Whether ``federated.sites.training_settings`` validated these settings, hyperparameters included."""
        return self._checked

    def mark_checked(self) -> TrainSettings:
        """These settings, marked as validated by ``federated.sites.training_settings`` (its own use)."""
        self._checked = True
        return self

    @field_validator("device")
    @classmethod
    def _device(cls, v: str) -> str:
        if v != "auto":
            import torch  # here, not at the top: the command line validates settings without loading torch

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
        import torch

        if self.device != "auto":
            return torch.device(self.device)
        if torch.cuda.is_available():
            return torch.device("cuda", local_rank % torch.cuda.device_count())
        return torch.device("cpu")
