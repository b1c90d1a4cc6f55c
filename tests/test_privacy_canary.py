"""Privacy canary: nothing patient-level reaches the centre.

A tiny generic-CSV federation whose patient ids and file names are marker strings (all starting with
``zqxcanary``) and whose images are made of 4x4 blocks of eight planted gray levels (no other value, so a
run of them is recognisable as pixels in any encoding) is onboarded and preprocessed by a "site" process
(with a third site whose onboarding fails: the failure's state and logs reach the centre too), then trained,
registered and evaluated by a "centre" process (in-process, and at the sites as an NVIDIA FLARE
simulator job), both against one temporary MLflow SQLite store and the centre's Prefect server (a real one,
its home in the centre's folder). Then every file of the MLflow store and its artifacts, of the Prefect home
(database and its write-ahead log, results, the server's log), of the FLARE job's server side (logs, the sites'
returned summaries) and the centre's captured console output is scanned for the markers (plain, UTF-16,
base64; inside zip and gzip members too) and for image pixels: runs of planted levels as uint8 bytes, float32 / float64 values, numbers in text (JSON input examples),
rendered PNGs, and image files (PNG/JPEG/DICOM bytes of the sources). A positive control scans the site's
own output folder, where all of these must be found. The centre then trains once more over NVIDIA FLARE on
a provisioned consortium on this machine, and the server's workspace (job store included), the admin's
downloads and the consoles are scanned too.

On the pre-change main (2212bd3) this test failed with these leaks at the centre:
- the registered model's ``input_example.json`` / ``serving_input_example.json``: real training pixels;
- ``qc/samples.png`` of each site in the parent and child runs: rendered real images;
- ``data/model.pt2``: torch.export's sample inputs, the same real pixels, as float32;
- ``qc/report.json`` / ``qc/report.md`` in MLflow and the QC Markdown artifact in Prefect's database
  (``artifact``, ``artifact_collection`` and ``events`` tables): quarantine rows with record ids, file names.
The backend check was added once site-local evaluation landed (8b922da); before it, ``Engine.evaluate``
gathered every site's (N, C) labels and scores, which its per-image-rows check flags.
"""

from __future__ import annotations

import base64
import gzip
import io
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest
import yaml
from canary_scanner import LEVELS, MARK, scan, scan_bytes

SIZE = 32  # source size = shard size, so the planted blocks reach the shards unresampled
SITES = ("north", "south")
FAILING = "east"  # a third site of the hospital's, whose onboarding fails
DISEASES = {"Cardiomegaly": "cmg", "Edema": "edm", "Consolidation": "cns", "Atelectasis": "atl", "Pleural Effusion": "eff"}
ROOT = Path(__file__).resolve().parents[1]
# The hospital's own folder (its data and site YAMLs): a path that holds the marker, so that a path of the
# hospital's reaching the centre (a flow run's parameters, an artifact's description) is found like a file name.
HOSPITAL = f"{MARK}-hospital-folder"

pytestmark = pytest.mark.slow


# --- the federation ----------------------------------------------------------------------------------
def planted_image(rng: np.random.Generator) -> np.ndarray:
    blocks = rng.choice(LEVELS, size=(SIZE // 4, SIZE // 4))
    return np.kron(blocks, np.ones((4, 4), dtype=np.uint8))


def build_federation(root: Path, images_per_site: int = 36) -> None:
    from PIL import Image

    rng = np.random.default_rng(20261123)
    entries = []
    for site in SITES:
        data = root / HOSPITAL / "data" / site
        (data / "images").mkdir(parents=True)
        rows = []
        for i in range(images_per_site):
            name = f"{MARK}-img-{site}-{i:03d}.png"
            Image.fromarray(planted_image(rng)).save(data / "images" / name)
            rows.append([name, f"{MARK}-pat-{site}-{i // 2:03d}", *(rng.random(len(DISEASES)) < 0.5).astype(int)])
        # Quarantined rows carry markers too: a file that is not there and a PNG cut short.
        truncated = f"{MARK}-img-{site}-truncated.png"
        buffer = io.BytesIO()
        Image.fromarray(planted_image(rng)).save(buffer, format="PNG")
        (data / "images" / truncated).write_bytes(buffer.getvalue()[:60])
        for name in (f"{MARK}-img-{site}-missing.png", truncated):
            rows.append([name, f"{MARK}-pat-{site}-{name.rsplit('-', 1)[1][:-4]}", 1, 0, 1, 0, 1])
        with open(data / "labels.csv", "w") as handle:
            handle.write(",".join(["file", "patient", *DISEASES.values()]) + "\n")
            handle.writelines(",".join(map(str, row)) + "\n" for row in rows)
        config = {"name": site, "format": "generic-csv", "root": f"data/{site}", "task": "chest-xray",
                  "image_size": SIZE, "min_image_size": 16,
                  "split": {"seed": 0, "valid": 0.25, "test": 0.25, "use_official": False},
                  "options": {"labels_csv": "labels.csv", "path_column": "file", "image_dir": "images",
                              "patient_column": "patient", "default_view": "PA",
                              "label_columns": DISEASES}}
        (root / HOSPITAL / f"{site}.yaml").write_text(yaml.safe_dump(config))
        # The centre's copy (in-process training reads its task and name; the shards are what it reads).
        (root / "sites").mkdir(exist_ok=True)
        (root / "sites" / f"{site}.yaml").write_text(yaml.safe_dump({**config, "root": "at-the-hospital"}))
        entries.append({"config": f"sites/{site}.yaml"})
    (root / "federation.yaml").write_text(yaml.safe_dump({"name": "canary", "task": "chest-xray", "sites": entries}))
    # A site whose label table is not there: its failed onboarding reaches the centre's Prefect too, where the
    # error's path (inside the hospital's folder, which holds the marker) must not.
    (root / HOSPITAL / f"{FAILING}.yaml").write_text(yaml.safe_dump({**config, "name": FAILING, "root": "data/gone"}))


# --- the two processes (run as `python tests/test_privacy_canary.py site|centre ROOT`) -------------------
def run_site(root: Path) -> None:
    """A hospital: onboard and preprocess (its Prefect flow runs report to the central Prefect server), its
    worker set up as infra/README.md says: its site YAMLs in $FEDAUC_SITES, its shards in $FEDAUC_SHARDS."""
    from common.errors import FailedAtSite
    from pipelines.prefect_env import configure_prefect_env

    configure_prefect_env()
    os.environ.update(FEDAUC_SITES=str(root / HOSPITAL), FEDAUC_SHARDS=str(root / "shards"))
    from pipelines import flows
    from pipelines.preprocess_flow import preprocess_site

    for site in SITES:
        flows.onboard_site(site)
        preprocess_site(site, workers=0)
    try:
        flows.onboard_site(FAILING)
    except FailedAtSite:
        pass  # its state, task runs and logs at the centre are scanned with the rest
    else:
        raise AssertionError(f"site {FAILING} onboarded without its label table")


def run_centre(root: Path) -> None:
    """The centre: train (registering the model and moving the champion alias), then evaluate."""
    from pipelines.prefect_env import configure_prefect_env

    configure_prefect_env()
    import torch

    import federated.engine
    from federated.backends import InProcessTransport
    from pipelines import flows

    traffic: list[tuple[str, torch.Tensor]] = []

    class RecordingTransport(InProcessTransport):
        """The in-process transport, keeping a copy of every tensor a site hands to it."""

        def mean_(self, per_site, weights, robust=None, names=()):
            traffic.extend(("mean", t.detach().cpu().clone()) for tensors in per_site for t in tensors)
            super().mean_(per_site, weights, robust, names)

        def gather(self, per_site):
            traffic.extend(("gather", t.detach().cpu().clone()) for t in per_site)
            return super().gather(per_site)

    federated.engine.InProcessTransport = RecordingTransport
    config = {"algorithm": "codasca", "params": {"T0": 2}, "network": "small_resnet", "rounds": 2,
              "local_steps": 2, "batch_size": 8, "lr": 0.05, "eval_every": 1, "progress": False}
    flows.train_federated(str(root / "federation.yaml"), str(root / "shards"), config, "canary")
    flows.evaluate(str(root / "federation.yaml"), str(root / "shards"))
    # The champion scored at the sites as an NVIDIA FLARE job: what the server receives is scanned below.
    flows.evaluate(str(root / "federation.yaml"), str(root / "shards"),
                   launcher={"kind": "flare", "env": "sim", "workspace": str(root / "flare")})
    torch.save(traffic, root / "backend-traffic.pt")


def run_hospital(root: Path) -> None:
    """A hospital using the champion (docs/deploy.md section 4): its dataset scored through `fedauc predict`
    into a table that stays at the site, and the scoring run's aggregates sent to the centre's MLflow, as the
    PACS job sends them; with ``min_count: 1``, the most a site's sharing policy lets leave."""
    from pipelines.prefect_env import configure_prefect_env

    configure_prefect_env()
    import pandas as pd
    import torch
    from typer.testing import CliRunner

    from federated.data import load_shard
    from federated.predict import predict_scores
    from pipelines.cli import app
    from pipelines.hospital import drift
    from pipelines.model_package import loading
    from preprocessing.sites import SharingPolicy, load_site

    for site in SITES:
        out = root / f"scores-{site}.parquet"
        result = CliRunner().invoke(app, ["predict", str(root / HOSPITAL / f"{site}.yaml"), "--out", str(out), "--workers", "0"])
        assert result.exit_code == 0, result.output
        with loading.scratch_folder() as folder:
            scorer = loading.load_registered(None, "chest-xray", Path(folder))
            valid = load_shard(root / "shards" / site).splits["valid"]
            reference = predict_scores(scorer.network, valid.images, torch.device("cpu")).astype(np.float64)
        rows = pd.read_parquet(out).to_dict("records")
        summary = drift.aggregates(rows, reference, scorer.contract.diseases, SharingPolicy(min_count=1))
        assert summary["histograms"], "the canary must send histograms to be a test of them"
        drift.record(load_site(root / HOSPITAL / f"{site}.yaml").task, site, scorer.name, scorer.version, summary)


def run_flare(root: Path) -> None:
    """The centre again, training over NVIDIA FLARE on a provisioned consortium on this machine: a server and
    one client per site, each site started as `fedauc consortium start-site` starts it, the job submitted
    with the admin kit and its result downloaded."""
    from pipelines.prefect_env import configure_prefect_env

    configure_prefect_env()
    from pipelines import flows

    config = {"algorithm": "codasca", "params": {"T0": 2}, "network": "small_resnet", "rounds": 2,
              "local_steps": 2, "batch_size": 8, "lr": 0.05, "eval_every": 1, "progress": False, "timeout_s": 120}
    flows.train_federated(str(root / "federation.yaml"), str(root / "shards"), config, "canary-flare",
                          launcher={"kind": "flare", "env": "poc", "workspace": str(root / "flare")})


def run_role(role: str, root: Path, centre: Path, prefect_api: str) -> subprocess.CompletedProcess:
    # PREFECT_HOME: the results each role's flow runs persist go to the centre's folder too, and are scanned.
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PREFECT_HOME": str(centre / "prefect"), "PREFECT_API_URL": prefect_api,
           "MLFLOW_TRACKING_URI": f"sqlite:///{centre / 'mlruns.db'}", "PREFECT_LOGGING_LEVEL": "INFO",
           "PREFECT_RESULTS_PERSIST_BY_DEFAULT": "true"}
    done = subprocess.run([sys.executable, __file__, role, str(root)], env=env, capture_output=True, text=True,
                          timeout=900)
    assert done.returncode == 0, f"{role} process failed:\n{done.stdout[-3000:]}\n{done.stderr[-6000:]}"
    return done


def source_chunks(root: Path) -> list[bytes]:
    """32 bytes from the middle of every source image file: its compressed pixel stream."""
    chunks = []
    for file in sorted((root / HOSPITAL / "data").rglob("*.png")):
        data = file.read_bytes()
        if len(data) >= 96:
            chunks.append(data[len(data) // 2 - 16: len(data) // 2 + 16])
    return chunks


# --- the test ----------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def centre_prefect(tmp_path_factory):
    """The canary's folder and the centre's Prefect server (its home, database and log in the centre's folder),
    which every role's flow runs report to, as a consortium's do: its API URL."""
    from repeated_costs import start_prefect_server

    from pipelines.servers import stop_server

    root = tmp_path_factory.mktemp("canary")
    process, api = start_prefect_server(root / "centre" / "prefect")
    yield root, api
    stop_server(process)


@pytest.fixture(scope="module")
def canary(centre_prefect):
    root, api = centre_prefect
    centre = root / "centre"
    build_federation(root)
    run_role("site", root, centre, api)
    console = run_role("centre", root, centre, api)
    run_role("hospital", root, centre, api)  # its console is the hospital's, not scanned as the centre's
    (root / "centre-console.txt").write_text(console.stdout + console.stderr)
    return root


def test_the_scanner_finds_what_a_site_keeps(canary):
    """Positive control: the site's own output holds markers, pixels and a rendered grid, and the scanner
    sees each kind, in every encoding it claims (so a clean centre below is not a blind scanner)."""
    leaks = "\n".join(scan([canary / "shards"], source_chunks(canary)))
    assert f"marker {MARK.encode()!r}" in leaks
    assert "uint8 pixels" in leaks
    assert "a rendered picture of planted images" in leaks

    image = np.load(canary / "shards" / "north" / "train" / "images.npy")[0]
    assert set(np.unique(image)) <= set(LEVELS)  # the planted blocks reach the shards unchanged
    pixels = image.astype(np.float32) / np.float32(255)
    encodings = {
        "float32 pixels": b"header" + pixels.tobytes(),
        "float64 pixels": b"abc" + pixels.astype(np.float64).tobytes(),
        "pixel values as text": json.dumps({"inputs": pixels.tolist()}).encode(),
        "marker": base64.b64encode(b"row id " + f"{MARK}-pat-north-000".encode()),
        "a JPEG or DICOM file": b"\xff\xd8\xff\xe0" + bytes(200),
        "bytes of a source image file": b"x" + source_chunks(canary)[0] + b"y",
    }
    for kind, data in encodings.items():
        assert any(kind in leak for leak in scan_bytes(data, kind, source_chunks(canary))), kind
    archive = io.BytesIO()
    with zipfile.ZipFile(archive, "w", compression=zipfile.ZIP_DEFLATED) as zipped:
        zipped.writestr("inner/example.bin", gzip.compress(pixels.tobytes()))
    assert scan_bytes(archive.getvalue(), "model.zip", []) == ["model.zip!inner/example.bin!gunzip: float32 pixels"]


def test_nothing_patient_level_reaches_the_centre(canary):
    centre = canary / "centre"
    assert (centre / "mlruns.db").is_file() and (centre / "mlartifacts").is_dir()
    assert any((centre / "prefect").rglob("*.db"))
    # The NVIDIA FLARE evaluation's server: its logs and what the sites returned to it (the sites' own folders
    # of the simulator's workspace are the sites', not the centre's).
    server = canary / "flare" / "fedauc-evaluate" / "server"
    assert list(server.rglob("result.json")) and list(server.rglob("log.txt"))
    leaks = scan([centre, canary / "centre-console.txt", server], source_chunks(canary))
    assert not leaks, "patient-level data reached the centre:\n" + "\n".join(leaks)


def test_no_subgroup_cell_below_the_threshold_reaches_the_centre(canary):
    """The canary's test splits hold about nine images a site, so every subgroup cell (sex, age band, view,
    manufacturer) is below the sites' threshold of 10: what the sites returned to the NVIDIA FLARE server carries
    for each cell its flag and "<10" counts only, no histogram, and the centre's evaluation runs hold no subgroup
    figure (federated/subgroups.py)."""
    import sqlite3

    from common.small_counts import ON_WIRE

    (result,) = (canary / "flare" / "fedauc-evaluate" / "server").rglob("result.json")
    cells = [(key, arrays) for site in json.loads(result.read_text())["sites"].values()
             for summary in site["summaries"] for key, arrays in summary.items() if "@" in key]
    assert {key.split("@")[1].split(".")[0] for key, _ in cells} == {"sex", "age", "view", "manufacturer"}
    for key, arrays in cells:
        report, histograms = np.asarray(arrays["report"]), np.asarray(arrays["histograms"])
        assert (report[:, 2] == 1).all() and (report[:, :2] == ON_WIRE).any(axis=1).all(), key
        assert not histograms.any() and np.isnan(report[:, 3:]).all(), key
    with sqlite3.connect(canary / "centre" / "mlruns.db") as db:
        keys = {key for (key,) in db.execute("SELECT DISTINCT key FROM metrics")}
    assert not [key for key in keys if "/subgroup/" in key or "/subgroup_gap/" in key]


@pytest.fixture(scope="module")
def flare_canary(poc_slot, canary, centre_prefect):
    console = run_role("flare", canary, canary / "centre", centre_prefect[1])
    (canary / "flare-console.txt").write_text(console.stdout + console.stderr)
    return canary


def test_nothing_patient_level_reaches_the_centre_over_flare(flare_canary):
    """After a training over NVIDIA FLARE: the centre's MLflow and Prefect stores, the server's whole
    workspace (its logs, its job store under stores/, the job's run folder with the result), the admin kit
    (the downloaded result), NVFlare's submit log, the server's console and the centre's console. The
    hospitals' kits and logs are theirs, not scanned."""
    poc = flare_canary / "flare" / "poc"
    (consortium,) = (poc / "kits").glob("*/prod_*")
    server, admin = consortium / "localhost", consortium / "admin@fedauc.org"
    assert any((server / "stores" / "jobs").iterdir())  # the job went through the server's own store
    assert any(p.name == "global_state.pt" for p in admin.rglob("*"))  # the result came back to the admin
    places = [flare_canary / "centre", server, admin, flare_canary / "flare" / "submit.log", poc / "logs" / "server.log",
              flare_canary / "flare-console.txt"]
    leaks = scan(places, source_chunks(flare_canary))
    assert not leaks, "patient-level data reached the centre over NVIDIA FLARE:\n" + "\n".join(leaks)


def test_nothing_patient_level_crosses_the_backend(canary):
    """What the sites handed to the engine's backend (model state, label counts, evaluation summaries): no
    pixels, no markers, and no per-image rows (a tensor of one row per image of some site's split and one
    column per disease: labels or scores)."""
    import pandas as pd
    import torch

    traffic = torch.load(canary / "backend-traffic.pt", weights_only=True)
    assert {kind for kind, _ in traffic} == {"mean", "gather"}
    split_sizes = {len(pd.read_parquet(manifest)) for manifest in (canary / "shards").glob("*/*/manifest.parquet")}
    leaks = []
    for i, (kind, tensor) in enumerate(traffic):
        leaks += scan_bytes(tensor.numpy().tobytes(), f"{kind} #{i} {tuple(tensor.shape)}", [])
        if tensor.ndim == 2 and tensor.shape[1] == len(DISEASES) and tensor.shape[0] in split_sizes:
            leaks.append(f"{kind} #{i}: one row per image of a split, {tuple(tensor.shape)}")
    assert not leaks, "patient-level data crossed the backend:\n" + "\n".join(leaks)
    assert sum(t.numel() for _, t in traffic) > 10_000  # the model really went through it


if __name__ == "__main__":
    role, where = sys.argv[1], Path(sys.argv[2])
    {"site": run_site, "centre": run_centre, "hospital": run_hospital, "flare": run_flare}[role](where)
