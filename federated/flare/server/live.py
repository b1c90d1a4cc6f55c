"""The server's live account of a running job: each round's record as site 0 finishes it, the failure that
ends the job (its reason and the site it names), and the sites' heartbeats, which name a site that died.

Where it goes: ``LIVE_FILE`` (one JSON object a line) in the server's run folder of the job, which the
submitter reads while the job runs (``federated.flare.centre.feed``: the file itself under the simulator, NVFlare's
admin ``cat`` against a consortium) and ``fedauc consortium status`` reads for a running job's round;
``SITES_FILE`` in the server's workspace root: every site's last heartbeat and the fedauc version it runs,
and, once it admitted a DP job, the epsilon its ledger has spent and has left, across jobs; ``LEFT_FILE``
beside it: when each site last left the consortium (its client logged out), written by the server's own
process (``federated.flare.server.departures.RecordDepartures``), which alone hears the logout. They hold what the
sites already send the centre (a round's aggregate record: bytes, mean loss, metrics with small counts
suppressed), nothing per image.

A site heartbeats every ``HEARTBEAT_S`` seconds from a thread of its own (``federated.flare.site.heartbeat``),
whatever its training is doing; a site silent for ``dead_after_s`` (its process or machine died, its
network dropped) is named at once, instead of when the others time out at a collective (``--site-timeout``,
which still bounds a site that is alive but slow). NVIDIA FLARE's own dead-client detection is no help
here: the server drops a client after its ``heart_beat_timeout`` (600 s in a provisioned kit) and reports
a dead job only when the client's parent process survives to say so. A site stopped cleanly (``systemctl
stop``: its client logs out before its job process ends, ``federated.flare.site.leave``) is named within a
second as having left: the job's watch reads ``LEFT_FILE``, and a job failing meanwhile (the others'
collectives fail as the site's job process ends) names the departure (``departed``), not those failures.
NVIDIA FLARE's own report of the logout to the job puts the client on a watch list for 60 s and names no one.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from federated.flare.protocol import LEFT_FILE, LIVE_FILE, SITES_FILE

DEAD_AFTER_S = 30.0  # six missed heartbeats: a busy machine skips one, a dead one all


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


_departures = threading.Lock()  # the server's process hears several clients log out at once


def record_departure(root_dir: Path, site: str) -> None:
    """``site`` left the consortium now (its client logged out): ``LEFT_FILE`` in the server's workspace root."""
    path = Path(root_dir) / LEFT_FILE
    with _departures:
        _write_atomic(path, json.dumps({**_read_json(path), site: time.time()}))


def left_reason(site: str) -> str:
    return (f"site {site!r} left the consortium (its operator stopped fedauc); the job stops: start the site again "
            f"with `fedauc consortium start-site`, then `fedauc train --resume`")


class LiveRecords:
    """The server's side: ``record`` and ``heartbeat`` are called by the sites (server-published functions),
    ``watch`` runs a thread that calls ``on_gone(site, reason)`` once for the first site still training that
    left the consortium (``LEFT_FILE``) or went silent."""

    def __init__(self, run_dir: Path, root_dir: Path, sites: list[str], job_id: str,
                 dead_after_s: float = DEAD_AFTER_S):
        self.path = Path(run_dir) / LIVE_FILE
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.sites_path = Path(root_dir) / SITES_FILE
        self.left_path = Path(root_dir) / LEFT_FILE
        self.job_id = job_id
        self.dead_after_s = dead_after_s
        now = self.started = time.time()
        self._heard = dict.fromkeys(sites, now)  # from the moment the job started the sites' training
        # Every site's last heartbeat across jobs: read once, written by the watch loop.
        self._known = _read_json(self.sites_path).get("sites", {})
        self._dirty = False
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._append({"job": job_id, "sites": sites, "started": now})

    def _append(self, entry: dict) -> None:
        with self._lock, open(self.path, "a") as out:
            out.write(json.dumps(entry) + "\n")

    def record(self, record: dict) -> None:
        self._append({"round": record["round"], "record": record, "at": time.time()})

    def failure(self, reason: str, site: str | None) -> None:
        self._append({"failure": reason, "site": site, "at": time.time()})

    def heartbeat(self, site: str, version: str, done: bool) -> None:
        now = time.time()
        with self._lock:
            if done:  # its training returned: no longer watched
                self._heard.pop(site, None)
            elif site in self._heard:
                self._heard[site] = now
            # Written at most once a second (``flush``), not at every heartbeat: K sites' heartbeats each
            # rewriting the K sites' file cost the server K^2 a heartbeat period.
            self._known.setdefault(site, {}).update(last_heartbeat=now, fedauc=version, job=self.job_id)
            self._dirty = True

    def budget(self, site: str, spent: float, remaining: float | None, change: str | None = None) -> None:
        """What ``site``'s ledger has spent, and has left (None: no budget), once it admitted this DP job, and its
        ledger's last budget change (one line; None: none)."""
        with self._lock:
            self._known.setdefault(site, {}).update(epsilon_spent=spent, epsilon_remaining=remaining,
                                                    budget_change=change)
            self._dirty = True

    def flush(self) -> None:
        """Write the sites' heartbeats to ``SITES_FILE`` if any came since the last write."""
        with self._lock:
            if self._dirty:
                _write_atomic(self.sites_path, json.dumps({"sites": self._known}))
                self._dirty = False

    def departed(self, among: Iterable[str]) -> str | None:
        """The first of the sites ``among`` to have left the consortium since the job started (``LEFT_FILE``)."""
        # Earlier departures are of sites that came back before this job (it started with all of them).
        left = {site: at for site, at in _read_json(self.left_path).items() if at > self.started and site in among}
        return min(left, key=left.get) if left else None

    def watch(self, on_gone: Callable[[str, str], None]) -> None:
        def loop():
            while not self._stop.wait(1.0):
                self.flush()
                with self._lock:
                    now = time.time()
                    training = list(self._heard)
                    silent = [(now - t, site) for site, t in self._heard.items() if now - t > self.dead_after_s]
                gone = self.departed(training)
                if gone is not None:
                    on_gone(gone, left_reason(gone))
                    return
                if silent:
                    seconds, site = max(silent)
                    on_gone(site, f"site {site!r} stopped answering: no heartbeat for {seconds:.0f} s (its process "
                                  f"or machine died, or its network to the server dropped); the job stops")
                    return

        threading.Thread(target=loop, daemon=True, name="fedauc-liveness").start()

    def stop(self) -> None:
        self._stop.set()
        self.flush()
