"""One writer per site: a lock file ``<out>/<site>/.lock`` held with ``flock`` while shards are written.

The kernel drops an ``flock`` when its process ends, however it ends, so a lock can never outlive its
run: a second run finds it taken only while the first is alive, and is told who holds it (pid, host,
since) by the JSON the holder wrote into the file. A clean exit empties the file; a file still holding a
holder when the lock is free was left by a run that was killed, which the next run says in one line and
takes over. The file is never deleted: unlinking a locked file lets a third run lock a fresh inode while
the second still holds the old one. ``flock`` on NFS is emulated with POSIX locks on Linux (NFSv4).
"""

from __future__ import annotations

import contextlib
import datetime
import fcntl
import json
import os
import socket
from collections.abc import Callable, Iterator
from pathlib import Path

from common.errors import FedaucError
from common.notice import notice
from preprocessing.shard_format import LOCK_FILE


class SiteBusyError(FedaucError):
    """Another run is writing the same site's shards."""


def _holder_text(holder: dict) -> str:
    return f"pid {holder.get('pid')} on {holder.get('host')}, since {holder.get('since')}"


def _read_holder(descriptor: int) -> dict | None:
    text = os.pread(descriptor, 4096, 0).decode(errors="replace").strip()
    if not text:
        return None
    try:
        holder = json.loads(text)
    except json.JSONDecodeError:
        return {"pid": "?", "host": "?", "since": "? (unreadable lock file)"}
    return holder if isinstance(holder, dict) else None


def check_site_free(site_dir: Path) -> None:
    """Raise ``SiteBusyError`` naming the holder when a run holds ``site_dir``'s lock now (nothing is locked)."""
    path = Path(site_dir) / LOCK_FILE
    if not path.exists():
        return
    descriptor = os.open(path, os.O_RDONLY)
    try:
        try:
            fcntl.flock(descriptor, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            raise _busy(site_dir, descriptor) from None
    finally:
        os.close(descriptor)


def _busy(site_dir: Path, descriptor: int) -> SiteBusyError:
    holder = _read_holder(descriptor) or {"pid": "?", "host": "?", "since": "? (it is starting)"}
    return SiteBusyError(
        f"{site_dir}: another preprocess of this site is running ({_holder_text(holder)})",
        fix="wait for it to finish or stop it; a run that was killed leaves no lock behind",
    )


@contextlib.contextmanager
def site_lock(site_dir: Path, announce: Callable[[str], None] = notice) -> Iterator[None]:
    """Hold ``site_dir``'s lock for the block; raise ``SiteBusyError`` naming the holder when it is taken."""
    site_dir = Path(site_dir)
    site_dir.mkdir(parents=True, exist_ok=True)
    descriptor = os.open(site_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise _busy(site_dir, descriptor) from None
        stale = _read_holder(descriptor)
        if stale is not None:
            announce(f"{site_dir}: taking over the lock of an interrupted run ({_holder_text(stale)})")
        holder = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "since": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        }
        os.ftruncate(descriptor, 0)
        os.pwrite(descriptor, (json.dumps(holder) + "\n").encode(), 0)
        yield
        os.ftruncate(descriptor, 0)  # released cleanly: the next run has nothing to recover
    finally:
        os.close(descriptor)  # closing drops the flock
