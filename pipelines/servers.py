"""``fedauc ui``: the MLflow UI and the Prefect UI on localhost, over the same stores the pipeline writes."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

from pipelines import tracking


def ui_commands(mlflow_port: int, prefect_port: int) -> dict[str, tuple[list[str], str]]:
    """name -> (command, URL) for both UIs."""
    bin_dir = Path(sys.executable).parent
    return {
        "MLflow": ([str(bin_dir / "mlflow"), "ui", "--backend-store-uri", tracking.configure(),
                    "--host", "127.0.0.1", "--port", str(mlflow_port)], f"http://127.0.0.1:{mlflow_port}"),
        "Prefect": ([str(bin_dir / "prefect"), "server", "start", "--host", "127.0.0.1", "--port", str(prefect_port)],
                    f"http://127.0.0.1:{prefect_port}"),
    }


def wait_for(url: str, process: subprocess.Popen, timeout_s: float = 120.0) -> None:
    """Block until ``url`` answers; a server that exits or never answers is an error naming it."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{' '.join(process.args[:3])} exited with code {process.returncode} before {url} answered")
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except OSError:
            time.sleep(0.5)
    raise TimeoutError(f"{url} did not answer within {timeout_s:.0f} s")


def _interrupt(signum, frame):
    raise KeyboardInterrupt


def serve_uis(mlflow_port: int, prefect_port: int, echo: Callable[[str], None] = print) -> None:
    """Start both UIs, print their URLs, and stop them (with their worker processes) on Ctrl-C or SIGTERM."""
    signal.signal(signal.SIGTERM, _interrupt)
    processes = []
    try:
        for name, (command, url) in ui_commands(mlflow_port, prefect_port).items():
            # Own process group: the servers fork workers, and stopping must reach them too.
            process = subprocess.Popen(command, env=os.environ.copy(), stdout=subprocess.DEVNULL,
                                       stderr=subprocess.DEVNULL, start_new_session=True)
            processes.append(process)
            wait_for(url, process)
            echo(f"{name} UI: {url}")
        echo("Ctrl-C stops both.")
        while all(p.poll() is None for p in processes):
            time.sleep(1)
    except KeyboardInterrupt:
        pass
    finally:
        for process in processes:
            _signal_group(process, signal.SIGTERM)
        for process in processes:
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                _signal_group(process, signal.SIGKILL)


def _signal_group(process: subprocess.Popen, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signum)
