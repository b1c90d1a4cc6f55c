"""Where an NVIDIA FLARE job can run, and what it refuses before anything is submitted.

``FLARE_ENVS``: its simulator (every site a process on this machine), a provisioned consortium started on
this machine for the job (``poc``), or a running consortium reached with an admin's startup kit (``prod``).
The one definition: ``federated.launch.Flare`` and the command line's ``--flare-env`` choices follow it.
"""

from __future__ import annotations

from pathlib import Path

from common.errors import ConfigError
from federated.registry import get_algorithm

FLARE_ENVS = ("sim", "poc", "prod")


def check_flare_env(env: str, kit: str | Path | None) -> Path | None:
    """The admin kit ``prod`` submits with (None for the others); raises on a combination that cannot run."""
    if env not in FLARE_ENVS:
        raise ConfigError(f"NVFlare environment {env!r} is not available (available: {', '.join(FLARE_ENVS)})",
                          fix="train with --flare-env sim, poc or prod")
    if (kit is not None) != (env == "prod"):
        raise ConfigError("--kit (the admin's startup kit) goes with --flare-env prod, and only with it",
                          fix="--flare-env prod --kit <the admin kit from `fedauc consortium provision`>")
    if kit is None:
        return None
    admin = Path(kit).resolve()
    if not (admin / "startup" / "fed_admin.json").is_file():
        raise ConfigError(f"{admin}: not an admin's startup kit (no startup/fed_admin.json)",
                          fix="pass the admin@... folder that `fedauc consortium provision` wrote")
    return admin


def check_flare_algorithm(algorithm: str) -> None:
    """Refuse an algorithm that pools the sites' data: over NVIDIA FLARE the data stays at the hospitals."""
    if get_algorithm(algorithm).pools_sites:
        raise ConfigError(f"algorithm {algorithm!r} pools every site's data at one place, which moves patient data "
                          "out of the hospitals: it does not run over NVIDIA FLARE",
                          fix="train it in-process on data you may pool (--backend inprocess), or choose a federated "
                              "algorithm")
