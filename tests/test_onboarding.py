"""Onboarding as the README tells it: its walkthrough runs as written (on a generated CheXpert folder), the
site YAML `sites new` writes validates once filled in, `federation add` never writes a federation that does
not load, and preprocess and train find the same shards folder."""

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import write_generic_csv_site
from repeated_costs import seed_prefect_home

from common.errors import ConfigError
from pipelines.onboarding import add_site, shards_root, site_template
from pipelines.prefect_env import PROJECT_ROOT
from preprocessing.federation import load_federation
from preprocessing.shard_format import is_finished
from preprocessing.sites import SiteConfigError, load_site, validate_site
from preprocessing.synth import generate_site

README_ROOT = "/data/CheXpert-v1.0-small"


def walkthrough() -> list[list[str]]:
    """The commands of the README's onboarding walkthrough: the first bash block of its section."""
    readme = (PROJECT_ROOT / "README.md").read_text()
    section = readme[readme.index("## Onboarding a hospital"):]
    block = re.search(r"```bash\n(.*?)```", section, re.DOTALL).group(1)
    return [shlex.split(line, comments=True) for line in block.splitlines() if line.strip()]


def _env(tmp_path, store):
    env = {**os.environ, "PREFECT_HOME": str(tmp_path / "prefect"), "MLFLOW_TRACKING_URI": store,
           "PYTHONPATH": os.pathsep.join(filter(None, [str(PROJECT_ROOT), os.environ.get("PYTHONPATH")]))}
    env.pop("FEDAUC_SHARDS", None)
    return env


@pytest.mark.slow
def test_the_readme_walkthrough_runs_as_written(tmp_path, new_mlflow_store):
    commands = walkthrough()
    assert [c[:2] for c in commands] == [["fedauc", "sites"], ["fedauc", "sites"], ["fedauc", "sites"],
                                         ["fedauc", "preprocess"], ["fedauc", "federation"], ["fedauc", "train"]]
    generate_site("chexpert", tmp_path / "data", n=60, seed=1, workers=0, progress=False)
    data_root = str(tmp_path / "data" / "CheXpert-v1.0-small")
    work = tmp_path / "checkout"
    work.mkdir()
    outputs, env = [], _env(tmp_path, new_mlflow_store(tmp_path / "mlruns.db"))
    seed_prefect_home(tmp_path / "prefect")
    for command in commands:
        args = [data_root if arg == README_ROOT else arg for arg in command[1:]]
        result = subprocess.run([sys.executable, "-m", "pipelines.cli", *args], cwd=work, env=env,
                                capture_output=True, text=True, timeout=900)
        assert result.returncode == 0, f"{shlex.join(command)}:\n{result.stdout}\n{result.stderr}"
        outputs.append(result.stdout)
    assert load_site(work / "sites" / "my-hospital.yaml").root == tmp_path / "data" / "CheXpert-v1.0-small"
    assert is_finished(work / "shards" / "my-hospital")
    assert [s.name for s in load_federation(work / "sites" / "my-federation.yaml").sites] == ["my-hospital"]
    summary = json.loads(outputs[-1][outputs[-1].index("{"):])
    assert summary["algorithm"] == "codasca" and summary["model_version"] == "1"


def test_a_generic_export_validates_once_its_columns_are_given(tmp_path):
    write_generic_csv_site(tmp_path / "export")
    placeholder = tmp_path / "placeholder.yaml"
    placeholder.write_text(site_template("clinic", "generic-csv", str(tmp_path / "export")))
    problems = [str(p) for p in validate_site(placeholder)]
    assert any("options.labels_csv: metadata file not found" in p and p.endswith("EDIT-ME") for p in problems), problems

    filled = tmp_path / "clinic.yaml"
    filled.write_text(site_template("clinic", "generic-csv", str(tmp_path / "export"), options={
        "labels_csv": "labels.csv", "path_column": "file", "image_dir": "images", "patient_column": "mrn_hash",
        "view_column": "projection", "label_columns": {"Cardiomegaly": "cardiomegaly", "Pleural Effusion": "effusion"}}))
    assert validate_site(filled) == []
    site = load_site(filled)
    assert site.adapter_options.label_columns == {"Cardiomegaly": "cardiomegaly", "Pleural Effusion": "effusion"}
    assert site.image_size == 224 and site.views == ["PA", "AP"]


def test_site_template_rejects_unknown_format_and_options():
    with pytest.raises(ConfigError, match="unknown format 'chexpret'"):
        site_template("x", "chexpret", "/data")
    with pytest.raises(ConfigError, match=r"unknown option\(s\) \['label_column'\]"):
        site_template("x", "generic-csv", "/data", options={"label_column": {}})


def test_federation_add_keeps_comments_and_refuses_a_bad_site(tmp_path):
    for name in ("oslo", "lima"):
        write_generic_csv_site(tmp_path / name, name=name, patients=4)
        (tmp_path / f"{name}.yaml").write_text(yaml.safe_dump(
            {"name": name, "format": "generic-csv", "root": name, "task": "chest-xray",
             "options": {"labels_csv": "labels.csv", "path_column": "file", "image_dir": "images",
                         "patient_column": "mrn_hash", "label_columns": {"Cardiomegaly": "cardiomegaly"}}}))
    federation = tmp_path / "fed" / "nordic.yaml"
    add_site(federation, tmp_path / "oslo.yaml", name="nordic")
    federation.write_text("# agreed at the consortium meeting\n" + federation.read_text())
    loaded = add_site(federation, tmp_path / "lima.yaml")
    assert [s.name for s in loaded.sites] == ["oslo", "lima"]
    assert federation.read_text().startswith("# agreed at the consortium meeting\n")
    assert "  - config: ../lima.yaml\n" in federation.read_text()

    before = federation.read_text()
    melanoma = tmp_path / "derm.yaml"
    melanoma.write_text((tmp_path / "oslo.yaml").read_text().replace("name: oslo", "name: derm")
                        .replace("task: chest-xray", "task: melanoma").replace("Cardiomegaly", "Melanoma"))
    with pytest.raises(SiteConfigError, match="is a melanoma site, the federation is chest-xray"):
        add_site(federation, melanoma)
    assert federation.read_text() == before
    with pytest.raises(ConfigError, match="already lists"):
        add_site(federation, tmp_path / "oslo.yaml")


def test_one_shards_location(tmp_path, monkeypatch):
    federation_yaml = tmp_path / "fed.yaml"
    write_generic_csv_site(tmp_path / "oslo", patients=2)
    (tmp_path / "oslo.yaml").write_text(yaml.safe_dump(
        {"name": "oslo", "format": "generic-csv", "root": "oslo", "task": "chest-xray",
         "options": {"labels_csv": "labels.csv", "path_column": "file", "patient_column": "mrn_hash",
                     "label_columns": {"Cardiomegaly": "cardiomegaly"}}}))
    federation_yaml.write_text("name: f\ntask: chest-xray\nshards: store/shards\nsites:\n  - config: oslo.yaml\n")
    federation = load_federation(federation_yaml)
    monkeypatch.delenv("FEDAUC_SHARDS", raising=False)
    assert shards_root(None, None) == shards_root(None) == shards_root("") == Path("shards")
    assert shards_root(None, federation) == tmp_path / "store" / "shards"
    monkeypatch.setenv("FEDAUC_SHARDS", str(tmp_path / "env"))
    assert shards_root(None, federation) == shards_root(None) == tmp_path / "env"
    assert shards_root(tmp_path / "given", federation) == tmp_path / "given"


def test_data_folders_are_gitignored():
    paths = ["shards/site/train.npy", "demo_data/x/y.png", "logs/mlflow-ui.log", "mlruns.db", ".prefect/prefect.db",
             "mlartifacts/1/model.pt2"]
    result = subprocess.run(["git", "check-ignore", *paths], cwd=PROJECT_ROOT, capture_output=True, text=True)
    assert result.stdout.split() == paths
