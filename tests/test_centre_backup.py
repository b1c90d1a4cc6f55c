"""The centre backed up and restored onto an empty folder (pipelines/centre_backup.py): a real MLflow store with
a registered champion, Prefect's database (made by its own migrations), a provisioned consortium and its
federation and site YAMLs go into `fedauc centre backup`; the original folder is deleted; `fedauc centre restore` onto an empty folder gives a store whose runs, versions and
champion are those backed up, whose models load from the restored artifacts, kits still owner-only and signed by
their root, and a training there registers the next version against the same champion."""

from __future__ import annotations

import os
import shutil
import sqlite3
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from mlflow import MlflowClient
from typer.testing import CliRunner

from federated import schema
from federated.flare.centre.provision import project, provision
from federated.flare.site.start import check_certificate, read_kit
from pipelines.cli import app
from pipelines.evaluations import model_to_score
from pipelines.tracking import configure
from preprocessing.federation import load_federation

pytestmark = pytest.mark.slow
runner = CliRunner()
MODEL = "fedauc-melanoma"


def _train(federation, shards, run_name: str) -> None:
    result = runner.invoke(app, ["train", "--federation", str(federation), "--shards", str(shards), "--algorithm",
                                 "codasca", "-p", "T0=4", "--rounds", "1", "--local-steps", "2", "--batch-size", "16",
                                 "--eval-every", "1", "--run-name", run_name])
    assert result.exit_code == 0, result.output


def _prefect_revision(database: Path) -> str:
    db = sqlite3.connect(database)
    try:
        assert db.execute("PRAGMA integrity_check").fetchone() == ("ok",)
        return db.execute("SELECT version_num FROM alembic_version").fetchone()[0]
    finally:
        db.close()


def _history(client: MlflowClient) -> tuple:
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
    versions = client.search_model_versions(f"name = '{MODEL}'")
    # repr: undefined AUCs are NaN, which equals nothing
    return (sorted((r.info.run_name, r.info.status, repr(sorted(r.data.metrics.items()))) for r in runs),
            sorted((str(v.version), v.run_id) for v in versions),
            str(client.get_model_version_by_alias(MODEL, schema.CHAMPION_ALIAS).version))


def test_a_restored_centre_trains_again_with_its_champion_and_history(melanoma_shards, tmp_path, monkeypatch):
    root, federation = melanoma_shards
    centre = tmp_path / "centre"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{centre / 'mlruns.db'}")
    # Prefect's own database, made by its own migrations (as `prefect server start` makes it)
    prefect_url = f"sqlite+aiosqlite:///{centre / 'prefect.db'}"
    centre.mkdir()
    subprocess.run([str(Path(sys.executable).parent / "prefect"), "server", "database", "upgrade", "-y"], check=True,
                   env={**os.environ, "PREFECT_HOME": str(centre), "PREFECT_API_DATABASE_CONNECTION_URL": prefect_url},
                   capture_output=True, timeout=300)
    migrated = _prefect_revision(centre / "prefect.db")
    monkeypatch.delenv("PREFECT_API_DATABASE_CONNECTION_URL", raising=False)
    _train(federation, root / "shards", "before-backup")
    before = _history(MlflowClient())
    kits = provision(project(load_federation(federation), "localhost", 8002), centre / "kits")

    backup = tmp_path / "backup"
    settings = [federation, *(root / f"{site}.yaml" for site in ("vienna", "barcelona", "new-york"))]
    made = runner.invoke(app, ["centre", "backup", str(backup), "--provisioning", str(centre / "kits"),
                               "--prefect-db", prefect_url, *(arg for path in settings for arg in ("--settings", str(path)))])
    assert made.exit_code == 0, made.output
    assert stat.S_IMODE(backup.stat().st_mode) == 0o700
    assert all(stat.S_IMODE(p.stat().st_mode) == 0o600 for p in backup.rglob("*") if p.is_file())
    shutil.rmtree(centre)  # the centre's disk is gone

    restored = tmp_path / "restored"
    back = runner.invoke(app, ["centre", "restore", str(backup), "--to", str(restored)])
    assert back.exit_code == 0, back.output
    assert f"MLFLOW_TRACKING_URI=sqlite:///{restored / 'mlruns.db'}" in back.output
    assert f"PREFECT_API_DATABASE_CONNECTION_URL=sqlite+aiosqlite:///{restored / 'prefect.db'}" in back.output
    assert _prefect_revision(restored / "prefect.db") == migrated and migrated
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{restored / 'mlruns.db'}")
    configure()  # as every fedauc command starts
    client = MlflowClient()
    assert _history(client) == before
    champion = before[2]
    _, weights = model_to_score("melanoma", champion)  # read from the restored artifacts
    assert weights and all(torch.isfinite(t).all() for t in weights.values() if t.is_floating_point())

    provisioning = restored / "provisioning" / kits.server.relative_to(centre / "kits").parent
    key = provisioning / "vienna" / "startup" / "client.key"
    assert stat.S_IMODE(key.stat().st_mode) == 0o600 and stat.S_IMODE(key.parent.stat().st_mode) == 0o700
    check_certificate(read_kit(provisioning / "vienna"))
    assert (restored / "settings" / federation.name).read_text() == federation.read_text()

    _train(restored / "settings" / federation.name, root / "shards", "after-restore")
    versions = sorted(str(v.version) for v in client.search_model_versions(f"name = '{MODEL}'"))
    assert versions == sorted([*(v for v, _ in before[1]), str(int(max(before[1])[0]) + 1)])
    assert str(client.get_model_version_by_alias(MODEL, schema.CHAMPION_ALIAS).version) in versions


def test_a_restore_refuses_a_folder_in_use_and_a_damaged_backup(tmp_path, monkeypatch):
    db = tmp_path / "mlruns.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{db}")
    monkeypatch.delenv("PREFECT_API_DATABASE_CONNECTION_URL", raising=False)
    configure()
    MlflowClient().search_experiments()  # creates the store
    made = runner.invoke(app, ["centre", "backup", str(tmp_path / "b")])
    assert made.exit_code == 0, made.output
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "mlruns.db").write_text("the running centre's")
    refused = runner.invoke(app, ["centre", "restore", str(tmp_path / "b"), "--to", str(busy)])
    assert refused.exit_code != 0 and f"{busy}: not empty" in refused.output
    with open(tmp_path / "b" / "mlruns.db", "ab") as damaged:
        damaged.write(b"\0")
    refused = runner.invoke(app, ["centre", "restore", str(tmp_path / "b"), "--to", str(tmp_path / "new")])
    assert refused.exit_code != 0 and "sha256 differs" in refused.output and not (tmp_path / "new").exists()
    postgres = runner.invoke(app, ["centre", "backup", str(tmp_path / "c"), "--mlflow", "postgresql://db/mlflow"])
    assert postgres.exit_code != 0 and "pg_dump" in postgres.output and "Traceback" not in postgres.output
    assert not (tmp_path / "c").exists()
