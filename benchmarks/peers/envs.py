"""The peers' own virtual environments for python -m benchmarks.peers, made on first use under a cache folder
(``~/.cache/fedauc-peers/<name>``), never in fedauc's: Flower pins a fastapi that Prefect 3.8.8 refuses, LibAUC
pulls torchvision. Each holds the same torch release as fedauc's (the machine's local CPU wheel).

Flower: ``flwr[simulation]`` (its simulation runs clients as Ray actors). Where that cannot be installed here,
the newest Flower whose simulation extra can, else an error naming pip's own message.
LibAUC 2.0.1 is installed without its dependencies (torchvision among them) plus the few its loss and optimizer
import (AUCMLoss, PESG: torch and numpy only; its package ``__init__`` imports more, listed in LIBAUC_NEEDS).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

TORCH = "torch==2.13.0"
FLOWER = ["flwr[simulation]"]
FLOWER_FALLBACKS = [["flwr[simulation]<1.20"], ["flwr[simulation]<1.10"]]
LIBAUC = "libauc==2.0.1"
LIBAUC_NEEDS = ["numpy", "scikit-learn", "pandas", "pillow", "tqdm", "scipy"]


def _pip(python: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(python), "-m", "pip", "install", "-q", *args], capture_output=True, text=True)


def peer_python(name: str, cache: Path) -> str:
    """The interpreter of peer ``name``'s environment, made (once) if missing; a marker says it is complete."""
    env = cache / name
    python = env / "bin" / "python"
    if (env / ".installed").exists():
        return str(python)
    cache.mkdir(parents=True, exist_ok=True)
    if not python.exists():
        subprocess.run(["python3", "-m", "venv", str(env)], check=True)
    print(f"making {name}'s environment under {env} (once)", file=sys.stderr, flush=True)
    if name == "flower":
        for attempt in [FLOWER, *FLOWER_FALLBACKS]:
            done = _pip(python, TORCH, "numpy", *attempt)
            if done.returncode == 0:
                break
            print(f"{' '.join(attempt)} does not install here: {done.stderr.strip()[-600:]}", file=sys.stderr)
        else:
            raise RuntimeError("no Flower with its simulation extra (Ray) installs on this machine; see pip above")
    elif name == "libauc":
        done = _pip(python, TORCH, *LIBAUC_NEEDS)
        if done.returncode == 0:
            done = _pip(python, "--no-deps", LIBAUC)
        if done.returncode:
            raise RuntimeError(f"LibAUC's environment failed: {done.stderr.strip()[-1000:]}")
    else:
        raise ValueError(f"no peer environment named {name!r}")
    (env / ".installed").touch()
    return str(python)


def peer_versions(cache: Path) -> str:
    """The peers' releases as their environments hold them (one line for the table's heading)."""
    probes = {"flower": "import flwr, ray; print(f'Flower {flwr.__version__}, Ray {ray.__version__}')",
              "libauc": "from importlib.metadata import version; print(f'LibAUC {version(\"libauc\")}')"}
    found = []
    for name, probe in probes.items():
        try:
            done = subprocess.run([peer_python(name, cache), "-c", probe], capture_output=True, text=True, timeout=300)
            found.append(done.stdout.strip() or f"{name}: {done.stderr.strip()[-200:]}")
        except (RuntimeError, subprocess.TimeoutExpired) as error:
            found.append(f"{name}: {error}")
    return ", ".join(found)
