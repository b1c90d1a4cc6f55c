"""Decoding workers that cannot take a run down: a per-file time limit, a dead worker replaced.

A ``concurrent.futures`` process pool can neither stop one stuck task (a decoder spinning inside C on a
crafted file never returns) nor survive a worker that dies (a decoder segfault, the OOM killer): the
pool breaks and the whole run with it. Here each worker is a process of its own on a pipe, reporting every
file as it finishes it, so the parent knows which file each worker is on and since when:

* a file past ``limits.timeout_s`` gets its worker killed and replaced, and is quarantined DECODE_TIMEOUT;
* a worker that dies quarantines the file it was on as DECODER_CRASHED;
* either way the rest of that chunk goes to the replacement, and the run goes on.

Workers die with their parent however the parent ends (``die_with_parent``), and ignore Ctrl-C, which the
parent handles by stopping them. ``workers=0`` decodes in this process, without a time limit.
"""

from __future__ import annotations

import contextlib
import ctypes
import multiprocessing
import os
import signal
import sys
import time
from collections.abc import Iterator
from multiprocessing.connection import Connection, wait

import numpy as np

from preprocessing.quarantine import Reason
from preprocessing.tiles import Chunk, ChunkResult, TransformSettings, failed_outcome, process_chunk, process_file

_PR_SET_PDEATHSIG = 1  # linux/prctl.h


def die_with_parent(parent_pid: int) -> None:
    """Have the kernel SIGKILL this process when its parent dies (Linux ``PR_SET_PDEATHSIG``).

    Checked against ``parent_pid`` afterwards: a parent that died before the call would go unnoticed.
    Elsewhere a worker still exits, once its current file is done, when its pipe to the parent closes.
    """
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent_pid:
        os._exit(1)


def _worker_main(connection: Connection, transform: TransformSettings, parent_pid: int) -> None:
    die_with_parent(parent_pid)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    connection.send("ready")
    while True:
        try:
            chunk = connection.recv()
        except EOFError:
            return
        if chunk is None:
            return
        for offset in range(len(chunk.paths)):
            connection.send(process_file(chunk, offset, transform))


class _Slot:
    """One worker process and the chunk it is on; the process is replaced, the slot stays."""

    def __init__(self, context, transform: TransformSettings):
        self.context = context
        self.transform = transform
        self.chunk: Chunk | None = None
        self._start_process()

    def _start_process(self) -> None:
        self.connection, child = self.context.Pipe()
        self.process = self.context.Process(
            target=_worker_main, args=(child, self.transform, os.getpid()), daemon=True, name="fedauc-decode"
        )
        self.process.start()
        child.close()
        self.ready = False
        self.file_started = 0.0

    def assign(self, chunk: Chunk) -> None:
        self.chunk = chunk
        self.tiles = np.zeros((len(chunk.paths),) + self.transform.tile_shape, dtype=np.uint8)
        self.outcomes: list[dict] = []
        self.file_started = time.monotonic()
        self._send(chunk)

    def _send(self, chunk: Chunk) -> None:
        # A dead worker cannot take it: its sentinel reports the death and the chunk moves to a replacement.
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            self.connection.send(chunk)

    @property
    def deadline(self) -> float:
        # The clock starts once the worker has imported its decoders: a fresh process takes seconds.
        return self.file_started + self.transform.limits.timeout_s if self.ready else float("inf")

    @property
    def waitables(self) -> list:
        return [self.connection, self.process.sentinel]

    def drain(self) -> None:
        while self.connection.poll():
            try:
                message = self.connection.recv()
            except (EOFError, ConnectionResetError, OSError):
                return
            self.file_started = time.monotonic()
            if message == "ready":
                self.ready = True
                continue
            tile, outcome = message
            offset = outcome["i"] - self.chunk.start
            if tile is not None:
                self.tiles[offset] = tile
            self.outcomes.append(outcome)

    @property
    def done(self) -> bool:
        return self.chunk is not None and len(self.outcomes) == len(self.chunk.paths)

    def take(self) -> ChunkResult:
        result = ChunkResult(self.chunk.split, self.chunk.start, self.tiles, self.outcomes)
        self.chunk = None
        return result

    def replace_if_stuck(self) -> None:
        """Kill and replace a worker past its file's deadline, or replace one that died; quarantine that file."""
        if self.chunk is None or self.done:
            if not self.process.is_alive():
                self._restart()
            return
        if self.process.is_alive() and time.monotonic() < self.deadline:
            return
        if not self.ready and not self.process.is_alive():
            # Died before its first file: the environment, not a file, is broken; quarantining every file
            # as "crashed" would hide that.
            raise RuntimeError(f"a decode worker exited while starting ({_exit_description(self.process.exitcode)})")
        offset = len(self.outcomes)
        path = self.chunk.paths[offset]
        if self.process.is_alive():
            reason = Reason.DECODE_TIMEOUT
            detail = f"{path}: decoding took more than timeout_s={self.transform.limits.timeout_s:g} s; its worker was replaced"
        else:
            reason = Reason.DECODER_CRASHED
            detail = f"{path}: the worker decoding it died ({_exit_description(self.process.exitcode)})"
        self.outcomes.append(failed_outcome(self.chunk.start + offset, reason, detail))
        self._restart()
        rest = Chunk(self.chunk.split, self.chunk.start + offset + 1, self.chunk.paths[offset + 1 :], self.chunk.root)
        if rest.paths:
            self._send(rest)

    def _restart(self) -> None:
        self.stop(kill=True)
        self._start_process()
        self.file_started = time.monotonic()

    def stop(self, kill: bool = False) -> None:
        if not kill:
            self._send(None)
            self.process.join(timeout=5)
        if self.process.is_alive():
            self.process.kill()
        self.process.join()
        self.connection.close()


def _exit_description(exitcode: int | None) -> str:
    if exitcode is not None and exitcode < 0:
        return f"killed by {signal.Signals(-exitcode).name}"
    return f"exit code {exitcode}"


def decode_chunks(chunks: Iterator[Chunk], transform: TransformSettings, workers: int) -> Iterator[ChunkResult]:
    """Decode ``chunks`` in ``workers`` processes (0: here), yielding each chunk's result when it is complete."""
    if workers == 0:
        for chunk in chunks:
            yield process_chunk(chunk, transform)
        return
    # spawn, not fork: the parent may run Prefect's threads, and forking a threaded process can deadlock.
    context = multiprocessing.get_context("spawn")
    slots = [_Slot(context, transform) for _ in range(workers)]
    try:
        while True:
            for slot in slots:
                if slot.chunk is None:
                    chunk = next(chunks, None)
                    if chunk is not None:
                        slot.assign(chunk)
            busy = [slot for slot in slots if slot.chunk is not None]
            if not busy:
                return
            timeout = max(0.0, min(slot.deadline for slot in busy) - time.monotonic())
            wait([w for slot in busy for w in slot.waitables], timeout=min(timeout, 5.0))
            for slot in busy:
                slot.drain()
                if slot.done:
                    yield slot.take()
            for slot in busy:
                slot.replace_if_stuck()
                if slot.done:
                    yield slot.take()
    finally:
        for slot in slots:
            slot.stop(kill=sys.exc_info()[0] is not None)
