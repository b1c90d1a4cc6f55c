"""The training configuration: one validated pydantic model, serializable to JSON for torchrun."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Annotated, Any, Literal

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, Field

from common.errors import DataError
from federated import secagg_graph
from federated.data import SiteData, SplitData, learned, load_shard, synthetic_site
from federated.privacy.binding import guarded_ledger
from federated.privacy.budget import declared_budget
from federated.privacy.policy import SiteBudget
from federated.settings import TrainSettings
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
        """The site's privacy ledger (federated/privacy/ledger.py): the one bound to the data the shards were
        written from; refused in one line where a ledger of the site's name guards other data (binding.py)."""
        return guarded_ledger(self.path)

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


def load_sites(sites: list[SiteSpec], indices: list[int], diseases: tuple[str, ...] | None = None) -> list[SiteData]:
    """The data of ``sites[k]`` for each k of ``indices``, only the label columns of ``diseases`` (None: all); they
    must label the same diseases in one order."""
    datas = [learned(sites[k].load(k), diseases) for k in indices]
    for d in datas[1:]:
        if d.diseases != datas[0].diseases:
            raise ValueError(f"site {d.name!r} has diseases {d.diseases}, site {datas[0].name!r} has "
                             f"{datas[0].diseases}")
    return datas


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
