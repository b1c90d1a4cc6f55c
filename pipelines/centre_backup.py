"""The coordinating centre's state, backed up into one folder and restored onto another (``fedauc centre
backup`` / ``fedauc centre restore``; docs/consortium.md "Backup and restore").

What the centre holds: MLflow's store (its SQLite database: runs, metrics, registered models, the champion
alias; and its artifact folder: the models' files), Prefect's SQLite database (deployments, schedules, flow
runs), the provisioning folder (``fedauc consortium provision --out``: the root CA's key in its ``state/``,
every kit) and the consortium's settings (federation YAMLs). The databases are copied with SQLite's own online
backup (``sqlite3.Connection.backup``: a consistent copy while the servers run), the folders as tar archives
that keep their modes (the provisioning folder is owner-only). A PostgreSQL store is backed up with its own
tools (``pg_dump``), which this refuses to replace.

An embedded MLflow store records its artifacts by absolute ``file://`` URI; a restore onto another folder
rewrites the URIs under the old artifact folder to the new one, so the restored store reads its models there.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sqlite3
import tarfile
from pathlib import Path

from common.errors import ConfigError
from common.formats import check as check_format
from common.formats import stamp

MANIFEST = "centre-backup.json"
MLFLOW_DB, PREFECT_DB = "mlruns.db", "prefect.db"
ARTIFACTS, PROVISIONING, SETTINGS = "mlartifacts", "provisioning", "settings"


def sqlite_path(uri: str, what: str) -> Path:
    """The file of a SQLite URI (``sqlite:///...``, ``sqlite+aiosqlite:///...``); other stores are refused."""
    scheme, sep, rest = uri.partition(":///")
    if not sep or scheme.split("+")[0] != "sqlite":
        raise ConfigError(f"{what} is not a SQLite store ({scheme}://...): back it up with its database's own tools",
                          fix="PostgreSQL: `pg_dump -Fc <database> > <file>`, restored with `pg_restore -d <database> "
                              "<file>`; then back up the rest with this command without that store")
    return Path("/" + rest.lstrip("/"))


def _copy_sqlite(source: Path, target: Path) -> None:
    if not source.is_file():
        raise ConfigError(f"{source}: no such database", fix="name the store the centre's server uses")
    os.close(os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600))
    src, dst = sqlite3.connect(f"file:{source}?mode=ro", uri=True), sqlite3.connect(target)
    try:
        src.backup(dst)
    finally:
        src.close()
        dst.close()


def _tar(folder: Path, target: Path) -> None:
    if not folder.is_dir():
        raise ConfigError(f"{folder}: no such folder", fix="name the folder the centre uses")
    with tarfile.open(target, "w") as archive:
        archive.add(folder, arcname=".")


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def backup(dest: str | Path, mlflow_uri: str, artifacts: Path | None, prefect_uri: str | None,
           provisioning: Path | None, settings: list[Path]) -> Path:
    """Write the centre's state into the new folder ``dest`` (owner-only); returns its manifest."""
    dest = Path(dest).resolve()
    database = sqlite_path(mlflow_uri, "the MLflow store")
    prefect = sqlite_path(prefect_uri, "the Prefect database") if prefect_uri else None
    if dest.exists() and any(dest.iterdir()):
        raise ConfigError(f"{dest}: not empty; a backup goes into a folder of its own", fix="name a new folder")
    dest.mkdir(parents=True, exist_ok=True, mode=0o700)
    dest.chmod(0o700)
    parts: dict[str, dict] = {}
    _copy_sqlite(database, dest / MLFLOW_DB)
    parts[MLFLOW_DB] = {"from": str(database)}
    artifacts = Path(artifacts or database.parent / ARTIFACTS).resolve()
    if artifacts.is_dir():
        _tar(artifacts, dest / f"{ARTIFACTS}.tar")
        parts[f"{ARTIFACTS}.tar"] = {"from": str(artifacts), "uri": artifacts.as_uri()}
    if prefect is not None:
        _copy_sqlite(prefect, dest / PREFECT_DB)
        parts[PREFECT_DB] = {"from": str(prefect)}
    if provisioning:
        _tar(Path(provisioning).resolve(), dest / f"{PROVISIONING}.tar")
        parts[f"{PROVISIONING}.tar"] = {"from": str(Path(provisioning).resolve())}
    for path in settings:
        (dest / SETTINGS).mkdir(exist_ok=True, mode=0o700)
        shutil.copy2(path, dest / SETTINGS / Path(path).name)
        parts[f"{SETTINGS}/{Path(path).name}"] = {"from": str(Path(path).resolve())}
    for name, part in parts.items():
        (dest / name).chmod(0o600)
        part["sha256"] = _digest(dest / name)
    manifest = dest / MANIFEST
    manifest.write_text(json.dumps(stamp("centre-backup", {"parts": parts}), indent=1))
    manifest.chmod(0o600)
    return manifest


def _rewrite_artifact_uris(database: Path, old: str, new: str) -> int:
    """Every text value of the store that starts with ``old`` (the backed-up artifact folder's URI) starts with
    ``new`` instead; returns how many were rewritten."""
    changed = 0
    with sqlite3.connect(database) as db:
        tables = [row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        for table in tables:
            for column in db.execute(f'PRAGMA table_info("{table}")').fetchall():
                if "CHAR" in column[2].upper() or "TEXT" in column[2].upper():
                    changed += db.execute(
                        f'UPDATE "{table}" SET "{column[1]}" = ? || substr("{column[1]}", ?) '
                        f'WHERE substr("{column[1]}", 1, ?) = ?', (new, len(old) + 1, len(old), old)).rowcount
    db.close()
    return changed


def restore(source: str | Path, to: str | Path) -> dict[str, Path]:
    """Unpack backup ``source`` onto the empty folder ``to`` after checking every part against the manifest;
    returns where each part now is (``mlflow``, ``artifacts``, ``prefect``, ``provisioning``, ``settings``)."""
    source, to = Path(source).resolve(), Path(to).resolve()
    manifest_path = source / MANIFEST
    if not manifest_path.is_file():
        raise ConfigError(f"{source}: not a centre backup (no {MANIFEST})", fix="name the folder `fedauc centre backup` wrote")
    parts = check_format("centre-backup", json.loads(manifest_path.read_text()), manifest_path)["parts"]
    for name, part in parts.items():
        if not (source / name).is_file() or _digest(source / name) != part["sha256"]:
            raise ConfigError(f"{source / name}: missing or not the file that was backed up (sha256 differs)",
                              fix="restore from an intact copy of the backup")
    if to.exists() and any(to.iterdir()):
        raise ConfigError(f"{to}: not empty; a restore never overwrites a centre's state", fix="name an empty folder")
    to.mkdir(parents=True, exist_ok=True, mode=0o700)
    to.chmod(0o700)
    where = {"mlflow": to / MLFLOW_DB}
    shutil.copy2(source / MLFLOW_DB, to / MLFLOW_DB)
    if f"{ARTIFACTS}.tar" in parts:
        where["artifacts"] = to / ARTIFACTS
        with tarfile.open(source / f"{ARTIFACTS}.tar") as archive:
            archive.extractall(where["artifacts"], filter="tar")
        _rewrite_artifact_uris(to / MLFLOW_DB, parts[f"{ARTIFACTS}.tar"]["uri"], where["artifacts"].as_uri())
    if PREFECT_DB in parts:
        where["prefect"] = to / PREFECT_DB
        shutil.copy2(source / PREFECT_DB, where["prefect"])
    if f"{PROVISIONING}.tar" in parts:
        where["provisioning"] = to / PROVISIONING
        with tarfile.open(source / f"{PROVISIONING}.tar") as archive:
            archive.extractall(where["provisioning"], filter="tar")  # modes as they were: owner-only
    if (source / SETTINGS).is_dir():
        where["settings"] = to / SETTINGS
        shutil.copytree(source / SETTINGS, where["settings"])
    return where
