"""Where a training or an evaluation runs: the ``Launcher``.

One value says it, built once by the command line, a Prefect flow's parameters or a deployment, and passed
down; nothing downstream branches on where the sites are. A launcher (``_Launcher``, the contract) owns what
differs between places:

- ``kind``: its name, in ``LAUNCHERS``, in ``--backend`` and in the flows' JSON (``{"kind": ...}``);
- ``options``: the command line's options it takes, by the field each sets (``from_options``: an option of
  another launcher is refused, not ignored), and ``waits_for_sites``: whether the training's ``timeout_s``
  applies (sites in processes of their own, one of which may leave the others waiting);

- ``reads_shards_here``: whether this machine holds the sites' shards (in-process, torchrun, and NVIDIA
  FLARE's ``sim`` and ``poc``, which run every site here) or each hospital reads its own (FLARE ``prod``:
  nothing here opens or even locates a shard);
- ``pools(algorithm)``: whether an algorithm that pools every site's data (``centralized``) trains as one
  site here, and ``check_algorithm`` refuses it where pooling would move patient data;
- ``train(config, federation, shards_root, callbacks, name)``: the training, its records to ``callbacks`` as rounds end,
  and every site's report on its data (``federated.sites.site_report``), checked against the federation
  (``check_site_reports``) whichever launcher ran it;
- ``score(models, states, federation, shards_root, bins, min_count, eval_noise_multiplier)``: registered models
  scored by every site on its own valid and test splits (``federated.scoring.score_site``), released as its
  privacy budget allows (``federated.dp.evaluation``): per site its summaries, shard hash and what the job
  spent of its budget;
- ``checkpoint_dir(run_name, outputs)``: where the sites checkpoint (this machine's run folder, or a folder
  relative to each hospital's own working directory);
- ``params()``: what MLflow records about the place (``backend``, and FLARE's environment).

``LAUNCHERS`` registers them by kind; its keys are ``federated.settings.LAUNCHER_KINDS``, the command line's
``--backend`` choices, which load no torch (tests/test_cli_startup.py checks they agree); tests/test_launch.py runs
every registered launcher through the contract. Adding a launcher: README.md "Adding a launcher, a transport, a
result sink or an accountant".
"""

from __future__ import annotations

import functools
import operator
import os
import socket
import subprocess
import sys
import tempfile
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal, Self

import torch
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

from common.errors import ConfigError, FedaucError
from federated import ood
from federated.config import ShardSite, TrainConfig
from federated.dp.evaluation import admit_evaluation
from federated.engine import RoundCallback, TrainResult
from federated.flare.centre.environments import FLARE_ENVS, check_flare_algorithm, check_flare_env
from federated.registry import get_algorithm
from federated.scoring import ModelToScore, Scores
from federated.sites import check_site_reports, site_report, site_shard_dirs
from preprocessing.federation import Federation


@dataclass
class Trained:
    """A finished training and every site's report on its data, in the federation's order."""

    result: TrainResult
    site_reports: list[dict]
    pooled: bool  # one site held every site's data (its records are the federation's, not a site's)


class _Launcher(BaseModel, ABC):
    """What every launcher keeps (module docstring); ``LAUNCHERS`` registers it by ``kind``."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    kind: str  # each launcher's Literal: the discriminator of ``Launcher``
    reads_shards_here: ClassVar[bool] = True
    options: ClassVar[dict[str, str]] = {}  # command-line option: the field it sets
    waits_for_sites: ClassVar[bool] = False

    @classmethod
    def from_options(cls, given: dict[str, Any]) -> Self:
        """This launcher from the command line's launcher options (option: value, None where not given)."""
        foreign = [option for option, value in given.items() if value is not None and option not in cls.options]
        if foreign:
            kind = cls.model_fields["kind"].default
            takers = [name for name, other in LAUNCHERS.items() if set(foreign) <= set(other.options)]
            raise ConfigError(f"{', '.join(foreign)} {'goes' if len(foreign) == 1 else 'go'} with --backend "
                              f"{' or '.join(takers) or 'none'}, not {kind}",
                              fix=f"leave out {' and '.join(foreign)}, or choose that --backend")
        return cls(**{field: given[option] for option, field in cls.options.items() if given.get(option) is not None})

    def pools(self, algorithm: str) -> bool:
        return False

    def check(self) -> None:
        """Raise (a ``ConfigError`` saying the fix) where this launcher cannot run as set."""

    def recorded(self, config: TrainConfig) -> TrainConfig:
        """``config`` as this launcher trains it, its sites still the federation's: what MLflow records."""
        return config

    def check_algorithm(self, algorithm: str) -> None:
        """Raise where ``algorithm`` cannot run here."""

    def checkpoint_dir(self, run_name: str, outputs: Path) -> str:
        return str(Path(outputs) / "checkpoints" / run_name)

    def params(self) -> dict[str, str]:
        return {"backend": self.kind}

    @abstractmethod
    def train(self, config: TrainConfig, federation: Federation, shards_root: Path | None,
              callbacks: Sequence[RoundCallback] = (), name: str = "fedauc") -> Trained:
        """The training, its records to ``callbacks`` as rounds end, with every site's report on its data."""

    def score(self, models: list[ModelToScore], states: list[dict[str, torch.Tensor]], federation: Federation,
              shards_root: Path | None, bins: int, min_count: int, eval_noise_multiplier: float | None = None
              ) -> Scores:
        """Every site's shards are here: each scored in this process, as each site would score its own. Every
        site admits the job before any is scored or charged."""
        dirs = site_shard_dirs(federation, Path(shards_root))
        labels = [model.label for model in models]
        releases = [admit_evaluation(site.name, d, labels, eval_noise_multiplier)
                    for site, d in zip(federation.sites, dirs)]
        per_site, hashes = zip(*(release.scored(d, models, states, bins, min_count)
                                 for d, release in zip(dirs, releases)))
        return (list(per_site), dict(zip([site.name for site in federation.sites], hashes)),
                {site.name: release.privacy for site, release in zip(federation.sites, releases)})


class InProcess(_Launcher):
    """Every site in this process (``federated.train``); the research default and the demo's."""

    kind: Literal["inprocess"] = "inprocess"

    def pools(self, algorithm: str) -> bool:
        return get_algorithm(algorithm).pools_sites

    def recorded(self, config: TrainConfig) -> TrainConfig:
        from federated.algorithms.centralized import pooled

        return pooled(config) if self.pools(config.algorithm) else config

    def train(self, config: TrainConfig, federation: Federation, shards_root: Path | None,
              callbacks: Sequence[RoundCallback] = (), name: str = "fedauc") -> Trained:
        from federated import train
        from federated.algorithms.centralized import centralize

        pooled = self.pools(config.algorithm)
        result = train(centralize(config) if pooled else config, callbacks)
        return Trained(result, _local_reports(federation, config, result), pooled)


class Torchrun(_Launcher):
    """One process per site on this machine under ``torchrun`` (``python -m federated.distributed``): gloo on
    CPU, NCCL on GPU, one site per GPU. The records reach ``callbacks`` when the job ends."""

    kind: Literal["torchrun"] = "torchrun"
    waits_for_sites: ClassVar[bool] = True

    def train(self, config: TrainConfig, federation: Federation, shards_root: Path | None,
              callbacks: Sequence[RoundCallback] = (), name: str = "fedauc") -> Trained:
        result = self._run(config, callbacks, name)
        return Trained(result, _local_reports(federation, config, result), pooled=False)

    def _run(self, config: TrainConfig, callbacks: Sequence[RoundCallback], name: str) -> TrainResult:
        with tempfile.TemporaryDirectory(prefix=f"fedauc-{name}-") as folder:
            cfg_path, out = Path(folder) / "config.json", Path(folder) / "result.pt"
            cfg_path.write_text(config.model_dump_json())
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
            # Every site process with this process's thread count, as NVIDIA FLARE's simulator runs them: the
            # same reductions in the same order, so the same model as in-process.
            env = {**os.environ, "OMP_NUM_THREADS": str(torch.get_num_threads())}
            done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node",
                                   str(len(config.sites)), "--master-addr", "127.0.0.1", "--master-port", str(port),
                                   "-m", "federated.distributed", str(cfg_path), "--out", str(out)],
                                  capture_output=True, text=True, env=env)
            if done.returncode != 0 or not out.is_file():
                lines = [line for line in done.stderr.splitlines() if "fedauc distributed:" in line]
                raise TorchrunFailed(f"the torchrun training failed (exit {done.returncode}): "
                                     f"{lines[0] if lines else done.stderr.strip()[-500:]}",
                                     fix="its message names the site and the collective; rerun with --backend "
                                         "inprocess to see the same error in one process")
            saved = torch.load(out, map_location="cpu", weights_only=True)
        for record in saved["history"]:
            for callback in callbacks:
                callback(record)
        return TrainResult(saved["global_state"], saved["history"], config, tuple(saved["input_shape"]),
                           saved["num_classes"], ood=ood.from_saved(saved.get("ood")))


class TorchrunFailed(FedaucError, RuntimeError):
    """A site process of a torchrun training failed (its message names the site and the collective)."""


class Flare(_Launcher):
    """An NVIDIA FLARE job (federated/flare/centre/job.py): ``env`` ``sim`` (its simulator, every site a process
    here), ``poc`` (a consortium provisioned and started here for the job) or ``prod`` (the running
    consortium reached with the admin's startup kit ``kit``; each hospital reads its own shards).
    ``workspace``: the job's folder here (its logs)."""

    kind: Literal["flare"] = "flare"
    env: Literal[FLARE_ENVS] = "sim"
    workspace: Path = Path("flare_workspace")
    kit: Path | None = None
    options: ClassVar[dict[str, str]] = {"--flare-env": "env", "--flare-workspace": "workspace", "--kit": "kit"}
    waits_for_sites: ClassVar[bool] = True

    def check(self) -> None:
        check_flare_env(self.env, self.kit)

    @property
    def reads_shards_here(self) -> bool:  # type: ignore[override]
        return self.env != "prod"

    def check_algorithm(self, algorithm: str) -> None:
        check_flare_algorithm(algorithm)

    def checkpoint_dir(self, run_name: str, outputs: Path) -> str:
        # A running consortium's hospitals checkpoint on their own machines: a path relative to where each
        # site's client runs, not this machine's folders.
        return f"checkpoints/{run_name}" if self.env == "prod" else super().checkpoint_dir(run_name, outputs)

    def params(self) -> dict[str, str]:
        return {"backend": self.kind, "flare_env": self.env}

    def train(self, config: TrainConfig, federation: Federation, shards_root: Path | None,
              callbacks: Sequence[RoundCallback] = (), name: str = "fedauc") -> Trained:
        from federated.flare.centre.job import train_flare

        result = train_flare(config, federation, shards_root if self.reads_shards_here else None, self.env,
                             self.workspace, self.kit, callbacks, name)
        return Trained(result, result.site_reports, pooled=False)

    def score(self, models: list[ModelToScore], states: list[dict[str, torch.Tensor]], federation: Federation,
              shards_root: Path | None, bins: int, min_count: int, eval_noise_multiplier: float | None = None
              ) -> Scores:
        from federated.flare.centre.evaluate import evaluate_flare

        return evaluate_flare(models, states, federation, shards_root if self.reads_shards_here else None,
                              self.env, self.workspace, self.kit, bins, min_count, eval_noise_multiplier)


# The registry: a launcher is one class here (or in a module of its own imported here) and its entry in this
# tuple, its kind in federated.settings.LAUNCHER_KINDS.
LAUNCHERS: dict[str, type[_Launcher]] = {cls.model_fields["kind"].default: cls for cls in (InProcess, Torchrun, Flare)}
Launcher = Annotated[functools.reduce(operator.or_, LAUNCHERS.values()), Field(discriminator="kind")]
_ADAPTER: TypeAdapter = TypeAdapter(Launcher)


def launcher(value: Launcher | dict | None) -> Launcher:
    """A launcher from its JSON form (a Prefect parameter, a deployment's YAML); None: in-process."""
    if value is None:
        return InProcess()
    if isinstance(value, _Launcher):
        return value
    return _ADAPTER.validate_python(value)


def _local_reports(federation: Federation, config: TrainConfig, result: TrainResult) -> list[dict]:
    """Every site's report, computed here (its shards are on this machine), checked as FLARE's are."""
    reports = [site_report(site.name, spec.path, site.sharing, result.input_shape, result.num_classes,
                           private=config.dp is not None)
               for site, spec in zip(federation.sites, config.sites) if isinstance(spec, ShardSite)]
    check_site_reports(reports, [site.name for site in federation.sites], federation.task,
                       tuple(federation.sites[0].diseases))
    return reports


__all__ = ["LAUNCHERS", "Flare", "InProcess", "Launcher", "Scores", "Torchrun", "Trained", "launcher"]
