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

import json
import os
import signal
import subprocess
import threading
from pathlib import Path

import psutil

from common.lifetime import family, parent_death_preexec, signal_all, start_time, terminate, wait_ended


def stop_family(pid: int, grace_s: float = 15.0) -> list[psutil.Process]:
    """SIGTERM process ``pid``, then, once it has ended or after ``grace_s``, what it started and left
    running; SIGKILL what is left after ``grace_s`` more; the survivors (none, unless a process ignores
    SIGKILL)."""
    members = family(pid)
    # The root first: a hospital's client logs out before its job processes end (federated.flare.site.leave), so
    # the server hears that the hospital left before the other sites fail for want of it.
    signal_all(members[-1:], signal.SIGTERM)
    wait_ended(members[-1:], grace_s)
    return terminate(members, grace_s)


def claimed_by(pid_file: Path) -> int | None:
    """The live process ``pid_file`` names (pid and start time match), or None."""
    try:
        record = json.loads(pid_file.read_text())
    except (OSError, ValueError):
        return None
    return record["pid"] if start_time(record["pid"]) == record["started"] else None


def claim(pid_file: Path) -> None:
    """Name this process in ``pid_file`` (owner-only); the caller checked ``claimed_by`` first."""
    fd = os.open(pid_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        json.dump({"pid": os.getpid(), "started": start_time(os.getpid())}, out)
    pid_file.chmod(0o600)


def run_until_stopped(command: list[str], env: dict[str, str], cwd: Path, grace_s: float = 15.0) -> int:
    """Run ``command`` until it exits (its exit status) or this process is asked to stop by SIGTERM or
    SIGINT (then 0, once it and everything it started have ended). It gets SIGTERM if this process (this
    thread) ends first."""
    # Python delivers signals to the main thread only; elsewhere (a flow run's worker thread) the client
    # stays in this process group, so that whatever stops the group stops it too.
    catch = threading.current_thread() is threading.main_thread()
    process = subprocess.Popen(command, env=env, cwd=cwd, start_new_session=catch,
                               preexec_fn=parent_death_preexec(signal.SIGTERM))
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
