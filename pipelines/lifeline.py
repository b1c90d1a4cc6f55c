"""Children end with their parent: after ``kill -9`` of a fedauc command, the processes it started go too.

The kernel does not end a process's children when it dies: they are re-parented and run on, an ephemeral
Prefect server keeping its port and SQLite database, an MLflow server its port. Decode workers arrange
their own end (``PR_SET_PDEATHSIG``, ``preprocessing.pool``); the processes fedauc does not start itself
(Prefect starts its server) are covered by ``guard_children()``: it starts one guardian process that notes
the parent's descendants twice a second while the parent lives and, once the parent is gone however it
ended, terminates those still running (SIGTERM, SIGKILL after 5 s). The guardian learns of the death at
once through a pidfd (Linux 5.3+); process start times guard against a reused pid (``common.lifetime``,
the one module of process lifetimes). Linux only (``/proc``); elsewhere it is a no-op.

Run as ``python -m pipelines.lifeline PID`` by ``guard_children``; it imports nothing heavy.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time

import psutil

from common.lifetime import alive, descendants, terminate

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


def guard(parent: int) -> None:
    me = os.getpid()
    try:
        watched = [psutil.Process(parent)]
        death = os.pidfd_open(parent)
    except psutil.NoSuchProcess:
        return
    except (AttributeError, OSError):
        death = None
    known: dict[int, psutil.Process] = {}
    while alive(watched):
        # descendants() checks what it finds; of the rest, only what has left the tree (a child whose parent
        # ended) is checked again: every check reads /proc, twice a second, for as long as the parent lives.
        found = {member.pid: member for member in descendants([parent], exclude=me)}
        known = {**{member.pid: member for member in alive(m for pid, m in known.items() if pid not in found)},
                 **found}
        if death is not None:
            select.select([death], [], [], _POLL_S)
        else:
            time.sleep(_POLL_S)
    # The parent's children are re-parented by now; what they started is still below them.
    victims = {**known, **{member.pid: member for member in descendants(list(known), exclude=me)}}
    terminate(victims.values(), _GRACE_S, kill_wait_s=0.0)


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    guard(int(sys.argv[1]))
