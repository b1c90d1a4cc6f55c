"""A site's privacy ledger: its budget and every release it has made, kept beside its shards, owner-only (0600),
read and written only on the site's own machine (nothing here is ever sent).

Each entry is one Gaussian mechanism applied ``steps`` times at sampling rate ``sample_rate`` with noise
multiplier ``noise_multiplier`` (a DP-SGD training: rounds x local steps at q = batch / records; noised
evaluations: one step at q = 1 per evaluation round or per model an evaluation job scores; a noised release of
label counts: one step at q = 1). What the site has spent is the composition of all entries by Opacus's
accountant (RDP, Mironov 2017, or PRV, Gopi et al. 2021) at the budget's delta: not the sum of the entries'
epsilons, which would overstate it.
"""

from __future__ import annotations

import json
import os
import stat
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from federated.privacy.policy import PrivacyRefused, SiteBudget

LEDGER_SUFFIX = ".privacy-ledger.json"


def ledger_path(shard_dir: str | Path) -> Path:
    """Where the ledger of the site whose shards are in ``shard_dir`` lives: beside that folder (the shard folder's
    own files are hashed into its content hash, which a ledger entry must not change)."""
    shard_dir = Path(shard_dir)
    return shard_dir.parent / f"{shard_dir.name}{LEDGER_SUFFIX}"


@dataclass
class Entry:
    job: str  # what identifies the training (a resumed training is not charged twice)
    what: str  # "training", "evaluation" or "prior"
    noise_multiplier: float
    sample_rate: float
    steps: int
    when: float = field(default_factory=time.time)


def epsilon(entries: list[Entry], delta: float, accountant: str = "rdp") -> float:
    """The epsilon at ``delta`` of all ``entries`` composed, as Opacus's accountant computes it."""
    if not entries:
        return 0.0
    from opacus.accountants import PRVAccountant, RDPAccountant

    acc = RDPAccountant() if accountant == "rdp" else PRVAccountant()
    acc.history = [(e.noise_multiplier, e.sample_rate, e.steps) for e in entries]
    return float(acc.get_epsilon(delta))


@dataclass
class Ledger:
    path: Path | None  # None: a site without a ledger (no budget)
    budget: SiteBudget | None = None
    entries: list[Entry] = field(default_factory=list)

    @classmethod
    def load(cls, path: str | Path | None) -> Ledger:
        """The ledger at ``path``; none there: no budget and nothing spent. One readable by others is refused."""
        if path is None:
            return cls(None)
        path = Path(path)
        if not path.exists():
            return cls(path)
        mode = stat.S_IMODE(path.stat().st_mode)
        if mode & 0o077:
            raise PrivacyRefused(f"{path}: the privacy ledger has mode {mode:o}; it must be owner-only "
                                 f"(chmod 600 {path})")
        raw = json.loads(path.read_text())
        budget = raw.get("budget")
        return cls(path, None if budget is None else SiteBudget.model_validate(budget),
                   [Entry(**e) for e in raw.get("entries", [])])

    def save(self) -> None:
        """Write it atomically, created 0600 (never world-readable, not even for a moment)."""
        tmp = self.path.with_name(self.path.name + ".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.fchmod(fd, 0o600)  # O_CREAT's mode is masked by the umask; this is not
        with os.fdopen(fd, "w") as f:
            json.dump({"budget": None if self.budget is None else self.budget.model_dump(),
                       "entries": [asdict(e) for e in self.entries]}, f, indent=1)
        os.replace(tmp, self.path)

    def spent(self, delta: float, accountant: str = "rdp") -> float:
        return epsilon(self.entries, delta, accountant)

    def charged(self, job: str) -> bool:
        return any(e.job == job for e in self.entries)


def set_budget(shard_dir: str | Path, budget: SiteBudget | None) -> Path | None:
    """Record the site YAML's budget in the site's ledger (``fedauc preprocess``); its entries stay. A site
    without a budget and without a ledger gets none."""
    ledger = Ledger.load(ledger_path(shard_dir))
    if budget is None and ledger.budget is None and not ledger.entries:
        return None
    ledger.budget = budget
    ledger.save()
    return ledger.path


def admit(site: str, ledger: Ledger, job: list[Entry], accountant: str = "rdp") -> dict:
    """Refuse ``job`` in one line naming the site, the job's cost and what remains if it would take the ledger over
    the site's budget; else what the site will have spent once the caller charges it: {"epsilon_job",
    "epsilon_spent", "epsilon_remaining"}."""
    budget = ledger.budget
    delta = budget.delta
    before = ledger.spent(delta, accountant)
    cost = epsilon(job, delta, accountant)
    after = epsilon(ledger.entries + job, delta, accountant)
    if after > budget.epsilon:
        raise PrivacyRefused(
            f"site {site!r} refuses the job: it would spend epsilon {cost:.3g} at delta {delta:g} "
            f"({_describe(job)}), and with the {before:.3g} already spent that makes {after:.3g}, over the site's "
            f"budget of {budget.epsilon:g} (remaining {max(budget.epsilon - before, 0.0):.3g})")
    return {"epsilon_job": cost, "epsilon_spent": after, "epsilon_remaining": budget.epsilon - after}


def _describe(job: list[Entry]) -> str:
    return "; ".join(f"{e.what}: {e.steps} steps at sampling rate {e.sample_rate:.3g}, noise multiplier "
                     f"{e.noise_multiplier:.3g}" for e in job)
