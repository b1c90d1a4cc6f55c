"""The submitter's side of a job's live account (``federated.flare.server.live``): while the job runs, read the
server's ``LIVE_FILE`` every ``interval_s`` seconds and hand each new round record to the training's callbacks
(MLflow, the console), in order, once; remember the failure it reports and call ``on_failure`` at once.

Under the simulator the file is on this machine; against a consortium (POC or real) it is read with the
admin's own kit through NVIDIA FLARE's admin ``cat`` of the server's workspace, so the centre reads what its
server wrote and nothing at a hospital. Each reader names the errors of its transport (``LiveReader.errors``):
a read that fails with one of them is tried again at the next poll, and after ``give_up_s`` seconds of
failures the feed stops and says so in one line on stderr (the job goes on; the rounds it did not bring
come with the job's result, ``job.deliver_rest``). Any other error is a bug: the feed stops, says so, and
raises it when the job's block ends.
"""

from __future__ import annotations

import contextlib
import json
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from federated.flare.centre.session import quiet_session
from federated.flare.protocol import LIVE_FILE

if TYPE_CHECKING:  # `fedauc consortium status` reads the live file through this module without loading torch
    from federated.reporting import RoundCallback


def parse(text: str) -> list[dict]:
    """The live file's entries; anything else the read returned (a missing file's message) is skipped."""
    entries = []
    for line in text.splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if isinstance(entry, dict):
            entries.append(entry)
    return entries


@dataclass(frozen=True)
class LiveReader:
    """``read()``: the live file's text so far (None before it exists); ``errors``: what its transport raises
    when it cannot read the file now (a dropped connection, a busy server), as opposed to a bug; ``close()``:
    lets go of what the reads held open, once the feed is done with them."""

    read: Callable[[], str | None]
    errors: tuple[type[BaseException], ...]
    close: Callable[[], None] = lambda: None


class LiveFeed:
    """Hands each round record to ``callbacks`` once, in order; ``reading(reader)`` polls the reader from a
    thread while the job runs. ``stopped``: why live reading stopped before the job's end (None while it
    reads)."""

    def __init__(self, callbacks: Sequence[RoundCallback] = (),
                 on_failure: Callable[[str, str | None], None] | None = None, interval_s: float = 2.0,
                 give_up_s: float = 60.0):
        self.callbacks, self.on_failure, self.interval_s = list(callbacks), on_failure, interval_s
        self.give_up_s = give_up_s
        self.first_round: int | None = None  # the first round handed to the callbacks
        self.last_round: int | None = None  # the newest
        self.failure: tuple[str, str | None] | None = None
        self.stopped: str | None = None
        self._lock = threading.Lock()

    def deliver(self, record: dict) -> None:
        """Hand ``record`` to the callbacks unless a record of its round (or a later one) was handed already."""
        with self._lock:
            if self.last_round is not None and record["round"] <= self.last_round:
                return
            for callback in self.callbacks:
                callback(record)
            self.last_round = record["round"]
            if self.first_round is None:
                self.first_round = record["round"]

    def poll(self, read: Callable[[], str | None]) -> None:
        """Read once and hand on what is new; raises what ``read`` raises."""
        for entry in parse(read() or ""):
            if "record" in entry:
                self.deliver(entry["record"])
            elif "failure" in entry and self.failure is None:
                self.failure = (entry["failure"], entry.get("site"))
                if self.on_failure is not None:
                    self.on_failure(*self.failure)

    def _stop(self, err: BaseException, bug: bool) -> None:
        """Say once, in one line on stderr, that live records stop and why."""
        if self.stopped is not None:
            return
        self.stopped = f"{type(err).__name__}: {err}"
        after = "before the first round" if self.last_round is None else f"after round {self.last_round + 1}"
        then = ("a bug in fedauc, raised when the job ends" if bug else
                "the job goes on; the rounds not shown come with its result")
        print(f"fedauc: live round records stop {after}: {self.stopped} ({then})", file=sys.stderr, flush=True)

    @contextlib.contextmanager
    def reading(self, reader: LiveReader):
        """Poll ``reader`` every ``interval_s`` seconds inside the block, and once more after it (what the job
        wrote after the last poll). A transport error is tried again until it has lasted ``give_up_s``
        seconds; any other error stops the feed and is raised when the block ends."""
        stop = threading.Event()
        bugs: list[BaseException] = []

        def loop():
            failing_since = None
            while not stop.wait(self.interval_s):
                try:
                    self.poll(reader.read)
                    failing_since = None
                except reader.errors as err:
                    failing_since = failing_since or time.monotonic()
                    if time.monotonic() - failing_since >= self.give_up_s:
                        self._stop(err, bug=False)
                        return
                except Exception as err:
                    bugs.append(err)
                    self._stop(err, bug=True)
                    return

        thread = threading.Thread(target=loop, daemon=True, name="fedauc-live-feed")
        thread.start()
        try:
            yield self
        finally:
            stop.set()
            thread.join()
            try:
                if bugs:
                    raise bugs[0]
                if self.stopped is None:
                    try:
                        self.poll(reader.read)
                    except reader.errors as err:
                        self._stop(err, bug=False)
            finally:
                reader.close()


def local_reader(folder: Path) -> LiveReader:
    """The live file of the job whose server runs under ``folder`` on this machine (the simulator): the file
    system's errors only (the simulator removing or replacing a folder while it is searched)."""
    def read():
        found = sorted(Path(folder).rglob(LIVE_FILE))
        return found[0].read_text() if found else None
    return LiveReader(read, (OSError,))


def admin_reader(kit: Path, username: str, job_id: str) -> LiveReader:
    """The live file of job ``job_id`` on the consortium's server, through the admin's own session: one session
    for every read while it works (each login costs NVIDIA FLARE's admin client a second's wait and both ends
    a TLS handshake and a signature check), a new one at the next read after one failed. Its transport's
    errors: the connection's (``OSError``: NVFlare's ``NoConnection`` is a ``ConnectionError``; timeouts,
    TLS), its communication layer's, and what NVFlare's admin API raises when the server closed, did not
    answer, failed or refused the session."""
    from nvflare.apis.fl_exception import FLCommunicationError
    from nvflare.fuel.flare_api import api_spec

    errors = (OSError, FLCommunicationError, api_spec.SessionClosed, api_spec.NoReply, api_spec.InternalError,
              api_spec.AuthenticationError, api_spec.AuthorizationError)
    open_sessions = []

    def read():
        if not open_sessions:
            open_sessions.append(quiet_session(username, kit, timeout_s=10.0))
        try:
            return open_sessions[0].cat_target("server", file=f"{job_id}/{LIVE_FILE}")
        except errors:
            close()
            raise

    def close():
        while open_sessions:
            open_sessions.pop().close()

    return LiveReader(read, errors, close)


def describe_slowest(record: dict) -> str | None:
    """One phrase naming the round's slowest site and its delay (the record's ``slowest``: federated/timing.py), or
    None for a record without timings."""
    slowest = record.get("slowest")
    if not slowest:
        return None
    return (f"slowest site {slowest['site']!r} ({slowest['compute_s']:.1f} s, held the round up "
            f"{slowest['held_up_s']:.1f} s)")


VALID_AUC = "valid/pooled/auc_macro"


def progress_printer(rounds: int) -> RoundCallback:
    """A callback printing one line a round to stderr at the centre: the round, the mean training loss over
    sites, the latest pooled validation macro-AUC (with the round it was evaluated at) and the round's slowest
    site with how long it held the round up (federated/timing.py)."""
    latest: list[tuple[float, int]] = []

    def show(record: dict) -> None:
        auc = record.get("metrics", {}).get(VALID_AUC)
        if auc is not None:
            latest[:] = [(auc, record["round"])]
        line = f"round {record['round'] + 1}/{rounds}: train loss {record['train_loss']:.4f}"
        if latest:
            line += f", pooled valid AUC {latest[0][0]:.4f} (round {latest[0][1] + 1})"
        slowest = describe_slowest(record)
        if slowest:
            line += f"; {slowest}"
        print(line, file=sys.stderr, flush=True)

    return show
