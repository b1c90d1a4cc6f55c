"""`make test`'s distribution over its two workers (tests/conftest.py: CONSORTIUM_GROUP), run for real with the
Makefile's own pytest options and this suite's conftest on a small suite of its own: the modules that start an
NVIDIA FLARE consortium (their tests take the consortium slot) run one after another on one worker, before anything
else there; every other module stays whole on one worker, its module fixture set up once; the slowest tests
are printed; a worker that dies ends the run, naming its test."""

import os
import re
import shlex
import shutil
import subprocess
import sys
from collections import defaultdict

from conftest import CONSORTIUM_FIXTURE

from pipelines.prefect_env import PROJECT_ROOT

# Each test and module fixture of the small suite writes a line "<worker> <module> <what>" here.
RECORD = '''
import os

def record(module, what):
    with open(os.environ["SCHEDULE_RECORD"], "a") as out:
        out.write(f"{os.environ.get('PYTEST_XDIST_WORKER', 'main')} {module} {what}\\n")
'''
# A consortium module of the small suite: a slot fixture of its own (the name is what groups it), not the
# machine-wide lock, which a real consortium module of a running `make test` may hold.
CONSORTIUM = '''
import pytest
from record import record

@pytest.fixture(scope="module")
def {slot}():
    yield

@pytest.mark.slow
@pytest.mark.parametrize("case", range({n}))
def test_trains({slot}, case):
    record(__name__, f"test {{case}}")
'''
OTHER = '''
import pytest
from record import record

@pytest.fixture(scope="module")
def shared():
    record(__name__, "setup")

@pytest.mark.parametrize("case", range({n}))
def test_uses(shared, case):
    record(__name__, f"test {{case}}")
'''


def make_test_options() -> list[str]:
    """The options after ``pytest`` in the Makefile's test target."""
    makefile = (PROJECT_ROOT / "Makefile").read_text()
    recipe = makefile[makefile.index("\ntest:"):]
    return shlex.split(re.search(r"-m pytest (.*)", recipe).group(1))


CONFTEST = ("conftest.py", "repeated_costs.py", "prefect_servers.py")  # the suite's conftest and its plugins


def _small_suite(tmp_path):
    """A folder ``suite`` under ``tmp_path`` with this suite's conftest and ``record.py``; pytest's ini file beside it."""
    suite = tmp_path / "suite"
    suite.mkdir()
    for conftest in CONFTEST:
        shutil.copy(PROJECT_ROOT / "tests" / conftest, suite / conftest)
    (suite / "record.py").write_text(RECORD)
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    slow: slow\n")
    return suite


def _make_test(tmp_path, record, timeout_s: float) -> subprocess.CompletedProcess:
    """pytest with the Makefile's options on the small suite in ``tmp_path``."""
    env = {**os.environ, "SCHEDULE_RECORD": str(record),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(PROJECT_ROOT), os.environ.get("PYTHONPATH")]))}
    return subprocess.run([sys.executable, "-m", "pytest", *make_test_options(), "-p", "no:cacheprovider",
                           "--rootdir", str(tmp_path), "-c", str(tmp_path / "pytest.ini"), "suite"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=timeout_s)


def test_make_test_runs_the_consortium_modules_first_on_one_worker_and_keeps_every_module_whole(tmp_path):
    suite = _small_suite(tmp_path)
    # The two consortium modules have the most tests: xdist's loadfile would hand them to the two workers first.
    consortia = {"test_poc_one", "test_poc_two"}
    for name in consortia:
        (suite / f"{name}.py").write_text(CONSORTIUM.format(slot=CONSORTIUM_FIXTURE, n=6))
    others = {f"test_other_{i}" for i in range(5)}
    for name in others:
        (suite / f"{name}.py").write_text(OTHER.format(n=3))
    record = tmp_path / "record.txt"
    done = _make_test(tmp_path, record, 600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "slowest 25 durations" in done.stdout

    lines = [line.split(" ", 2) for line in record.read_text().splitlines()]
    workers, order, setups = defaultdict(set), defaultdict(list), defaultdict(int)
    for worker, module, what in lines:
        workers[module].add(worker)
        if not order[worker] or order[worker][-1] != module:
            order[worker].append(module)
        setups[module] += what == "setup"
    assert {module for module, ran in workers.items() if len(ran) > 1} == set()
    assert len({next(iter(workers[module])) for module in consortia}) == 1
    (consortium_worker,) = workers["test_poc_one"]
    assert set(order[consortium_worker][:2]) == consortia
    assert all(setups[module] == 1 for module in others)
    assert sum(what.startswith("test") for *_, what in lines) == 2 * 6 + 5 * 3


DYING = "test_dies.py"


def test_a_worker_that_dies_ends_make_test_at_once_naming_its_test(tmp_path):
    """A native crash (here an abort, as the heap corruption of torch 2.13's oneDNN was) kills an xdist worker; the
    run must end with the test named, not hang until CI's limit as xdist's replacement worker made it."""
    suite = _small_suite(tmp_path)
    (suite / DYING).write_text("import os\n\ndef test_aborts():\n    os.abort()\n")
    for i in range(3):
        (suite / f"test_other_{i}.py").write_text(OTHER.format(n=2))
    try:
        done = _make_test(tmp_path, tmp_path / "record.txt", 240)
    except subprocess.TimeoutExpired as hung:
        printed = (hung.stdout or b"").decode(errors="replace")
        raise AssertionError(f"make test's pytest still ran 240 s after a worker died: {printed}") from None
    assert done.returncode == 1, done.stdout[-3000:]
    assert f"crashed while running 'suite/{DYING}::test_aborts'" in done.stdout, done.stdout[-3000:]


def test_a_module_taking_the_consortium_slot_without_naming_it_is_refused_with_the_fix(tmp_path):
    """The controller groups modules by their text: one that gets the slot through a fixture of the conftest
    would run beside a consortium, so collection stops and says what to write."""
    conftest = (PROJECT_ROOT / "tests" / "conftest.py").read_text()
    (tmp_path / "conftest.py").write_text(
        f"{conftest}\n\n@pytest.fixture(scope='module')\ndef consortium({CONSORTIUM_FIXTURE}):\n    yield\n")
    for plugin in CONFTEST[1:]:
        shutil.copy(PROJECT_ROOT / "tests" / plugin, tmp_path / plugin)
    (tmp_path / "test_indirect.py").write_text("def test_trains(consortium):\n    pass\n")
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    env = {**os.environ,
           "PYTHONPATH": os.pathsep.join(filter(None, [str(PROJECT_ROOT), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                           "--rootdir", str(tmp_path), "-c", str(tmp_path / "pytest.ini"), "test_indirect.py"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode != 0
    assert (f"test_indirect.py: its tests take {CONSORTIUM_FIXTURE} through another fixture; name "
            f"{CONSORTIUM_FIXTURE} in the module") in done.stderr + done.stdout
