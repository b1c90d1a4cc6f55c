import functools
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from pipelines.prefect_env import PROJECT_ROOT, prefect_env_defaults
from preprocessing.public_metadata import PublicMetadataUnavailable, public_metadata_dir

# Migrated MLflow stores and Prefect databases, flow runs without waits; the tests' own Prefect servers.
pytest_plugins = ["repeated_costs", "prefect_servers"]

# Settings that would send a test's flow runs, models or shards to a real server or folder of the user's.
_USER_VARIABLES = ("PREFECT_API_URL", "PREFECT_API_KEY", "PREFECT_PROFILE", "MLFLOW_REGISTRY_URI",
                   "PREFECT_API_DATABASE_CONNECTION_URL", "FEDAUC_SHARDS")
_session_state: list[str] = []
_session_tracking_uri: list[str] = []


# The services of a Prefect server that no test here relies on, each writing to the server's SQLite database on
# a loop of its own: under CI's load their writes queued behind each other's locks (`database is locked` in the
# log of a server that answered nothing for minutes, three scheduled runs never started). The scheduler, the
# event persister and the task run recorder stay.
QUIET_PREFECT_SERVICES = {f"PREFECT_SERVER_SERVICES_{name}_ENABLED": "false" for name in (
    "LATE_RUNS", "FOREMAN", "CANCELLATION_CLEANUP", "PAUSE_EXPIRATIONS", "REPOSSESSOR", "TRIGGERS")}


def pytest_configure(config):
    """Before any test module imports Prefect (which reads its settings at import): point Prefect's home
    and MLflow's store at a temporary folder for the whole session, in every xdist worker."""
    state = tempfile.mkdtemp(prefix="fedauc-test-state-")
    _session_state.append(state)
    for name in _USER_VARIABLES:
        os.environ.pop(name, None)
    os.environ["PREFECT_HOME"] = os.path.join(state, "prefect")
    if not hasattr(config, "workerinput"):  # the first process: its xdist workers, started after this, inherit it
        from repeated_costs import start_migrated_prefect_db

        start_migrated_prefect_db(state)
    # The product's Prefect defaults (logging at WARNING among them) whatever module imports Prefect first: a
    # test module that imports a flow module before configure_prefect_env() left Prefect at INFO, and its
    # "Stopping temporary server" line at exit went to the captured stderr pytest had closed by then, a
    # `--- Logging error ---` traceback per xdist worker at the end of `make test`.
    for name, value in prefect_env_defaults().items():
        os.environ.setdefault(name, value)
    # Every Prefect server the tests' processes start (each worker's temporary one, those of the `fedauc` commands
    # they run, the session's) without the services no test relies on: idle, each costs its server CPU all its life.
    os.environ.update(QUIET_PREFECT_SERVICES)
    os.environ["MLFLOW_TRACKING_URI"] = f"sqlite:///{os.path.join(state, 'mlruns.db')}"
    _session_tracking_uri.append(os.environ["MLFLOW_TRACKING_URI"])
    # The sites' privacy ledgers (federated/privacy/ledger.py), never the user's; site processes inherit it.
    os.environ["FEDAUC_SITE_STATE"] = os.path.join(state, "site-state")


def pytest_unconfigure(config):
    for state in _session_state:
        shutil.rmtree(state, ignore_errors=True)


# `make test`'s work units (`--dist loadfile`, with the scheduler below): a module each, as loadfile
# does (its module fixtures set up once), except that every module starting an NVIDIA FLARE POC consortium is
# in one unit. Two consortia at once time out on two cores, so those modules run one after another on one
# worker: as units of their own they came last, on both workers, and the second worker to reach one stood
# idle in ``poc_slot`` for the whole of the other's run. (xdist's own ``xdist_group`` marks do nothing under
# pytest 9: xdist 3.8 renames a marked test through an attribute pytest no longer reads.)
CONSORTIUM_GROUP, CONSORTIUM_FIXTURE = "poc-consortium", "poc_slot"


@functools.cache
def starts_a_consortium(module: Path) -> bool:
    """Whether a test module takes ``poc_slot``, read from its text: xdist's controller, which hands out the
    units, sees test ids only. A module takes it by name (a test's or its module fixture's argument); the
    workers check that against the fixtures each test really requests."""
    return CONSORTIUM_FIXTURE in module.read_text()


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """In an xdist worker: the consortium modules first, then the modules with slow tests, then the rest, the
    order `--no-loadscope-reorder` hands the units out in (longest first: the second worker works through the
    long files while the first runs the consortia, and the short ones fill in at the end)."""
    consortium = {item.path for item in items if CONSORTIUM_FIXTURE in item.fixturenames}
    for module in consortium:
        if not starts_a_consortium(module):
            raise pytest.UsageError(
                f"{module}: its tests take {CONSORTIUM_FIXTURE} through another fixture; name {CONSORTIUM_FIXTURE} "
                "in the module (a test's or its module fixture's argument) so that make test runs it with the other "
                "consortium modules")
    if hasattr(config, "workerinput"):
        slow = {item.path for item in items if item.get_closest_marker("slow")}
        items.sort(key=lambda item: (item.path not in consortium, item.path not in slow))


def pytest_xdist_make_scheduler(config, log):
    """`--dist loadfile` with the consortium modules in one unit."""
    if config.getoption("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class ConsortiumModulesTogether(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module = super()._split_scope(nodeid)
            return CONSORTIUM_GROUP if starts_a_consortium(config.rootpath / module) else module

    return ConsortiumModulesTogether(config, log)


@pytest.fixture(scope="session")
def public_metadata():
    """Directory of the real public metadata CSVs from the torchxrayvision wheel (fetched once)."""
    try:
        return public_metadata_dir()
    except PublicMetadataUnavailable as err:
        pytest.skip(f"real public metadata unavailable, cannot fetch the torchxrayvision wheel: {err}")


@pytest.fixture(autouse=True)
def session_tracking_store():
    """Every test starts on the session's MLflow store: ``mlflow.set_tracking_uri(None)`` (how tests and
    module fixtures leave their own store) also deletes MLFLOW_TRACKING_URI from the environment, and the
    next test of this worker would then write into the project's mlruns.db. And after every test too: a command
    a test runs in process sets MLflow's process-wide URI (``tracking.configure``) to the test's own store,
    and the next module's fixtures, which run before this, would record there while its servers read the
    session's store."""
    on_session_store()
    yield
    on_session_store()


def on_session_store() -> None:
    if "mlflow" in sys.modules:
        sys.modules["mlflow"].set_tracking_uri(None)
    os.environ["MLFLOW_TRACKING_URI"] = _session_tracking_uri[0]


@pytest.fixture(autouse=True)
def fedauc_environment():
    """Every test starts with the session's FEDAUC_* variables: a command a test runs in process (CliRunner) sets
    its entry's (``fedauc preprocess`` its FEDAUC_SHARDS) for the rest of the worker, and a later test's own
    command then looked for its shards in the earlier test's folder."""
    saved = {name: value for name, value in os.environ.items() if name.startswith("FEDAUC_")}
    yield
    for name in [name for name in os.environ if name.startswith("FEDAUC_") and name not in saved]:
        del os.environ[name]
    os.environ.update(saved)


@pytest.fixture(autouse=True)
def fresh_site_ledgers():
    """Every test starts with no site ledger: sites are keyed by name (vienna, ...) in the session's one state
    directory, which the site processes of a module's consortium also use."""
    from federated.privacy.ledger import state_dir

    yield
    shutil.rmtree(state_dir(), ignore_errors=True)


@pytest.fixture(scope="session", autouse=True)
def one_torch_thread():
    """`make test` runs two pytest-xdist workers on two cores: a second intra-op thread per worker only
    contends (tiny models here are latency-bound; steps ran up to 8x slower with two threads each)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def melanoma_shards(tmp_path_factory):
    """Three tiny dermatology clinics like the demo's (SIIM-ISIC DICOM and JPEG, their own colour casts),
    preprocessed into real shards at 32 px: ``(root, federation YAML)``; shards in ``root / "shards"``."""
    return melanoma_federation(tmp_path_factory.mktemp("melanoma"))


@pytest.fixture
def budgets(melanoma_shards):
    """Write each clinic's budget (an epsilon at delta 1e-5; None: no ledger) in its ledger for one test, and
    take the ledgers away after it (the shards are shared with the session's other tests, which train without
    DP): ``budgets(epsilons)`` gives the federation, its shards folder and the ledgers' paths."""
    from federated.privacy.ledger import Ledger, ledger_path
    from federated.privacy.policy import SiteBudget
    from preprocessing.federation import load_federation

    root, federation_yaml = melanoma_shards
    federation = load_federation(federation_yaml)
    paths = [ledger_path(root / "shards" / site.name) for site in federation.sites]

    def write(epsilons):
        for path, eps in zip(paths, epsilons):
            if eps is None:
                path.unlink(missing_ok=True)
            else:
                Ledger(path, SiteBudget(epsilon=eps, delta=1e-5)).save()
        return federation, root / "shards", paths

    yield write
    for path in paths:
        path.unlink(missing_ok=True)


@pytest.fixture(scope="session")
def evaluable_melanoma(tmp_path_factory):
    """``melanoma_shards``' clinics with 240 images each at a melanoma rate of 30 % instead of the release's
    1.8 %, so that every valid and test split holds enough positives and negatives for its AUCs, per site too,
    to be defined and reported (evaluation tests)."""
    return melanoma_federation(tmp_path_factory.mktemp("melanoma-evaluable"), n=240, prevalence=0.3)


def melanoma_federation(root, n=120, prevalence=None):
    from testbed.federations import DERMATOLOGY_CLINICS, phantom_federation

    return root, phantom_federation(root / "melanoma.yaml", "tiny-melanoma", "melanoma", DERMATOLOGY_CLINICS, n=n,
                                    prevalence=prevalence, synthetic=True)


def write_generic_csv_site(root, name="clinic", patients=40, seed=0):
    """A small hospital export in the generic-csv layout (PNG images, one labels.csv row per image, two
    labelled diseases); returns the labels CSV path. Real files, read by the real adapter and decoder."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    images = root / "images"
    images.mkdir(parents=True, exist_ok=True)
    rows = ["file,mrn_hash,projection,cardiomegaly,effusion"]
    for patient in range(patients):
        for study in range(2):
            cardio, effusion = int(rng.random() < 0.3), int(rng.random() < 0.4)
            pixels = rng.integers(0, 180, (72, 72), dtype=np.uint8)
            pixels[20:50, 15:15 + 20 + 20 * cardio] = 230
            file = f"{name}-{patient:03d}-{study}.png"
            Image.fromarray(pixels).save(images / file)
            rows.append(f"{file},p{patient:03d},{'PA' if study == 0 else 'AP'},{cardio},{effusion}")
    labels = root / "labels.csv"
    labels.write_text("\n".join(rows) + "\n")
    return labels


def generic_csv_site_yaml(name, root):
    """The site YAML of ``write_generic_csv_site``'s layout."""
    return {
        "name": name, "format": "generic-csv", "root": str(root), "task": "chest-xray",
        "image_size": 32, "min_image_size": 16, "split": {"seed": 0, "valid": 0.2, "test": 0.3},
        "options": {"labels_csv": "labels.csv", "path_column": "file", "image_dir": "images",
                    "patient_column": "mrn_hash", "view_column": "projection",
                    "label_columns": {"Cardiomegaly": "cardiomegaly", "Pleural Effusion": "effusion"}},
    }


@pytest.fixture(scope="module")
def poc_slot():
    """One NVIDIA FLARE POC consortium on this machine at a time, across pytest-xdist workers: a consortium
    is a server and three clients, each a few processes, and two at once on CI's two cores time out. A test
    module that starts one (``LocalConsortium``, ``--flare-env poc``) takes this fixture first, which also puts
    it in `make test`'s CONSORTIUM_GROUP; under any other distribution, or beside another pytest run on the
    same machine, a second module waits here, not in a collective."""
    import fcntl

    with open(os.path.join(tempfile.gettempdir(), "fedauc-poc-slot.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


@pytest.fixture(scope="session")
def renewal() -> dict:
    """What tests/test_consortium_renewal_poc.py hands on to tests/test_renewed_consortium_poc.py, the consortium
    unit's last module, in the same worker: the consortium it renewed (stopped) and its old kits, expiring while the
    modules between them run."""
    return {}


@pytest.fixture(scope="session")
def _melanoma_consortia():
    """The session's consortium of ``melanoma_shards`` (at most one), stopped when the session ends."""
    started = []
    yield started
    for consortium in started:
        consortium.stop()


@pytest.fixture(scope="module")
def melanoma_consortium(poc_slot, melanoma_shards, tmp_path_factory, _melanoma_consortia):
    """A POC consortium of ``melanoma_shards`` (federated/flare/centre/poc.py) with its server and every site
    running, each computing on one thread. One for the session, shared by the modules that take it: starting
    one is a server, three clients and their checks, a quarter of a short module's time. What an earlier
    module stopped is started again here (a site killed or stopped: that site; the server: all of it), so
    a module may stop any part of it."""
    from federated.flare.centre.poc import LocalConsortium
    from preprocessing.federation import load_federation

    root, federation = melanoma_shards
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("OMP_NUM_THREADS", "1")  # every hospital computes like the one-thread test process
        if not _melanoma_consortia:
            _melanoma_consortia.append(LocalConsortium(load_federation(federation), root / "shards",
                                                       tmp_path_factory.mktemp("poc")).start())
        consortium = _melanoma_consortia[0]
        stopped = [name for name in ("server", *consortium.kits.sites)
                   if name not in consortium.processes or consortium.processes[name].poll() is not None]
        if "server" in stopped:
            consortium.stop()
            consortium.start()
        elif stopped:
            for name in stopped:
                consortium.processes.pop(name, None)
            consortium.start_sites(stopped)
    return consortium


@pytest.fixture
def trainings():
    """``trainings(args)`` starts ``fedauc <args>`` as the centre runs it, a command of its own, and returns a
    thread that waits for it and the outcome it fills (``output``, ``exit_code``, ``ended``). Not a CliRunner
    in a thread: that swaps the process's sys.stdout under the test's other threads (one such run ended on a
    closed stream in CI)."""
    started: list[subprocess.Popen] = []

    def train_in_background(args: list[str]) -> tuple[threading.Thread, dict]:
        process = subprocess.Popen([sys.executable, "-m", "pipelines.cli", *args], cwd=PROJECT_ROOT, text=True,
                                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        started.append(process)
        outcome: dict = {}

        def wait():
            outcome["output"] = process.communicate()[0]
            outcome["exit_code"] = process.returncode
            outcome["ended"] = time.monotonic()

        thread = threading.Thread(target=wait, daemon=True)
        thread.start()
        return thread, outcome

    yield train_in_background
    for process in started:
        if process.poll() is None:
            process.kill()
            process.wait(30)
