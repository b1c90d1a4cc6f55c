"""A consortium's identities: the NVFlare project file and its signed startup kits, from a federation YAML.

One root CA (kept in the output folder's provisioning state, so a later provisioning of the same folder,
e.g. to onboard a hospital, signs with the same CA), one certificate and key per participant: the server
(named by the host the hospitals dial), one client per hospital of the federation (its site name), one
project admin who submits jobs. ``connection_security`` is mutual TLS; the hospitals only dial out to
the server's one port. ``nvflare.lighter`` does the cryptography.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

import yaml

from common.errors import ConfigError
from federated.flare.centre.certificates import (
    ROOT_KEYS,
    ROOT_VALID,
    STATE_FILE,
    WARN_BEFORE,
    issue_root,
    seed_root,
    stored_root,
)
from federated.flare.installed import allow_components
from federated.flare.lockdown import centre_policy, make_owner_only, server_stores, write_owner_only
from preprocessing.federation import Federation

DEFAULT_PORT = 8002


@dataclass
class Kits:
    project_file: Path
    server: Path
    sites: dict[str, Path]
    admin: Path
    # The participants whose kit this provisioning made for the first time (all of them the first time; after
    # a re-provisioning into the same folder, e.g. a hospital joining, only the newcomers').
    new: frozenset[str] = frozenset()

    @property
    def state(self) -> Path:
        """NVFlare's provisioning state: the root CA's key and every participant's."""
        return self.server.parent.parent / "state"

    def summary(self, server_host: str, port: int) -> str:
        """What to send to whom (and what never to send), as Markdown; after a re-provisioning, the kits to send
        are marked new and the others are to be left where they are."""
        again = {self.server.name, self.admin.name, *self.sites} != set(self.new)

        def send(kit: Path, whom: str) -> str:
            if not again:
                return whom
            return f"**new**: {whom}" if kit.name in self.new else f"nothing: {whom} keeps the kit it has"

        centre = f"the coordinating centre's server machine ({server_host})"
        lines = [
            f"Consortium kits in {self.server.parent} (project file {self.project_file}).",
            *([f"Re-provisioned with the same root CA: send only the new kit(s) ({', '.join(sorted(self.new)) or 'none'}); "
               "everyone else keeps the kit sent before, which stays valid."] if again else []),
            "",
            "| kit | send to | it runs | network |",
            "|---|---|---|---|",
            f"| `{self.server}` | {send(self.server, centre)} | "
            f"`fedauc consortium start-server {self.server.name}` | accepts TCP {port} from the hospitals and the "
            "admin (mutual TLS) |",
        ]
        for name, kit in self.sites.items():
            lines.append(f"| `{kit}` | {send(kit, f'hospital {name!r}, the machine that holds its shards')} | "
                         f"`fedauc consortium start-site {kit.name} --site-yaml <its site YAML> --shards <its shards>` | "
                         f"dials out to {server_host}:{port}; nothing inbound |")
        lines += [
            f"| `{self.admin}` | {send(self.admin, 'the person who submits trainings and evaluations (project admin)')} | "
            f"`fedauc train` / `fedauc evaluate --federation <its YAML> --backend flare --flare-env prod --kit {self.admin}` | "
            f"dials {server_host}:{port} |",
            "",
            "Each kit holds its owner's private key: send it over a channel you trust, one kit per recipient; "
            "kits and keys are owner-only (0600 in 0700 folders) and every participant refuses a key others "
            "can read. Certificates expire: `fedauc consortium status` and `start-site` warn 30 days ahead, and "
            "`fedauc consortium renew` re-issues every kit.",
            "",
            f"**Never send `{self.state}` anywhere: it stays with the project admin.** It holds the root CA's "
            "private key (whoever has it can admit any machine to the consortium) and every participant's "
            "private key.",
        ]
        return "\n".join(lines)


def project(federation: Federation, server_host: str, port: int = DEFAULT_PORT, admin: str = "admin@fedauc.org",
            root_valid_days: int = 360) -> dict:
    """The NVFlare project (api_version 3) of ``federation``."""
    participants = [{"name": server_host, "type": "server", "org": "coordinating_centre",
                     "fed_learn_port": port, "admin_port": port}]
    participants += [{"name": site.name, "type": "client", "org": re.sub(r"[^A-Za-z0-9_]", "_", site.name)} for site in federation.sites]
    participants.append({"name": admin, "type": "admin", "org": "coordinating_centre", "role": "project_admin"})
    return {
        "api_version": 3,
        "name": federation.name,
        "description": f"fedauc consortium of federation {federation.name} ({federation.task})",
        "participants": participants,
        "builders": [
            {"path": "nvflare.lighter.impl.workspace.WorkspaceBuilder",
             "args": {"template_file": ["master_template.yml"]}},
            {"path": "nvflare.lighter.impl.static_file.StaticFileBuilder",
             "args": {"config_folder": "config", "connection_security": "mtls"}},
            {"path": "nvflare.lighter.impl.cert.CertBuilder", "args": {"root_valid_days": root_valid_days}},
            {"path": "nvflare.lighter.impl.signature.SignatureBuilder"},
        ],
    }


def provision(project_dict: dict, out: Path, root_valid_for: dt.timedelta | None = None) -> Kits:
    """Write ``project.yml`` and the signed startup kits under ``out``, owner-only (``federated.flare.lockdown``),
    with fedauc's authorization policy in every participant's kit and the server's stores in its own.
    ``root_valid_for`` sets a new root CA's validity to the second (``certificates.seed_root``); a folder
    provisioned before keeps its root."""
    from nvflare.lighter.provision import prepare_builders, prepare_packager, prepare_project
    from nvflare.lighter.provisioner import Provisioner

    out = Path(out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    project_file = out / "project.yml"
    write_owner_only(project_file, yaml.safe_dump(project_dict, sort_keys=False))
    spec = yaml.safe_load(project_file.read_text())
    state_dir = out / project_dict["name"] / "state"
    if root_valid_for is not None and stored_root(state_dir) is None:
        seed_root(state_dir, project_dict["name"], root_valid_for)
    root = stored_root(state_dir)
    earlier = sorted((out / project_dict["name"]).glob("prod_*"))
    before = {p.name for p in earlier[-1].iterdir()} if earlier else set()
    # No moment at which the CA's key or a participant's is readable by others (umask is process-wide,
    # the modes are set again below).
    umask = os.umask(0o077)
    try:
        nvflare_project = prepare_project(spec)
        if root is not None:
            # The stored root as the project's own: NVIDIA FLARE would otherwise refuse a root whose validity is not
            # the project file's root_valid_days (a renewed root, or one valid for minutes).
            nvflare_project.serialized_root_cert, nvflare_project.root_private_key = root
        ctx = Provisioner(str(out), prepare_builders(spec), prepare_packager(spec)).provision(nvflare_project)
    finally:
        os.umask(umask)
    prod = Path(ctx.get_result_location()) if ctx is not None and hasattr(ctx, "get_result_location") else None
    if prod is None:
        prod = sorted((out / project_dict["name"]).glob("prod_*"))[-1]
    by_type = {p["type"]: p["name"] for p in project_dict["participants"] if p["type"] != "client"}
    kits = Kits(project_file, prod / by_type["server"],
                {p["name"]: prod / p["name"] for p in project_dict["participants"] if p["type"] == "client"},
                prod / by_type["admin"], frozenset(p["name"] for p in project_dict["participants"]) - before)
    for kit in (kits.server, *kits.sites.values()):
        write_owner_only(kit / "local" / "authorization.json.default",
                         json.dumps(centre_policy(server=kit == kits.server), indent=2))
    for kit in kits.sites.values():
        # No site's error log (tracebacks with its paths) goes to the centre. Not through project.yml's
        # allow_log_streaming: NVFlare 2.9's provisioning reads a false there as unset (get_prop_fb).
        resources = json.loads((kit / "local" / "resources.json.default").read_text())
        write_owner_only(kit / "local" / "resources.json.default",
                         json.dumps({**resources, "allow_log_streaming": False}, indent=2))
    # The server runs fedauc's job modules from its own install, like the hospitals (no code in jobs).
    allow_components(kits.server / "local")
    server_stores(kits.server)
    make_owner_only(out / project_dict["name"])
    return kits


def renew(out: str | Path, root_valid_for: dt.timedelta = ROOT_VALID, now: dt.datetime | None = None):
    """Re-issue every kit of the consortium provisioned into ``out`` from the same identities, in a new
    provisioning folder (a new root certificate for the same key when the root expires within
    ``WARN_BEFORE``); returns the ``Kits``, every one of them to be sent."""
    from cryptography import x509

    out = Path(out).resolve()
    project_file = out / "project.yml"
    if not project_file.is_file():
        raise ConfigError(f"{out}: no project.yml; not a folder `fedauc consortium provision` wrote",
                          fix="pass the --out folder of `fedauc consortium provision`")
    project_dict = yaml.safe_load(project_file.read_text())
    state_dir = out / project_dict["name"] / "state"
    root = stored_root(state_dir)
    if root is None:
        raise ConfigError(f"{state_dir / STATE_FILE}: missing; the root CA's key is needed to renew",
                          fix="renew on the machine that provisioned the consortium (restore its backup first)")
    now = now or dt.datetime.now(dt.timezone.utc)
    state = json.loads((state_dir / STATE_FILE).read_text())
    kept = {key: state[key] for key in ROOT_KEYS}
    if x509.load_pem_x509_certificate(root[0]).not_valid_after_utc - now <= WARN_BEFORE:
        kept = issue_root(project_dict["name"], root[1], root_valid_for)
    # Without a participant's entry NVIDIA FLARE's CertBuilder issues it a new key and certificate.
    write_owner_only(state_dir / STATE_FILE, json.dumps(kept))
    kits = provision(project_dict, out)
    return dataclasses.replace(kits, new=frozenset(p["name"] for p in project_dict["participants"]))
