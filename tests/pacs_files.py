"""Real radiographs for the PACS tests: pydicom-data's chest PA (RG1, a CR, MONOCHROME1, 1955 x 1841, 15 bits)
in every transfer syntax a PACS stores it in, the adversary proxy a PACS test puts between the job and
Orthanc, and what a test reads back from the PACS."""

from __future__ import annotations

import shutil
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pydicom
import pytest
import requests
from pacs_helpers import study_tags
from pydicom.data import get_testdata_file
from pydicom.uid import generate_uid

# pydicom-data's own encodings of RG1, and dcmtk's re-encodings of its uncompressed form.
PYDICOM_DATA = ["RG1_UNCR.dcm", "RG1_UNCI.dcm", "RG1_J2KR.dcm", "RG1_J2KI.dcm"]
DCMTK = {"jpeg-lossless-sv1": ["dcmcjpeg", "+e1"], "jpeg-lossless-p14": ["dcmcjpeg", "+el"],
         "jpeg-12bit-extended": ["dcmcjpeg", "+ee"], "jpeg-ls-lossless": ["dcmcjpls"], "rle": ["dcmcrle"]}


def chest_in_every_syntax(folder: Path, study: str, patient: str = "P9") -> list[Path]:
    """RG1 once per transfer syntax, each an instance of its own series in ``study``, dated today (pixel data
    as pydicom-data or dcmtk wrote it; only identifying attributes are new)."""
    if shutil.which("dcmcjpls") is None:
        pytest.skip("dcmtk is not installed (apt-get install dcmtk; `make setup` does it as root)")
    folder.mkdir(parents=True, exist_ok=True)
    encodings = folder.with_name(f"{folder.name}-dcmtk")
    encodings.mkdir(exist_ok=True)
    sources = [Path(get_testdata_file(name)) for name in PYDICOM_DATA]
    for name, command in DCMTK.items():
        encoded = encodings / f"{name}.dcm"
        subprocess.run([*command, str(sources[0]), str(encoded)], check=True, capture_output=True)
        sources.append(encoded)
    return [restudy(source, folder / f"chest-{i}.dcm", study, patient, i + 1) for i, source in enumerate(sources)]


def restudy(source: Path, target: Path, study: str, patient: str, number: int, view: str | None = None,
            date: str | None = None, series: str | None = None) -> Path:
    """``source`` as a new instance of ``series`` (default a new one) in ``study`` (pixel data untouched)."""
    ds = pydicom.dcmread(source)
    ds.update(study_tags(study, patient))
    if date is not None:
        ds.StudyDate = date
    ds.SeriesInstanceUID, ds.SOPInstanceUID = series or generate_uid(), generate_uid()
    ds.file_meta.MediaStorageSOPInstanceUID = ds.SOPInstanceUID
    ds.SeriesNumber = ds.InstanceNumber = number
    if view is not None:
        ds.ViewPosition = view
    ds.save_as(target, enforce_file_format=True)
    return target


class Adversary:
    """A real HTTP server between the job and Orthanc: it forwards every request and logs its path; a
    request whose path holds a UID in ``cut`` gets Orthanc's 200 headers and half its body, then the
    connection closes (as a PACS that fails mid-stream ends its answer); one holding a UID in ``short``, a
    well-formed multipart body without its last part; one holding a UID in ``fail``, a 500; while
    ``refuse_stores``, every STOW-RS request (a POST), a 500."""

    def __init__(self, upstream: str):
        self.upstream, self.log, self.cut, self.short, self.fail = upstream, [], set(), set(), set()
        self.refuse_stores = False
        adversary = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.0"  # the body ends when the connection does: no length to betray a cut

            def _forward(self, method: str) -> None:
                adversary.log.append(f"{method} {self.path}")
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if any(uid in self.path for uid in adversary.fail) or (method == "POST" and adversary.refuse_stores):
                    self.send_response(500)
                    self.end_headers()
                    return
                answer = requests.request(method, adversary.upstream + self.path, data=body, timeout=60,
                                          headers={k: v for k, v in self.headers.items() if k.lower() != "host"})
                content = answer.content
                if any(uid in self.path for uid in adversary.cut):
                    content = content[: len(content) // 2]
                if any(uid in self.path for uid in adversary.short):
                    boundary = answer.headers["Content-Type"].split("boundary=")[1].split(";")[0].strip('"').encode()
                    parts = content.split(b"--" + boundary)  # preamble, the parts, the closing "--"
                    content = (b"--" + boundary).join(parts[:-2] + parts[-1:])
                self.send_response(answer.status_code)
                for name in ("Content-Type", "WWW-Authenticate"):
                    if name in answer.headers:
                        self.send_header(name, answer.headers[name])
                self.end_headers()
                self.wfile.write(content)

            def do_GET(self):
                self._forward("GET")

            def do_POST(self):
                self._forward("POST")

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def requested(self, uid: str) -> list[str]:
        return [line for line in self.log if uid in line]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def reports_in(pacs, study: str, folder: Path) -> list[pydicom.Dataset]:
    """The SRs the PACS holds in ``study``, read back whole."""
    folder.mkdir(parents=True, exist_ok=True)
    return [pydicom.dcmread(path) for series in pacs.series(study) if series["modality"] == "SR"
            for path in pacs.retrieve_series(study, series, folder)]


def dciodvfy_errors(sr: pydicom.Dataset, path: Path) -> list[str]:
    sr.save_as(path, enforce_file_format=True)
    checked = subprocess.run(["dciodvfy", str(path)], capture_output=True, text=True)
    return [line for line in (checked.stdout + checked.stderr).splitlines() if line.startswith("Error")]
