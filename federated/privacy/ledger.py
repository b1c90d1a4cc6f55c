"""A site's privacy ledger: its budget, every change of it, and every release it has made; owner-only (0600),
read and written only on the site's own machine (nothing here is ever sent).

The ledger is the site's dataset's, not one shard folder's: it lives in the site's state directory
(``FEDAUC_SITE_STATE``, default ``~/.fedauc/site-state``), keyed by the site's name and the binding of the data it
guards (federated/privacy/binding.py: the data root and the label table, recorded in the shards' ``shard.json``), so
preprocessing the same records into another folder finds the spend already there, and another dataset that
happens to share the site's name never does. Every read-modify-write holds an exclusive lock (``fcntl.flock`` on
``<ledger>.lock``) from load to save: jobs admitted at once, or an evaluation overlapping a training, each see
the others' charges and none writes back a stale copy.

Each entry is one Gaussian mechanism applied ``steps`` times at sampling rate ``sample_rate`` with noise
multiplier ``noise_multiplier`` (a DP-SGD training: rounds x local steps at q = batch / records; noised
evaluations: one step at q = 1 per evaluation round or per model an evaluation job scores). What the site has
spent is the composition of all entries by the site's accountant (its budget's: RDP, Mironov 2017, or PRV, Gopi et
al. 2021; common/accounting.py) at the budget's delta: not the sum of the entries' epsilons, which would
overstate it.
"""

from __future__ import annotations

import fcntl
import json
import os
import stat
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path

from common.accounting import ACCOUNTANTS, RDP, Accountant, SubsampledGaussian
from common.formats import check as check_format
from common.formats import stamp
from common.notice import notice
from federated.privacy.policy import PrivacyRefused, SiteBudget
from preprocessing.shard_format import BINDING_FIELD, SHARD_FILE

LEDGER_SUFFIX = ".privacy-ledger.json"
STATE_ENV = "FEDAUC_SITE_STATE"
DEFAULT_STATE_DIR = "~/.fedauc/site-state"


def state_dir() -> Path:
    """The site's state directory: where its ledger lives, whatever folder its shards are written to."""
    return Path(os.environ.get(STATE_ENV) or DEFAULT_STATE_DIR).expanduser()


def ledger_path(shard_dir: str | Path) -> Path:
    """The ledger of the site whose shards are in ``shard_dir`` (the shard writer names that folder after the
    site): in the site's state directory, for the data the shards were written from, so every copy of them shares
    it. Whether that ledger may be used is ``binding.guarded_ledger``'s to say."""
    return site_ledger_path(Path(shard_dir).name, shard_binding(shard_dir))


def shard_binding(shard_dir: str | Path) -> str | None:
    """The binding id of the data the shards in ``shard_dir`` were written from (None: written before bindings)."""
    info = Path(shard_dir) / SHARD_FILE
    return json.loads(info.read_text()).get(BINDING_FIELD) if info.is_file() else None


def site_ledger_path(site: str, binding: str | None) -> Path:
    """Site ``site``'s ledger for the data of binding id ``binding`` (None: shards written before ledgers were
    bound, whose ledger is keyed by the name alone)."""
    return state_dir() / (f"{site}{LEDGER_SUFFIX}" if binding is None else f"{site}.{binding}{LEDGER_SUFFIX}")


def write_private(path: Path, body: dict) -> None:
    """``body`` as JSON at ``path``, atomically, created 0600 (never readable by others, not even for a moment)."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)  # O_CREAT's mode is masked by the umask; this is not
    with os.fdopen(fd, "w") as f:
        json.dump(body, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


@dataclass
class Entry:
    job: str  # the training's job key (federated/dp/site.py), or what an evaluation job scored
    what: str  # "training" or "evaluation"
    noise_multiplier: float
    sample_rate: float
    steps: int
    when: float = field(default_factory=time.time)
    attempt: str = ""  # one run of the job (a resume is another); its entries are settled to what it sent

    @property
    def mechanism(self) -> SubsampledGaussian:
        return SubsampledGaussian(self.noise_multiplier, self.sample_rate, self.steps)


@dataclass
class BudgetEvent:
    """One change of the site's budget: the budget after it (None: none), the one before, the epsilon then
    spent (at the delta of the stricter of the two), when, and how (the command the hospital ran)."""

    budget: dict | None
    previous: dict | None
    spent: float
    how: str
    when: float = field(default_factory=time.time)

    def line(self, site: str) -> str:
        return (f"site {site!r}: privacy budget {show_budget(self.previous)} -> {show_budget(self.budget)} "
                f"({self.how}; epsilon spent then {self.spent:.3g})")


def show_budget(budget: dict | None) -> str:
    if budget is None:
        return "none"
    accountant = budget.get("accountant", RDP.name)
    return f"(epsilon {budget['epsilon']:g}, delta {budget['delta']:g}{'' if accountant == RDP.name else ', ' + accountant})"


def epsilon(entries: list[Entry], delta: float, accountant: Accountant = RDP) -> float:
    """The epsilon at ``delta`` of all ``entries`` composed by ``accountant``."""
    return accountant.epsilon((e.mechanism for e in entries), delta)


def lower(first: SiteBudget | None, second: SiteBudget | None) -> SiteBudget | None:
    """The stricter of two budgets, coordinate-wise (None: no budget, the loosest), composed by the first's
    accountant."""
    if first is None or second is None:
        return first or second
    return SiteBudget(epsilon=min(first.epsilon, second.epsilon), delta=min(first.delta, second.delta),
                      accountant=first.accountant)


@dataclass
class Ledger:
    path: Path | None  # None: a site without a ledger (no budget)
    budget: SiteBudget | None = None
    entries: list[Entry] = field(default_factory=list)
    events: list[BudgetEvent] = field(default_factory=list)
    site_yaml: str | None = None  # the site YAML preprocess read: admission re-reads its budget (a lowered one holds)
    exists: bool = True  # False: no file at ``path`` yet

    @classmethod
    def load(cls, path: str | Path | None) -> Ledger:
        """The ledger at ``path``; none there: no budget and nothing spent. One readable by others, or one that is
        not a ledger, is refused in one line."""
        if path is None:
            return cls(None, exists=False)
        path = Path(path)
        if not path.exists():
            return cls(path, exists=False)
        mode = stat.S_IMODE(path.stat().st_mode)
        if mode & 0o077:
            raise PrivacyRefused(f"{path}: the privacy ledger has mode {mode:o}; it must be owner-only "
                                 f"(chmod 600 {path})")
        try:
            raw = json.loads(path.read_text())
        except (OSError, ValueError) as err:
            raise PrivacyRefused(f"{path}: the privacy ledger is unreadable ({type(err).__name__}); every job is "
                                 "refused until it is restored from the site's backup") from None
        raw = check_format("privacy-ledger", raw, path)
        try:
            budget = raw.get("budget")
            return cls(path, None if budget is None else SiteBudget.model_validate(budget),
                       [Entry(**e) for e in raw.get("entries", [])],
                       [BudgetEvent(**e) for e in raw.get("events", [])], raw.get("site_yaml"))
        except (OSError, ValueError, TypeError, AttributeError) as err:
            raise PrivacyRefused(f"{path}: the privacy ledger is unreadable ({type(err).__name__}); every job is "
                                 "refused until it is restored from the site's backup") from None

    def save(self) -> None:
        """Write it atomically, owner-only (``write_private``)."""
        write_private(self.path, stamp("privacy-ledger", {
            "budget": None if self.budget is None else self.budget.model_dump(),
            "entries": [asdict(e) for e in self.entries], "events": [asdict(e) for e in self.events],
            "site_yaml": self.site_yaml}))
        self.exists = True

    def spent(self, delta: float, accountant: Accountant = RDP) -> float:
        return epsilon(self.entries, delta, accountant)

    def settle(self, attempt: str, steps: dict[str, int]) -> None:
        """Set the entries of run ``attempt`` to the steps it released (``what`` -> steps); none: dropped."""
        for e in self.entries:
            if e.attempt == attempt:
                e.steps = min(e.steps, steps.get(e.what, 0))
        self.entries = [e for e in self.entries if e.steps > 0 or e.attempt != attempt]


@contextmanager
def locked(*paths: Path | None) -> Iterator[dict[Path, Ledger]]:
    """The ledgers at ``paths``, each loaded under its exclusive lock, held until the block ends (taken in one
    order, so two processes locking the same ledgers cannot deadlock). Save inside the block."""
    with ExitStack() as stack:
        ledgers = {}
        for path in sorted({Path(p) for p in paths if p is not None}):
            path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            fd = os.open(path.with_name(path.name + ".lock"), os.O_RDWR | os.O_CREAT, 0o600)
            stack.callback(os.close, fd)
            fcntl.flock(fd, fcntl.LOCK_EX)
            ledgers[path] = Ledger.load(path)
        yield ledgers


def site_ledger(site: str, path: Path | None, ledgers: dict[Path, Ledger], declared: SiteBudget | None
                ) -> tuple[Ledger, SiteBudget | None]:
    """Site ``site``'s ledger and the budget admission holds it to (failing closed): a site whose shards declare a
    budget refuses every job, in one line, where its ledger is missing; the budget is the stricter of the shards',
    the ledger's and its site YAML's now (an edit that lowers it holds at once; raising takes
    ``fedauc preprocess --raise-budget``), said in one line where they differ."""
    ledger = ledgers[Path(path)] if path is not None else Ledger(None, exists=False)
    if declared is not None and not ledger.exists:
        raise PrivacyRefused(f"site {site!r} refuses every job: its shards declare a privacy budget (epsilon "
                             f"{declared.epsilon:g}, delta {declared.delta:g}) and its privacy ledger is missing; "
                             "restore it from the site's backup (a ledger is never recreated empty)")
    sources = {"ledger": ledger.budget, "shards": declared, "site YAML": _yaml_budget(ledger.site_yaml)}
    effective = None
    for budget in sources.values():
        effective = lower(effective, budget)
    if ledger.budget is not None and any(b is not None and b != effective for b in sources.values()):
        notice(f"site {site!r}: privacy budgets differ ({', '.join(f'{k} {show_budget(_dump(b))}' for k, b in sources.items())}"
               f"); the stricter, {show_budget(_dump(effective))}, applies")
    return ledger, effective


def _dump(budget: SiteBudget | None) -> dict | None:
    return None if budget is None else budget.model_dump()


def _yaml_budget(site_yaml: str | None) -> SiteBudget | None:
    """The budget the site YAML says now (None: none, or the YAML is gone: the ledger's then holds)."""
    if site_yaml is None or not Path(site_yaml).is_file():
        return None
    import yaml

    declared = (yaml.safe_load(Path(site_yaml).read_text()) or {}).get("privacy")
    return None if declared is None else SiteBudget.model_validate(declared)


def budget_report(site: str, ledger: Ledger, budget: SiteBudget) -> dict:
    """What a site reports of its budget with a job it admitted (MLflow, ``fedauc consortium status``): the epsilon
    it held the job to and its ledger's last budget change, in one line."""
    last = ledger.events[-1] if ledger.events else None
    when = None if last is None else time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(last.when))
    return {"budget_epsilon": budget.epsilon, "budget_change": None if last is None else f"{when}: {last.line(site)}"}


def check_delta(site: str, delta: float, records: int) -> None:
    """Refuse a delta of at least 1/records: a mechanism that publishes one random record in the clear is
    (0, 1/records)-DP, so such a delta bounds nothing (and the accountant's epsilon can turn negative)."""
    if records and delta >= 1.0 / records:
        raise PrivacyRefused(f"site {site!r} refuses the job: delta {delta:g} is not below 1 / its number of training "
                             "records, so (epsilon, delta) would allow publishing a record in the clear; set "
                             "privacy.delta (or --dp's delta) well below that, e.g. 1e-5")


def admit(site: str, ledger: Ledger, job: list[Entry], budget: SiteBudget | None = None) -> dict:
    """Refuse ``job`` in one line naming the site, the job's cost and what remains if it would take the ledger over
    ``budget`` (default: the ledger's; composed by its accountant); else what the site will have spent once the
    caller charges it: {"epsilon_job", "epsilon_spent", "epsilon_remaining"}."""
    budget = budget or ledger.budget
    accountant = ACCOUNTANTS[budget.accountant]
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
