"""A hospital's NVFlare client leaves the consortium when it is stopped, instead of vanishing.

NVFlare's client dies on SIGTERM without a word to the server, which then lists it until its heartbeat
timeout (600 s in a provisioned kit) and refuses to stop meanwhile. :class:`LeaveOnStop`, a component of the
client process (``local/resources.json``, written by ``federated.flare.site.start.prepare_site``), turns
SIGTERM into a logout (the server drops the client at once) and then NVIDIA FLARE's own client shutdown
(``ClientEngine.shutdown``), and ends the process ``grace_s`` seconds later if that shutdown has not. The job
processes the client started end with it (NVIDIA FLARE's worker stops when its parent is gone). The logout
comes first because the shutdown ends the jobs before it logs out: a job process that ends fails the other
sites' collectives, and the server, not yet told the site left, would name one of them.

SIGTERM reaches the client from ``fedauc consortium start-site``'s orderly stop, and from the kernel when
``start-site`` dies however it died (its parent-death signal, ``federated.flare.site.supervise``). The server
notes the logout for a running job (``federated.flare.server.departures``).
"""

from __future__ import annotations

import os
import signal
import threading

from nvflare.apis.event_type import EventType
from nvflare.apis.fl_component import FLComponent
from nvflare.apis.fl_context import FLContext


class LeaveOnStop(FLComponent):
    def __init__(self, grace_s: float = 10.0):
        super().__init__()
        self.grace_s = grace_s
        self._leaving = threading.Event()

    def handle_event(self, event_type: str, fl_ctx: FLContext):
        # The client process fires SYSTEM_BOOTSTRAP from its main thread, the only one that may set handlers.
        if event_type == EventType.SYSTEM_BOOTSTRAP and threading.current_thread() is threading.main_thread():
            engine = fl_ctx.get_engine()
            signal.signal(signal.SIGTERM, lambda *_: self.leave(engine))

    def leave(self, engine) -> None:
        if self._leaving.is_set():
            return
        self._leaving.set()
        self.logger.info("SIGTERM: leaving the consortium")
        # Not in the handler itself: logout and shutdown take locks the interrupted main thread may hold.
        threading.Thread(target=self._logout_then_shutdown, args=(engine,), name="fedauc-leave", daemon=True).start()
        deadline = threading.Timer(self.grace_s, os._exit, args=(0,))
        deadline.daemon = True  # a process that ended by itself does not wait for it
        deadline.start()

    def _logout_then_shutdown(self, engine) -> None:
        try:
            engine.client.logout_client(engine.new_context())
        except Exception as err:  # the shutdown still logs out, later
            self.logger.warning(f"could not log out before the shutdown: {err}")
        engine.shutdown()


# The entry of a site's ``local/resources.json``'s ``components`` that installs it.
COMPONENT = {"id": "fedauc_leave_on_stop", "path": f"{LeaveOnStop.__module__}.{LeaveOnStop.__qualname__}", "args": {}}
