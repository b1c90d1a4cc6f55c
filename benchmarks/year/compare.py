"""`fedauc compare` at a year's volume, on the SQLite file and over HTTP to an `mlflow server` on it (the centre's
documented setup), this tree against an earlier revision in the same run (issue 45: every daily command answers
in under 2 s at 12 months).

The store: a copy of one that `python -m benchmarks.year --keep DIR` left, padded to a year's runs (52 trainings with
their 8 site runs each, 365 nightly evaluations, 8 x 365 sites' scoring days) with copies of each kind's newest
run: its tags, params and metrics' latest values, which is what the command (and the MLflow UI's runs page)
reads; not the per-round history, which only the run's own page reads. The year's series itself
(`python -m benchmarks.year --months 1 3 6 12`) takes hours here; this takes minutes.

Each command runs in a fresh interpreter, best of ``--repeat``, wall and CPU seconds (user + system of the child,
which a loaded machine inflates less than the wall); the revision's tree is imported from a `git archive` of it,
with this checkout's virtual environment. Both trees' tables must be the same, on the file and over HTTP (but
for the order of tied rows).

    .venv/bin/python -m benchmarks.year.compare --store DIR [--before REV] [--repeat 3] [--keep OUT]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

from benchmarks import REPO
from benchmarks.throughput.cli_startup import TARGET_S, timed, tree_of
from federated.schema import EVALUATION_ROLE, ROLE_TAG, SCORING_ROLE, SITE_ROLE, TRAINING_ROLE

EXPERIMENT, SITES, WEEKS, DAYS = "chest-xray", 8, 52, 365
YEAR = {TRAINING_ROLE: WEEKS, SITE_ROLE: WEEKS * SITES, EVALUATION_ROLE: DAYS, SCORING_ROLE: DAYS * SITES}
COMMAND = ["-m", "pipelines.cli", "compare", "--experiment", EXPERIMENT, "--all", "--wide"]


def pad_to_year(uri: str) -> dict[str, int]:
    """Runs added to the store at ``uri`` until each role has a year's count; returns the counts."""
    from mlflow import MlflowClient
    from mlflow.entities import Metric, Param, RunTag

    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name(EXPERIMENT).experiment_id
    counts = {}
    for role, target in YEAR.items():
        runs = client.search_runs([experiment], f"tags.{ROLE_TAG} = '{role}'", max_results=50_000)
        newest, now = runs[0], int(time.time() * 1000)
        tags = [RunTag(k, v) for k, v in newest.data.tags.items() if not k.startswith("mlflow.")]
        params = [Param(k, v) for k, v in newest.data.params.items()]
        metrics = [Metric(k, v, now, 0) for k, v in newest.data.metrics.items()]
        for copy in range(len(runs), target):
            run_id = client.create_run(experiment, run_name=f"{newest.info.run_name}-copy{copy}").info.run_id
            records = [*tags, *params, *metrics]
            for start in range(0, len(records), 1000):  # log_batch's limit
                chunk = records[start:start + 1000]
                client.log_batch(run_id, metrics=[r for r in chunk if isinstance(r, Metric)],
                                 params=[r for r in chunk if isinstance(r, Param)],
                                 tags=[r for r in chunk if isinstance(r, RunTag)])
            client.set_terminated(run_id)
        counts[role] = max(len(runs), target)
    return counts


def server_cpu(server) -> float:
    """CPU seconds (user + system) the MLflow server's processes have used so far."""
    return sum(sum(p.cpu_times()[:2]) for p in (server, *server.children(recursive=True)))


def measure(tree: Path, uri: str, repeat: int, server) -> tuple[float, float, float, str]:
    """Best wall and CPU seconds of the command of ``tree`` reading ``uri``, the server's CPU seconds for it
    (what a loaded machine inflates least), and what it printed."""
    env = {**os.environ, "PYTHONPATH": str(tree), "PYTHONDONTWRITEBYTECODE": "1", "MLFLOW_TRACKING_URI": uri}
    runs = []
    for _ in range(repeat):
        before = server_cpu(server)
        runs.append((*timed([sys.executable, *COMMAND], env), server_cpu(server) - before))
    table = subprocess.run([sys.executable, *COMMAND], env=env, check=True, capture_output=True, text=True).stdout
    return (*(min(run[i] for run in runs) for i in range(3)), table)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", type=Path, required=True, help="a folder `python -m benchmarks.year --keep` left")
    parser.add_argument("--before", default="d716d5d", help="the revision to measure in the same run")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--keep", type=Path, help="keep the padded store here (give it as --store next time)")
    options = parser.parse_args()
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")

    from pipelines.servers import free_port, server_env, start_server, stop_server
    from pipelines.store_uri import default_tracking_uri

    work = Path(tempfile.mkdtemp(prefix="fedauc-compare-year-"))
    padded = (options.keep or work / "store").resolve()
    padded.mkdir(parents=True, exist_ok=True)
    if options.store.resolve() != padded:
        shutil.copy2(options.store / "mlruns.db", padded / "mlruns.db")
    file_uri = default_tracking_uri(padded)
    started = time.perf_counter()
    counts = pad_to_year(file_uri)
    print(f"store {padded}: {counts} runs by role, padded in {time.perf_counter() - started:.0f} s, "
          f"{(padded / 'mlruns.db').stat().st_size / 1e6:.0f} MB", flush=True)
    port = free_port()
    server = start_server("MLflow", [str(Path(sys.executable).parent / "mlflow"), "server", "--backend-store-uri",
                                     file_uri, "--host", "127.0.0.1", "--port", str(port), "--workers", "1"],
                          f"http://127.0.0.1:{port}/health", port, work / "mlflow.log", env=server_env("MLflow"))
    try:
        before_tree = tree_of(options.before, work / "before")
        (work / "cwd").mkdir()
        os.chdir(work / "cwd")  # no command may pick up this checkout from the working directory
        figures = {(where, tree): measure(path, uri, options.repeat, psutil.Process(server.pid))
                   for where, uri in (("SQLite file", file_uri), ("HTTP", f"http://127.0.0.1:{port}"))
                   for tree, path in (("before", before_tree), ("now", REPO))}
    finally:
        stop_server(server)
        shutil.rmtree(work, ignore_errors=True)
    # As multisets of lines: the padded copies tie, and ties came in pandas' (unstable) order before, newest first now.
    tables = {tuple(sorted(figure[-1].splitlines())) for figure in figures.values()}
    print(f"machine: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at the end; best of "
          f"{options.repeat}, fresh interpreter each; the same table from both trees on both: "
          f"{'yes' if len(tables) == 1 else 'NO'}")
    for where in ("SQLite file", "HTTP"):
        (old_wall, old_cpu, old_served, _), (wall, cpu, served, _) = figures[(where, "before")], figures[(where, "now")]
        server = f" + server {served:4.2f} s CPU" if where == "HTTP" else ""
        old_server = f" + server {old_served:4.2f} s CPU" if where == "HTTP" else ""
        print(f"fedauc compare, {where:11s}: now {wall:5.2f} s wall {cpu:5.2f} s CPU{server}; before ({options.before}) "
              f"{old_wall:5.2f} s wall {old_cpu:5.2f} s CPU{old_server}; ratio {old_wall / wall:4.1f}x wall "
              f"{old_cpu / cpu:4.1f}x CPU: {'PASS' if wall < TARGET_S else 'FAIL'} (< {TARGET_S:.0f} s)")


if __name__ == "__main__":
    main()
