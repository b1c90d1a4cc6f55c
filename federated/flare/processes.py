"""A participant's NVFlare process, whichever role starts it: a kit's own start command and the environment it
runs in, and a process with everything it started, found and signalled as one (NVFlare starts a job's
processes in sessions of their own, so a process group does not hold them)."""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path

import psutil


def start_command(root: Path) -> list[str]:
    """A kit's own NVFlare start script, once, in the foreground (no restart loop: the caller supervises)."""
    return ["bash", str(root / "startup" / "sub_start.sh"), "--once"]


def start_env() -> dict[str, str]:
    """The start script calls ``python3``: make it this interpreter (the one with fedauc and nvflare)."""
    return {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}


def family(pid: int) -> list[psutil.Process]:
    """Process ``pid`` and every process below it, the deepest first."""
    try:
        root = psutil.Process(pid)
        return [*reversed(root.children(recursive=True)), root]
    except psutil.NoSuchProcess:
        return []


def signal_family(members: list[psutil.Process], signum: int) -> None:
    for member in members:
        with contextlib.suppress(psutil.NoSuchProcess):
            member.send_signal(signum)
