"""Generate one synthetic hospital in a real dataset layout: sample records, render images, write files.

``generate_site("chexpert", out, n=800, seed=0)`` writes exactly what the CheXpert release holds (the
CSVs of ``sources``, the image files of ``files``) so the real adapters ingest it unchanged. The image of
record ``i`` depends only on ``(seed, format, i)``, never on the worker that drew it, so a run is
byte-for-byte reproducible with any number of processes.

Severity: each disease with evidence ``e`` (1 certain, 0.5 uncertain, VinDr reader fraction) draws
``severity = e * Beta(SEVERITY_A, SEVERITY_B)``: most positives are moderate, some are subtle, uncertain
mentions render a milder sign, which is what keeps the task between guessing and saturation.
"""

from __future__ import annotations

import dataclasses
import hashlib
import multiprocessing
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
from tqdm import tqdm

from preprocessing.public_metadata import public_metadata_dir
from preprocessing.quarantine import Reason
from preprocessing.records import CHEST_XRAY_DISEASES
from preprocessing.synth.chest import ChestFindings, acquire, render_chest, upsample
from preprocessing.synth.files import write_image
from preprocessing.synth.profiles import DEFAULT_PROFILE, chest_profile, skin_profile
from preprocessing.synth.skin import render_skin, sample_traits
from preprocessing.synth.source_tables import SiteSample
from preprocessing.synth.sources import sample_format, source_root

FORMATS = ("chexpert", "mimic-cxr-jpg", "nih-cxr14", "padchest", "vindr-cxr", "siim-isic-2020")
SEVERITY_A, SEVERITY_B = 2.0, 1.6


@dataclass
class SynthResult:
    format: str
    root: Path  # the data root a site YAML points at (CheXpert: the CheXpert-v1.0-small folder)
    images: int
    real_metadata: bool  # False when the fallback label model was used
    corrupted: pd.DataFrame  # image_path (relative to root), damage, expected_reason
    seconds: float


def _seed_of(*parts) -> list[int]:
    """A numpy seed sequence entropy from mixed parts (strings hashed stably, not with ``hash``)."""
    return [int.from_bytes(hashlib.sha256(str(p).encode()).digest()[:4], "little") if not isinstance(p, int) else p
            for p in parts]


def chest_findings(row: dict, rng: np.random.Generator) -> ChestFindings:
    """Severities for one image from its evidence (see the module docstring)."""
    severity = {}
    for disease in CHEST_XRAY_DISEASES:
        evidence = float(row[disease])
        if evidence > 0:
            severity[disease] = evidence * float(rng.beta(SEVERITY_A, SEVERITY_B))
    return ChestFindings(severity=severity, opacity=bool(row["opacity"]), nodule=bool(row["nodule"]),
                         devices=bool(row["devices"]), lateral=bool(row["lateral"]))


def sized_profile(profile_name: str, skin: bool, size: tuple[int, int] | None):
    """The named acquisition profile, with its image ``size`` (height, width) replaced when one is given."""
    site = (skin_profile if skin else chest_profile)(profile_name)
    if size is None:
        return site
    part = "device" if skin else "xray"
    return dataclasses.replace(site, **{part: dataclasses.replace(getattr(site, part), height=size[0], width=size[1])})


def _render_job(job: tuple) -> None:
    root, profile_name, size, seed, index, row = job
    rng = np.random.default_rng(seed + [index])
    path = Path(root) / row["path"]
    uid_seed = f"{seed}/{row['path']}"
    if row["file_type"] in ("dicom-rgb", "jpeg-rgb"):
        site = sized_profile(profile_name, True, size)
        image = render_skin(sample_traits(bool(row["malignant"]), rng), site.device, rng)
        write_image(path, row["file_type"], image, jpeg_quality=site.jpeg_quality, uid_seed=uid_seed)
        return
    site = sized_profile(profile_name, False, size)
    xray = site.xray
    # Anatomy is smooth: drawn at half the site's resolution, it is upsampled before the acquisition
    # adds blur, noise and markers at full resolution. This halves the cost of the whole generation.
    density = render_chest(chest_findings(row, rng), rng, max(96, xray.height // 2), max(96, xray.width // 2))
    image = acquire(upsample(density, xray.height, xray.width), xray, rng)
    write_image(path, row["file_type"], image, jpeg_quality=site.jpeg_quality, bits=int(row.get("bits", 12)),
                monochrome1=bool(row.get("monochrome1", False)), window=bool(row.get("window", False)),
                manufacturer=row.get("manufacturer"), uid_seed=uid_seed)


def render_all(sample: SiteSample, root: Path, profile_name: str, seed: list[int], workers: int, progress: bool,
               label: str, size: tuple[int, int] | None = None) -> None:
    rows = sample.images.to_dict("records")
    jobs = [(str(root), profile_name, size, seed, i, row) for i, row in enumerate(rows)]
    bar = tqdm(total=len(jobs), desc=f"synth {label}", unit="img", disable=not progress, leave=False)
    if workers <= 1:
        for job in jobs:
            _render_job(job)
            bar.update()
    else:
        # fork: the workers inherit the imported renderers instead of re-importing them.
        with multiprocessing.get_context("fork").Pool(workers) as pool:
            for _ in pool.imap_unordered(_render_job, jobs, chunksize=16):
                bar.update()
            # Let the workers exit on their own: the pool's exit would SIGTERM them, and inside a Prefect flow
            # the forked workers inherit Prefect's SIGTERM handler, which prints a traceback per worker.
            pool.close()
            pool.join()
    bar.close()


def _write_tables(sample: SiteSample, root: Path, fmt: str, profile_name: str, size: tuple[int, int] | None) -> None:
    for name, table in sample.tables.items():
        if fmt == "mimic-cxr-jpg" and name == "mimic-cxr-2.0.0-metadata.csv":
            xray = sized_profile(profile_name, False, size).xray
            table = table.assign(Rows=str(xray.height), Columns=str(xray.width))
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        table.to_csv(root / name, index=False)
    for name, text in sample.texts.items():
        (root / name).write_text(text)


def default_workers() -> int:
    return max(1, min(4, os.cpu_count() or 1))


def generate_site(fmt: str, out: str | Path, n: int, seed: int = 0, *, profile: str | None = None,
                  corrupt: float = 0.0, workers: int | None = None, overwrite: bool = False,
                  image_format: str | None = None, prevalence: float | None = None, metadata: str = "auto",
                  progress: bool = True, size: tuple[int, int] | None = None, images: bool = True) -> SynthResult:
    """Write a synthetic hospital of ``n`` images in ``fmt``'s real layout under ``out``.

    ``profile``: a name in ``profiles.CHEST_PROFILES`` / ``SKIN_PROFILES`` (default per format).
    ``corrupt``: fraction of image files damaged after writing (see ``corrupt_files``).
    ``image_format``: SIIM-ISIC only, "dicom" (default, ``train/*.dcm``) or "jpeg" (``jpeg/train/*.jpg``).
    ``prevalence``: SIIM-ISIC only, the melanoma rate (default the release's 1.8 %); benchmarks raise it
    to draw federations of any positive rate from one generated pool.
    ``metadata``: "auto" (the real public metadata, the documented fallback when it cannot be fetched),
    "real" (fail without it) or "fallback" (always the fallback label model, ``sources``).
    ``overwrite``: replace a non-empty ``out``; without it a non-empty ``out`` is an error, so that a
    typo never mixes two hospitals' files.
    ``size``: (height, width) of the images instead of the profile's. ``images=False`` writes the metadata
    tables alone (the labels and splits a site would have, in seconds; no image file).
    """
    if fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r}; expected one of {FORMATS}")
    if not 0.0 <= corrupt < 1.0:
        raise ValueError(f"corrupt must be a fraction in [0, 1), got {corrupt}")
    if image_format is not None and fmt != "siim-isic-2020":
        raise ValueError(f"image_format applies to siim-isic-2020 only, not {fmt!r}")
    if prevalence is not None and (fmt != "siim-isic-2020" or not 0.0 < prevalence < 1.0):
        raise ValueError(f"prevalence applies to siim-isic-2020 only and must be in (0, 1), got {prevalence} for {fmt!r}")
    if corrupt and not images:
        raise ValueError("corrupt damages image files; it needs images=True")
    if metadata not in ("auto", "real", "fallback"):
        raise ValueError(f"metadata must be 'auto', 'real' or 'fallback', got {metadata!r}")
    started = time.perf_counter()
    out = Path(out)
    if out.exists() and any(out.iterdir()):
        if not overwrite:
            raise FileExistsError(f"{out} is not empty; pass overwrite=True (--overwrite) to replace it")
        shutil.rmtree(out)
    profile_name = profile or DEFAULT_PROFILE[fmt]
    skin = fmt == "siim-isic-2020"
    sized_profile(profile_name, skin, size)  # fail on a wrong name before any work
    rng = np.random.default_rng(_seed_of(seed, fmt, "records"))
    options = {}
    if fmt == "vindr-cxr":
        site = chest_profile(profile_name)
        options = {"monochrome1": site.monochrome1, "window": site.window, "manufacturers": site.manufacturers}
    elif skin:
        options = {k: v for k, v in (("image_format", image_format), ("prevalence", prevalence)) if v is not None}
    if metadata == "real":
        public_metadata_dir()  # raises PublicMetadataUnavailable with pip's reason
    sample = sample_format(fmt, n, rng, use_real=metadata != "fallback", **options)
    root = out / source_root(fmt)
    root.mkdir(parents=True, exist_ok=True)
    _write_tables(sample, root, fmt, profile_name, size)
    if not images:
        return SynthResult(fmt, root, 0, sample.real_metadata, corrupt_files(root, sample.images["path"], 0.0, []),
                           time.perf_counter() - started)
    render_all(sample, root, profile_name, _seed_of(seed, fmt, "images"),
               default_workers() if workers is None else workers, progress, f"{fmt} ({profile_name})", size)
    corrupted = corrupt_files(root, sample.images["path"], corrupt, _seed_of(seed, fmt, "corrupt"))
    return SynthResult(fmt, root, len(sample.images), sample.real_metadata, corrupted, time.perf_counter() - started)


DAMAGES = {
    "truncated": Reason.UNREADABLE_FILE,  # cut at a third, as an interrupted copy leaves it
    "garbled": Reason.UNREADABLE_FILE,  # header overwritten with random bytes
    "deleted": Reason.MISSING_FILE,  # listed in the metadata, absent on disk
}


def corrupt_files(root: Path, paths: pd.Series, fraction: float, seed: list[int]) -> pd.DataFrame:
    """Damage ``round(fraction * len(paths))`` image files (at least one when ``fraction`` > 0).

    Returns one row per damaged file: ``image_path``, ``damage`` and the quarantine reason the decode
    stage must give it (``DAMAGES``), so tests can check that exactly these records are quarantined.
    """
    columns = ["image_path", "damage", "expected_reason"]
    if fraction <= 0:
        return pd.DataFrame(columns=columns)
    rng = np.random.default_rng(seed)
    count = max(1, int(round(fraction * len(paths))))
    chosen = np.sort(rng.choice(len(paths), size=count, replace=False))
    kinds = list(DAMAGES)
    rows = []
    for k, position in enumerate(chosen):
        relative = paths.iloc[position]
        path = root / relative
        damage = kinds[k % len(kinds)]
        if damage == "deleted":
            path.unlink()
        else:
            data = path.read_bytes()
            if damage == "truncated":
                data = data[: len(data) // 3]
            else:
                data = rng.integers(0, 256, size=min(len(data), 1024), dtype=np.uint8).tobytes() + data[1024:]
            path.write_bytes(data)
        rows.append((relative, damage, DAMAGES[damage].value))
    return pd.DataFrame(rows, columns=columns)
