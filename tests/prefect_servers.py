"""The tests' own Prefect servers, beside the temporary one Prefect starts for each worker: a module's server
(``prefect_server``, its scheduler looping every second, for deployments and schedules; on PostgreSQL,
``prefect_server_on_postgres``), and one for the session's modules that run `fedauc train` many times
(``shared_prefect``)."""

import contextlib
import os
from pathlib import Path

import pytest
from repeated_costs import start_prefect_server

from pipelines.prefect_env import PROJECT_ROOT

# A scheduler that turns an interval schedule into runs within a second, three runs ahead.
SCHEDULER_EVERY_SECOND = {"PREFECT_SERVER_SERVICES_SCHEDULER_LOOP_SECONDS": "1",
                          "PREFECT_SERVER_SERVICES_SCHEDULER_MAX_RUNS": "3",
                          "PREFECT_SERVER_SERVICES_SCHEDULER_MIN_SCHEDULED_TIME": "PT1M"}


@contextlib.contextmanager
def prefect_api(api: str):
    """Prefect's API is ``api`` until the block ends: in this process's settings and, through PREFECT_API_URL, in
    every command it starts. Yields the block's MonkeyPatch, for more of the commands' environment."""
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with pytest.MonkeyPatch.context() as patch, temporary_settings({PREFECT_API_URL: api}):
        patch.setenv("PREFECT_API_URL", api)
        yield patch


@contextlib.contextmanager
def module_prefect_server(home: Path, **settings: str):
    """A Prefect server of its own in ``home`` (``settings`` in its environment); PREFECT_API_URL (and Prefect's
    settings in this process) name it until the block ends, when it is stopped."""
    from pipelines.servers import stop_server

    process, api = start_prefect_server(home, **settings)
    try:
        with prefect_api(api) as patch:
            patch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(PROJECT_ROOT), os.environ.get("PYTHONPATH")])))
            yield {"api": api, "log": home / "server.log"}
    finally:
        stop_server(process)


@pytest.fixture(scope="module")
def prefect_server(tmp_path_factory):
    """A Prefect server of its own (home, database, port) for the module, its scheduler looping every second. A
    module that uses it calls ``configure_prefect_env()`` before it imports Prefect."""
    with module_prefect_server(tmp_path_factory.mktemp("prefect-server"), **SCHEDULER_EVERY_SECOND) as server:
        yield server


@pytest.fixture(scope="session")
def _session_prefect(tmp_path_factory):
    """One Prefect server for the session's modules that run `fedauc train` many times (its API URL), started
    by the first of them."""
    from pipelines.servers import stop_server

    process, api = start_prefect_server(tmp_path_factory.mktemp("session-prefect"))
    yield api
    stop_server(process)


@pytest.fixture(scope="module")
def shared_prefect(_session_prefect):
    """PREFECT_API_URL (here and in the commands the module starts) names the session's Prefect server for the
    module: each `fedauc train` then records its flow run there instead of starting Prefect's temporary server
    of its own first (a process importing Prefect's server, about 7 CPU s, waited for by the training)."""
    with prefect_api(_session_prefect):
        yield _session_prefect


@pytest.fixture(scope="module")
def prefect_server_on_postgres(tmp_path_factory):
    """``prefect_server`` with its database in PostgreSQL, as the centre runs it (infra/README.md section 1): for
    a module whose workers, scheduler and tests write at once. On SQLite, one writer at a time, under CI's load
    every service's loop waited out the 60 s lock timeout, a scheduled run that a worker had taken stayed
    Pending, holding its deployment's one concurrency slot, and no run completed in 300 s."""
    from testbed.postgres import postgres_cluster

    home = tmp_path_factory.mktemp("prefect-server")
    with postgres_cluster(home / "postgres.log", ("prefect",)) as cluster, module_prefect_server(
            home, PREFECT_API_DATABASE_CONNECTION_URL=cluster.url("prefect", "postgresql+asyncpg"),
            **SCHEDULER_EVERY_SECOND) as server:
        yield server
