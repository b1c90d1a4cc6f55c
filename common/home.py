"""This machine's fedauc folder: what a machine's commands share (the MLflow store, Prefect's home, logs, caches,
the demo's site files and data). $FEDAUC_HOME, else the checkout fedauc is installed from; never the folder a
command happens to run in (a user's current folder gets nothing written into it)."""

from __future__ import annotations

import os
from pathlib import Path

HOME_ENV = "FEDAUC_HOME"
CHECKOUT = Path(__file__).resolve().parents[1]


def fedauc_home() -> Path:
    return Path(os.environ.get(HOME_ENV) or CHECKOUT).resolve()
