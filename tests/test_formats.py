"""Every file fedauc persists carries a format version (common/formats.py): the files the fedauc of
commit 2d9c5ff wrote, without one (tests/fixtures/v1, written by its generate.py with that commit's code), are
read by today's as format 1: a hospital's privacy ledger keeps its spend, its PACS state and operating points
their content, a checkpoint resumes to the uninterrupted model, a kit's site settings name the site's shards.
A file of a newer format is refused in one line naming the file and what to do. `fedauc consortium status` names the hospitals behind the version the centre announces."""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import pytest
import torch

import federated
from common.errors import DataError
from common.formats import FIELD, FORMATS
from federated.flare.centre.operate import ConsortiumStatus, SiteStatus
from federated.flare.spec import local_site
from federated.privacy.ledger import Ledger
from pipelines.hospital import pacs_state
from pipelines.model_package import thresholds

V1 = Path(__file__).resolve().parent / "fixtures" / "v1"


def _generator():
    spec = importlib.util.spec_from_file_location("v1_generate", V1 / "generate.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _copy(name: str, tmp_path: Path) -> Path:
    """A writable copy, owner-only as fedauc wrote it (git keeps no modes but the executable bit)."""
    target = tmp_path / name
    (shutil.copytree if (V1 / name).is_dir() else shutil.copy)(V1 / name, target)
    for path in [target, *target.rglob("*")]:
        path.chmod(0o700 if path.is_dir() else 0o600)
    return target


def test_the_old_files_have_no_format_field_and_read_as_format_1(tmp_path):
    assert FIELD not in json.loads((V1 / "vienna.privacy-ledger.json").read_text())

    ledger = Ledger.load(_copy("vienna.privacy-ledger.json", tmp_path))
    assert ledger.budget.epsilon == 8.0 and [e.steps for e in ledger.entries] == [40] and len(ledger.events) == 1
    assert ledger.spent(1e-5) > 0
    ledger.save()  # rewritten in today's format, the same ledger
    assert json.loads(ledger.path.read_text())[FIELD] == FORMATS["privacy-ledger"]
    again = Ledger.load(ledger.path)
    assert again.spent(1e-5) == ledger.spent(1e-5) and again.site_yaml == "/srv/fedauc/vienna.yaml"

    state = pacs_state.read(V1 / "pacs-state.json")
    studies = state["melanoma/3"]["studies"]
    assert studies["1.2.3"]["done"] == {"1.2.3.4": 2} and studies["1.2.4"]["failures"] == 1
    pacs_state.write(tmp_path / "pacs.json", state)
    assert pacs_state.read(tmp_path / "pacs.json") == state

    points = thresholds.read(V1 / "thresholds.json")
    assert points.points["melanoma"]["youden"].threshold == 0.5 and points.positives == {"melanoma": 8}
    thresholds.write(points, tmp_path / "points.json")
    assert thresholds.read(tmp_path / "points.json") == points

    settings = local_site(V1)  # a kit's local/ folder
    assert settings["site"] == "vienna" and settings["shards"] == "/srv/fedauc/shards/vienna"


def test_a_checkpoint_of_the_old_fedauc_resumes_to_the_uninterrupted_model(tmp_path):
    config = _generator().checkpoint_config
    ckpt = _copy("checkpoint", tmp_path)
    assert FIELD not in json.loads((ckpt / "round_000001" / "meta.json").read_text())
    resumed = federated.train(config(rounds=4, checkpoint_dir=ckpt, resume=True))
    full = federated.train(config(rounds=4))
    assert [h["round"] for h in resumed.history] == [0, 1, 2, 3]
    # The stored rounds were computed on the machine that wrote the fixture, whose CPU kernels may round the last
    # bits otherwise than this one's (the test failed bit for bit on another x86 machine): equal to float32 rounding.
    for key, value in full.global_state.items():
        assert torch.allclose(value.double(), resumed.global_state[key].double(), rtol=1e-5, atol=1e-6), key
    assert json.loads((ckpt / "round_000003" / "meta.json").read_text())[FIELD] == FORMATS["checkpoint"]


@pytest.mark.parametrize("name, read", [
    ("vienna.privacy-ledger.json", Ledger.load),
    ("pacs-state.json", pacs_state.read),
    ("thresholds.json", thresholds.read),
    ("fedauc_site.json", lambda path: local_site(path.parent)),
])
def test_a_file_of_a_newer_format_is_refused_in_one_line_naming_it(tmp_path, name, read):
    path = _copy(name, tmp_path)
    body = json.loads(path.read_text())
    path.write_text(json.dumps({**body, FIELD: 99}))
    with pytest.raises(DataError) as refused:
        read(path)
    message = str(refused.value)
    assert len(message.splitlines()) == 1 and str(path) in message and "format 99" in message, message
    assert "written by a newer fedauc" in message and "upgrade fedauc" in message, message


def test_status_names_the_hospitals_behind_the_version_the_centre_announces():
    sites = [SiteStatus("vienna", 1.0, 2.0, fedauc="0.2.0+gaaaaaaaaaaaa"),
             SiteStatus("barcelona", 1.0, 2.0, fedauc="0.1.0+g2d9c5ff00000"), SiteStatus("graz", 1.0, 2.0)]
    status = ConsortiumStatus("today", sites, [])
    assert status.versions("0.2.0+gaaaaaaaaaaaa") == (
        "hospitals behind the centre's fedauc 0.2.0+gaaaaaaaaaaaa: barcelona (0.1.0+g2d9c5ff00000) (each upgrades, or "
        "lists 0.2.0+gaaaaaaaaaaaa in its site YAML's allowed_code_versions meanwhile); not reported yet (no fedauc job "
        "since they joined): graz")
    assert status.versions("0.1.0+g2d9c5ff00000").startswith("hospitals behind the centre's fedauc 0.1.0+g2d9c5ff00000: "
                                                             "vienna (0.2.0+gaaaaaaaaaaaa)")
    assert ConsortiumStatus("today", sites[:1], []).versions("0.2.0+gaaaaaaaaaaaa") == (
        "every hospital that reported runs the centre's fedauc 0.2.0+gaaaaaaaaaaaa")
