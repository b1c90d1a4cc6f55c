import socket
import subprocess
import sys
import time

import psutil
import pytest

from common.errors import ConfigError, FedaucError
from pipelines.servers import ui_servers, wait_for


def test_wait_for_names_a_server_that_exits():
    process = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    with pytest.raises(RuntimeError, match=r"exited with code 3 before http://127\.0\.0\.1:9/ answered"):
        wait_for("http://127.0.0.1:9/", process, timeout_s=30)


def test_wait_for_returns_once_the_server_answers(tmp_path):
    process = subprocess.Popen([sys.executable, "-m", "http.server", "0", "--bind", "127.0.0.1", "-d", str(tmp_path)],
                               stdout=subprocess.PIPE, text=True)
    try:
        port = int(process.stdout.readline().split("port ")[1].split()[0])
        wait_for(f"http://127.0.0.1:{port}/", process, timeout_s=30)
    finally:
        process.terminate()
        process.wait()


def test_ui_commands_serve_the_pipeline_stores(monkeypatch, tmp_path):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'x.db'}")
    servers = ui_servers(5001, 4201)
    mlflow_command = servers["MLflow"].command
    assert mlflow_command[mlflow_command.index("--backend-store-uri") + 1] == f"sqlite:///{tmp_path / 'x.db'}"
    assert servers["MLflow"].url == "http://127.0.0.1:5001"
    assert servers["Prefect"].url == "http://127.0.0.1:4201"
    assert servers["Prefect"].env["PREFECT_UI_API_URL"] == "http://127.0.0.1:4201/api"


def test_ui_refuses_a_taken_port_before_starting_anything(tmp_path, monkeypatch):
    """A second `fedauc ui` used to print its URLs and exit 0 against the first one's servers."""
    from typer.testing import CliRunner

    from pipelines.cli import app
    from pipelines.servers import free_port

    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'x.db'}")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = CliRunner().invoke(app, ["ui", "--mlflow-port", str(port), "--prefect-port", str(free_port())])
    assert result.exit_code == 1
    assert f"MLflow UI: port {port} on 127.0.0.1 is already in use" in result.output
    assert "--mlflow-port" in result.output and "http://" not in result.output


def test_start_server_writes_its_log_where_it_says(tmp_path):
    from pipelines.servers import free_port, start_server, stop_server

    port = free_port()
    log = tmp_path / "logs" / "http.log"
    process = start_server("http", [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1",
                                    "-d", str(tmp_path)], f"http://127.0.0.1:{port}/", port, log, timeout_s=60)
    try:
        with pytest.raises(ConfigError, match=f"port {port} on 127.0.0.1 is already in use"):
            start_server("again", [sys.executable, "-c", "pass"], f"http://127.0.0.1:{port}/", port, log)
    finally:
        stop_server(process)
    assert '"GET / HTTP/1.1" 200' in log.read_text()


def test_start_server_names_the_log_of_a_server_that_dies(tmp_path):
    from pipelines.servers import free_port, start_server

    port = free_port()
    log = tmp_path / "dies.log"
    with pytest.raises(FedaucError, match=f"exited with code 3 .*its log: {log}") as err:
        start_server("dies", [sys.executable, "-c", "print('bad config'); raise SystemExit(3)"],
                     f"http://127.0.0.1:{port}/", port, log, timeout_s=60)
    assert "bad config" in str(err.value)


def test_the_mlflow_ui_reads_what_fedauc_sets_to_open_training_runs():
    """MLflow 3.17's UI takes an experiment's view from ?workflowType= or the browser's stored choice (the
    experiment tag mlflow.experimentKind no longer decides it), and a runs table's filter, sort and columns from a
    shared view (?viewStateShareKey= and its experiment tag): fedauc's MLflow server stores the training view
    (pipelines/mlflow_ui.py) and `fedauc ui`'s links name the shared view (pipelines/ui_views.py). A newer MLflow
    that reads neither fails here, before a user finds the GenAI overview again."""
    from pathlib import Path

    import mlflow

    from pipelines.mlflow_ui import WORKFLOW_STORAGE_KEY
    from pipelines.ui_views import SHARED_VIEW_TAG_PREFIX

    bundle = "".join(path.read_text(errors="replace") for path in
                     (Path(mlflow.__file__).parent / "server" / "js" / "build" / "static" / "js").glob("*.js"))
    key, version = WORKFLOW_STORAGE_KEY.rsplit("_v", 1)
    assert f'key:"{key}",version:{version}' in bundle and '"machine_learning"' in bundle
    assert f'"{SHARED_VIEW_TAG_PREFIX}"' in bundle and '"viewStateShareKey"' in bundle


def test_the_mlflow_ui_runs_fedaucs_app_with_one_worker(monkeypatch, tmp_path):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'x.db'}")
    command = ui_servers(5001, 4201)["MLflow"].command
    assert command[command.index("--app-name") + 1] == "fedauc" and command[command.index("--workers") + 1] == "1"


def test_start_server_stops_the_server_when_its_probe_fails(tmp_path):
    """The caller gets no process to stop when start_server raises: start_server must stop it itself."""
    from pipelines.servers import free_port, start_server

    port = free_port()
    started = tmp_path / "started"

    def probe():
        if started.exists():
            raise OSError("probe broke")
        return False

    with pytest.raises(OSError, match="probe broke"):
        start_server("sleeper", [sys.executable, "-c", f"open({str(started)!r}, 'w').close(); import time; "
                                 "time.sleep(600)"], f"tcp://127.0.0.1:{port}", port, tmp_path / "s.log",
                     timeout_s=120, answers=probe)
    sleepers = [p for p in psutil.process_iter(["cmdline"]) if str(started) in " ".join(p.info["cmdline"] or [])]
    for sleeper in sleepers:  # not left running when this fails
        sleeper.kill()
    assert sleepers == []


def test_a_rotated_server_log_stays_within_its_limit_and_keeps_the_latest_lines(tmp_path):
    """What `fedauc ui` starts its servers with (UI_LOG_LIMIT): a server logging every request for months
    must not fill the disk; the standard library's rotation, with the newest lines in the log file itself."""
    import urllib.request

    from pipelines.servers import free_port, start_server, stop_server

    port = free_port()
    log = tmp_path / "logs" / "http.log"
    process = start_server("http", [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1",
                                    "-d", str(tmp_path)], f"http://127.0.0.1:{port}/", port, log, timeout_s=60,
                           log_limit=(2048, 2))
    try:
        for index in range(120):  # about 60 bytes a request: 7 KB, three files' worth and more
            urllib.request.urlopen(f"http://127.0.0.1:{port}/?request={index}", timeout=10).close()
        deadline = time.monotonic() + 30
        while "request=119 " not in log.read_text():
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.2)
    finally:
        stop_server(process)
    logs = sorted(p.name for p in log.parent.iterdir())
    assert logs == ["http.log", "http.log.1", "http.log.2"]
    assert all((log.parent / name).stat().st_size <= 2048 for name in logs)
    assert "request=118 " in (log.read_text() + (log.parent / "http.log.1").read_text())
