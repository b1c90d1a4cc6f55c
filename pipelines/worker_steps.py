"""Prefect pull steps that run on the worker, when a flow run starts there (infra/prefect.yaml ``pull:``).

Prefect resolves ``{{ $FEDAUC_HOME }}`` in a project file when ``prefect deploy`` runs, at the centre: every
hospital's worker then changed into the centre's path. ``enter_fedauc_home`` is resolved by each worker at
run time instead: its own ``$FEDAUC_HOME``, else the checkout its fedauc is installed from, so a hospital's
checkout lives wherever the hospital puts it.
"""

from __future__ import annotations

import os

from pipelines.store_uri import fedauc_home


def enter_fedauc_home() -> dict:
    """Change into this machine's fedauc folder (a Prefect pull step); its path as the step's output."""
    home = fedauc_home()
    os.chdir(home)
    return {"directory": str(home)}
