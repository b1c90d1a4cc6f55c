"""How long the daily commands take to start and answer (issue 45: every daily command answers in under 2 s):
`fedauc --help`, `fedauc compare --help`, `fedauc compare` on a store with the experiment and no runs (so what is
measured is the start: Python, the imports, opening the store) and the champion's lookup, each in a fresh
interpreter, best of ``--repeat``: its wall seconds and its CPU seconds (user + system of the child, which a
loaded machine inflates less than the wall).

With ``--before REV`` the same commands also run on the tree of git revision REV (``git archive``, imported from
there, this checkout's virtual environment), in this same run, and each line gets the ratio before / now.

    .venv/bin/python -m benchmarks.throughput.cli_startup [--before REV] [--repeat 3]
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tarfile
import tempfile
import time
from io import BytesIO
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TARGET_S = 2.0  # issue 45

COMMANDS = {
    "fedauc --help": ["-m", "pipelines.cli", "--help"],
    "fedauc compare --help": ["-m", "pipelines.cli", "compare", "--help"],
    "fedauc compare": ["-m", "pipelines.cli", "compare", "--experiment", "chest-xray"],
    "champion lookup": ["-c", "from pipelines.registry import champion_version; champion_version('chest-xray')"],
}


def timed(argv: list[str], env: dict) -> tuple[float, float]:
    """Wall and CPU seconds of one run of ``argv`` (the CPU of the child and its own children)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run(argv, env=env, check=True, capture_output=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def measure(tree: Path, env: dict, repeat: int) -> dict[str, tuple[float, float]]:
    env = {**env, "PYTHONPATH": str(tree), "PYTHONDONTWRITEBYTECODE": "1"}
    figures = {}
    for name, args in COMMANDS.items():
        runs = [timed([sys.executable, *args], env) for _ in range(repeat)]
        figures[name] = (min(wall for wall, _ in runs), min(cpu for _, cpu in runs))
    return figures


def tree_of(revision: str, into: Path) -> Path:
    archive = subprocess.run(["git", "-C", str(REPO), "archive", "--format=tar", revision], check=True,
                             capture_output=True).stdout
    with tarfile.open(fileobj=BytesIO(archive)) as tar:
        tar.extractall(into, filter="data")
    return into


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", help="a git revision to measure in the same run (e.g. the commit before)")
    parser.add_argument("--repeat", type=int, default=3)
    options = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="fedauc-cli-startup-") as work:
        work = Path(work)
        env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{work / 'mlruns.db'}"}
        # The store and its experiment, made once, so no measured run pays for creating MLflow's tables.
        subprocess.run([sys.executable, "-c", "import mlflow; mlflow.create_experiment('chest-xray')"], env=env,
                       check=True, capture_output=True)
        (work / "cwd").mkdir()
        os.chdir(work / "cwd")  # no command may pick up this checkout from the working directory
        now = measure(REPO, env, options.repeat)
        before = measure(tree_of(options.before, work / "before"), env, options.repeat) if options.before else {}

    print(f"machine: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at the end; best of "
          f"{options.repeat}, fresh interpreter each")
    for name, (wall, cpu) in now.items():
        line = f"{name:24s} {wall:6.2f} s wall {cpu:6.2f} s CPU  {'PASS' if wall < TARGET_S else 'FAIL'} (< {TARGET_S} s)"
        if name in before:
            old_wall, old_cpu = before[name]
            line += (f"   before ({options.before}): {old_wall:6.2f} s wall {old_cpu:6.2f} s CPU, "
                     f"ratio {old_wall / wall:4.1f}x wall {old_cpu / cpu:4.1f}x CPU")
        print(line)


if __name__ == "__main__":
    main()
