"""A throwaway PostgreSQL cluster for python -m benchmarks.year: the Debian packages' server (``apt-get install
postgresql``), initialised in the benchmark's folder and run as the ``postgres`` account on a free port, with
a database each for MLflow and Prefect (infra/README.md section 1 names the same two)."""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import subprocess
from pathlib import Path

from pipelines.servers import free_port

ACCOUNT = "postgres"


def server_bin() -> Path | None:
    """The newest installed server's bin folder, or None."""
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/pg_ctl"), key=lambda p: int(p.parts[-3]))
    return found[-1].parent if found else None


def unavailable() -> str | None:
    """Why the PostgreSQL series cannot run here, or None."""
    if server_bin() is None:
        return "no PostgreSQL server installed (apt-get install postgresql)"
    try:
        pwd.getpwnam(ACCOUNT)
    except KeyError:
        return f"no {ACCOUNT} account to run the server as (PostgreSQL refuses root)"
    return None


def _as_account(command: list, **options) -> subprocess.CompletedProcess:
    account = {} if os.geteuid() != 0 else {"user": ACCOUNT, "group": pwd.getpwnam(ACCOUNT).pw_gid,
                                             "extra_groups": []}
    return subprocess.run([str(c) for c in command], check=True, capture_output=True, text=True, **account,
                          **options)


@contextlib.contextmanager
def cluster(folder: Path):
    """A running cluster with databases ``mlflow`` and ``prefect`` (trust authentication on 127.0.0.1
    only), the one a kept ``folder`` holds (``python -m benchmarks.year --measure``) or a new one; yields its port. Stopped on
    leaving."""
    bin_dir, data, port = server_bin(), Path(folder) / "pgdata", free_port()
    fresh = not data.exists()
    folder.mkdir(parents=True, exist_ok=True)
    shutil.chown(folder, ACCOUNT)
    if fresh:
        _as_account([bin_dir / "initdb", "-D", data, "-U", ACCOUNT, "--auth=trust", "-E", "UTF8"])
    _as_account([bin_dir / "pg_ctl", "-D", data, "-l", folder / "postgres.log", "-w", "start", "-o",
                 f"-p {port} -k {folder} -c listen_addresses=127.0.0.1 -c fsync=off"])
    try:
        for database in ("mlflow", "prefect") if fresh else ():
            _as_account([bin_dir / "createdb", "-h", "127.0.0.1", "-p", port, "-U", ACCOUNT, database])
        yield port
    finally:
        _as_account([bin_dir / "pg_ctl", "-D", data, "-m", "fast", "-w", "stop"])


def database_bytes(port: int, database: str) -> int:
    import psycopg2

    with contextlib.closing(psycopg2.connect(host="127.0.0.1", port=port, user=ACCOUNT, dbname="postgres")) as db, \
            db.cursor() as cursor:
        cursor.execute("SELECT pg_database_size(%s)", (database,))
        return int(cursor.fetchone()[0])
