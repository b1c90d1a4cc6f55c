"""A participant's NVFlare process, whichever role starts it: a kit's own start command and the environment it
runs in. A process with everything it started is found and signalled as one by ``common.lifetime``
(NVFlare starts a job's processes in sessions of their own, so a process group does not hold them)."""

from __future__ import annotations

import os
import sys
from pathlib import Path


def start_command(root: Path) -> list[str]:
    """A kit's own NVFlare start script, once, in the foreground (no restart loop: the caller supervises)."""
    return ["bash", str(root / "startup" / "sub_start.sh"), "--once"]


def start_env() -> dict[str, str]:
    """The start script calls ``python3``: make it this interpreter (the one with fedauc and nvflare)."""
    return {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
