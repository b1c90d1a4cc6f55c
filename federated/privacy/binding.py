"""Which data a site's privacy ledger guards (docs/privacy.md section 2).

A site's name alone does not identify its records: two federations may each have a site ``north``, on one
machine, in one user's state directory. So a ledger is bound to its data: a fingerprint of the resolved data root
and of the label table's bytes (the metadata files the adapter reads), hashes only, nothing patient-level. The
ledger is found by the site's name and that binding's id (``<site>.<id>.privacy-ledger.json``, the id recorded in
the shards' ``shard.json``), and the binding itself sits beside it (``<site>.<id>.privacy-binding.json``, 0600).

A site whose data has no ledger of its own while a ledger of its name guards other data (another root, another
label table) is refused in one line, at preprocessing and at every job, until the operator says which it is:
``fedauc sites ledger <site.yaml> --moved`` (the same records moved or re-exported: that ledger, its budget and
its spend follow them) or ``--new-dataset`` (other records: a fresh ledger; the other one stays, untouched, for
its own data). Never failing open: a ledger whose binding is missing, unreadable or does not match its name is
refused too, and only a ledger that has neither a budget nor any spend is not counted as another's. Shards
written before bindings (no ``ledger_binding`` in their ``shard.json``) keep the ledger named by the site alone
until they are preprocessed again; their site's bound ledgers count as other data's.
"""

from __future__ import annotations

import hashlib
import json
import re
import stat
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from common.errors import DataError
from common.formats import check as check_format
from common.formats import stamp
from federated.privacy.ledger import (
    LEDGER_SUFFIX,
    Ledger,
    locked,
    shard_binding,
    site_ledger_path,
    state_dir,
    write_private,
)
from federated.privacy.policy import PrivacyRefused

BINDING_SUFFIX = ".privacy-binding.json"
ID_CHARS = 16
SAY_WHICH = ("say which it is: fedauc sites ledger {yaml} --moved (the same records moved or re-exported: the "
             "ledger and its spent budget follow them) or --new-dataset (other records: a fresh ledger; the other "
             "stays for its own data)")


@dataclass
class Binding:
    """The data a ledger guards: hashes of the resolved root path and of the label table, and how it came to be."""

    root_sha256: str
    labels_sha256: str
    bound: float = field(default_factory=time.time)
    history: list[dict] = field(default_factory=list)  # earlier bindings: {"id", "how", "when"}

    @property
    def id(self) -> str:
        return hashlib.sha256(f"{self.root_sha256}\0{self.labels_sha256}".encode()).hexdigest()[:ID_CHARS]

    def differs(self, other: Binding) -> str:
        parts = [what for what, mine, theirs in (("data root", self.root_sha256, other.root_sha256),
                                                 ("label table", self.labels_sha256, other.labels_sha256))
                 if mine != theirs]
        return " and ".join(parts)


def data_binding(root: Path, label_files: Iterable[Path]) -> Binding:
    """The binding of the records under ``root`` labelled by ``label_files`` (their bytes, in name order)."""
    labels = hashlib.sha256()
    for path in sorted(Path(p) for p in label_files):
        labels.update(f"\0{path.name}\0".encode())
        with path.open("rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                labels.update(block)
    return Binding(hashlib.sha256(str(Path(root).resolve()).encode()).hexdigest(), labels.hexdigest())


def binding_path(ledger: Path) -> Path:
    return ledger.with_name(ledger.name[: -len(LEDGER_SUFFIX)] + BINDING_SUFFIX)


def read_binding(ledger: Path) -> Binding | None:
    """The binding beside ``ledger``; None where it is missing, unreadable, readable by others, or not the one the
    ledger's name says (altered): each of them refuses the ledger."""
    path = binding_path(ledger)
    try:
        if stat.S_IMODE(path.stat().st_mode) & 0o077:
            return None
        binding = Binding(**check_format("privacy-binding", json.loads(path.read_text()), path))
    except (OSError, ValueError, TypeError, DataError):
        return None
    return binding if ledger.name.endswith(f".{binding.id}{LEDGER_SUFFIX}") else None


def write_binding(ledger: Path, binding: Binding) -> None:
    write_private(binding_path(ledger), stamp("privacy-binding", asdict(binding)))


def other_ledgers(site: str, binding_id: str | None) -> list[Path]:
    """The ledgers of site ``site`` for other data than ``binding_id``'s that guard something (a budget or a spend;
    an unreadable one counts: it may)."""
    pattern = re.compile(rf"{re.escape(site)}(\.[0-9a-f]{{{ID_CHARS}}})?{re.escape(LEDGER_SUFFIX)}")
    found = []
    for path in sorted(state_dir().glob(f"{site}*{LEDGER_SUFFIX}")):
        if not pattern.fullmatch(path.name) or path == site_ledger_path(site, binding_id):
            continue
        try:
            ledger = Ledger.load(path)
            if ledger.budget is None and not ledger.entries:
                continue
        except (PrivacyRefused, DataError):
            pass
        found.append(path)
    return found


def check_binding(site: str, binding_id: str | None, site_yaml: str = "<the site's YAML>") -> Path:
    """Site ``site``'s ledger for the data of ``binding_id``, once it may be used (module docstring); else
    ``PrivacyRefused`` in one line naming the ledger and the command that settles it. By file names only: a
    preprocess flow's refusal reaches the consortium's Prefect server, which gets no path of the hospital's."""
    site_yaml = Path(site_yaml).name
    path = site_ledger_path(site, binding_id)
    if path.exists():
        # Shards written before bindings keep the ledger named by the site alone, as before, until preprocessed again.
        if binding_id is not None and read_binding(path) is None:
            raise PrivacyRefused(
                f"site {site!r} refuses every job: its privacy ledger {path.name} has no readable record of the data it "
                f"guards ({binding_path(path).name} missing, unreadable or altered); restore it from the site's "
                f"backup, or, if this ledger does guard this site's data, {SAY_WHICH.format(yaml=site_yaml)}")
        return path
    others = other_ledgers(site, binding_id)
    if others:
        data = f"binding {binding_id}" if binding_id else "shards written before ledgers were bound: preprocess again"
        more = f" (and {len(others) - 1} more)" if len(others) > 1 else ""
        raise PrivacyRefused(f"site {site!r} refuses every job: its data ({data}) is not what its privacy ledger "
                             f"{others[0].name}{more} guards; {SAY_WHICH.format(yaml=site_yaml)}")
    return path


def guarded_ledger(shard_dir: str | Path) -> Path:
    """The ledger of the site whose shards are in ``shard_dir``, checked against the data they were written from
    (what a training or an evaluation reads)."""
    return check_binding(Path(shard_dir).name, shard_binding(shard_dir))


def rebind(site: str, binding: Binding, how: str, source: str | None = None) -> str:
    """``fedauc sites ledger``: bind site ``site``'s data ``binding`` to a ledger as the operator says; ``how``:
    "moved" (the one other ledger of the site, or ``source``'s id, with its budget and spend, now guards this data)
    or "new-dataset" (a fresh, empty ledger; the others stay). The one line to print."""
    path = site_ledger_path(site, binding.id)
    if path.exists() and read_binding(path) is not None:
        return f"site {site!r}: its privacy ledger {path} already guards this data; nothing to do"
    if how == "new-dataset":
        if path.exists():
            raise PrivacyRefused(f"site {site!r}: {path} holds this data's ledger already, without a readable "
                                 "binding; restore the binding from the site's backup, or bind it: --moved")
        with locked(path) as ledgers:
            binding.history.append({"id": None, "how": "new dataset", "when": time.time()})
            write_binding(path, binding)
            ledgers[path].save()
        return f"site {site!r}: a new privacy ledger {path} guards this data (the site's other ledgers are kept)"
    sources = [path] if path.exists() else other_ledgers(site, binding.id)
    if source is not None:
        sources = [p for p in sources if f".{source}{LEDGER_SUFFIX}" in p.name]
    if len(sources) != 1:
        raise PrivacyRefused(f"site {site!r}: {len(sources)} ledgers could be the one that moved "
                             f"({', '.join(p.name for p in sources) or 'none'}); name it: --from <its binding id>")
    old = sources[0]
    with locked(old, path) as ledgers:
        previous = read_binding(old)
        if previous is not None:
            binding.history = [*previous.history, {"id": previous.id, "how": "moved", "when": time.time()}]
        else:
            binding.history.append({"id": None, "how": f"bound to {old.name}", "when": time.time()})
        write_binding(path, binding)
        if old != path:
            ledgers[old].path = path
            ledgers[old].save()
            old.unlink()  # its content is at ``path`` now, its old binding in the history
            binding_path(old).unlink(missing_ok=True)
    return f"site {site!r}: privacy ledger {old} now guards this data at {path} (its budget and spend kept)"
