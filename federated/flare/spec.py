"""What the server sends every site: the training settings, the federation's sites in order, its task and
diseases, and (the simulator only) where each site's shards are and what of their QC may leave them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from common.errors import ConfigError, DataError
from common.formats import check as check_format
from federated.config import ShardSite, TrainConfig
from federated.scoring import ModelToScore
from federated.sites import check_shard
from federated.version import code_version
from preprocessing.sharing import SharingPolicy

# Written by `fedauc consortium start-site` into the site's startup kit (local/): the site's own shard folder.
SITE_FILE = "fedauc_site.json"


def local_site(site_config_dir: Path | None) -> dict:
    """What ``fedauc consortium start-site`` wrote into the site's kit (SITE_FILE); empty without one."""
    local = None if site_config_dir is None else Path(site_config_dir) / SITE_FILE
    return check_format("site-settings", json.loads(local.read_text()), local) if local is not None and local.is_file() else {}


class EvaluationRequest(BaseModel):
    """What an evaluation job asks every site to score (federated/flare/site/evaluate.py): the models'
    networks, inputs and classes; their weights travel beside the job (``protocol.WEIGHTS_FILE``), not in it."""

    model_config = ConfigDict(extra="forbid")
    models: list[ModelToScore] = Field(min_length=1)
    bins: int = Field(gt=0)  # TrainConfig.eval_bins
    min_count: int = Field(gt=0)  # TrainConfig.eval_min_count
    # S_e: each site releases noised histograms only, charged to its ledger (federated/dp/evaluation.py);
    # None: exact summaries, which a site with a privacy budget refuses.
    eval_noise_multiplier: float | None = Field(default=None, gt=0)


class FlareJob(BaseModel):
    model_config = ConfigDict(extra="forbid")
    # The centre's fedauc (federated/flare/site/version.py): a site runs the job only with this code.
    code_version: str = Field(default_factory=code_version)
    # "train": every site runs the engine (site.train); "evaluate": every site scores the models of
    # ``evaluation`` on its own valid and test splits (site.evaluate).
    kind: Literal["train", "evaluate"] = "train"
    settings: dict[str, Any]  # a TrainConfig without sites (empty for an evaluation)
    evaluation: EvaluationRequest | None = None
    sites: list[str] = Field(min_length=1)  # the federation's site names, in its order = site index
    task: str
    diseases: tuple[str, ...]
    # SimEnv: every site on this machine, shards named here. A consortium (POC or real) leaves it empty:
    # each hospital's kit says where its own shards are (SITE_FILE), and the centre never knows the paths.
    shard_dirs: dict[str, str] = Field(default_factory=dict)
    # SimEnv only, like shard_dirs: each site's sharing policy from its site YAML. A hospital's kit carries
    # its own (SITE_FILE), so what leaves a site is decided at the site, not by the centre's job.
    sharing: dict[str, dict] = Field(default_factory=dict)
    job_timeout_s: float = Field(gt=0)
    # torch's intra-op threads at every site. CPU kernels split their sums by thread, so the same model
    # needs the same count everywhere: one-machine environments send the submitter's (the in-process run's);
    # a real consortium leaves each hospital its own (None).
    threads: int | None = Field(default=None, gt=0)
    # SimEnv and POC (every site on the submitting machine): each site checkpoints into
    # settings.checkpoint_dir/<site>. A consortium: each under its own kit (federated/flare/site/resume.py).
    checkpoints_here: bool = False

    @model_validator(mode="after")
    def _kind_has_what_it_needs(self) -> FlareJob:
        if (self.kind == "evaluate") != (self.evaluation is not None):
            raise ValueError("an evaluation job, and only one, names the models to score (evaluation)")
        return self

    def site_index(self, name: str) -> int:
        if name not in self.sites:
            raise ConfigError(f"this NVFlare client is site {name!r}, which the federation does not list "
                              f"(its sites: {', '.join(self.sites)})",
                              fix="start the client from the kit of a site in the federation YAML")
        return self.sites.index(name)

    def own_shards(self, name: str, site_config_dir: Path | None) -> tuple[Path, SharingPolicy]:
        """Site ``name``'s shard folder, checked against the federation, and its sharing policy: from its
        kit (SITE_FILE, written by ``fedauc consortium start-site`` from its own site YAML), else from the
        job (SimEnv); a kit without a policy shares as the defaults allow."""
        own = local_site(site_config_dir)
        local = None if site_config_dir is None else Path(site_config_dir) / SITE_FILE
        if own:
            if own.get("site") != name:
                raise ConfigError(f"{local} describes site {own.get('site')!r}, this client is {name!r}",
                                  fix="start each site from its own kit")
            shard_dir, sharing = Path(own["shards"]), own.get("sharing", {})
        elif name in self.shard_dirs:
            shard_dir, sharing = Path(self.shard_dirs[name]), self.sharing.get(name, {})
        else:
            raise DataError(f"site {name!r}: no shard folder known (no {local or SITE_FILE})",
                            fix="start the site with `fedauc consortium start-site <kit> --site-yaml <its site YAML> "
                                "--shards <folder>`")
        check_shard(name, shard_dir, self.task, self.diseases)
        return shard_dir, SharingPolicy.model_validate(sharing)

    def train_config(self, name: str, shard_dir: Path) -> TrainConfig:
        """The config site ``name`` trains with: its own shard folder and, for the other sites, names only
        (their data is never opened here)."""
        sites = [ShardSite(name=s, path=shard_dir if s == name else Path(self.shard_dirs.get(s, s)))
                 for s in self.sites]
        return TrainConfig.model_validate({**self.settings, "sites": sites})
