"""`make test` keeps its Prefect and MLflow state in a temporary folder (tests/conftest.py), never in the
user's .prefect, mlruns.db or servers."""

import os
import subprocess
import sys
from pathlib import Path

from pipelines.prefect_env import PROJECT_ROOT, configure_prefect_env

configure_prefect_env()

import mlflow  # noqa: E402
from prefect import flow  # noqa: E402
from prefect.settings import get_current_settings  # noqa: E402

from pipelines import tracking  # noqa: E402


def _stamp(path: Path):
    return [(p, p.stat().st_mtime_ns, p.stat().st_size) for p in sorted(path.rglob("*")) if p.is_file()] \
        if path.is_dir() else (path.stat().st_mtime_ns if path.exists() else None)


@flow(name="isolation-probe")
def _probe() -> int:
    return 7


def test_flow_and_tracking_runs_stay_out_of_the_project():
    project_state = {p: _stamp(p) for p in (PROJECT_ROOT / ".prefect", PROJECT_ROOT / "mlruns.db")}
    home = Path(get_current_settings().home)
    assert not home.is_relative_to(PROJECT_ROOT) and not home.is_relative_to(Path.home() / ".prefect")
    assert "PREFECT_API_URL" not in os.environ

    assert _probe() == 7
    uri = tracking.configure()
    with mlflow.start_run(experiment_id=tracking.experiment_id("isolation-probe")):
        mlflow.log_metric("x", 1.0)

    assert uri.startswith("sqlite:///") and not Path(uri.removeprefix("sqlite:///")).is_relative_to(PROJECT_ROOT)
    assert any(home.rglob("*.db")), "the flow run went to a Prefect database outside the session's home"
    assert {p: _stamp(p) for p in project_state} == project_state


def test_a_fedauc_home_that_does_not_exist_yet_gets_its_prefect_home(tmp_path):
    """`FEDAUC_HOME=/tmp/try fedauc demo` on a folder not made yet: Prefect's home must exist before Prefect is
    imported, or its server cannot open its database and the demo never starts."""
    home = tmp_path / "not-made-yet"
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_HOME"} | {"FEDAUC_HOME": str(home)}
    subprocess.run([sys.executable, "-c", "from pipelines.prefect_env import configure_prefect_env; "
                    "configure_prefect_env(); import prefect"], env=env, check=True, timeout=120)
    assert (home / ".prefect").is_dir()
