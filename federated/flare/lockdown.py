"""The consortium's trust boundary on disk: owner-only secrets, who may do what, where the server keeps jobs.

Secrets: provisioning leaves every file it writes owner-only (files 0600, or 0700 when executable, in 0700
folders): the kits' private keys and the provisioning state (``<out>/<project>/state/cert.json``: the root
CA's key and every participant's). A participant refuses to start from a kit whose private key others may
read (:func:`check_private_key`), as ssh refuses such a key.

Least privilege (NVIDIA FLARE 2.9's authorization policy, ``nvflare/fuel/sec/authz.py``: a role's rights by
command or category; a right the role does not list is refused): the provisioned policy
(:func:`centre_policy`) lets the project admin submit, list, abort and download jobs, see status and
disable a client, and at the server alone read fedauc's files in its workspace, forget a silent client and stop it, nothing else. A hospital's own ``local/authorization.json`` (:func:`site_policy`, which
NVFlare reads before the kit's ``authorization.json.default``) grants the same and refuses shell
commands (``ls``, ``cat``, ``grep``, ``head``, ``tail``, ``pwd``) and custom code (``byoc``), whatever the
server's policy says: the site checks every command that reaches it against its own file.

Stores: the server keeps its job store and snapshots in ``stores/`` of its own workspace (owner-only), not
NVFlare's default ``/tmp/nvflare``, which every consortium and user on the machine shares; it runs no
receiver for sites' live logs.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

from common.errors import ConfigError

# What the project admin may do (NVFlare's command names; "abort" is how abort_job reaches a site's job).
ADMIN_RIGHTS = ("submit_job", "list_jobs", "get_job_meta", "abort_job", "abort", "download_job", "check_status",
                "disable_client")
# What the project admin may do at the server alone: read fedauc's files in the server's own workspace (a
# running job's round records and the sites' heartbeats, federated/flare/server/live.py; its log: when each site
# joined), drop a hospital that stopped heartbeating from its list and stop the server
# (federated/flare/centre/operate.py), and delete finished jobs from its job store after the retention period
# (federated/flare/centre/prune.py). Every hospital refuses them all.
SERVER_RIGHTS = ("cat", "grep", "remove_client", "shutdown", "delete_job")
# What a hospital refuses whatever the server's policy says.
SITE_REFUSES = ("shell_commands", "byoc")
STORES = "stores"  # in the server's workspace: jobs/ and snapshots/


def make_owner_only(root: str | Path) -> None:
    """Folders 0700 and files 0600 (0700 if executable) under ``root``, ``root`` included."""
    root = Path(root)
    for folder, _dirs, files in os.walk(root):
        os.chmod(folder, 0o700)
        for name in files:
            path = Path(folder) / name
            if not path.is_symlink():
                path.chmod(0o700 if path.stat().st_mode & stat.S_IXUSR else 0o600)


def write_owner_only(path: Path, text: str) -> None:
    """``text`` into ``path``, readable by its owner only from the moment it exists."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(text)
    path.chmod(0o600)


def check_private_key(key: Path) -> None:
    """Raise unless ``key`` exists and only its owner may read or write it."""
    if not key.is_file():
        raise ConfigError(f"{key}: the kit's private key is missing",
                          fix="use the kit exactly as `fedauc consortium provision` wrote it")
    mode = stat.S_IMODE(key.stat().st_mode)
    if mode & 0o077:
        raise ConfigError(f"{key}: private key readable by others (mode {mode:04o}); refusing to start with it",
                          fix=f"chmod 600 {key} && chmod 700 {key.parent}, then ask the project admin for a new "
                              "kit if others may have read it")


def centre_policy(server: bool = False) -> dict:
    """The provisioned policy; the server's (``server``) adds ``SERVER_RIGHTS``."""
    rights = ADMIN_RIGHTS + (SERVER_RIGHTS if server else ())
    return {"format_version": "1.0", "permissions": {"project_admin": dict.fromkeys(rights, "any")}}


def site_policy() -> dict:
    rights = dict.fromkeys(ADMIN_RIGHTS, "any") | dict.fromkeys(SITE_REFUSES, "none")
    return {"format_version": "1.0", "permissions": {"project_admin": rights}}


def install_site_policy(local_dir: Path) -> Path:
    path = Path(local_dir) / "authorization.json"
    write_owner_only(path, json.dumps(site_policy(), indent=2))
    return path


def server_stores(kit: Path) -> Path:
    """Point the server's job store and snapshots (its ``local/resources.json``) at ``stores/`` in its own
    workspace ``kit``, created owner-only, and drop NVFlare's receiver of sites' live logs; the stores."""
    stores = Path(kit).resolve() / STORES
    for sub in ("jobs", "snapshots"):
        (stores / sub).mkdir(parents=True, exist_ok=True, mode=0o700)
    make_owner_only(stores)
    path = Path(kit) / "local" / "resources.json"
    resources = json.loads(path.read_text())
    resources["snapshot_persistor"]["args"]["storage"]["args"]["root_dir"] = str(stores / "snapshots")
    components = [c for c in resources["components"] if not c["path"].endswith(".JobLogReceiver")]
    for component in components:
        if component["id"] == "job_manager":
            component["args"]["uri_root"] = str(stores / "jobs")
    resources["components"] = components
    write_owner_only(path, json.dumps(resources, indent=2))
    return stores
