"""A site's budget as ``fedauc preprocess`` declares it: every change is an event in the site's ledger (its time,
the budget before and after, the epsilon spent then), printed in one line; an edit of the site YAML can lower the
budget but never raise or remove it: that takes ``fedauc preprocess --raise-budget``, run by the hospital.

The shard writer also records the declared budget in the shards' ``shard.json`` (covered by their content hash),
where admission reads it (``ledger.site_ledger``): a site whose shards declare a budget and whose ledger is gone
refuses every job, instead of training as a site without one.
"""

from __future__ import annotations

import json
from pathlib import Path

from common.accounting import ACCOUNTANTS
from federated.privacy.binding import Binding, write_binding
from federated.privacy.ledger import BudgetEvent, Ledger, ledger_path, locked, show_budget
from federated.privacy.policy import PrivacyRefused, SiteBudget
from preprocessing.shard_format import SHARD_FILE


def declared_budget(shard_dir: str | Path) -> SiteBudget | None:
    """The budget the shards in ``shard_dir`` were written under (their ``shard.json``; None: none, or shards
    written before the field existed)."""
    info = Path(shard_dir) / SHARD_FILE
    if not info.is_file():
        return None
    declared = json.loads(info.read_text()).get("privacy")
    return None if declared is None else SiteBudget.model_validate(declared)


def _looser(new: SiteBudget | None, old: SiteBudget | None) -> bool:
    if old is None:
        return False
    # Another accountant may compose the same releases into a smaller epsilon: a change of it is a raise.
    return new is None or new.epsilon > old.epsilon or new.delta > old.delta or new.accountant != old.accountant


def set_budget(site: str, shard_dir: str | Path, budget: SiteBudget | None, raise_budget: bool = False,
               site_yaml: str | Path | None = None, declared_before: SiteBudget | None = None,
               binding: Binding | None = None) -> tuple[Path | None, str | None]:
    """Record the site YAML's ``budget`` in the site's ledger, as an event where it changes the ledger's;
    (the ledger's path, None for a site that never had a budget; the one line to print, None when nothing
    changed). A looser budget (or none) than the ledger's is kept out unless ``raise_budget``. ``site_yaml``: that
    YAML, whose budget admission reads again (``ledger.site_ledger``). ``declared_before``: the budget the shards
    in ``shard_dir`` declared before this run: with the ledger gone, refused (a new ledger would start at 0).
    ``binding``: the data the shards were written from, recorded beside a ledger this creates (binding.py)."""
    path = ledger_path(shard_dir)
    if budget is None and declared_before is None and not path.exists():
        # A site without a budget has no ledger to keep: not even a lock file in the site's state directory.
        return None, None
    with locked(path) as ledgers:
        ledger: Ledger = ledgers[path]
        if declared_before is not None and not ledger.exists:
            raise PrivacyRefused(f"site {site!r}: its shards were written under a privacy budget (epsilon "
                                 f"{declared_before.epsilon:g}, delta {declared_before.delta:g}) and its privacy "
                                 "ledger is missing; restore it from the site's backup before preprocessing again")
        old = ledger.budget
        if budget is None and not ledger.exists:
            return None, None
        if not ledger.exists and binding is not None:
            write_binding(path, binding)
        if site_yaml is not None and ledger.site_yaml != str(Path(site_yaml).resolve()):
            ledger.site_yaml = str(Path(site_yaml).resolve())
            ledger.save()
        if budget == old:
            return path, None
        delta = min(b.delta for b in (budget, old) if b is not None)
        spent = ledger.spent(delta, ACCOUNTANTS[(old or budget).accountant])
        if _looser(budget, old) and not raise_budget:
            return path, (f"site {site!r}: the site YAML's privacy budget {_dump(budget)} is looser than its ledger's "
                          f"{_dump(old)}, which stays (epsilon spent {spent:.3g}); to raise it, run fedauc "
                          "preprocess --raise-budget")
        how = "raised by fedauc preprocess --raise-budget" if _looser(budget, old) else "fedauc preprocess"
        event = BudgetEvent(None if budget is None else budget.model_dump(), None if old is None else old.model_dump(),
                            spent, how)
        ledger.budget = budget
        ledger.events.append(event)
        ledger.save()
        return path, event.line(site)


def _dump(budget: SiteBudget | None) -> str:
    return show_budget(None if budget is None else budget.model_dump())
