"""What the suite would otherwise pay again and again, paid once (tests/conftest.py takes these fixtures and
starts the Prefect migrations): new MLflow stores and Prefect databases without their migrations each time, and
flow runs without a heartbeat's wait.

MLflow makes a new SQLite store by creating its first tables and running its Alembic migrations one by one:
about 1 CPU s on a quiet core and several under the suite's load, in each of the many tests that point
MLflow at a store of their own. Each worker migrates one empty store once, and every new SQLite store its
process opens gets that store's schema and Alembic revision, copied with SQLite's backup API; a test whose
`fedauc` command (a process of its own) makes the store copies it there first (``new_mlflow_store``). What
MLflow does next (the default experiment, the schema check at the head revision) is its own, as with a store
it migrated itself.

Prefect's server migrates a new database (PREFECT_HOME/prefect.db) at its start: about 5 CPU s on a quiet core,
for each worker's own home, each module's Prefect server and each `fedauc` command given a home of its own.
pytest's first process runs those migrations once, in the background while the workers start
(``start_migrated_prefect_db``); ``seed_prefect_home`` puts a copy in a new home before its server starts, and
``start_prefect_server`` starts a server of the tests' own on such a home."""

from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

PREFECT_DB_ENV = "FEDAUC_TEST_MIGRATED_PREFECT_DB"  # where the migrated database will be (workers inherit it)
_MIGRATED, _FAILED = "migrated.db", "failed"


def start_migrated_prefect_db(folder: str) -> None:
    """Prefect's own migrations of an empty database in ``folder``, in a process of their own; the database is
    renamed to its final name once they are done (``failed`` instead if they fail)."""
    if Path(os.environ.get(PREFECT_DB_ENV, "/nonexistent")).is_file():
        return  # pytest run by a test (tests/test_suite_schedule.py): the outer run's database
    home = Path(folder) / "prefect-migrated"
    home.mkdir()
    env = {name: value for name, value in os.environ.items()
           if name not in ("PREFECT_API_URL", "PREFECT_API_DATABASE_CONNECTION_URL")}
    prefect = str(Path(sys.executable).parent / "prefect")
    with open(home / "upgrade.log", "wb") as log:
        subprocess.Popen(["sh", "-c", f'"$0" server database upgrade -y && mv prefect.db {_MIGRATED} || touch {_FAILED}',
                          prefect], cwd=home, env={**env, "PREFECT_HOME": str(home)}, stdout=log,
                         stderr=subprocess.STDOUT, start_new_session=True)
    os.environ[PREFECT_DB_ENV] = str(home / _MIGRATED)


def seed_prefect_home(home: Path) -> None:
    """A copy of the migrated database in Prefect home ``home`` (made if missing) that has none yet; where the
    migrations failed or were not started, Prefect's server migrates its database itself."""
    migrated = Path(os.environ.get(PREFECT_DB_ENV, "/nonexistent"))
    if (home / "prefect.db").exists() or not migrated.parent.is_dir():
        return
    deadline = time.monotonic() + 120
    while not migrated.exists() and not (migrated.parent / _FAILED).exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    if migrated.exists():
        home.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(migrated, home / "prefect.db")


def start_prefect_server(home: Path, **settings: str) -> tuple[subprocess.Popen, str]:
    """``prefect server start`` with its own home and database on a free port, ``settings`` in its environment;
    the process and its API URL, once it answers."""
    from pipelines.servers import free_port, start_server

    port = free_port()
    home.mkdir(parents=True, exist_ok=True)  # its log goes there even where no migrated database is copied
    if "PREFECT_API_DATABASE_CONNECTION_URL" not in settings:  # PostgreSQL's is migrated by the server itself
        seed_prefect_home(home)
    env = {**os.environ, "PREFECT_HOME": str(home), "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
           "PREFECT_UI_ENABLED": "false", **settings}
    env.pop("PREFECT_API_URL", None)
    process = start_server("Prefect", [str(Path(sys.executable).parent / "prefect"), "server", "start", "--host",
                                       "127.0.0.1", "--port", str(port)], f"http://127.0.0.1:{port}/api/health",
                           port, home / "server.log", env=env, timeout_s=180)
    return process, f"http://127.0.0.1:{port}/api"


@pytest.fixture(scope="session", autouse=True)
def migrated_prefect_home():
    """The worker's own Prefect home, seeded when Prefect first starts its temporary server there (a module
    that runs no flow waits for no migration)."""
    from prefect.server.api.server import SubprocessASGIServer

    start = SubprocessASGIServer.start

    def seeded_start(server, *args, **kwargs):
        seed_prefect_home(Path(os.environ["PREFECT_HOME"]))
        return start(server, *args, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(SubprocessASGIServer, "start", seeded_start)
        yield


@pytest.fixture(scope="session")
def _migrated_store(tmp_path_factory):
    """The worker's migrated empty store, made by the first test that needs it (MLflow's own migrations), and
    MLflow's migration as it was (for stores that are not SQLite files)."""
    import mlflow.store.db.utils as db_utils
    from sqlalchemy import create_engine

    migrate = db_utils._initialize_tables
    template = tmp_path_factory.getbasetemp() / "mlflow-schema.db"

    def path() -> Path:
        if not template.exists():
            engine = create_engine(f"sqlite:///{template}")
            migrate(engine)
            engine.dispose()
        return template

    return path, migrate


@pytest.fixture(scope="session", autouse=True)
def migrated_mlflow_schema(_migrated_store):
    import mlflow.store.db.utils as db_utils
    from mlflow.store.model_registry import sqlalchemy_store as registry_store

    template, migrate = _migrated_store

    def copy_schema(engine) -> None:
        if engine.url.get_backend_name() != "sqlite":
            migrate(engine)
            return
        source = sqlite3.connect(template())
        try:
            with engine.connect() as connection:
                source.backup(connection.connection.driver_connection)
        finally:
            source.close()

    # The tracking store calls it through its module, the registry store through its own import of it.
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(db_utils, "_initialize_tables", copy_schema)
        patch.setattr(registry_store, "_initialize_tables", copy_schema)
        yield


@pytest.fixture
def new_mlflow_store(_migrated_store):
    """``new_mlflow_store(path)``: an empty migrated store at ``path`` (a new file), its tracking URI."""
    template, _ = _migrated_store

    def copy(path: Path) -> str:
        shutil.copyfile(template(), path)
        return f"sqlite:///{path}"

    return copy


@pytest.fixture(scope="session", autouse=True)
def no_flow_run_heartbeats():
    """Flow runs in the tests' processes send Prefect no heartbeats: the heartbeat thread sleeps in 1-s steps and
    a finishing run waits for the step to end, up to a second after each of the suite's flow runs. fedauc reads
    no heartbeat (no automation marks a silent run crashed); `fedauc` commands the tests start send theirs."""
    from prefect.settings import PREFECT_FLOWS_HEARTBEAT_FREQUENCY, temporary_settings

    with temporary_settings(updates={PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None}):
        yield
