"""Run a consortium process (a hospital's NVFlare client) in the foreground; it lives and dies with its caller.

NVFlare's client (``client_train``) starts one process per job in a session of its own and does not stop
them when it is itself signalled: SIGTERM to a plain ``subprocess.call`` left the job process running and
connected to the server. Here the client runs in a session of its own, SIGTERM and SIGINT to this process
are caught, and then the client gets SIGTERM (it logs out: ``federated.flare.site.leave``), and once it has
ended every process it started that is left (found before any is signalled, since a job process whose
parent died is no longer in the tree), and SIGKILL ``grace_s`` seconds later.

A caught signal is not enough: ``kill -9`` (an OOM kill, a crashed supervisor) ends the caller without a
word, and the client, in its own session, ran on. So the client also gets a parent-death signal
(``PR_SET_PDEATHSIG``, kept across the start script's ``exec``): SIGTERM from the kernel the moment its
caller ends, however it ended; its job processes stop when it does (NVIDIA FLARE's worker watches its
parent). ``claim`` keeps one caller per folder: a pid file, owner-only, naming the live one.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import subprocess
import threading
from pathlib import Path

import psutil

from federated.flare.processes import family, signal_family


def stop_family(pid: int, grace_s: float = 15.0) -> list[psutil.Process]:
    """SIGTERM process ``pid``, then, once it has ended or after ``grace_s``, what it started and left
    running; SIGKILL what is left after ``grace_s`` more; the survivors (none, unless a process ignores
    SIGKILL)."""
    members = family(pid)
    # The root first: a hospital's client logs out before its job processes end (federated.flare.site.leave), so
    # the server hears that the hospital left before the other sites fail for want of it.
    signal_family(members[-1:], signal.SIGTERM)
    psutil.wait_procs(members[-1:], timeout=grace_s)
    signal_family(members, signal.SIGTERM)
    _, alive = psutil.wait_procs(members, timeout=grace_s)
    signal_family(alive, signal.SIGKILL)
    _, alive = psutil.wait_procs(alive, timeout=5.0)
    return alive


_PR_SET_PDEATHSIG = 1


def _die_with_parent(parent: int):
    """A ``preexec_fn``: SIGTERM to the child when ``parent`` (the thread that starts it) ends."""
    libc = ctypes.CDLL(None, use_errno=True)

    def arm() -> None:
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
        if os.getppid() != parent:  # the parent died before the signal was armed
            os.kill(os.getpid(), signal.SIGTERM)

    return arm


def _start_time(pid: int) -> float | None:
    try:
        return psutil.Process(pid).create_time()
    except psutil.NoSuchProcess:
        return None


def claimed_by(pid_file: Path) -> int | None:
    """The live process ``pid_file`` names (pid and start time match), or None."""
    try:
        record = json.loads(pid_file.read_text())
    except (OSError, ValueError):
        return None
    return record["pid"] if _start_time(record["pid"]) == record["started"] else None


def claim(pid_file: Path) -> None:
    """Name this process in ``pid_file`` (owner-only); the caller checked ``claimed_by`` first."""
    fd = os.open(pid_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        json.dump({"pid": os.getpid(), "started": _start_time(os.getpid())}, out)
    pid_file.chmod(0o600)


def run_until_stopped(command: list[str], env: dict[str, str], cwd: Path, grace_s: float = 15.0) -> int:
    """Run ``command`` until it exits (its exit status) or this process is asked to stop by SIGTERM or
    SIGINT (then 0, once it and everything it started have ended). It gets SIGTERM if this process (this
    thread) ends first."""
    # Python delivers signals to the main thread only; elsewhere (a flow run's worker thread) the client
    # stays in this process group, so that whatever stops the group stops it too.
    catch = threading.current_thread() is threading.main_thread()
    process = subprocess.Popen(command, env=env, cwd=cwd, start_new_session=catch,
                               preexec_fn=_die_with_parent(os.getpid()))
    asked = threading.Event()
    handlers = ({signum: signal.signal(signum, lambda *_: asked.set()) for signum in (signal.SIGTERM, signal.SIGINT)}
                if catch else {})
    try:
        while process.poll() is None and not asked.wait(0.5):
            pass
        if process.poll() is not None:
            return process.returncode
        stop_family(process.pid, grace_s)
        process.wait()
        return 0
    finally:
        for signum, handler in handlers.items():
            signal.signal(signum, handler)
