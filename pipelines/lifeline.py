"""Children end with their parent: after ``kill -9`` of a fedauc command, the processes it started go too.

The kernel does not end a process's children when it dies: they are re-parented and run on, an ephemeral
Prefect server keeping its port and SQLite database, an MLflow server its port. Decode workers arrange
their own end (``PR_SET_PDEATHSIG``, ``preprocessing.pool``); the processes fedauc does not start itself
(Prefect starts its server) are covered by ``guard_children()``: it starts one guardian process that notes
the parent's descendants twice a second while the parent lives and, once the parent is gone however it
ended, terminates those still running (SIGTERM, SIGKILL after 5 s). The guardian learns of the death at
once through a pidfd (Linux 5.3+); process start times guard against a reused pid. Linux only (``/proc``);
elsewhere it is a no-op.

Run as ``python -m pipelines.lifeline PID`` by ``guard_children``; it imports nothing heavy.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import sys
import time

_POLL_S = 0.5
_GRACE_S = 5.0
_guardian: subprocess.Popen | None = None


def guard_children() -> None:
    """Start this process's guardian (once per process)."""
    global _guardian
    if _guardian is not None or not os.path.isdir("/proc/self"):
        return
    # Its own session: Ctrl-C in the terminal is the parent's to handle, not the guardian's.
    _guardian = subprocess.Popen(
        [sys.executable, "-m", "pipelines.lifeline", str(os.getpid())],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, start_new_session=True,
    )


def _start_time(pid: int) -> int | None:
    """Field 22 of /proc/PID/stat (clock ticks after boot), None once the process has ended (or is a zombie
    nobody reaped, as happens under a container's init): a pid and its start time name one process."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            fields = handle.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return None if fields[0] in ("Z", "X") else int(fields[19])


def _children_by_parent() -> dict[int, list[int]]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as handle:
                    parent = int(handle.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(parent, []).append(int(entry))
    return children


def descendants(roots: list[int], exclude: int) -> dict[int, int]:
    """pid -> start time of every process below ``roots`` (not the roots), ``exclude`` and its subtree left out."""
    children = _children_by_parent()
    found: dict[int, int] = {}
    pending = list(roots)
    while pending:
        for child in children.get(pending.pop(), []):
            started = _start_time(child)
            if child != exclude and child not in found and started is not None:
                found[child] = started
                pending.append(child)
    return found


def running(processes: dict[int, int]) -> dict[int, int]:
    """Those of ``processes`` (pid -> start time) that still run."""
    return {pid: started for pid, started in processes.items() if _start_time(pid) == started}


def _terminate(processes: dict[int, int]) -> None:
    for signum, wait_s in ((signal.SIGTERM, _GRACE_S), (signal.SIGKILL, 0.0)):
        living = running(processes)
        for pid in living:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signum)
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline and running(living):
            time.sleep(0.1)


def guard(parent: int) -> None:
    me = os.getpid()
    parent_started = _start_time(parent)
    try:
        death = os.pidfd_open(parent)
    except (AttributeError, OSError):
        death = None
    known: dict[int, int] = {}
    while parent_started is not None and _start_time(parent) == parent_started:
        known = running(known | descendants([parent], exclude=me))
        if death is not None:
            select.select([death], [], [], _POLL_S)
        else:
            time.sleep(_POLL_S)
    # The parent's children are re-parented by now; what they started is still below them.
    victims = dict(known)
    victims.update(descendants(list(known), exclude=me))
    _terminate(victims)


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    guard(int(sys.argv[1]))
