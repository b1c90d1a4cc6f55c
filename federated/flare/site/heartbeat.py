"""The site's heartbeat while it trains: a thread of its own calls the server's published ``heartbeat``
every ``HEARTBEAT_S`` seconds (``federated.flare.protocol``), so the centre tells a dead site (silent) from a
slow one (still beating, bounded by ``--site-timeout`` at the next collective). It carries the site's
name and the fedauc code version it runs (``federated.version``), nothing else."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable

from federated.flare.protocol import HEARTBEAT_S
from federated.version import code_version


class Heartbeat:
    """``with Heartbeat(call, site):`` beats (``call(site, version, False)``) from entry to exit, then says
    it is done (``call(site, version, True)``: a site whose training returned is not dead). A beat that fails
    (the server busy, a dropped connection) is skipped: silence, not an error, is what the server judges."""

    def __init__(self, call: Callable[[str, str, bool], None], site: str, interval_s: float = HEARTBEAT_S):
        self._call, self.site, self.interval_s = call, site, interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, daemon=True, name="fedauc-heartbeat")

    def _send(self, done: bool) -> None:
        with contextlib.suppress(Exception):  # the next beat tries again; the server judges the silence
            self._call(self.site, code_version(), done)

    def _beat(self) -> None:
        while True:
            self._send(False)
            if self._stop.wait(self.interval_s):
                return

    def __enter__(self) -> Heartbeat:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=self.interval_s)
        self._send(True)
