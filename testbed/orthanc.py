"""A real Orthanc PACS (Debian's orthanc with orthanc-dicomweb) on 127.0.0.1, with DICOMweb and a password: what
the PACS tests (tests/pacs_helpers.py) and benchmarks/throughput/pacs_memory.py score against."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from contextlib import contextmanager
from pathlib import Path
from unittest import SkipTest

import requests

from pipelines.servers import free_port

PLUGIN = Path("/usr/share/orthanc/plugins/libOrthancDicomWeb.so")
USER, PASSWORD = "hospital", "s3cret-pacs"


@contextmanager
def orthanc_server(here: Path):
    """Orthanc with DICOMweb and a password, its storage in ``here``. Where it is not installed: ``SkipTest``, which
    pytest reports as a skipped test; its message says what to install."""
    if shutil.which("Orthanc") is None or not PLUGIN.is_file() or shutil.which("dciodvfy") is None:
        raise SkipTest("Orthanc, its DICOMweb plugin or dciodvfy is not installed "
                       "(apt-get install orthanc orthanc-dicomweb dicom3tools; `make setup` does it as root)")
    here.mkdir(parents=True, exist_ok=True)
    port = free_port()
    config = {"Name": "fedauc-test", "StorageDirectory": str(here / "db"), "IndexDirectory": str(here / "db"),
              "HttpPort": port, "DicomServerEnabled": False, "RemoteAccessAllowed": False,
              "AuthenticationEnabled": True, "RegisteredUsers": {USER: PASSWORD}, "Plugins": [str(PLUGIN)],
              "DicomWeb": {"Enable": True, "Root": "/dicom-web/"}}
    (here / "orthanc.json").write_text(json.dumps(config))
    log = (here / "orthanc.log").open("w")
    process = subprocess.Popen(["Orthanc", str(here / "orthanc.json")], stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            if requests.get(f"{base}/system", auth=(USER, PASSWORD), timeout=2).ok:
                break
        except requests.ConnectionError:
            pass
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            raise RuntimeError(f"Orthanc did not start: {(here / 'orthanc.log').read_text()[-2000:]}")
        time.sleep(0.2)
    try:
        yield base
    finally:
        process.terminate()
        process.wait(timeout=30)
