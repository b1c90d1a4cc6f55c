"""The server hears a hospital leave: :class:`RecordDepartures`, a component of the server's process (written
by ``federated.flare.server.start.prepare_server``), notes each logout where a running job's liveness watch reads it
(``federated.flare.protocol.LEFT_FILE``, by ``federated.flare.server.live.record_departure``): only the server's
process hears it, and the job then names the site that left at once, instead of 30 s later as one gone silent
or, sooner, one of the sites whose collective failed as the leaving site's job process ended. The site's half,
the logout itself: ``federated.flare.site.leave``.
"""

from __future__ import annotations

from pathlib import Path

from nvflare.apis.event_type import EventType
from nvflare.apis.fl_component import FLComponent
from nvflare.apis.fl_context import FLContext

from federated.flare.server.live import record_departure


class RecordDepartures(FLComponent):
    def handle_event(self, event_type: str, fl_ctx: FLContext):
        # Fired once the server has dropped the client (NVIDIA FLARE's ``quit_client``), with the client's context.
        if event_type == EventType.CLIENT_QUIT and fl_ctx.get_peer_context() is not None:
            site = fl_ctx.get_peer_context().get_identity_name()
            self.logger.info(f"site {site} left the consortium")
            record_departure(Path(fl_ctx.get_engine().get_workspace().get_root_dir()), site)


# The entry of the server's ``local/resources.json``'s ``components`` that installs it.
COMPONENT = {"id": "fedauc_record_departures", "path": f"{RecordDepartures.__module__}.{RecordDepartures.__qualname__}",
             "args": {}}
