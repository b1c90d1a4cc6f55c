"""A data or config mistake ends a command with one message and its fix, exit code 1, no traceback, and
before Prefect or MLflow start (no Prefect database, no MLflow store appears); `--debug` shows the traceback."""

import os
import subprocess
import sys

import pytest
import yaml
from conftest import generic_csv_site_yaml, write_generic_csv_site

from pipelines.prefect_env import PROJECT_ROOT

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def hospital(tmp_path_factory):
    """A federation of one generic-csv site that was never preprocessed."""
    root = tmp_path_factory.mktemp("hospital")
    write_generic_csv_site(root / "data")
    (root / "clinic.yaml").write_text(yaml.safe_dump(generic_csv_site_yaml("clinic", root / "data")))
    (root / "federation.yaml").write_text(yaml.safe_dump(
        {"name": "one", "task": "chest-xray", "sites": [{"config": "clinic.yaml"}]}))
    return root


def _fedauc(tmp_path, *args):
    state = tmp_path / "state"
    env = {**os.environ, "PREFECT_HOME": str(state / "prefect"),
           "MLFLOW_TRACKING_URI": f"sqlite:///{state / 'mlruns.db'}"}
    result = subprocess.run([sys.executable, "-m", "pipelines.cli", *args], cwd=PROJECT_ROOT, env=env,
                            capture_output=True, text=True, timeout=300)
    started = {"prefect": (state / "prefect").exists(), "mlflow": (state / "mlruns.db").exists()}
    return result, started


def _edited_site(hospital, tmp_path, **changes):
    site = {**generic_csv_site_yaml("clinic", hospital / "data"), **changes}
    path = tmp_path / "clinic.yaml"
    path.write_text(yaml.safe_dump(site))
    return path


def _assert_one_message(result, started, *expected):
    assert result.returncode == 1, result.stdout + result.stderr
    assert "Traceback" not in result.stderr and "╭" not in result.stderr
    assert result.stderr.startswith("error: ")
    for text in expected:
        assert text in result.stderr
    assert len(result.stderr.splitlines()) <= 6, result.stderr
    assert started == {"prefect": False, "mlflow": False}


def test_site_root_missing(hospital, tmp_path):
    site = _edited_site(hospital, tmp_path, root=str(tmp_path / "nowhere"))
    _assert_one_message(*_fedauc(tmp_path, "preprocess", str(site), "--out", str(tmp_path / "shards")),
                        "root: data root not found", str(tmp_path / "nowhere"))


def test_misspelt_column(hospital, tmp_path):
    options = generic_csv_site_yaml("clinic", hospital / "data")["options"]
    site = _edited_site(hospital, tmp_path, options={**options, "patient_column": "mrn_hsah"})
    _assert_one_message(*_fedauc(tmp_path, "preprocess", str(site), "--out", str(tmp_path / "shards")),
                        "options.labels_csv", "missing column(s) ['mrn_hsah']")


def test_train_before_preprocess(hospital, tmp_path):
    _assert_one_message(*_fedauc(tmp_path, "train", "--federation", str(hospital / "federation.yaml"),
                                 "--algorithm", "codasca", "--shards", str(tmp_path / "shards")),
                        "no shards at", "fix: run `fedauc preprocess")


def test_unknown_algorithm_suggests_the_closest(hospital, tmp_path):
    result, started = _fedauc(tmp_path, "train", "--federation", str(hospital / "federation.yaml"),
                              "--algorithm", "codsca", "--shards", str(tmp_path / "shards"))
    _assert_one_message(result, started, "unknown algorithm 'codsca'", "did you mean 'codasca'?")


def test_federation_naming_a_missing_site_file(hospital, tmp_path):
    federation = tmp_path / "federation.yaml"
    federation.write_text(yaml.safe_dump({"name": "two", "task": "chest-xray",
                                          "sites": [{"config": str(hospital / "clinic.yaml")},
                                                    {"config": "vienna.yaml"}]}))
    _assert_one_message(*_fedauc(tmp_path, "train", "--federation", str(federation), "--algorithm", "codasca",
                                 "--shards", str(tmp_path / "shards")),
                        f"{tmp_path / 'vienna.yaml'}: site file not found")


def test_header_only_labels_file_fails_validate_and_preprocess(hospital, tmp_path):
    data = tmp_path / "data"
    (data / "images").mkdir(parents=True)
    header = (hospital / "data" / "labels.csv").read_text().splitlines()[0]
    (data / "labels.csv").write_text(header + "\n")
    site = _edited_site(hospital, tmp_path, root=str(data))
    for command in (["sites", "validate", str(site)], ["sites", "report", str(site), "--labels-only"],
                    ["preprocess", str(site), "--out", str(tmp_path / "shards")]):
        result, started = _fedauc(tmp_path, *command)
        assert result.returncode == 1 and not started["mlflow"], command
        assert "no data rows, only a header" in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "shards").exists()


def test_debug_shows_the_traceback(hospital, tmp_path):
    result, _ = _fedauc(tmp_path, "--debug", "train", "--federation", str(hospital / "federation.yaml"),
                        "--algorithm", "codsca", "--shards", str(tmp_path / "shards"))
    assert result.returncode == 1
    assert "Traceback" in result.stderr or "╭" in result.stderr
    assert "ConfigError" in result.stderr


def test_report_warns_of_a_split_without_positives(hospital, tmp_path):
    data = tmp_path / "data"
    write_generic_csv_site(data, patients=30)
    labels = data / "labels.csv"
    rows = labels.read_text().splitlines()
    labels.write_text("\n".join([rows[0], *(r[:-1] + "0" for r in rows[1:])]) + "\n")  # effusion never positive
    site = _edited_site(hospital, tmp_path, root=str(data))
    result, _ = _fedauc(tmp_path, "sites", "report", str(site), "--labels-only")
    assert result.returncode == 0, result.stderr
    for split in ("train", "valid", "test"):
        assert f"split {split}: no positive for Pleural Effusion" in result.stdout
    assert "no positive for Cardiomegaly" not in result.stdout
