"""The submitter's side of a job's live account (``federated.flare.live``): while the job runs, read the
server's ``LIVE_FILE`` every ``interval_s`` seconds and hand each new round record to the training's callbacks
(MLflow, the console), in order, once; remember the failure it reports and call ``on_failure`` at once.

Under the simulator the file is on this machine; against a consortium (POC or real) it is read with the
admin's own kit through NVIDIA FLARE's admin ``cat`` of the server's workspace, so the centre reads what its
server wrote and nothing at a hospital.
"""

from __future__ import annotations

import contextlib
import json
import sys
import threading
from collections.abc import Callable, Sequence
from pathlib import Path

from federated.engine import RoundCallback
from federated.flare.live import LIVE_FILE
from federated.timing import describe_slowest


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


class LiveFeed:
    """Hands each round record to ``callbacks`` once, in order; ``reading(read)`` polls ``read()`` (the live
    file's text so far, or None) from a thread while the job runs."""

    def __init__(self, callbacks: Sequence[RoundCallback] = (),
                 on_failure: Callable[[str, str | None], None] | None = None, interval_s: float = 2.0):
        self.callbacks, self.on_failure, self.interval_s = list(callbacks), on_failure, interval_s
        self.first_round: int | None = None  # the first round handed to the callbacks
        self.last_round: int | None = None  # the newest
        self.failure: tuple[str, str | None] | None = None
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
        try:
            text = read()
        except Exception:  # a dropped admin connection: the next poll reads again
            return
        for entry in parse(text or ""):
            if "record" in entry:
                self.deliver(entry["record"])
            elif "failure" in entry and self.failure is None:
                self.failure = (entry["failure"], entry.get("site"))
                if self.on_failure is not None:
                    self.on_failure(*self.failure)

    @contextlib.contextmanager
    def reading(self, read: Callable[[], str | None]):
        """Poll ``read`` every ``interval_s`` seconds inside the block, and once more after it (what the job
        wrote after the last poll)."""
        stop = threading.Event()

        def loop():
            while not stop.wait(self.interval_s):
                self.poll(read)

        thread = threading.Thread(target=loop, daemon=True, name="fedauc-live-feed")
        thread.start()
        try:
            yield self
        finally:
            stop.set()
            thread.join()
            self.poll(read)


def local_reader(folder: Path) -> Callable[[], str | None]:
    """The live file of the job whose server runs under ``folder`` on this machine (the simulator)."""
    def read():
        found = sorted(Path(folder).rglob(LIVE_FILE))
        return found[0].read_text() if found else None
    return read


@contextlib.contextmanager
def admin_reader(kit: Path, username: str, job_id: str):
    """Yields a reader of job ``job_id``'s live file on the consortium's server through one admin session of
    the admin's own kit, kept for the job (a new session a poll cost a TLS login each time), opened again
    after a dropped connection; closed on leaving."""
    from nvflare.fuel.flare_api.flare_api import new_secure_session

    held: list = []

    def read():
        if not held:
            held.append(new_secure_session(username, str(kit), timeout=10.0))
        try:
            return held[0].cat_target("server", file=f"{job_id}/{LIVE_FILE}")
        except Exception:
            session = held.pop()
            with contextlib.suppress(Exception):  # the connection is gone already
                session.close()
            raise

    try:
        yield read
    finally:
        for session in held:
            session.close()


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
