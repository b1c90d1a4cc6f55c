"""A process's lifetime, for every process fedauc starts: it dies with its parent, it is named by its pid and
start time, and a process with everything it started ends as one.

- ``die_with_parent`` (in the child) and ``parent_death_preexec`` (a ``preexec_fn``): the kernel signals the
  child the moment its parent ends, however it ended (Linux ``PR_SET_PDEATHSIG``, kept across ``exec``);
  a parent that died before the signal was armed is noticed too. The decode workers
  (``preprocessing.pool``) and a hospital's NVFlare client (``federated.flare.site.supervise``).
- ``start_time``: a pid and its start time name one process (a pid alone is reused); an ended process and a
  zombie nobody reaped (as under a container's init) have none. Owner tags of MLflow runs
  (``pipelines.tracking``), a site's pid file.
- ``family``/``descendants``, ``alive``, ``signal_all``, ``terminate``: a tree of processes found before any
  is signalled (a process whose parent died is no longer below it), signalled as one, SIGTERM then SIGKILL.
  The guardian of a fedauc command (``pipelines.lifeline``), a site's supervisor, the centre's local
  consortium (``federated.flare.centre.poc``).

It imports the standard library and psutil only, so that a guardian process starts fast.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
import time
from collections.abc import Iterable

import psutil

_PR_SET_PDEATHSIG = 1  # linux/prctl.h


def _prctl():
    return ctypes.CDLL(None, use_errno=True).prctl if sys.platform.startswith("linux") else None


def _arm(prctl, parent_pid: int, signum: int) -> None:
    if prctl is not None:
        prctl(_PR_SET_PDEATHSIG, signum, 0, 0, 0)
    if os.getppid() != parent_pid:  # the parent died before the signal was armed
        os.kill(os.getpid(), signum)


def die_with_parent(parent_pid: int, signum: int = signal.SIGKILL) -> None:
    """In a child: ``signum`` from the kernel when its parent ``parent_pid`` ends (Linux; elsewhere only the
    check that the parent still lives)."""
    _arm(_prctl(), parent_pid, signum)


def parent_death_preexec(signum: int = signal.SIGTERM):
    """A ``preexec_fn``: ``signum`` to the child when this process (the thread that starts it) ends. libc is
    looked up here, before the fork: loading a library in the forked child of a threaded process can hang."""
    prctl, parent_pid = _prctl(), os.getpid()
    return lambda: _arm(prctl, parent_pid, signum)


def start_time(pid: int) -> float | None:
    """When process ``pid`` started (seconds since the epoch), None once it has ended or is a zombie."""
    try:
        process = psutil.Process(pid)
        return None if process.status() in (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD) else process.create_time()
    except psutil.NoSuchProcess:
        return None


def alive(members: Iterable[psutil.Process]) -> list[psutil.Process]:
    """Those of ``members`` still running: the same process (pid and start time), not a zombie."""
    return [member for member in members if start_time(member.pid) == member.create_time()]


def family(pid: int) -> list[psutil.Process]:
    """Process ``pid`` and every process below it, the deepest first."""
    try:
        root = psutil.Process(pid)
        return [*reversed(root.children(recursive=True)), root]
    except psutil.NoSuchProcess:
        return []


def descendants(roots: Iterable[int], exclude: int) -> list[psutil.Process]:
    """Every running process below ``roots`` (not the roots themselves), but ``exclude`` (a guardian: it has no
    children of its own)."""
    found: dict[int, psutil.Process] = {}
    for root in roots:
        found.update((member.pid, member) for member in family(root)[:-1] if member.pid != exclude)
    return alive(found.values())


def signal_all(members: Iterable[psutil.Process], signum: int) -> None:
    """``signum`` to each of ``members`` that still runs (psutil refuses a pid now another process's)."""
    for member in members:
        with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
            member.send_signal(signum)


def wait_ended(members: Iterable[psutil.Process], timeout_s: float) -> list[psutil.Process]:
    """Wait up to ``timeout_s`` for ``members`` to end; those still running."""
    living = alive(members)
    deadline = time.monotonic() + timeout_s
    while living and time.monotonic() < deadline:
        time.sleep(0.1)
        living = alive(living)
    return living


def terminate(members: Iterable[psutil.Process], grace_s: float, kill_wait_s: float = 5.0) -> list[psutil.Process]:
    """SIGTERM ``members``, SIGKILL those left after ``grace_s``; those left ``kill_wait_s`` later (none, unless
    a process ignores SIGKILL)."""
    living = alive(members)
    for signum, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, kill_wait_s)):
        signal_all(living, signum)
        living = wait_ended(living, wait_s)
    return living
