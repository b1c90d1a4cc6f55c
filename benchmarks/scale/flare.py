"""The scale benchmark's simulator series: one configuration over NVIDIA FLARE's simulator, every site a process of
its own, with the peak memory of each and the round's cost in wall and in CPU seconds.

Wall seconds: the round (median of the middle rounds), its compute (the slowest site's local steps, as the sites
run at once) and the overhead, their difference. On a machine with fewer cores than sites, a site's wait for a
core counts as overhead, and grows with K and with whatever else the machine runs.

CPU seconds, summed over every process of the job: each site's process from the round's start to its per-site
gather (``site_process_cpu_s``, federated/timing.py, which also gives its local steps' thread CPU,
``site_compute_cpu_s``: both ride in the round's record as the wall timings do), and the processes that are no
site (the simulator's server and this submitting process, less this benchmark's memory watcher thread), whose
CPU per wall second between the first and the last middle round's record, read as the centre's live feed hands
them on, is reckoned over a round's median seconds. The CPU overhead is the round's CPU less the sites' local
steps'. It includes what NVIDIA FLARE's runtime spends per wall second (its threads' polling, the heartbeats),
which a longer round (a busier machine) makes larger: ``site_idle_cpu_per_s`` reports a site's CPU outside its
local steps per wall second of the round, to say how much.
"""

from __future__ import annotations

import contextlib
import math
import statistics
import tempfile
import threading
import time
from pathlib import Path

SITE_MB = 280  # a simulated site's own pages at its peak (USS 272-277 MB at K = 16-64; torch's libraries are shared)
SERVER_MB = 1800  # the simulator's server and this submitting process (1.7 GB at K = 64)


def memory_short(K: int) -> str | None:
    """Why K simulated sites would not fit in this machine's available memory now, or None."""
    import psutil

    need, available = (K * SITE_MB + SERVER_MB) / 1024, psutil.virtual_memory().available / 2 ** 30
    if need <= available:
        return None
    return (f"{K} site processes need about {need:.1f} GiB ({SITE_MB} MB of their own each, plus the server) "
            f"and {available:.1f} GiB is available")


def site_of(cmd: list[str]) -> str | None:
    """The site a simulator worker runs (``--client <name>``), None for a process that is no site."""
    return cmd[cmd.index("--client") + 1] if "--client" in cmd else None


def no_site_cpu(watcher_tid: int | None) -> float:
    """CPU seconds so far of this process and its descendants that are no site, less the watcher thread's."""
    import psutil

    me = psutil.Process()
    times = me.cpu_times()
    total = times.user + times.system
    total -= sum(t.user_time + t.system_time for t in me.threads() if t.id == watcher_tid)
    for proc in me.children(recursive=True):
        with contextlib.suppress(psutil.Error):
            if site_of(proc.cmdline()) is None:
                times = proc.cpu_times()
                total += times.user + times.system
    return total


def _watch_rss(peaks: dict, done: threading.Event) -> None:
    """Peak RSS (MB) of this process's descendants, sites (``--client <name>``) apart from the rest."""
    import psutil

    peaks["watcher_tid"] = threading.get_native_id()
    me = psutil.Process()
    while not done.wait(0.5):
        total = me.memory_info().rss
        for proc in me.children(recursive=True):
            try:
                site, rss = site_of(proc.cmdline()), proc.memory_info().rss
            except psutil.Error:
                continue
            if site is not None:
                peaks["sites"][site] = max(peaks["sites"].get(site, 0.0), rss / 2 ** 20)
                if site not in peaks["uss"] or peaks["uss_at"].get(site, 0.0) < time.monotonic() - 5:
                    # USS (the pages only this process holds; torch's libraries are shared) is dearer to read
                    with contextlib.suppress(psutil.Error):
                        uss = proc.memory_full_info().uss / 2 ** 20
                        peaks["uss"][site] = max(peaks["uss"].get(site, 0.0), uss)
                        peaks["uss_at"][site] = time.monotonic()
            else:
                total += rss
        peaks["server"] = max(peaks["server"], total / 2 ** 20)


def run_flare(train_settings: dict, federation: Path) -> tuple[dict, list[dict], list[str]]:
    """One training over the simulator: its figures, its round history and its sites' names."""
    import torch

    from federated.flare.centre.job import train_flare
    from federated.sites import federation_config
    from preprocessing.federation import load_federation

    torch.set_num_threads(1)
    fed = load_federation(federation)
    config = federation_config(fed, federation.parent / "shards", train_settings)
    peaks: dict = {"server": 0.0, "sites": {}, "uss": {}, "uss_at": {}, "watcher_tid": None}
    marks: list[tuple[int, float, float]] = []  # (round, monotonic seconds, no-site CPU) as each record arrives

    def mark(record: dict) -> None:
        marks.append((record["round"], time.monotonic(), no_site_cpu(peaks["watcher_tid"])))

    done = threading.Event()
    watcher = threading.Thread(target=_watch_rss, args=(peaks, done), daemon=True)
    watcher.start()
    with tempfile.TemporaryDirectory() as workspace:
        history = train_flare(config, fed, federation.parent / "shards", "sim", Path(workspace),
                              callbacks=[mark]).history
    done.set()
    watcher.join()
    middle = history[1:-1]
    round_s = statistics.median(r["seconds"] for r in middle)
    sites_cpu = statistics.median(sum(r["site_process_cpu_s"]) for r in middle)
    compute_cpu = statistics.median(sum(r["site_compute_cpu_s"]) for r in middle)
    # The feed hands records on in batches (a poll every 2 s): the span from the first record's arrival to the
    # last middle round's, when it is not one batch.
    within = [m for m in marks if m[0] < len(history) - 1]
    span_s = within[-1][1] - within[0][1] if within else 0.0
    server_cpu = (within[-1][2] - within[0][2]) / span_s * round_s if span_s > 0.5 else math.nan
    idle = statistics.median((p - c) / r["seconds"] for r in middle
                             for p, c in zip(r["site_process_cpu_s"], r["site_compute_cpu_s"]))
    result = {"round_s": round_s, "compute_s": statistics.median(max(r["site_compute_s"]) for r in middle),
              "server_rss_mb": peaks["server"],
              "site_rss_mb": statistics.median(peaks["sites"].values() or [math.nan]),
              "site_uss_mb": statistics.median(peaks["uss"].values() or [math.nan]),
              "evaluation_s": history[-1]["seconds"] - round_s,
              "bytes": sum(middle[0]["bytes_sent"]) + sum(middle[0]["bytes_received"]),
              "round_cpu_s": sites_cpu + server_cpu, "compute_cpu_s": compute_cpu, "sites_cpu_s": sites_cpu,
              "server_cpu_s": server_cpu, "site_idle_cpu_per_s": idle}
    return result, history, [s.name for s in fed.sites]
