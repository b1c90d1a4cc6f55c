"""The coordinating centre's NVFlare server: check its kit, then run it in the foreground (what ``fedauc
consortium start-server`` and the one-machine ``LocalConsortium`` do).

Before NVFlare starts: the kit's private key must be its owner's alone (``lockdown.check_private_key``),
the server builds only fedauc's job components (``installed.allow_components``) and keeps its job store and
snapshots owner-only in its own workspace, with no receiver of sites' live logs (``lockdown.server_stores``).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from common.errors import ConfigError
from federated.flare.installed import allow_components
from federated.flare.lockdown import centre_policy, check_private_key, server_stores, write_owner_only
from federated.flare.processes import start_command, start_env
from federated.flare.server.departures import COMPONENT as RECORD_DEPARTURES


def prepare_server(kit: str | Path) -> Path:
    """Every check and the server's local settings; the kit's folder."""
    root = Path(kit).resolve()
    if not (root / "startup" / "fed_server.json").is_file():
        raise ConfigError(f"{root}: not the server's startup kit (no startup/fed_server.json)",
                          fix="pass the server's folder that `fedauc consortium provision` wrote")
    check_private_key(root / "startup" / "server.key")
    allow_components(root / "local", RECORD_DEPARTURES)  # a running job names a hospital that left at once
    # The current policy, not the one of the fedauc that provisioned the kit: a server provisioned before the
    # retention's `delete_job` gets it at its next start.
    write_owner_only(root / "local" / "authorization.json.default", json.dumps(centre_policy(server=True), indent=2))
    server_stores(root)
    return root


def run_server(root: Path) -> int:
    """Run the server until it stops; its exit status."""
    return subprocess.call(start_command(root), env=start_env(), cwd=root)
