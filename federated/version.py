"""Which fedauc runs here: ``code_version()``, the one value MLflow records for a training (its
``code_version`` param) and an NVIDIA FLARE site checks a job against (``federated/flare/site/version.py``).

The installed package's version and, for a git checkout (how a hospital pins its fedauc: a clone at a
reviewed commit), ``+g`` and the first 12 hex digits of its HEAD commit: e.g. ``0.1.0+g248c0b5a1f3e``.
Every checkout of one commit has one value, whatever its folder or machine; a checkout with uncommitted
edits still reports its commit (the hospital's reviewer pins the commit, not the working tree), so an
operator matches an MLflow run to what the sites report by this string alone.
"""

from __future__ import annotations

import functools
import importlib.metadata
import subprocess
from pathlib import Path

# The checkout fedauc runs from: the folder that holds the ``federated`` package.
_ROOT = Path(__file__).resolve().parents[1]


@functools.cache
def code_version() -> str:
    try:
        version = importlib.metadata.version("fedauc")
    except importlib.metadata.PackageNotFoundError:
        version = "unreleased"
    if not (_ROOT / ".git").exists():
        return version
    try:
        commit = subprocess.run(["git", "-C", str(_ROOT), "rev-parse", "HEAD"], capture_output=True, text=True,
                                timeout=30, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return version
    return f"{version}+g{commit[:12]}"
