"""A site's refusal of a job built by another fedauc than its own.

The code version is ``federated.version.code_version()`` (package version and the checkout's commit, the
value MLflow records for a training). A job carries the centre's value (``FlareJob.code_version``); a site
runs it only if the value is its own or one its site YAML lists in ``allowed_code_versions``, so the centre
and every hospital run the same algorithm code, and a hospital upgrades when it chooses to.
"""

from __future__ import annotations

from common.errors import ConfigError
from federated.version import code_version


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
