"""``fedauc ui``: the MLflow UI and the Prefect UI on localhost, over the same stores the pipeline writes.

Also the one way fedauc starts a server process (the UIs, and the central services a test stands up): the
port is checked first (a taken port is an error naming it, not a silent success against whatever already
answers there), the output goes to a log file that is named, and a server that exits early is reported
with the end of its log. The UIs' logs rotate (``UI_LOG_LIMIT``): ``fedauc ui`` runs for as long as the
operator keeps it, and its servers log every request.
"""

from __future__ import annotations

import contextlib
import logging.handlers
import os
import pwd
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from common.errors import ConfigError, FedaucError
from pipelines import tracking
from pipelines.store_uri import fedauc_home
from pipelines.ui_views import links_text, task_links

# Bytes per log file and rotated files kept, per UI server: NVIDIA FLARE's own handlers' size (20 MB), half
# their count; 120 MB for a UI however long it runs.
UI_LOG_LIMIT = (20 * 1024 * 1024, 5)
# The MLflow UI's own server: MLflow's app opening experiments on their training runs (pipelines/mlflow_ui.py), one
# worker (MLflow's default four took about 2 GB beside Prefect, for one user's browser).
MLFLOW_UI_APP, MLFLOW_UI_WORKERS = "fedauc", "1"
# fedauc submits no MLflow server jobs (GenAI evaluation, trace roll-ups); left on, every MLflow server starts
# seven job-queue processes, leaves their queues in /dev/shm, and took 20 s to stop on PostgreSQL.
MLFLOW_SERVER_ENV = {"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
# Every server fedauc starts runs with its analytics off, whatever the caller's environment says.
TELEMETRY_OFF = {"PREFECT_SERVER_ANALYTICS_ENABLED": "false", "MLFLOW_DISABLE_TELEMETRY": "true"}


def server_env(name: str) -> dict[str, str]:
    """The environment of the ``name`` ("MLflow" or "Prefect") server fedauc starts."""
    return {**os.environ, **TELEMETRY_OFF, **(MLFLOW_SERVER_ENV if name == "MLflow" else {})}


@dataclass(frozen=True)
class UIServer:
    """One UI server fedauc starts: its command, URL, port and environment."""

    command: list[str]
    url: str
    port: int
    env: dict[str, str]


def ui_servers(mlflow_port: int, prefect_port: int) -> dict[str, UIServer]:
    """name -> the server, for both UIs."""
    bin_dir = Path(sys.executable).parent
    mlflow_url, prefect_url = f"http://127.0.0.1:{mlflow_port}", f"http://127.0.0.1:{prefect_port}"
    return {
        "MLflow": UIServer([str(bin_dir / "mlflow"), "ui", "--backend-store-uri", tracking.tracking_uri(),
                            "--app-name", MLFLOW_UI_APP, "--workers", MLFLOW_UI_WORKERS,
                            "--host", "127.0.0.1", "--port", str(mlflow_port)],
                           mlflow_url, mlflow_port, server_env("MLflow")),
        # Prefect's UI calls the API where its settings say, 127.0.0.1:4200 by default: on another port it
        # showed no run and "Can't connect to Server API" unless told its own address.
        "Prefect": UIServer([str(bin_dir / "prefect"), "server", "start", "--host", "127.0.0.1",
                             "--port", str(prefect_port)],
                            prefect_url, prefect_port,
                            {**server_env("Prefect"), "PREFECT_UI_API_URL": f"{prefect_url}/api"}),
    }


def port_in_use(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        try:
            probe.bind((host, port))
        except OSError:
            return True
    return False


def free_port() -> int:
    """A port nothing listens on now (the OS's choice)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _log_tail(log_path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(log_path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def wait_for(url: str, process: subprocess.Popen, timeout_s: float = 120.0, log_path: Path | None = None,
             answers: Callable[[], bool] | None = None) -> None:
    """Block until ``url`` answers an HTTP GET, or until ``answers()`` is true for a server that speaks
    another protocol (PostgreSQL); a server that exits or never answers is an error naming it (and its log)."""
    deadline = time.monotonic() + timeout_s
    where = f"; its log: {log_path}\n{_log_tail(log_path)}" if log_path else ""
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(
                f"{' '.join(process.args[:3])} exited with code {process.returncode} before {url} answered{where}")
        if answers is not None:
            if answers():
                return
        else:
            try:
                with urllib.request.urlopen(url, timeout=2):
                    return
            except OSError:
                pass
        time.sleep(0.5)
    raise TimeoutError(f"{url} did not answer within {timeout_s:.0f} s{where}")


def start_server(name: str, command: list[str], url: str, port: int, log_path: Path,
                 env: dict[str, str] | None = None, timeout_s: float = 120.0,
                 answers: Callable[[], bool] | None = None, user: str | None = None,
                 log_limit: tuple[int, int] | None = None) -> subprocess.Popen:
    """Start ``command`` (which serves ``url`` on ``port``) with its output appended to ``log_path``, and
    return once it answers (``answers``: as in ``wait_for``). ``user``: the account it runs as, with that
    account's group only (PostgreSQL refuses to run as root). ``log_limit``: (bytes, backups) to rotate the
    log at, as ``logging.handlers.RotatingFileHandler`` does (``log_path.1`` the newest backup); the output
    then passes through this process. A taken port or a server that dies is a FedaucError naming the port or
    log."""
    if port_in_use(port):
        raise ConfigError(f"{name}: port {port} on 127.0.0.1 is already in use (another `fedauc ui` or server?)",
                          fix=f"stop what listens there (e.g. `lsof -i :{port}`) or choose another port")
    log_path = Path(log_path)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") if log_limit is None else contextlib.nullcontext(subprocess.PIPE) as log:
        # Own process group: the servers fork workers, and stopping must reach them too.
        account = {} if user is None else {"user": user, "group": pwd.getpwnam(user).pw_gid, "extra_groups": []}
        process = subprocess.Popen(command, env=env if env is not None else os.environ.copy(), stdout=log,
                                   stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
                                   **account)
    if log_limit is not None:
        threading.Thread(target=copy_rotating, args=(process.stdout, log_path, *log_limit), daemon=True).start()
    try:
        wait_for(url, process, timeout_s, log_path, answers)
    except (RuntimeError, TimeoutError) as err:
        stop_server(process)
        raise FedaucError(f"{name} did not start: {err}", fix=f"read {log_path}") from None
    except BaseException:  # a readiness probe that fails, Ctrl-C: the caller never gets the process to stop
        stop_server(process)
        raise
    return process


def copy_rotating(stream, log_path: Path, max_bytes: int, backups: int) -> None:
    """Every line of ``stream`` into ``log_path``, rotated by the standard library's handler, until it ends."""
    handler = logging.handlers.RotatingFileHandler(log_path, maxBytes=max_bytes, backupCount=backups)
    handler.setFormatter(logging.Formatter("%(message)s"))
    with stream, contextlib.closing(handler):
        for line in iter(stream.readline, b""):
            handler.emit(logging.makeLogRecord({"msg": line.decode(errors="replace").rstrip("\n")}))


def stop_server(process: subprocess.Popen, timeout_s: float = 20.0) -> None:
    """SIGTERM the server's process group, SIGKILL it if it has not exited after ``timeout_s``."""
    _signal_group(process, signal.SIGTERM)
    try:
        process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        _signal_group(process, signal.SIGKILL)
        process.wait()


def _interrupt(signum, frame):
    raise KeyboardInterrupt


def serve_uis(mlflow_port: int, prefect_port: int, echo: Callable[[str], None] = print,
              log_dir: Path | None = None) -> None:
    """Start both UIs, print their URLs and log files, and stop them on Ctrl-C or SIGTERM. Both ports are
    checked before either server starts; a server that exits is reported with its log (in ``log_dir``, default
    the fedauc folder's ``logs/``)."""
    log_dir = Path(log_dir or fedauc_home() / "logs")
    signal.signal(signal.SIGTERM, _interrupt)
    servers = ui_servers(mlflow_port, prefect_port)
    for name, server in servers.items():
        if port_in_use(server.port):
            option = f"--{name.lower()}-port"
            raise ConfigError(f"{name} UI: port {server.port} on 127.0.0.1 is already in use (is `fedauc ui` "
                              "running?)", fix=f"open the running UI, stop it, or pass {option} with a free port")
    processes = {}
    try:
        for name, server in servers.items():
            log_path = Path(log_dir) / f"{name.lower()}-ui.log"
            processes[name] = start_server(f"{name} UI", server.command, server.url, server.port, log_path,
                                           env=server.env, log_limit=UI_LOG_LIMIT)
            echo(f"{name} UI: {server.url}  (log: {log_path})")
        echo(links_text(task_links(servers["MLflow"].url, servers["Prefect"].url)))
        echo("Ctrl-C stops both.")
        while all(p.poll() is None for p in processes.values()):
            time.sleep(1)
        exited = next(name for name, p in processes.items() if p.poll() is not None)
        raise FedaucError(f"{exited} UI exited with code {processes[exited].returncode}",
                          fix=f"read {Path(log_dir) / f'{exited.lower()}-ui.log'}")
    except KeyboardInterrupt:
        pass
    finally:
        for process in processes.values():
            stop_server(process)


def _signal_group(process: subprocess.Popen, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signum)
