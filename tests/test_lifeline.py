"""Children end with their parent, tested with a real ``kill -9``: a plain process tree, and `fedauc
preprocess` with its ephemeral Prefect server and decode workers."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import numpy as np
import psutil
import pytest
import yaml
from hostile_files import big_png
from PIL import Image

from common.lifetime import alive, descendants

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="the guardian reads /proc (Linux)")

_PARENT = """
import subprocess, sys, time
from pipelines.lifeline import guard_children
guard_children()
subprocess.Popen(["sleep", "300"])
subprocess.Popen(["bash", "-c", "sleep 301 & wait"])  # a grandchild under a child
print("started", flush=True)
time.sleep(300)
"""


def _command(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            return handle.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _wait_gone(processes: list[psutil.Process], seconds: float) -> list[int]:
    """The pids still running after ``seconds``; those are killed, so that a failed test leaves nothing behind."""
    deadline = time.monotonic() + seconds
    while alive(processes) and time.monotonic() < deadline:
        time.sleep(0.2)
    survivors = [process.pid for process in alive(processes)]
    for pid in survivors:
        os.kill(pid, signal.SIGKILL)
    return survivors


def test_kill_9_of_the_parent_ends_its_children_and_grandchildren():
    parent = subprocess.Popen([sys.executable, "-c", _PARENT], stdout=subprocess.PIPE, text=True,
                              env=os.environ | {"PYTHONPATH": os.getcwd()})
    assert parent.stdout.readline().strip() == "started"
    time.sleep(1.5)  # the guardian notes the tree twice a second
    tree = descendants([parent.pid], exclude=-1)
    commands = [_command(process.pid) for process in tree]
    assert sum("sleep 30" in c for c in commands) == 3 and any("pipelines.lifeline" in c for c in commands)
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    survivors = _wait_gone(tree, 15)
    assert not survivors, [_command(pid) for pid in survivors]


@pytest.mark.slow
def test_kill_9_of_preprocess_ends_the_prefect_server_and_the_decode_workers(tmp_path):
    root = tmp_path / "data"
    root.mkdir()
    rows = ["path,patient,edema"]
    for k in range(8):  # a few seconds each: the workers are busy when the parent dies
        big_png(root / f"slow{k}.png", 8000, 8000)
        rows.append(f"slow{k}.png,P{k},1")
    Image.fromarray(np.add.outer(np.arange(64), np.arange(64)).astype(np.uint8)).save(root / "ok.png")
    (root / "labels.csv").write_text("\n".join(rows + ["ok.png,P9,0"]) + "\n")
    site = tmp_path / "site.yaml"
    site.write_text(yaml.safe_dump({
        "name": "killed", "format": "generic-csv", "root": "data", "task": "chest-xray",
        "decode_limits": {"max_pixels": 70_000_000},
        "options": {"labels_csv": "labels.csv", "path_column": "path", "patient_column": "patient",
                    "label_columns": {"Edema": "edema"}, "default_view": "PA"},  # kept rows: a site of only
    }))                                                                       # excluded views stops at scan
    env = os.environ | {"PYTHONPATH": os.getcwd(), "PREFECT_HOME": str(tmp_path / ".prefect")}
    env.pop("PREFECT_API_URL", None)
    command = [sys.executable, "-c", "from pipelines.cli import app; app()",
               "preprocess", str(site), "--out", str(tmp_path / "out"), "--workers", "2"]
    parent = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 240
        tree: list[psutil.Process] = []
        while time.monotonic() < deadline and parent.poll() is None:
            tree = descendants([parent.pid], exclude=-1)
            commands = [_command(process.pid) for process in tree]
            if any("uvicorn" in c and "prefect" in c for c in commands) and sum("spawn_main" in c for c in commands) == 2:
                break
            time.sleep(0.2)
        else:
            pytest.fail(f"preprocess never had its Prefect server and two decode workers (exit {parent.poll()})")
        parent.send_signal(signal.SIGKILL)
        parent.wait()
        survivors = _wait_gone(tree, 20)
        assert not survivors, [_command(pid) for pid in survivors]
    finally:
        if parent.poll() is None:
            leftovers = descendants([parent.pid], exclude=-1)
            parent.kill()
            _wait_gone(leftovers, 10)
