"""Decoding workers that cannot take a run down: a per-file time limit, a dead worker replaced.

A ``concurrent.futures`` process pool can neither stop one stuck task (a decoder spinning inside C on a
crafted file never returns) nor survive a worker that dies (a decoder segfault, the OOM killer): the
pool breaks and the whole run with it. Here each worker is a process of its own on a pipe, reporting every
file as it finishes it, so the parent knows which file each worker is on and since when:

* a file past ``limits.timeout_s`` gets its worker killed and replaced, and is quarantined DECODE_TIMEOUT;
* a worker that dies quarantines the file it was on as DECODER_CRASHED;
* either way what the worker had not reported goes to the replacement, and the run goes on;
* an error of fedauc's own code in a worker (``tiles.process_file`` turns only decoding errors into
  quarantine rows) is sent to the parent with its traceback and raised there: a bug stops the run.

Workers die with their parent however the parent ends (``die_with_parent``), and ignore Ctrl-C, which the
parent handles by stopping them. ``workers=0`` decodes in this process, without a time limit.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import sys
import time
import traceback
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait

import numpy as np

from common.lifetime import die_with_parent
from preprocessing.quarantine import Reason
from preprocessing.tiles import Chunk, ChunkResult, TransformSettings, failed_outcome, process_chunk, process_file


@dataclass(frozen=True)
class WorkerBug:
    """What a worker sends in place of a file's outcome when fedauc's code raised on it."""

    path: str
    trace: str


class DecodeWorkerBug(RuntimeError):
    """fedauc's own code raised in a decode worker: not the file's fault, so not a quarantine row."""


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
            try:
                result = process_file(chunk, offset, transform)
            except Exception:
                # Dying would read as a decoder crash (a quarantine row); the parent raises it instead.
                connection.send(WorkerBug(chunk.paths[offset], traceback.format_exc()))
                return
            connection.send(result)


class _Pending:
    """A chunk sent to a worker, filling up as its files are reported."""

    def __init__(self, chunk: Chunk, tile_shape: tuple[int, ...]):
        self.chunk = chunk
        self.tiles = np.zeros((len(chunk.paths),) + tile_shape, dtype=np.uint8)
        self.outcomes: list[dict] = []

    @property
    def complete(self) -> bool:
        return len(self.outcomes) == len(self.chunk.paths)

    def rest(self) -> Chunk:
        """The chunk's files not reported yet."""
        done = len(self.outcomes)
        return Chunk(self.chunk.split, self.chunk.start + done, self.chunk.paths[done:], self.chunk.root)


class _Slot:
    """One worker process and the chunks sent to it (up to ``DEPTH``, so that it never waits for the parent
    to write); the process is replaced, the slot and its chunks stay."""

    DEPTH = 2

    def __init__(self, context, transform: TransformSettings):
        self.context = context
        self.transform = transform
        self.pending: deque[_Pending] = deque()
        self.finished: list[ChunkResult] = []
        self._start_process()

    def _start_process(self) -> None:
        self.connection, child = self.context.Pipe()
        self.process = self.context.Process(
            target=_worker_main, args=(child, self.transform, os.getpid()), daemon=True, name="fedauc-decode"
        )
        self.process.start()
        child.close()
        self.ready = False
        self.file_started = time.monotonic()

    @property
    def has_room(self) -> bool:
        return len(self.pending) < self.DEPTH

    @property
    def busy(self) -> bool:
        return bool(self.pending)

    def assign(self, chunk: Chunk) -> None:
        if not self.pending:
            self.file_started = time.monotonic()  # an idle worker starts on it now
        self.pending.append(_Pending(chunk, self.transform.tile_shape))
        self._send(chunk)

    def _send(self, chunk: Chunk | None) -> None:
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
        """Read what the worker reported; chunks it completed move to ``finished``."""
        while self.connection.poll():
            try:
                message = self.connection.recv()
            except (EOFError, ConnectionResetError, OSError):
                return
            self.file_started = time.monotonic()
            if message == "ready":
                self.ready = True
                continue
            if isinstance(message, WorkerBug):
                raise DecodeWorkerBug(f"a decode worker failed on {message.path} with an error in fedauc's code, "
                                      f"not in the file:\n{message.trace}")
            tile, outcome = message
            head = self.pending[0]  # a worker reports the files of its chunks in the order it got them
            if tile is not None:
                head.tiles[outcome["i"] - head.chunk.start] = tile
            head.outcomes.append(outcome)
            self._move_complete()

    def _move_complete(self) -> None:
        while self.pending and self.pending[0].complete:
            done = self.pending.popleft()
            self.finished.append(ChunkResult(done.chunk.split, done.chunk.start, done.tiles, done.outcomes))

    def take(self) -> list[ChunkResult]:
        finished, self.finished = self.finished, []
        return finished

    def replace_if_stuck(self) -> None:
        """Kill and replace a worker past its file's deadline, or replace one that died; quarantine that file."""
        if not self.pending:
            if not self.process.is_alive():
                self._restart()
            return
        if self.process.is_alive() and time.monotonic() < self.deadline:
            return
        if not self.ready and not self.process.is_alive():
            # Died before its first file: the environment, not a file, is broken; quarantining every file
            # as "crashed" would hide that.
            raise RuntimeError(f"a decode worker exited while starting ({_exit_description(self.process.exitcode)})")
        head = self.pending[0]
        index = head.chunk.start + len(head.outcomes)
        path = head.chunk.paths[len(head.outcomes)]
        if self.process.is_alive():
            reason = Reason.DECODE_TIMEOUT
            detail = f"{path}: decoding took more than timeout_s={self.transform.limits.timeout_s:g} s; its worker was replaced"
        else:
            reason = Reason.DECODER_CRASHED
            detail = f"{path}: the worker decoding it died ({_exit_description(self.process.exitcode)})"
        head.outcomes.append(failed_outcome(index, reason, detail))
        self._move_complete()
        self._restart()
        # The replacement gets what its predecessor had not reported, in the same order.
        for pending in self.pending:
            self._send(pending.rest())

    def _restart(self) -> None:
        self.stop(kill=True)
        self._start_process()

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
                while slot.has_room and (chunk := next(chunks, None)) is not None:
                    slot.assign(chunk)
            busy = [slot for slot in slots if slot.busy]
            if not busy:
                return
            timeout = max(0.0, min(slot.deadline for slot in busy) - time.monotonic())
            wait([w for slot in busy for w in slot.waitables], timeout=min(timeout, 5.0))
            for slot in busy:
                slot.drain()
                slot.replace_if_stuck()
                yield from slot.take()
    finally:
        for slot in slots:
            slot.stop(kill=sys.exc_info()[0] is not None)
