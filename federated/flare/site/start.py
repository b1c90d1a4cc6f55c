"""A hospital joins a running consortium: check its startup kit, its certificate, the server and its shards,
then run its NVFlare client in the foreground (what ``fedauc consortium start-site`` and the hospital's
Prefect deployment do).

Every check fails with a ``ConfigError`` / ``DataError`` that says what to do, before NVFlare starts: a
private key others may read, an expired certificate or one the kit's root CA did not sign, a server that
cannot be reached (named by address), a site YAML whose site is not the kit's, shards that do not fit
the federation, and a client of this kit that already runs (two clients of one name would both train).
"""

from __future__ import annotations

import datetime as dt
import json
import socket
from dataclasses import dataclass
from pathlib import Path

import psutil

from common.errors import ConfigError
from common.formats import stamp
from federated.flare.installed import allow_components
from federated.flare.lockdown import check_private_key, install_site_policy, write_owner_only
from federated.flare.processes import start_command, start_env
from federated.flare.site.leave import COMPONENT as LEAVE_ON_STOP
from federated.flare.site.supervise import claim, claimed_by, run_until_stopped
from federated.flare.spec import SITE_FILE
from federated.sites import check_shard
from preprocessing.shard_format import read_shard_info
from preprocessing.shard_integrity import check_shard_files
from preprocessing.sites import load_site


@dataclass
class ClientKit:
    root: Path
    name: str  # the site name the certificate was issued to
    server_host: str
    server_port: int

    @property
    def certificate(self) -> Path:
        return self.root / "startup" / "client.crt"

    @property
    def root_ca(self) -> Path:
        return self.root / "startup" / "rootCA.pem"


def read_kit(kit: str | Path) -> ClientKit:
    root = Path(kit).resolve()
    config_path = root / "startup" / "fed_client.json"
    if not config_path.is_file():
        raise ConfigError(f"{root}: not a hospital's startup kit (no startup/fed_client.json)",
                          fix="pass the folder `fedauc consortium provision` wrote for this hospital")
    config = json.loads(config_path.read_text())
    host, _, port = config["servers"][0]["service"]["target"].rpartition(":")
    return ClientKit(root, config["client"]["fqsn"], host, int(port))


PID_FILE = "fedauc-site.pid"  # in the kit's local/: the `start-site` that runs it
_CLIENT_MODULE = "nvflare.private.fed.app.client.client_train"


def running_client(kit: ClientKit) -> int | None:
    """The pid of a live ``start-site`` of this kit (its pid file), or of an NVFlare client of this kit that
    runs without one (started otherwise, or orphaned by an older fedauc); None when there is none."""
    pid = claimed_by(kit.root / "local" / PID_FILE)
    if pid is not None:
        return pid
    for process in psutil.process_iter(["cmdline"]):
        command = process.info["cmdline"] or []
        if _CLIENT_MODULE in command and "-m" in command[:-1]:
            with_kit = Path(command[command.index("-m") + 1])
            if with_kit.is_absolute() and with_kit.resolve() == kit.root:
                return process.pid
    return None


def check_certificate(kit: ClientKit, now: dt.datetime | None = None) -> dt.datetime:
    """The certificate's expiry; raises unless it is valid now and signed by the kit's root CA."""
    from cryptography import x509

    now = now or dt.datetime.now(dt.timezone.utc)
    cert = x509.load_pem_x509_certificate(kit.certificate.read_bytes())
    root = x509.load_pem_x509_certificate(kit.root_ca.read_bytes())
    fix = "ask the consortium's project admin for a renewed kit (`fedauc consortium renew`)"
    try:
        cert.verify_directly_issued_by(root)
    except (ValueError, TypeError, Exception) as err:  # cryptography raises InvalidSignature / ValueError
        raise ConfigError(f"{kit.certificate}: not signed by the consortium's root CA in {kit.root_ca} ({err or 'bad signature'}); "
                          "the server would refuse this site", fix=fix) from None
    for which, c in (("certificate", cert), ("root CA", root)):
        if c.not_valid_after_utc < now:
            raise ConfigError(f"{kit.root}: the site's {which} expired on {c.not_valid_after_utc:%Y-%m-%d}", fix=fix)
        if c.not_valid_before_utc > now:
            raise ConfigError(f"{kit.root}: the site's {which} is valid only from {c.not_valid_before_utc:%Y-%m-%d %H:%M} UTC",
                              fix="check this machine's clock")
    return min(cert.not_valid_after_utc, root.not_valid_after_utc)


def check_server_reachable(host: str, port: int, timeout_s: float = 5.0) -> None:
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            pass
    except OSError as err:
        raise ConfigError(f"the consortium's server {host}:{port} cannot be reached: {err}",
                          fix=f"check that the server runs and that this machine may open outbound TCP to {host}:{port}"
                          ) from None


def prepare_site(kit: str | Path, site_yaml: str | Path, shards_root: str | Path, check_server: bool = True) -> ClientKit:
    """Every check, then the kit's ``local/`` learns where this site's shards are (they never leave here),
    what of their QC summary may leave (the site YAML's ``sharing``) and which fedauc versions' jobs besides
    its own it runs (``allowed_code_versions``); its component allow-list admits fedauc's job only and its
    own authorization policy refuses shell commands and custom code (``lockdown.site_policy``)."""
    client = read_kit(kit)
    pid = running_client(client)
    if pid is not None:
        raise ConfigError(f"site {client.name} already runs from {client.root} (pid {pid}); stop it (`kill {pid}` or "
                          "`systemctl stop fedauc-site`) before starting it again")
    site = load_site(site_yaml)
    if site.name != client.name:
        raise ConfigError(f"{site_yaml} is site {site.name!r}, the kit {client.root} was issued to {client.name!r}",
                          fix="start each hospital with its own kit and its own site YAML")
    check_private_key(client.root / "startup" / "client.key")
    check_certificate(client)
    shard_dir = Path(shards_root).resolve() / site.name
    check_shard(site.name, shard_dir, site.task, site.diseases)
    check_shard_files(shard_dir, read_shard_info(shard_dir), full=True)  # every byte, once, before joining
    if check_server:
        check_server_reachable(client.server_host, client.server_port)
    write_owner_only(client.root / "local" / SITE_FILE, json.dumps(stamp("site-settings", {
        "site": site.name, "shards": str(shard_dir), "sharing": site.sharing.model_dump(),
        "allowed_code_versions": site.allowed_code_versions})))
    allow_components(client.root / "local", LEAVE_ON_STOP)
    install_site_policy(client.root / "local")
    return client


def client_command(kit: ClientKit) -> list[str]:
    return start_command(kit.root)


def run_site(kit: ClientKit) -> int:
    """Run the site's client until it stops (its exit status) or this process gets SIGTERM / SIGINT, which
    stops the client and its job processes with it (``federated.flare.site.supervise``: then 0); this process
    named in the kit's pid file meanwhile. The client leaves the consortium as it stops
    (``federated.flare.site.leave``), and stops when this process dies in any way."""
    pid_file = kit.root / "local" / PID_FILE
    claim(pid_file)
    try:
        return run_until_stopped(client_command(kit), start_env(), kit.root)
    finally:
        pid_file.unlink(missing_ok=True)
