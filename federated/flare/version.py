"""Which fedauc a participant runs, and a site's refusal of a job built by another one.

The code version is the installed package's version and, for a git checkout (how a hospital pins its
fedauc: a clone at a reviewed commit), ``+g`` and the first 12 hex digits of its HEAD commit: e.g.
``0.1.0+g248c0b5a1f3e``. Every checkout of one commit has one value, whatever its folder or machine; a
checkout with uncommitted edits still reports its commit (the hospital's reviewer pins the commit, not
the working tree). A job carries the centre's value (``FlareJob.code_version``); a site runs it only
if the value is its own or one its site YAML lists in ``allowed_code_versions``, so the centre and every
hospital run the same algorithm code, and a hospital upgrades when it chooses to.
"""

from __future__ import annotations

import functools
import importlib.metadata
import subprocess
from pathlib import Path

from preprocessing.errors import ConfigError

# The checkout fedauc runs from: the folder that holds the ``federated`` package.
_ROOT = Path(__file__).resolve().parents[2]


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


class ForeignCodeVersion(ConfigError):
    """A job from a centre that runs another fedauc than this site (one line: it is what the centre sees)."""

    def __str__(self) -> str:
        return f"{self.args[0]}; fix: {self.fix}"


def check_code_version(site: str, job_version: str, allowed: list[str] | tuple[str, ...] = ()) -> None:
    """Raise unless ``job_version`` is this site's own fedauc or in its site YAML's ``allowed``."""
    own = code_version()
    if job_version == own or job_version in allowed:
        return
    raise ForeignCodeVersion(
        f"site {site!r} refuses the job: it was built by fedauc {job_version}, this site runs fedauc {own}",
        fix=f"run fedauc {own} at the centre, or the site adds {job_version} to allowed_code_versions in its "
            "site YAML and restarts `fedauc consortium start-site`")
