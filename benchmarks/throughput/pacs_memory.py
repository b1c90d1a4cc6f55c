"""Peak memory of the PACS scoring job on a large study: bounded by one instance, not by the study.

A real Orthanc (Debian's, with DICOMweb; testbed/orthanc.py starts it) holds two studies of pydicom-data's
chest PA (RG1, 7.2 MB uncompressed): a small one (one instance) and a large one (``--instances`` copies, in
series of 35, about 1 GB at 140). Each study is scored by one run of ``pipelines.hospital.pacs.score_pacs``
in a fresh process (64 px tiles, ``small_resnet``, the decoder in its worker process as the job runs it),
which reports its own peak RSS (``ru_maxrss``) and its decoder worker's. The job retrieves a series at a
time, streams instances to its temporary folder and decodes them in chunks, so the large study's peak
should be close to the small one's; the hand-written client it replaced held the whole study in memory, at
about three times its size.

Target: the large study's peak RSS (job and decoder) <= the small one's + 200 MB.

Run: ``.venv/bin/python -m benchmarks.throughput.pacs_memory [--instances 140]`` (needs Orthanc with DICOMweb, as root
``make setup`` installs it; about 2 GB of disk while it runs).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import resource
import subprocess
import sys
import tempfile
from pathlib import Path
from unittest import SkipTest

import pydicom
import requests
from pydicom.data import get_testdata_file
from pydicom.uid import generate_uid

from benchmarks import REPO

TARGET_MB = 200
SERIES_SIZE = 35


def fill(base: str, auth: tuple[str, str], study: str, instances: int) -> int:
    """``instances`` copies of RG1 in ``study``, in series of SERIES_SIZE; returns the bytes stored."""
    ds = pydicom.dcmread(get_testdata_file("RG1_UNCR.dcm"))
    ds.StudyInstanceUID, ds.StudyDate = study, f"{dt.date.today():%Y%m%d}"
    stored = 0
    for i in range(instances):
        if i % SERIES_SIZE == 0:
            ds.SeriesInstanceUID = generate_uid()
        ds.SOPInstanceUID = ds.file_meta.MediaStorageSOPInstanceUID = generate_uid()
        ds.InstanceNumber = i + 1
        with tempfile.TemporaryFile() as buffer:
            ds.save_as(buffer, enforce_file_format=True)
            buffer.seek(0)
            data = buffer.read()
        requests.post(f"{base}/instances", data=data, auth=auth, timeout=120).raise_for_status()
        stored += len(data)
    return stored


def child(url: str, user: str, password: str, state: str) -> None:
    """One run of the job, then its peak RSS and its decoder worker's, in MB, as JSON."""
    import torch

    from benchmarks.throughput.predict import bench_scorer
    from pipelines.hospital import pacs

    torch.set_num_threads(1)
    scorer = bench_scorer()
    diseases = scorer.contract.diseases
    summary = pacs.score_pacs(pacs.Pacs(url, (user, password)), scorer, "youden", dict.fromkeys(diseases), "bench",
                              Path(state), stable_minutes=0)
    assert summary.studies_reported == 1 and not summary.failed, summary
    print(json.dumps({"job_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                      "decoder_mb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024,
                      "images": sum(row["status"] == "scored" for row in summary.rows)}))


def measure(auth: tuple[str, str], study_instances: int, folder: Path) -> dict:
    """A fresh Orthanc holding one study of ``study_instances``, scored by a fresh process."""
    from testbed.orthanc import orthanc_server

    with orthanc_server(folder / "orthanc") as base:
        size = fill(base, auth, generate_uid(), study_instances)
        out = subprocess.run([sys.executable, "-m", "benchmarks.throughput.pacs_memory", "--child", f"{base}/dicom-web",
                              *auth, str(folder / "state.json")], capture_output=True, text=True, check=False,
                             cwd=REPO)
    if out.returncode != 0:
        raise SystemExit(out.stderr[-3000:])
    return {**json.loads(out.stdout.strip().splitlines()[-1]), "study_mb": size / 2**20}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--instances", type=int, default=140)
    parser.add_argument("--child", nargs=4, metavar=("URL", "USER", "PASSWORD", "STATE"))
    args = parser.parse_args()
    if args.child:
        child(*args.child)
        return
    from testbed.orthanc import PASSWORD, USER

    auth = (USER, PASSWORD)
    with tempfile.TemporaryDirectory() as tmp:
        try:
            small = measure(auth, 1, Path(tmp) / "small")
        except SkipTest as missing:
            raise SystemExit(f"pacs_memory: {missing}") from None
        large = measure(auth, args.instances, Path(tmp) / "large")
    print(f"peak RSS of one PACS scoring run (64 px tiles, small_resnet), RG1 chest PA copies, {sys.platform}:")
    for name, row in (("small study", small), ("large study", large)):
        print(f"  {name}: {row['images']} images, {row['study_mb']:.0f} MB; job {row['job_mb']:.0f} MB, "
              f"decoder worker {row['decoder_mb']:.0f} MB")
    growth = max(large["job_mb"] - small["job_mb"], large["decoder_mb"] - small["decoder_mb"])
    verdict = "PASS" if growth <= TARGET_MB else "FAIL"
    print(f"  growth with the study: {growth:.0f} MB for {large['study_mb'] - small['study_mb']:.0f} MB more study "
          f"(target <= {TARGET_MB} MB): {verdict}")


if __name__ == "__main__":
    main()
