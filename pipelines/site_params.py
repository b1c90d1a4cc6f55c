"""What a hospital's flow run may carry to the centre: names, never the hospital's paths.

A site's flow runs (``onboard_site``, ``preprocess_site``) report to the consortium's Prefect server, which
stores their parameters and results. So they take the site's name (or its YAML's path relative to the
worker's folder, as the shipped deployments name ``sites/demo/<name>.yaml``) and, optionally, a shards
folder relative to the worker's folder; the site resolves both itself: the YAML from ``$FEDAUC_SITES`` (the
hospital's folder of site YAMLs, default ``sites/``), the shards by ``pipelines.onboarding.shards_root``
(``$FEDAUC_SHARDS``, else ``shards/``). An absolute path is refused before anything runs. A failure is a run's
state and log line there too: ``failures_stay_at_the_site`` keeps its message at the hospital.
"""

from __future__ import annotations

import functools
import logging
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import ParamSpec, TypeVar

from common.errors import ConfigError, FailedAtSite, FedaucError
from pipelines.onboarding import shards_root

SITES_ENV = "FEDAUC_SITES"
# The worker's own log at the hospital: Prefect sends its run loggers' records to the server, not this logger's.
SITE_LOG = "fedauc.site"
_P, _R = ParamSpec("_P"), TypeVar("_R")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


def _relative(value: str, what: str) -> Path:
    path = Path(value)
    if path.is_absolute() or ".." in path.parts:
        raise ConfigError(f"{what} {value!r}: a flow run's parameters reach the consortium's Prefect server, so "
                          "they carry no path of the hospital's",
                          fix=f"pass the site's name (its YAML in ${SITES_ENV}, else sites/) and set ${SITES_ENV} / "
                              "$FEDAUC_SHARDS on the hospital's worker")
    return path


def site_yaml(site: str) -> Path:
    """The YAML of ``site``: a name, looked up in $FEDAUC_SITES (else ``sites/``), or a relative path."""
    if site.endswith((".yaml", ".yml")):
        return _relative(site, "site")
    if not _NAME.match(site):
        raise ConfigError(f"site {site!r}: not a site's name", fix="pass the `name:` of the site's YAML")
    folder = Path(os.environ.get(SITES_ENV, "sites"))
    for path in (folder / f"{site}.yaml", folder / f"{site}.yml"):
        if path.is_file():
            return path
    raise ConfigError(f"site {site!r}: no {site}.yaml in {folder}",
                      fix=f"set ${SITES_ENV} to the folder of this hospital's site YAMLs on its worker")


def site_shards(shards: str | None = None) -> Path:
    """Where the site's shards go: ``shards`` (relative to the worker's folder), else $FEDAUC_SHARDS, else shards/."""
    return shards_root(_relative(shards, "shards folder") if shards else None)


def name_here(config_path: str | Path) -> str:
    """For a flow run started at the site itself (``fedauc preprocess``, the demo): the name to pass for the
    site YAML ``config_path``; the command's entry sets ``sites_env(config_path)`` first."""
    return Path(config_path).stem


def sites_env(config_path: str | Path) -> dict[str, str]:
    """The environment a flow run started here needs to find the site YAML ``config_path`` by its name
    (``$FEDAUC_SITES``: its folder), as a hospital's worker has it; the command's entry sets it, nothing below."""
    return {SITES_ENV: str(Path(config_path).resolve().parent)}


def failures_stay_at_the_site(step: str) -> Callable[[Callable[_P, _R]], Callable[_P, _R]]:
    """For the body of a flow or task that runs at a hospital (beneath Prefect's decorator, which records what it
    raises): an error is logged whole on the hospital's ``SITE_LOG`` and raised again as a ``FailedAtSite``
    naming only ``step`` and the error's kind; the command line at the site shows the whole error again."""
    def decorate(function: Callable[_P, _R]) -> Callable[_P, _R]:
        @functools.wraps(function)
        def run(*args: _P.args, **kwargs: _P.kwargs) -> _R:
            try:
                return function(*args, **kwargs)
            except FailedAtSite:
                raise
            except Exception as err:
                # A user's error in its own words (no traceback for a data problem); a bug with its traceback.
                logging.getLogger(SITE_LOG).error("%s failed: %s", step, err,
                                                  exc_info=None if isinstance(err, FedaucError) else err)
                raise FailedAtSite(step, err, SITE_LOG) from None
        return run
    return decorate
