"""A provisioned consortium on this machine, run as hospitals run theirs (``fedauc train --flare-env poc``).

Not NVFlare's own ``PocEnv`` (which provisions its own project with generated site names): the kits come
from :func:`federated.flare.centre.provision.provision` for the federation, exactly as ``fedauc consortium
provision`` writes them, the server starts as ``fedauc consortium start-server`` starts it
(:func:`federated.flare.server.start.prepare_server`), every hospital's client
starts through :func:`federated.flare.site.start.prepare_site` (certificate, shards and server checks, its
shard folder written into its own kit) and the training is submitted with the admin's kit through
``ProdEnv``, mutual TLS on one port chosen free at start. So a POC run exercises the production path
end to end; only the machines are one.
"""

from __future__ import annotations

import signal
import socket
import subprocess
import time
from pathlib import Path

from common.errors import ConfigError
from common.lifetime import family, signal_all
from federated.flare.centre.provision import Kits, project, provision
from federated.flare.centre.session import quiet_session
from federated.flare.processes import start_command, start_env
from federated.flare.server.start import prepare_server
from federated.flare.site.start import check_server_reachable, client_command, prepare_site
from preprocessing.federation import Federation

ADMIN = "admin@fedauc.org"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def admin_session(kit: Path, timeout_s: float = 30.0):
    return quiet_session(ADMIN, kit, timeout_s)


def connected_sites(admin_kit: Path) -> list[str]:
    """The clients the server has admitted (through the admin's own mutually authenticated session)."""
    session = admin_session(admin_kit)
    try:
        return sorted(c.name for c in session.get_system_info().client_info)
    finally:
        session.close()


class LocalConsortium:
    """Server and one client per federation site as processes here; logs under ``workspace/logs``."""

    def __init__(self, federation: Federation, shards_root: str | Path, workspace: str | Path, port: int | None = None):
        self.federation = federation
        self.shards_root = Path(shards_root).resolve()
        self.workspace = Path(workspace).resolve()
        self.port = port or free_port()
        self.kits: Kits | None = None
        self.processes: dict[str, subprocess.Popen] = {}

    @property
    def logs(self) -> Path:
        return self.workspace / "logs"

    def launch(self, name: str, command: list[str], cwd: Path) -> None:
        """Run ``command`` as participant ``name`` (its output in ``logs/<name>.log``), stopped with the rest."""
        self.logs.mkdir(parents=True, exist_ok=True)
        with open(self.logs / f"{name}.log", "ab") as log:
            # Its own session, so that stopping it (and its job processes) never signals this process.
            self.processes[name] = subprocess.Popen(command, cwd=cwd, env=start_env(), stdout=log,
                                                    stderr=subprocess.STDOUT, start_new_session=True)

    def start(self, wait_s: float = 300.0) -> LocalConsortium:
        """Provision (unless ``kits`` were provisioned already), start the server and every site, return once
        the server has admitted all of them."""
        if self.kits is None:
            self.kits = provision(project(self.federation, "localhost", self.port, ADMIN), self.workspace / "kits")
        self.launch("server", start_command(prepare_server(self.kits.server)), self.kits.server)
        deadline = time.monotonic() + wait_s
        self._until(deadline, "the server to listen", lambda: _reachable("localhost", self.port))
        self.start_sites([site.name for site in self.federation.sites], deadline - time.monotonic())
        return self

    def start_sites(self, names: list[str], wait_s: float = 300.0) -> None:
        """Start the clients of sites ``names`` (each through the hospital's own checks) and return once the
        server has heard from every one of them since: one killed without a word stays listed until
        NVIDIA FLARE's heartbeat timeout, so being listed is not enough."""
        deadline = time.monotonic() + wait_s
        folder = self.federation.path.parent
        configs = {site.name: folder / entry.config for site, entry in zip(self.federation.sites, self.federation.spec.sites)}
        launched = time.time()
        for name in names:
            client = prepare_site(self.kits.sites[name], configs[name], self.shards_root)
            self.launch(name, client_command(client), client.root)
        # One session for every look (a login costs NVIDIA FLARE's admin client a second's wait).
        session = admin_session(self.kits.admin, timeout_s=max(1.0, deadline - time.monotonic()))
        try:
            self._until(deadline, f"sites {', '.join(sorted(names))} to connect",
                        lambda: set(names) <= {c.name for c in session.get_system_info().client_info
                                               if c.last_connect_time >= launched})
        finally:
            session.close()

    def _until(self, deadline: float, what: str, done) -> None:
        while not done():
            for name, process in self.processes.items():
                if process.poll() is not None:
                    raise ConfigError(f"the local consortium's {name} stopped (exit {process.returncode}) while "
                                      f"waiting for {what}", fix=f"read {self.logs / (name + '.log')}")
            if time.monotonic() > deadline:
                raise ConfigError(f"the local consortium timed out waiting for {what}",
                                  fix=f"read the logs in {self.logs}")
            time.sleep(0.5)

    def exec_env(self):
        from nvflare.recipe import ProdEnv

        return ProdEnv(startup_kit_location=str(self.kits.admin), username=ADMIN, login_timeout=30.0)

    def kill(self, name: str) -> None:
        """SIGKILL participant ``name`` and its job processes (NVFlare starts each in a session of its own):
        what a crashed machine looks like to the others."""
        process = self.processes.pop(name)
        signal_all(family(process.pid), signal.SIGKILL)
        process.wait()

    def stop(self) -> None:
        for name in list(self.processes):
            self.kill(name)

    def __enter__(self) -> LocalConsortium:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def _reachable(host: str, port: int) -> bool:
    try:
        check_server_reachable(host, port, timeout_s=1.0)
    except ConfigError:
        return False
    return True

