import subprocess
import sys

import pytest

from pipelines.servers import ui_commands, wait_for


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
    commands = ui_commands(5001, 4201)
    mlflow_command, mlflow_url = commands["MLflow"]
    assert mlflow_command[mlflow_command.index("--backend-store-uri") + 1] == f"sqlite:///{tmp_path / 'x.db'}"
    assert mlflow_url == "http://127.0.0.1:5001"
    assert commands["Prefect"][1] == "http://127.0.0.1:4201"
