"""Prefect settings for running fedauc on a laptop or a hospital server without a Prefect server.

Call ``configure_prefect_env()`` before the first ``import prefect``: Prefect reads its settings from the
environment when it is imported. Values already set (by the Makefile, CI or the user) win.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

from pipelines.lifeline import guard_children
from pipelines.store_uri import fedauc_home

PROJECT_ROOT = Path(__file__).resolve().parents[1]


def prefect_env_defaults() -> dict[str, str]:
    return {
        # Keep Prefect's database and logs in this machine's fedauc folder instead of ~/.prefect.
        "PREFECT_HOME": str(fedauc_home() / ".prefect"),
        # No telemetry (infra/README.md "Security"): hospital machines are often offline, and nothing about a
        # consortium's runs leaves it. Prefect's server analytics; MLflow 3's client and server usage events
        # (read when mlflow is imported, so set here, before the first import).
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "MLFLOW_DISABLE_TELEMETRY": "true",
        # The ephemeral server needs ~20 s to start on a loaded 2-core machine; the default gives up sooner.
        "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "120",
        # A SQLite Prefect server waits this long for a lock before it answers 500, which Prefect's clients do not
        # retry: at its default (10 s) a loaded 2-core machine's worker crashed on reading its deployment while
        # two other workers wrote.
        "PREFECT_SERVER_DATABASE_TIMEOUT": "60",
        # Task-level INFO lines would interleave with the progress bar; warnings and errors still show.
        "PREFECT_LOGGING_LEVEL": "WARNING",
        # ...but a flow's own progress and results go to the Prefect server's log of its run (the UI's Logs tab),
        # not to the console: run loggers at INFO, the console handler at WARNING.
        "PREFECT_LOGGING_LOGGERS_PREFECT_FLOW_RUNS_LEVEL": "INFO",
        "PREFECT_LOGGING_LOGGERS_PREFECT_TASK_RUNS_LEVEL": "INFO",
        "PREFECT_LOGGING_HANDLERS_CONSOLE_LEVEL": "WARNING",
        # MLflow's INFO chatter ("Creating initial MLflow database tables") and its artifact download bars
        # (empty ones, between fedauc's tables) stay out of fedauc's output; its warnings still show.
        "MLFLOW_LOGGING_LEVEL": "WARNING",
        "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false",
    }


def configure_prefect_env() -> dict[str, str]:
    """Set each default that is unset in ``os.environ``; returns what was set.

    Also starts this process's guardian (``pipelines.lifeline``): the ephemeral Prefect server Prefect
    starts, and every other child, must not outlive a fedauc command that is killed.
    """
    guard_children()
    applied = {}
    for name, value in prefect_env_defaults().items():
        if name not in os.environ:
            os.environ[name] = value
            applied[name] = value
    # A fresh $FEDAUC_HOME (`FEDAUC_HOME=/tmp/try fedauc demo`) does not exist yet: Prefect creates its home
    # without parents, fails, and its server then cannot open its database.
    Path(os.environ["PREFECT_HOME"]).expanduser().mkdir(parents=True, exist_ok=True)
    return applied


def boot_ephemeral_server() -> threading.Thread | None:
    """Start Prefect's ephemeral server in a thread when no ``PREFECT_API_URL`` is set, so that it boots (3 s,
    10 s of CPU on a fresh database: the migrations) while the caller imports the rest; returns the thread,
    which must be joined before the first flow runs (a flow finding the server starting would not wait for
    it). After ``configure_prefect_env()``. A failed start is the flow's to report: it starts the server again."""
    from prefect.settings import PREFECT_API_URL

    if PREFECT_API_URL.value():
        return None
    from prefect.server.api.server import SubprocessASGIServer

    thread = threading.Thread(target=SubprocessASGIServer().start, name="prefect-server-boot", daemon=True)
    thread.start()
    return thread
