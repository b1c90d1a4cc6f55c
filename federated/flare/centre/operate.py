"""What the centre's operator asks a running consortium, with the admin's kit (NVIDIA FLARE's admin API over
mutual TLS): who is connected and since when, the running jobs and their round, each site's fedauc version
and privacy budget (``consortium_status``); and a non-interactive stop of the server (``stop_server``).

Everything is read from the server: NVIDIA FLARE's own client list (each client's last heartbeat, every
30 s), its log's record of when each client joined, and the files fedauc's job writes in the server's
workspace (``federated.flare.server.live``: the sites' last fedauc heartbeat and version, each job's rounds).
Nothing is asked of a hospital's machine.
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

from common.errors import ConfigError
from federated.flare.centre.feed import describe_slowest, parse
from federated.flare.centre.session import quiet_session
from federated.flare.protocol import LIVE_FILE, SITES_FILE

_JOINED = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d).*New client (\S+?)@\S* joined")


def admin_session(kit: str | Path, timeout_s: float = 30.0):
    """A session with the consortium's server as the admin whose startup kit is ``kit``."""
    kit = Path(kit).resolve()
    config = kit / "startup" / "fed_admin.json"
    if not config.is_file():
        raise ConfigError(f"{kit}: not an admin's startup kit (no startup/fed_admin.json)",
                          fix="pass the admin@... folder that `fedauc consortium provision` wrote")
    username = json.loads(config.read_text())["admin"]["username"]
    try:
        with _quiet():
            return quiet_session(username, kit, timeout_s)
    except Exception as err:  # NVFlare's NoConnection, timeouts, refused logins
        raise ConfigError(f"cannot reach the consortium's server with the admin kit {kit}: {err}",
                          fix="check that the server runs and that this machine can reach its port") from None


@dataclass
class SiteStatus:
    name: str
    connected_since: float | None  # when the server last admitted it (its log)
    last_heartbeat: float  # NVIDIA FLARE's client heartbeat
    fedauc: str | None = None  # the version its last fedauc job reported
    fedauc_heartbeat: float | None = None
    # What its privacy ledger had spent and had left when it admitted its last DP job (remaining None: no budget).
    epsilon_spent: float | None = None
    epsilon_remaining: float | None = None
    budget_change: str | None = None  # its ledger's last budget change, as the site said it

    def budget(self) -> str:
        if self.epsilon_spent is None:
            return "-"
        left = "no budget" if self.epsilon_remaining is None else f"{self.epsilon_remaining:.3g} left"
        change = f"; last change: {self.budget_change}" if self.budget_change else ""
        return f"{self.epsilon_spent:.3g} spent, {left}{change}"


@dataclass
class JobStatus:
    job_id: str
    name: str
    sites: list[str] = field(default_factory=list)
    rounds_done: int = 0  # rounds site 0 has finished
    failure: str | None = None
    slowest: str | None = None  # the last round's slowest site and how long it held the round up


def job_status(job_id: str, name: str, live_text: str) -> JobStatus:
    """A running job's status from its live file (``federated.flare.server.live``)."""
    entries = parse(live_text)
    start = next((e for e in entries if "job" in e), {})
    records = [e["record"] for e in entries if "record" in e]
    failure = next((e["failure"] for e in entries if "failure" in e), None)
    last = max(records, key=lambda r: r["round"]) if records else {}
    return JobStatus(job_id, name, start.get("sites", []), last["round"] + 1 if records else 0, failure,
                     describe_slowest(last))


@dataclass
class ConsortiumStatus:
    server_started: str
    sites: list[SiteStatus]
    jobs: list[JobStatus]

    def versions(self, announced: str) -> str:
        """One line: which hospitals lag behind the fedauc version the centre announces (their last fedauc job
        reported another one), and which have run no fedauc job since they joined (version unknown)."""
        behind = [f"{s.name} ({s.fedauc})" for s in self.sites if s.fedauc is not None and s.fedauc != announced]
        unknown = [s.name for s in self.sites if s.fedauc is None]
        line = (f"hospitals behind the centre's fedauc {announced}: {', '.join(behind)} (each upgrades, or lists "
                f"{announced} in its site YAML's allowed_code_versions meanwhile)" if behind
                else f"every hospital that reported runs the centre's fedauc {announced}")
        return line + (f"; not reported yet (no fedauc job since they joined): {', '.join(unknown)}" if unknown else "")

    def markdown(self) -> str:
        def when(t: float | None) -> str:
            return "-" if t is None else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))

        lines = [f"server up since {self.server_started}; {len(self.sites)} site(s) connected", "",
                 "| site | connected since | last heartbeat | fedauc | last fedauc heartbeat | privacy (epsilon) |",
                 "|---|---|---|---|---|---|"]
        lines += [f"| {s.name} | {when(s.connected_since)} | {when(s.last_heartbeat)} | {s.fedauc or '-'} | "
                  f"{when(s.fedauc_heartbeat)} | {s.budget()} |" for s in self.sites]
        lines += ["", f"{len(self.jobs)} running job(s)"]
        if self.jobs:
            lines += ["", "| job | name | sites | rounds done | last round | failure |", "|---|---|---|---|---|---|"]
            lines += [f"| {j.job_id} | {j.name} | {', '.join(j.sites)} | {j.rounds_done} | {j.slowest or '-'} | "
                      f"{j.failure or '-'} |" for j in self.jobs]
        return "\n".join(lines)


def _joined_times(log_text: str) -> dict[str, float]:
    joined = {}
    for line in log_text.splitlines():
        match = _JOINED.search(line)
        if match:
            joined[match.group(2)] = time.mktime(time.strptime(match.group(1), "%Y-%m-%d %H:%M:%S"))
    return joined


def site_status(name: str, joined: float | None, last_heartbeat: float, known: dict) -> SiteStatus:
    """A connected site's status; ``known``: its entry of the server's ``SITES_FILE`` (federated/flare/server/live.py)."""
    return SiteStatus(name, joined, last_heartbeat, known.get("fedauc"), known.get("last_heartbeat"),
                      known.get("epsilon_spent"), known.get("epsilon_remaining"), known.get("budget_change"))


def consortium_status(kit: str | Path) -> ConsortiumStatus:
    session = admin_session(kit)
    try:
        info = session.get_system_info()
        joined = _joined_times(session.grep_target("server", pattern="joined", file="log.txt"))
        try:
            versions = json.loads(session.cat_target("server", file=SITES_FILE)).get("sites", {})
        except ValueError:  # no fedauc job has run yet: no such file
            versions = {}
        sites = [site_status(c.name, joined.get(c.name), c.last_connect_time, versions.get(c.name, {}))
                 for c in sorted(info.client_info, key=lambda c: c.name)]
        # NVIDIA FLARE's system info names a job by its app ("app"); its job list by the name fedauc gave it
        # (the training's run name).
        names = {j.get("job_id"): j.get("job_name") or j.get("name") for j in session.list_jobs()}
        jobs = [job_status(job.job_id, names.get(job.job_id) or job.app_name,
                           session.cat_target("server", file=f"{job.job_id}/{LIVE_FILE}"))
                for job in info.job_info]
        started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(info.server_info.start_time)))
        return ConsortiumStatus(started, sites, jobs)
    finally:
        session.close()


# NVIDIA FLARE's clients heartbeat every 10 s (client_train's ``heart_beat_interval``): a client silent for
# this long has stopped, whatever the server's own 600 s limit says.
SILENT_S = 25.0


def stop_server(kit: str | Path, timeout_s: float = 60.0, silent_s: float = SILENT_S) -> list[str]:
    """Shut the consortium's server down (NVIDIA FLARE's admin ``shutdown server``), no question asked, and
    return once it no longer answers; the hospitals it dropped as gone.

    NVIDIA FLARE stops its server only when no client is connected and no job runs, and lists a client that
    died without logging out until its heartbeat timeout (600 s). So the clients it lists are watched for up
    to ``timeout_s``: one that heartbeats meanwhile is running, and the stop is refused, naming it (the
    hospitals decide when their own clients stop: they refuse the centre's ``shutdown``); one silent for
    ``silent_s`` is dropped from the list (``remove_client``)."""
    from nvflare.fuel.flare_api.api_spec import ClientsStillRunning, JobNotDone

    session = admin_session(kit)
    fix = ("the hospitals stop their clients (`systemctl stop fedauc-site`, or SIGTERM to `fedauc consortium "
           "start-site`), or stop the server at its machine (`systemctl stop fedauc-server`)")
    try:
        dropped = _drop_silent_clients(session, time.monotonic() + timeout_s, silent_s, fix)
        with _quiet():
            session.shutdown("server", wait=True, timeout=timeout_s)
        return dropped
    except ClientsStillRunning:
        names = sorted(c.name for c in session.get_system_info().client_info)
        raise ConfigError(f"the server still has connected hospitals ({', '.join(names)}); NVIDIA FLARE stops "
                          "its server only after its clients", fix=fix) from None
    except JobNotDone as err:
        raise ConfigError(f"a job is running on the consortium ({err})",
                          fix="wait for it to end, or abort it with the admin kit, then stop the server") from None
    except TimeoutError as err:
        raise ConfigError(f"the server did not stop: {err}", fix="read the server's log.txt in its workspace") from None
    finally:
        with _quiet():
            session.close()


def _drop_silent_clients(session, deadline: float, silent_s: float, fix: str) -> list[str]:
    first_seen: dict[str, float] = {}
    dropped = []
    while clients := session.get_system_info().client_info:
        # One heartbeat seen while watching is enough to refuse; the refusal names every hospital still listed.
        if any(c.last_connect_time > first_seen.setdefault(c.name, c.last_connect_time) for c in clients):
            raise ConfigError(f"the server still has connected hospitals ({', '.join(sorted(c.name for c in clients))})"
                              "; NVIDIA FLARE stops its server only after its clients", fix=fix)
        for client in clients:
            if time.time() - client.last_connect_time > silent_s:
                session.remove_client(client.name)
                dropped.append(client.name)
        if time.monotonic() > deadline:
            raise ConfigError(f"the server still lists hospitals ({', '.join(c.name for c in clients)}) after the "
                              "wait", fix=fix)
        time.sleep(1.0)
    return dropped


@contextlib.contextmanager
def _quiet():
    """NVIDIA FLARE's connector errors (its admin connection losing a server that stops on purpose) stay out
    of fedauc's output: its loggers (``nvflare.*``) above CRITICAL meanwhile; every other logger, and this
    process's stdout, as they are."""
    nvflare = logging.getLogger("nvflare")
    level = nvflare.level
    nvflare.setLevel(logging.CRITICAL + 1)
    try:
        yield
    finally:
        nvflare.setLevel(level)
