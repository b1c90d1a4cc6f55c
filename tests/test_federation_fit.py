"""Federations whose sites do not fit together (issue 53 items 6 and 7): a disease no site labels, refused before
Prefect or MLflow start, and trained without when the federation or the training names what it learns; sites at
different image sizes, refused at `fedauc federation add` and before training."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import mlflow
import pytest
import yaml
from conftest import generic_csv_site_yaml, write_generic_csv_site

from common.errors import DataError
from federated.sites import site_shard_dirs
from pipelines.model_package.contract import METADATA_KEY, ModelContract
from pipelines.model_package.predict import probability_column
from pipelines.onboarding import add_site
from pipelines.prefect_env import PROJECT_ROOT
from preprocessing.federation import load_federation
from preprocessing.scan import scan_site
from preprocessing.shards import shard_site
from preprocessing.sites import SiteConfigError, load_site

FOUR = ["Cardiomegaly", "Edema", "Atelectasis", "Pleural Effusion"]  # the task's order; no site labels Consolidation


def four_disease_site(root: Path, name: str, seed: int, image_size: int = 32) -> Path:
    """A hospital export that labels four of the chest task's five diseases (two of its columns, each read for
    two diseases: what matters here is which diseases have labels), preprocessed into ``root/shards``."""
    write_generic_csv_site(root / name, name=name, seed=seed)
    site = generic_csv_site_yaml(name, root / name) | {"image_size": image_size}
    site["options"]["label_columns"] = {"Atelectasis": "effusion", "Cardiomegaly": "cardiomegaly",
                                        "Edema": "cardiomegaly", "Pleural Effusion": "effusion"}
    path = root / f"{name}.yaml"
    path.write_text(yaml.safe_dump(site))
    config = load_site(path)
    shard_site(config, scan_site(config), root / "shards", workers=0, progress=False)
    return path


@pytest.fixture(scope="module")
def federation(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("four-diseases")
    for name, seed in (("north", 1), ("south", 2)):
        four_disease_site(root, name, seed)
    (root / "fed.yaml").write_text(yaml.safe_dump({"name": "four", "task": "chest-xray", "shards": "shards",
                                                   "sites": [{"config": "north.yaml"}, {"config": "south.yaml"}]}))
    return root


def fedauc(work: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PREFECT_HOME": str(work / "prefect"), "MLFLOW_TRACKING_URI": f"sqlite:///{work / 'mlruns.db'}",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(PROJECT_ROOT), os.environ.get("PYTHONPATH")]))}
    return subprocess.run([sys.executable, "-m", "pipelines.cli", *args], cwd=work, env=env, capture_output=True,
                          text=True, timeout=900)


def test_a_disease_no_site_labels_is_refused_before_anything_starts(federation, tmp_path):
    result = fedauc(tmp_path, "train", "--federation", str(federation / "fed.yaml"), "--algorithm", "fedavg",
                    "--rounds", "1")
    assert result.returncode == 1, result.stderr
    lines = result.stderr.strip().splitlines()
    assert lines[0] == ("error: federation 'four': disease 'Consolidation' has no label in any site's training split, "
                        "so no model can learn it"), result.stderr
    assert lines[1].startswith(f"  fix: train on the diseases the sites label: `diseases: {FOUR}` in ")
    assert lines[2:] == ["(`fedauc --debug ...` shows the traceback)"] and "Traceback" not in result.stderr + result.stdout
    assert not (tmp_path / "mlruns.db").exists() and not (tmp_path / "prefect").exists()
    named = fedauc(tmp_path, "train", "--federation", str(federation / "fed.yaml"), "--algorithm", "fedavg",
                   "--rounds", "1", "--disease", "Edema", "--disease", "Consolidation")
    assert named.returncode == 1 and "disease 'Consolidation' has no label" in named.stderr
    assert not (tmp_path / "mlruns.db").exists()


@pytest.mark.slow
def test_a_federation_of_four_diseases_trains_and_its_model_names_four(federation, tmp_path):
    spec = yaml.safe_load((federation / "fed.yaml").read_text()) | {"diseases": FOUR}
    (federation / "fed4.yaml").write_text(yaml.safe_dump(spec))
    result = fedauc(tmp_path, "train", "--federation", str(federation / "fed4.yaml"), "--algorithm", "fedavg",
                    "--rounds", "1", "-I", "2", "--batch-size", "8", "--eval-every", "1")
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads(result.stdout[result.stdout.index("{"):])
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'mlruns.db'}")
    info = mlflow.models.get_model_info(f"models:/fedauc-chest-xray/{summary['model_version']}")
    contract = ModelContract.model_validate(info.metadata[METADATA_KEY])
    outputs = [column.name for column in info.signature.outputs.inputs]
    assert contract.diseases == FOUR and [name for name in outputs if name.startswith("p_")] == [
        probability_column(disease) for disease in FOUR]
    metrics = mlflow.get_run(info.run_id).data.metrics
    assert {disease for disease in FOUR + ["Consolidation"] if any(disease in key for key in metrics)} == set(FOUR)
    assert any(key.startswith("test/pooled/") and "Edema" in key for key in metrics), sorted(metrics)


def test_sites_at_different_image_sizes_are_refused_at_federation_add(tmp_path):
    small, large = four_disease_site(tmp_path, "north", 1), four_disease_site(tmp_path, "south", 2, image_size=48)
    add_site(tmp_path / "fed.yaml", small)
    before = (tmp_path / "fed.yaml").read_text()
    with pytest.raises(SiteConfigError) as err:
        add_site(tmp_path / "fed.yaml", large)
    assert str(err.value) == (f"{tmp_path / 'fed.yaml'}: sites: the sites do not fit together: north image_size 32, "
                              "south image_size 48; give every site's YAML the same image_size and preprocess the "
                              "changed sites again")
    assert (tmp_path / "fed.yaml").read_text() == before


def test_shards_of_different_sizes_are_refused_before_training(tmp_path):
    four_disease_site(tmp_path, "north", 1)
    south = four_disease_site(tmp_path, "south", 2, image_size=48)
    south.write_text(south.read_text().replace("image_size: 48", "image_size: 32"))  # the YAML changed, not the shards
    (tmp_path / "fed.yaml").write_text(yaml.safe_dump({"name": "f", "task": "chest-xray",
                                                       "sites": [{"config": "north.yaml"}, {"config": "south.yaml"}]}))
    with pytest.raises(DataError, match=r"^the sites' shards do not fit together: north 32 px x 1 channel\(s\), "
                                        r"south 48 px x 1 channel\(s\)\n  fix: give every site's YAML the same"):
        site_shard_dirs(load_federation(tmp_path / "fed.yaml"), tmp_path / "shards")
