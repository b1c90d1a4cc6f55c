"""An accelerated year of a centre: K = 8 hospitals at the documented cadences, the stores' sizes and the
operator's daily commands at 1, 3, 6 and 12 months, against the targets of issue 45 (every store grows at
most linearly and a year fits a 100 GB disk; every daily command answers in under 2 s at 12 months).

The records are written by fedauc's own recording code with synthetic numbers (testbed/year_records.py):
a weekly training of 40 rounds (per-round records on the parent and the 8 site runs, privacy spending, the
model registered and the champion moved), a nightly evaluation of the champion, and each site's day of
PACS scoring (one record per site and day, however often the 15-minute job runs: pipelines/hospital/drift.py);
Prefect's flow runs through Prefect's API (benchmarks/year/flow_runs.py): each mark writes a sample of
``PREFECT_SAMPLE_RUNS`` of a day's runs (96 PACS runs per site and day, the evaluation, the training; a
month's 23,000 take hours through the API on the development machine) and extrapolates the database by
their bytes per run to the mark's count. The clock is the records' own: each scoring record carries its
day, each flow run its scheduled time; MLflow stamps runs with the real time, which no size or query here
depends on.

Measured at each mark: the MLflow database and artifact folder, the Prefect database, the checkpoints a
finished training leaves (computed: its final two rounds, pipelines' checkpoint layout) and the latency of
``fedauc compare`` (the command end to end and its query alone, each on the store itself and over HTTP to an
``mlflow server`` on it, the centre's documented setup), the champion's lookup, the MLflow UI's runs page (the
search its page sends, over HTTP to that ``mlflow server``) and the Prefect UI's flow-runs page (its filter and
count requests to ``prefect server``, over the flow runs written). Not measured: NVIDIA FLARE's server
workspace and logs, and ``fedauc consortium status`` (a running consortium).

    python -m benchmarks.year --quick            # a month (target: 10 minutes; 12 here at load 11)
    python -m benchmarks.year [--months 1 3 6 12] [--keep DIR]
    python -m benchmarks.year --measure DIR      # the latencies alone again, this checkout's code, on a kept DIR
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import numpy as np

SITES = ["hanoi", "vienna", "nih", "stanford", "san-juan", "barcelona", "new-york", "graz"]
DAYS_AT = {1: 30, 3: 91, 6: 182, 12: 365}
DISK_GB, LATENCY_S, LINEAR_SLACK = 100, 2.0, 1.25
PREFECT_SAMPLE_RUNS = 300  # per mark, through the API: ~0.2 s each on the loaded development machine
START = dt.date(2026, 1, 1)


def folder_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in Path(path).rglob("*") if f.is_file()) if Path(path).exists() else 0


def checkpoint_bytes(trainings: int) -> int:
    """What finished trainings' checkpoint folders hold (federated/checkpoint.py keeps the last two rounds):
    per site and round the network's and the algorithm's tensors, measured on small_resnet's state saved
    as a checkpoint saves it, CODASCA's control variate and last-average copies beside the model."""
    import io

    import torch

    from models.networks import build_network

    buffer = io.BytesIO()
    torch.save({"model": build_network("small_resnet", num_classes=5, in_channels=1).state_dict()}, buffer)
    return trainings * 2 * len(SITES) * 3 * buffer.getbuffer().nbytes


def best_of(seconds, repeat: int = 3) -> float:
    return min(seconds() for _ in range(repeat))


def _timed(call) -> float:
    started = time.perf_counter()
    call()
    return time.perf_counter() - started


def _post(url: str, body: dict) -> None:
    request = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=120) as response:
        response.read()


def latencies(mlflow_url: str, prefect_url: str, env: dict) -> dict[str, float]:
    from mlflow import MlflowClient

    from pipelines import compare, registry

    experiment = MlflowClient().get_experiment_by_name("chest-xray").experiment_id
    fedauc = str(Path(sys.executable).parent / "fedauc")
    command = [fedauc, "compare", "--experiment", "chest-xray"]
    # The centre's documented setup: the command reads the MLflow server (here the one serving the same store).
    over_http = {**env, "MLFLOW_TRACKING_URI": mlflow_url}
    # The runs page of the MLflow UI: a search of the experiment's newest 100 runs (what the page sends).
    runs_page = {"experiment_ids": [experiment], "max_results": 100, "order_by": ["attributes.start_time DESC"],
                 "run_view_type": "ACTIVE_ONLY", "filter": ""}
    flow_runs_page = {"sort": "START_TIME_DESC", "limit": 100, "offset": 0}
    def run(argv, environment=env):
        return lambda: _timed(lambda: subprocess.run(argv, env=environment, check=True, capture_output=True))

    return {
        # The command end to end on the store itself and over HTTP, and a command that reads no store (its
        # start: Python, the imports).
        "fedauc compare (command)": best_of(run(command), repeat=2),
        "fedauc compare over HTTP (command)": best_of(run(command, over_http), repeat=2),
        "fedauc --help (start)": best_of(run([fedauc, "--help"]), repeat=2),
        "compare query": best_of(lambda: _timed(lambda: compare.compare_runs("chest-xray"))),
        "compare query over HTTP": best_of(lambda: _timed(lambda: compare.compare_runs("chest-xray", uri=mlflow_url))),
        "champion lookup": best_of(lambda: _timed(lambda: registry.champion_version("chest-xray"))),
        "MLflow runs page": best_of(lambda: _timed(lambda: _post(
            f"{mlflow_url}/ajax-api/2.0/mlflow/runs/search", runs_page))),
        "Prefect flow-runs page": best_of(lambda: _timed(lambda: (
            _post(f"{prefect_url}/api/flow_runs/filter", flow_runs_page),
            _post(f"{prefect_url}/api/flow_runs/count", {})))),
    }


def stores(work: Path, backend: str, port: int | None) -> dict:
    """Where the backend keeps MLflow's runs and artifacts and Prefect's state, and how big each is."""
    from pipelines import tracking

    if backend == "sqlite":
        return {"mlflow": tracking.default_tracking_uri(work), "artifacts": work / "mlartifacts",
                "prefect": f"sqlite+aiosqlite:///{work / 'prefect.db'}",
                "mlflow_bytes": lambda: (work / "mlruns.db").stat().st_size,
                "prefect_bytes": lambda: (work / "prefect.db").stat().st_size}
    from benchmarks.year import postgres as year_postgres

    # An MLflow client on a database URI keeps artifacts in ./mlruns of its working folder: the benchmark's.
    os.chdir(work)
    return {"mlflow": f"postgresql://{year_postgres.ACCOUNT}@127.0.0.1:{port}/mlflow", "artifacts": work / "mlruns",
            "prefect": f"postgresql+asyncpg://{year_postgres.ACCOUNT}@127.0.0.1:{port}/prefect",
            "mlflow_bytes": lambda: year_postgres.database_bytes(port, "mlflow"),
            "prefect_bytes": lambda: year_postgres.database_bytes(port, "prefect")}


def recording_env(work: Path, where: dict, prefect_url: str) -> dict[str, str]:
    """What this process records under: the backend's MLflow store and the Prefect server at ``prefect_url`` on
    the backend's Prefect database (``main`` sets it: fedauc's recording code reads MLflow's store, and Prefect's
    client its server, from the environment)."""
    return {"MLFLOW_TRACKING_URI": where["mlflow"], "PREFECT_API_URL": f"{prefect_url}/api",
            "PREFECT_HOME": str(work / ".prefect"), "PREFECT_API_DATABASE_CONNECTION_URL": where["prefect"]}


@contextlib.contextmanager
def prefect_served(work: Path, prefect_url: str):
    """A Prefect server at ``prefect_url`` (this host) on the Prefect database ``recording_env`` names."""
    from pipelines.servers import server_env, start_server, stop_server

    prefect_port = int(prefect_url.rsplit(":", 1)[1])
    prefect = start_server("Prefect", [str(Path(sys.executable).parent / "prefect"), "server", "start", "--host",
                                       "127.0.0.1", "--port", str(prefect_port), "--no-services"],
                           f"{prefect_url}/api/health", prefect_port, work / "prefect.log", env=server_env("Prefect"))
    try:
        yield prefect_url
    finally:
        stop_server(prefect)


def served_latencies(work: Path, prefect_url: str) -> dict[str, float]:
    """``latencies`` with an ``mlflow server`` on this process's store (the UI's page and the HTTP command)."""
    from pipelines.servers import free_port, server_env, start_server, stop_server

    mlflow_port = free_port()
    mlflow_url = f"http://127.0.0.1:{mlflow_port}"
    mlflow_server = start_server(
        "MLflow", [str(Path(sys.executable).parent / "mlflow"), "server", "--backend-store-uri",
                   os.environ["MLFLOW_TRACKING_URI"], "--host", "127.0.0.1", "--port", str(mlflow_port), "--workers", "1"],
        f"{mlflow_url}/health", mlflow_port, work / "mlflow.log", env=server_env("MLflow"))
    try:
        return latencies(mlflow_url, prefect_url, dict(os.environ))
    finally:
        stop_server(mlflow_server)


def measure_kept(work: Path, where: dict, prefect_url: str) -> dict:
    """The daily commands' latencies alone, with this checkout's code, on the stores a ``--keep`` run left in
    ``work`` (written by whichever fedauc ran the series), and what the MLflow store holds."""
    from pipelines import compare

    timings = served_latencies(work, prefect_url)
    return {"trainings": len(compare.compare_runs("chest-xray", include_unfinished=True)),
            "MLflow DB": where["mlflow_bytes"](), "latency_s": timings}


def write_year(work: Path, months: list[int], log, where: dict, prefect_url: str) -> list[dict]:
    from benchmarks.year import flow_runs
    from testbed import year_records

    rng = np.random.default_rng(45)
    fed = year_records.federation(SITES)
    rows, day, trainings, written = [], 0, 0, {"mlflow_s": 0.0, "prefect_s": 0.0, "flow_runs": 0}
    for month in months:
        started = time.perf_counter()
        days = [START + dt.timedelta(days=d) for d in range(day, DAYS_AT[month])]
        for date in days:
            if date.weekday() == 6 or trainings == 0:  # Sundays, and a champion from the first day
                trainings += 1
                year_records.record_training(fed, f"consortium-chest-codasca-{date.isoformat()}", rng)
            year_records.record_evaluation(fed, rng)
            for site in SITES:
                year_records.record_scoring_day(fed, site, date, rng)
        written["mlflow_s"] += time.perf_counter() - started
        # Prefect: a sample day per mark through the API (a month's 23,000 flow runs would take hours here),
        # its bytes per flow run extrapolated to the mark's runs (each run adds the same rows).
        started, before = time.perf_counter(), where["prefect_bytes"]()
        sampled = flow_runs.write_days(SITES, days[-1:], PREFECT_SAMPLE_RUNS)
        written["prefect_s"] += time.perf_counter() - started
        written["flow_runs"] += sampled
        per_run = (where["prefect_bytes"]() - before) / sampled
        day = DAYS_AT[month]
        timings = served_latencies(work, prefect_url)
        sizes = {"MLflow DB": where["mlflow_bytes"](), "MLflow artifacts": folder_bytes(where["artifacts"]),
                 "Prefect DB (extrapolated)": int(where["prefect_bytes"]() + per_run * (
                     flow_runs.runs_in(len(SITES), DAYS_AT[month]) - written["flow_runs"])),
                 "checkpoints (computed)": checkpoint_bytes(trainings)}
        rows.append({"month": month, "days": day, "trainings": trainings, "sizes": sizes, "latency_s": timings,
                     "prefect_bytes_per_run": per_run, **written})
        log(json.dumps(rows[-1]))
    return rows


def verdicts(rows: list[dict]) -> list[str]:
    """Growth per day between the first and the last mark within LINEAR_SLACK (at most linear), a year's
    projection of all stores under the disk, every latency at the last mark under LATENCY_S."""
    first, last = rows[0], rows[-1]
    out = []
    for store in last["sizes"]:
        per_day = [row["sizes"][store] / row["days"] for row in (first, last)]
        ratio = per_day[1] / per_day[0] if per_day[0] else float("nan")
        out.append(f"{store}: {per_day[1] / 1e6:.2f} MB/day at {last['days']} days, {ratio:.2f}x the first "
                   f"mark's rate: {'PASS' if len(rows) == 1 or ratio <= LINEAR_SLACK else 'FAIL'} (at most linear)")
    year_gb = sum(last["sizes"].values()) / last["days"] * 365 / 1e9
    out.append(f"a year of every store, projected from {last['days']} days: {year_gb:.2f} GB: "
               f"{'PASS' if year_gb < DISK_GB else 'FAIL'} (< {DISK_GB} GB)")
    for name, seconds in last["latency_s"].items():
        out.append(f"{name}: {seconds:.2f} s at {last['month']} months: {'PASS' if seconds < LATENCY_S else 'FAIL'}"
                   f" (< {LATENCY_S:.0f} s)")
    return out


def markdown(rows: list[dict]) -> str:
    stores, timed = list(rows[0]["sizes"]), list(rows[0]["latency_s"])
    head = ["months", "days", "trainings", *(f"{s} MB" for s in stores), *(f"{t} s" for t in timed)]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in rows:
        lines.append("| " + " | ".join([str(row["month"]), str(row["days"]), str(row["trainings"]),
                                        *(f"{row['sizes'][s] / 1e6:.1f}" for s in stores),
                                        *(f"{row['latency_s'][t]:.2f}" for t in timed)]) + " |")
    return "\n".join(lines)


def print_kept(work: Path, backend: str, kept: dict) -> None:
    print(f"backend {backend}, stores in {work}: {kept['trainings']} trainings, MLflow DB "
          f"{kept['MLflow DB'] / 1e6:.1f} MB; load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    for name, seconds in kept["latency_s"].items():
        print(f"{name}: {seconds:.2f} s: {'PASS' if seconds < LATENCY_S else 'FAIL'} (< {LATENCY_S:.0f} s)")


def main() -> None:
    from pipelines.servers import free_port

    parser = argparse.ArgumentParser(prog="python -m benchmarks.year", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="One month (the 1-month mark only).")
    parser.add_argument("--months", type=int, nargs="+", default=[1, 3, 6, 12], choices=sorted(DAYS_AT))
    parser.add_argument("--backend", choices=("sqlite", "postgresql"), default="sqlite",
                        help="The embedded default (SQLite files) or the centre's PostgreSQL (a cluster started here).")
    parser.add_argument("--keep", type=Path, help="Write the stores here and keep them (default: a temp folder).")
    parser.add_argument("--measure", type=Path, metavar="DIR",
                        help="Write nothing: time the daily commands again on the stores a --keep DIR run left "
                             "(the same --backend), with this checkout's code.")
    args = parser.parse_args()
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("MLFLOW_LOGGING_LEVEL", "WARNING")
    if args.measure:
        work = args.measure.resolve()
        if not (work / ("mlruns.db" if args.backend == "sqlite" else "postgres")).exists():
            sys.exit(f"{work}: no {args.backend} stores of a `python -m benchmarks.year --keep {work}` run there")
    else:
        months = [1] if args.quick else sorted(args.months)
        work = (args.keep or Path(tempfile.mkdtemp(prefix="fedauc-year-"))).resolve()
        work.mkdir(parents=True, exist_ok=True)
        started = time.perf_counter()
        print(f"backend {args.backend}, {len(SITES)} hospitals, months {months}, stores in {work}", flush=True)
    try:
        with contextlib.ExitStack() as stack:
            port = None
            if args.backend == "postgresql":
                from benchmarks.year import postgres as year_postgres

                why = year_postgres.unavailable()
                if why:
                    sys.exit(f"PostgreSQL {'stores not measured' if args.measure else 'series not run'}: {why}")
                port = stack.enter_context(year_postgres.cluster(work / "postgres"))
            where = stores(work, args.backend, port)
            prefect_url = f"http://127.0.0.1:{free_port()}"
            os.environ.update(recording_env(work, where, prefect_url))
            stack.enter_context(prefect_served(work, prefect_url))
            if args.measure:
                print_kept(work, args.backend, measure_kept(work, where, prefect_url))
                return
            rows = write_year(work, months, lambda line: print(line, flush=True), where, prefect_url)
    finally:
        if not args.measure and args.keep is None:
            shutil.rmtree(work, ignore_errors=True)
    print(markdown(rows))
    for line in verdicts(rows):
        print(line)
    print(f"writing: MLflow {rows[-1]['mlflow_s']:.0f} s, Prefect {rows[-1]['prefect_s']:.0f} s "
          f"({rows[-1]['flow_runs']} flow runs); whole benchmark {time.perf_counter() - started:.0f} s; "
          f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    print(f"median daily command {statistics.median(rows[-1]['latency_s'].values()):.2f} s")


if __name__ == "__main__":
    main()
